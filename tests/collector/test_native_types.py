"""Native column types (decimal, uuid, binary, time, list/map/struct) the whole way:
HTTP and gRPC → ingestor validation → batch files → Spark collector → Iceberg, read back
through pyiceberg and through Spark with icefloe's reader. Bad values are refused at the
door with the field path, on both fronts."""

from __future__ import annotations

import base64
import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import grpc
import httpx
import msgspec
import pytest
from collector_support import collect_all, collector_config, output_engine, read_table
from google.rpc import error_details_pb2, status_pb2
from ingest_support import grpc_serving, http_serving, running

from icefloe.config import Column, StreamConfig
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from pipeline.read.iceberg_source import read_table as spark_read_table

UTC = dt.UTC
ITEMS = "list<struct<sku: string, price: decimal(5,2), at: timestamp, tags: list<string>>>"
NESTED = StreamConfig(name="orders", table="shop.native_orders", columns=(
    Column("order_id", "string", required=True),
    Column("total", "decimal(10,2)"),
    Column("ref", "uuid"),
    Column("blob", "binary"),
    Column("at_time", "time"),
    Column("items", ITEMS),
    Column("attrs", "map<string,long>"),
    Column("deep", "struct<a: struct<b: list<map<string,struct<c: decimal(4,1)>>>>>"),
    Column("extra", "json"),
))
REF = uuid.UUID("6f1c2b4e-8a0d-4c1e-9b7f-0123456789ab")


def order(i: int, **changes: Any) -> dict[str, Any]:
    return {"order_id": f"o{i}", "total": f"{i}.5", "ref": str(REF),
            "blob": base64.b64encode(bytes([i, 0, 255])).decode(), "at_time": "13:45:01.250",
            "items": [{"sku": f"s{i}", "price": 1.25, "at": "2026-11-23T10:00:00+01:00",
                       "tags": ["x", None]}, None],
            "attrs": {"a": i, "b": None},
            "deep": {"a": {"b": [{"k": {"c": "99.9"}}]}},
            "extra": {"free": [1, "form"]}, **changes}


BAD: list[tuple[dict[str, Any], str, str]] = [
    (order(9, items=[{"sku": "s"}, {"sku": 5}]), "items[1].sku", "expected `str | null`"),
    (order(9, items=[{}, {}, {"price": "1.234"}]), "items[2].price", "more than 2 digits after"),
    (order(9, total="123456789.1"), "total", "more than 8 digits before"),
    (order(9, blob="not base64!"), "blob", "base64"),
    (order(9, ref="not-a-uuid"), "ref", "invalid UUID"),
    (order(9, attrs=[["k", 1]]), "attrs", "expected `object | null`"),
    (order(9, attrs={"k": "1"}), "attrs[...]", "expected `int | null`"),
    (order(9, at_time="13:45:01+02:00"), "at_time", "no timezone"),
    (order(9, deep={"a": {"b": [{"k": {"c": "1000.0"}}]}}), "deep.a.b[0]['k'].c",
     "more than 3 digits before"),
]


@pytest.mark.parametrize(("event", "field", "reason"), BAD,
                         ids=[b[1] for b in BAD])
async def test_a_bad_native_value_is_refused_with_its_path_over_http_and_grpc(
        tmp_path, event, field, reason):
    config = collector_config(tmp_path, streams=(NESTED,))
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        bad = await client.post("/v1/streams/orders/events", json=[order(1), event])
        assert bad.status_code == 400, bad.text
        [detail] = bad.json()["details"]
        assert (detail["index"], detail["field"]) == (1, field)
        assert reason in detail["reason"]
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        request = ingest_pb2.PublishRequest(stream="orders", events=[
            ingest_pb2.Event(json=msgspec.json.encode(order(1))),
            ingest_pb2.Event(json=msgspec.json.encode(event))])
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await ingest_pb2_grpc.IngestStub(channel).Publish(request)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = status_pb2.Status.FromString(dict(caught.value.trailing_metadata())[
            "grpc-status-details-bin"])
        request_info = error_details_pb2.BadRequest()
        assert any(d.Unpack(request_info) for d in status.details)
        [violation] = request_info.field_violations
        assert violation.field == f"events[1].{field}"
        assert reason in violation.description


async def ingest(config: Any) -> None:
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        ok = await client.post("/v1/streams/orders/events",
                               json=[order(1), {"order_id": "o2"}])
        assert ok.status_code == 202, ok.text
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        request = ingest_pb2.PublishRequest(stream="orders", events=[
            ingest_pb2.Event(json=msgspec.json.encode(order(3)))])
        assert (await ingest_pb2_grpc.IngestStub(channel).Publish(request)).accepted == 1


def check_order_one(row: dict[str, Any], ref: Any) -> None:
    assert row["total"] == Decimal("1.50")
    assert row["ref"] == ref
    assert bytes(row["blob"]) == bytes([1, 0, 255])
    assert row["at_time"] == dt.time(13, 45, 1, 250000)
    [first, second] = row["items"]
    assert second is None
    assert (first["sku"], first["price"], first["tags"]) == ("s1", Decimal("1.25"),
                                                             ["x", None])
    at = first["at"]  # Spark gives naive datetimes in its session time zone (UTC here)
    assert (at if at.tzinfo else at.replace(tzinfo=UTC)) == dt.datetime(2026, 11, 23, 9,
                                                                       tzinfo=UTC)
    assert dict(row["attrs"]) == {"a": 1, "b": None}
    [entry] = row["deep"]["a"]["b"]
    assert dict(entry)["k"]["c"] == Decimal("99.9")
    assert msgspec.json.decode(row["extra"]) == {"free": [1, "form"]}


WITH_SQL = msgspec.structs.replace(NESTED, columns=(
    *NESTED.columns, Column("item_count", "int", sql="size(items)")))
"""A sql column puts the run on Spark's row path, where Spark itself holds the values."""


@pytest.mark.parametrize(("stream", "output"), [(NESTED, "embedded"), (WITH_SQL, "embedded"),
                                              (NESTED, "cluster")],
                         ids=["packed", "rows", "cluster"])
async def test_native_types_land_in_iceberg_and_read_back_in_pyiceberg_and_spark(
        tmp_path, spark, stream, output):
    config = collector_config(tmp_path, streams=(stream,), output=output)
    await ingest(config)
    await collect_all(config, output_engine(spark, output))
    from pipeline.iceberg.catalog import open_catalog

    schema = open_catalog(config.catalog).load_table("shop.native_orders").schema()
    kinds = {f.name: str(f.field_type) for f in schema.fields}
    assert kinds["total"] == "decimal(10, 2)"
    assert kinds["ref"] == "uuid"
    assert kinds["blob"] == "binary"
    assert kinds["at_time"] == "time"
    assert kinds["items"].startswith("list<struct<")
    assert kinds["attrs"].startswith("map<")
    table = read_table(config, "shop.native_orders")
    rows = {r["order_id"]: r for r in table.to_pylist()}
    assert sorted(rows) == ["o1", "o2", "o3"]
    check_order_one(rows["o1"], REF)
    assert rows["o3"]["total"] == Decimal("3.50")
    if stream is WITH_SQL:
        assert (rows["o1"].pop("item_count"), rows["o2"].pop("item_count")) == (2, -1)
    assert {k: v for k, v in rows["o2"].items() if v is not None
            and not k.startswith("_")} == {"order_id": "o2"}
    frame = spark_read_table(spark, config.catalog, "shop.native_orders")
    spark_rows = {r["order_id"]: r.asDict(recursive=True) for r in frame.collect()}
    assert sorted(spark_rows) == ["o1", "o2", "o3"]
    check_order_one(spark_rows["o1"], REF.bytes)  # Spark has no uuid type: 16 bytes


def test_nested_values_follow_the_streams_rules_at_every_depth():
    """Unknown members under ``reject``, timestamps, and ``json`` values keep their rules
    inside structs and lists, and the refusal names the nested path."""
    from ingestor.validate import CompiledStream, InvalidEvents

    strict = StreamConfig(name="s", table="n.t", unknown_fields="reject", columns=(
        Column("x", "struct<a: json, b: list<json>, c: timestamp>"),))
    compiled = CompiledStream(strict)
    [payload] = compiled.from_json(b'{"x":{"a":{"q":[1]},"b":[1,null],"c":0}}').payloads
    assert msgspec.json.decode(payload) == {"x": {"a": '{"q":[1]}', "b": ["1", None],
                                                  "c": "1970-01-01T00:00:00Z"}}
    deep = b"[" * 70 + b"]" * 70
    for body, field, reason in [
            (b'{"x":{"zz":1}}', "x", "unknown field `zz`"),
            (b'{"x":{"c":99999999999999999}}', "x.c", "out of range"),
            (b'{"x":{"b":[1,' + deep + b"]}}", "x.b[1]", "nested deeper than 64")]:
        with pytest.raises(InvalidEvents) as info:
            compiled.from_json(body)
        [violation] = info.value.violations
        assert violation.field == field
        assert reason in violation.reason


TIMED = msgspec.structs.replace(NESTED, columns=(
    *NESTED.columns, Column("slots", "list<struct<at: time, n: int>>"),
    Column("opens", "map<string,time>"), Column("at_hour", "int", sql="hour(at_time)"),
    Column("late", "boolean", sql="at_time > '12:00:00'")))
"""Spark functions over a `time` column: only with Spark's TIME type turned on (#36)."""


@pytest.mark.parametrize("output", ["embedded", "cluster"])
async def test_a_time_column_passes_the_collectors_spark_warm_up_and_its_sql(
        tmp_path, spark, output):
    """The collector's start-up (sql compile check, then the warm-up count) ran into
    ``UNSUPPORTED_TIME_TYPE`` on the pinned Spark and exited: no stream committed (#36)."""
    from pipeline.load.mapped import check_on_spark
    from pipeline.load.run import SparkEngine
    from pipeline.load.spec import run_spec

    config = collector_config(tmp_path, streams=(TIMED,), output=output)
    spec = run_spec(config, [])
    SparkEngine(spark, 2).warm_up(spec)  # what default_engine does before the first run
    check_on_spark(spark, spec.streams)  # and its check that every sql column compiles
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        ok = await client.post("/v1/streams/orders/events", json=[
            order(1, slots=[{"at": "08:30:00", "n": 1}, None], opens={"mon": "09:00:00.5"}),
            {"order_id": "o2"}, order(3)])
        assert ok.status_code == 202, ok.text
    await collect_all(config, output_engine(spark, output))
    rows = {r["order_id"]: r for r in read_table(config, "shop.native_orders").to_pylist()}
    assert sorted(rows) == ["o1", "o2", "o3"]
    assert rows["o1"]["at_time"] == dt.time(13, 45, 1, 250000)
    assert rows["o1"]["slots"] == [{"at": dt.time(8, 30), "n": 1}, None]  # nested time
    assert dict(rows["o1"]["opens"]) == {"mon": dt.time(9, 0, 0, 500000)}
    assert (rows["o1"]["at_hour"], rows["o1"]["late"]) == (13, True)
    assert (rows["o2"]["at_time"], rows["o2"]["at_hour"]) == (None, None)
