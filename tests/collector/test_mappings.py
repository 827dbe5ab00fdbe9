"""Column mappings: config errors, ingest-time extraction, envelope meta, and the whole way
through real HTTP and gRPC ingestors, a Spark collector and an Iceberg table."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
import pytest
from collector_support import (
    collect_all,
    collector_config,
    open_store_of,
    output_engine,
    read_table,
)
from ingest_support import grpc_serving, http_serving, running
from process_support import SPARK_TIMEOUT_S, run_cli, write_config

from icefloe.config import Column, Config, StreamConfig, load_config, validate
from icefloe.config.manifest import ManifestConfig
from icefloe.errors import ConfigError
from icefloe.formats.batch import BatchBuilder
from icefloe.formats.envelope import frame_events, split_by_stream
from icefloe.manifest import ManifestProducer
from icefloe.manifest.publish import publish_batch
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from ingestor.mappings import kafka_meta
from ingestor.validate import CompiledStream, InvalidEvents
from pipeline.load.decode import decode_batch_file
from pipeline.load.mapped import check_on_spark
from pipeline.load.packed import needs_rows
from pipeline.load.run import run_local, run_spark
from pipeline.load.spec import EntryFile, run_spec, stream_specs
from pipeline.load.split import split_columnar

UTC = dt.UTC
ORDERS = StreamConfig(name="orders", table="shop.orders", unknown_fields="reject",
                      event_id_field="order_id", columns=(
    Column("url", "string"),
    Column("price", "string"),
    Column("order_id", "string", path="$.order.id", required=True),
    Column("qty", "int", path="$.order.qty", default=1),
    Column("first_sku", "string", path="$.order.items[0]['sku']"),
    Column("placed", "timestamp", path="$.order.placed"),
    Column("coupon", "string", path="$.order.coupon", raw=True),
    Column("tags", "json", path="$.tags"),
    Column("body", "json", source="body"),
    Column("ip", "string", source="ip"),
    Column("agent", "string", header="User-Agent", default="unknown"),
    Column("tenant", "string", header="X-Tenant"),
    Column("received", "timestamp", source="datetime"),
    Column("received_ms", "long", source="datetime"),
    Column("received_day", "date", source="datetime"),
    Column("eid", "string", source="id"),
    Column("url_lower", "string", sql="lower(url)"),
    Column("price_dec", "double", sql="CAST(price AS DECIMAL(10,2))"),
    Column("month", "string", sql="strftime(placed, '%Y-%m')", dialect="duckdb"),
    Column("pg_len", "int", sql="length(url)::int", dialect="postgres"),
    Column("seq_plus", "long", sql="_sequence + 1"),
    Column("kafka_key", "binary", source="kafka_key"),
    Column("kafka_offset", "long", source="kafka_offset"),
    Column("kafka_at", "timestamp", source="kafka_timestamp"),
    Column("kafka_headers", "json", source="kafka_headers"),
))


def compiled(*columns: Column, **options: Any) -> CompiledStream:
    stream = StreamConfig(name="s", table="a.b", columns=columns, **options)
    validate(Config(streams=(stream,)), "test")
    return CompiledStream(stream)


def payload(stream: CompiledStream, body: bytes) -> dict[str, Any]:
    return msgspec.json.decode(stream.from_json(body).payloads[0])


def config_error(tmp_path: Path, column: str, **stream: Any) -> str:
    """Load a TOML file whose stream has ``column`` (an inline table) and return the error."""
    extra = "".join(f"{k} = {v!r}\n" for k, v in stream.items()).replace("'", '"')
    path = tmp_path / "icefloe.toml"
    path.write_text(f'[[streams]]\nname = "s"\ntable = "a.b"\n{extra}columns = [\n'
                    f'  {{ name = "url", type = "string" }},\n  {column},\n]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


# -- config -------------------------------------------------------------------------------


@pytest.mark.parametrize(("column", "expected"), [
    ('{ name = "x", type = "string", path = "$.a", header = "X-A" }',
     "at most one mapping, this one has path and header"),
    ('{ name = "x", type = "string", path = "user.id" }', "starts with '$'"),
    ('{ name = "x", type = "string", path = "$.a[*]" }', "no wildcards or filters"),
    ('{ name = "x", type = "string", path = "$[0]" }', "the first step must be a key"),
    ('{ name = "x", type = "string", from = "cookie" }', "unknown from = 'cookie'"),
    ('{ name = "x", type = "long", from = "ip" }', "gives string, not long"),
    ('{ name = "x", type = "long", path = "$.a", raw = true }', "'raw' applies only"),
    ('{ name = "x", type = "long", path = "$.a", default = "ten" }',
     "default 'ten' is not a valid long"),
    ('{ name = "x", type = "long", path = "$.a", default = 1, required = true }',
     "cannot have a default"),
    ('{ name = "x", type = "string", header = "Bad Header" }', "is not a header name"),
    ('{ name = "x", type = "string", sql = "lower(url" }', "invalid spark SQL"),
    ('{ name = "x", type = "long", sql = "count(url)" }', "an aggregate (COUNT(url))"),
    ('{ name = "x", type = "long", sql = "(SELECT 1)" }', "not allowed"),
    ('{ name = "x", type = "string", sql = "lower(nope)" }', "unknown column 'nope'"),
    ('{ name = "x", type = "string", sql = "t.url" }', "is qualified"),
    ('{ name = "x", type = "string", sql = "lower(url)", dialect = "oracle" }',
     "unknown dialect 'oracle'"),
    ('{ name = "x", type = "string", sql = "lower(url)", required = true }',
     "cannot be required"),
    ('{ name = "x", type = "string", path = "$.a", dialect = "duckdb" }',
     "'dialect' applies only to a sql mapping"),
    ('{ name = "x", type = "string", path = "$.url.host" }',
     "reads inside field 'url', which is also declared as a string column"),
])
def test_a_bad_mapping_fails_at_load_with_the_column_and_reason(tmp_path, column, expected):
    message = config_error(tmp_path, column)
    assert "icefloe.toml: streams[0].columns[1] (x): " in message, message
    assert expected in message, message


def test_a_sql_column_may_not_read_another_sql_column(tmp_path):
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "s"\ntable = "a.b"\ncolumns = [\n'
                    ' { name = "url", type = "string" },\n'
                    ' { name = "a", type = "string", sql = "lower(url)" },\n'
                    ' { name = "b", type = "string", sql = "upper(a)" },\n]\n')
    with pytest.raises(ConfigError, match=r"columns\[2\] \(b\): column 'a' is itself a sql"):
        load_config(path)


def test_the_event_id_cannot_come_from_a_header(tmp_path):
    message = config_error(tmp_path, '{ name = "x", type = "string", header = "X-Id" }',
                           event_id_field="x")
    assert "event_id_field: 'x' is a header mapping" in message


def test_mappings_load_from_toml_with_the_from_key(tmp_path):
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "s"\ntable = "a.b"\ncolumns = [\n'
                    ' { name = "ip", type = "string", from = "ip" },\n'
                    ' { name = "uid", type = "long", path = "$.user[\'id\']", default = 0 },\n]\n')
    columns = load_config(path).streams[0].columns
    assert (columns[0].source, columns[0].mapping) == ("ip", "ip")
    assert (columns[1].path, columns[1].default, columns[1].mapping) == ("$.user['id']", 0,
                                                                          "path")


# -- ingest-time extraction ------------------------------------------------------------------


def test_path_values_are_extracted_typed_and_the_subtrees_are_not_kept():
    stream = compiled(
        Column("id", "long", path="$.user.id", required=True),
        Column("name", "string", path="$.user['full name']"),
        Column("sku", "string", path="$.items[1].sku"),
        Column("at", "timestamp", path="$.meta.at"),
        Column("n", "int", path="$.meta.n", default=7),
        Column("blob", "json", path="$.items"),
        Column("coupon", "string", path="$.coupon", raw=True))
    body = (b'{"user":{"id":42,"full name":"Ada"},"items":[{"sku":"a"},{"sku":"b"}],'
            b'"meta":{"at":"2026-11-23T12:00:00+02:00"},"coupon":{"code":"X"},"other":1}')
    assert payload(stream, body) == {
        "id": 42, "name": "Ada", "sku": "b", "at": "2026-11-23T10:00:00Z", "n": 7,
        "blob": '[{"sku":"a"},{"sku":"b"}]', "coupon": '{"code":"X"}'}


def test_epoch_milliseconds_and_missing_optional_paths():
    stream = compiled(Column("at", "timestamp", path="$.m.at"),
                      Column("x", "string", path="$.m.x"))
    assert payload(stream, b'{"m":{"at":0}}') == {"at": "1970-01-01T00:00:00Z"}
    assert payload(stream, b'{"m":{"x":null}}') == {}
    with pytest.raises(InvalidEvents) as info:  # a path through a non-object: refused
        stream.from_json(b'{"m":[1]}')
    assert info.value.violations[0].as_dict() == {
        "index": 0, "field": "at", "reason": "value at $.m.at: expected `object`, got `array`"}


def test_a_path_with_an_index_through_the_wrong_shape_is_refused_too():
    stream = compiled(Column("sku", "string", path="$.items[0].sku"))
    assert payload(stream, b'{"items":[]}') == {}
    assert payload(stream, b'{"items":[{"sku":"a"}]}') == {"sku": "a"}
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(b'{"items":{"sku":"a"}}')
    assert info.value.violations[0].as_dict() == {
        "index": 0, "field": "sku",
        "reason": "value at $.items[0].sku: expected `array` before index 0, got `object`"}


def test_bad_mapped_values_are_refused_with_index_column_and_path():
    stream = compiled(Column("id", "long", path="$.user.id", required=True),
                      Column("n", "int", path="$.n"))
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(b'[{"user":{"id":1}},{"user":{"id":"x"}},{"user":{}},'
                         b'{"user":{"id":2},"n":3000000000}]')
    assert info.value.code == "validation_failed"
    assert [v.as_dict() for v in info.value.violations] == [
        {"index": 1, "field": "id", "reason": "value at $.user.id: expected `int`, got `str`"},
        {"index": 2, "field": "id",
         "reason": "required value at $.user.id is missing or null"},
        {"index": 3, "field": "n",
         "reason": "value at $.n: expected `int` <= 2147483647"}]


def test_reject_unknown_fields_counts_path_roots_as_known():
    stream = compiled(Column("id", "string", path="$.user.id"), unknown_fields="reject")
    assert payload(stream, b'{"user":{"id":"u"}}') == {"id": "u"}
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(b'{"user":{"id":"u"},"extra":1}')
    assert "extra" in info.value.violations[0].reason


def test_a_path_inside_a_json_column_reads_that_field():
    stream = compiled(Column("user", "json"), Column("id", "string", path="$.user.id"))
    assert payload(stream, b'{"user":{"id":"u"}}') == {"user": '{"id":"u"}', "id": "u"}


def test_body_keeps_each_events_own_json_over_every_input_shape():
    stream = compiled(Column("a", "long"), Column("raw", "json", source="body"))
    one = stream.from_json(b'{"a":1,"zz":[1, 2]}').payloads
    many = stream.from_json(b'[{"a":1},{"a":2,"b":"x"}]').payloads
    lines = stream.from_ndjson(b'{"a":3}\n\n{"a":4}\n').payloads
    assert [msgspec.json.decode(p)["raw"] for p in one + many + lines] == [
        '{"a":1,"zz":[1, 2]}', '{"a":1}', '{"a":2,"b":"x"}', '{"a":3}', '{"a":4}']


def test_the_event_id_can_come_from_a_path():
    stream = compiled(Column("id", "string", path="$.order.id"), event_id_field="id")
    assert stream.from_json(b'[{"order":{"id":"o1"}},{"order":{}}]').body_ids == ["o1", None]


def test_request_meta_keeps_only_what_mappings_use():
    stream = compiled(Column("ip", "string", source="ip"),
                      Column("agent", "string", header="User-Agent", default="none"),
                      Column("tenant", "string", header="X-Tenant", required=True))
    headers = {"x-tenant": "t1", "cookie": "secret"}
    meta = msgspec.json.decode(stream.request_meta("10.0.0.9", headers.get))
    assert meta == {"ip": "10.0.0.9", "h": {"user-agent": "none", "x-tenant": "t1"}}
    with pytest.raises(InvalidEvents) as info:
        stream.request_meta("10.0.0.9", {}.get)
    assert info.value.code == "missing_header"
    assert compiled(Column("a", "string")).request_meta("1.2.3.4", headers.get) == b""


# -- envelope meta through both splits and the decode -------------------------------------


def test_meta_survives_both_splits_and_becomes_columns():
    stream = StreamConfig(name="s", table="a.b", columns=(
        Column("a", "long"), Column("ip", "string", source="ip"),
        Column("agent", "string", header="User-Agent"),
        Column("at", "timestamp", source="datetime"), Column("eid", "string", source="id")))
    meta = b'{"ip":"1.2.3.4","h":{"user-agent":"curl/8"}}'
    with_meta = frame_events("s", 1_700_000_000_000, ["e1", "e2"], [b'{"a":1}', b'{"a":2}'],
                             meta=meta)
    without = frame_events("s", 1_700_000_000_005, ["e3"], [b'{"a":3}'])
    block = with_meta + without
    exact = split_by_stream(block, 3)["s"]
    fast = split_columnar(block, 3)["s"]  # type: ignore[index]
    assert exact.metas == [meta, meta, b""]
    assert fast.metas.to_pylist() == exact.metas
    builder = BatchBuilder()
    builder.add_framed(block, 3)
    data = builder.finish()
    spec = stream_specs([stream])[0]
    rows = decode_batch_file(data, EntryFile(9, "k", len(data), 0),
                             {"s": spec.plan()}).tables["s"].to_pylist()
    assert [(r["a"], r["ip"], r["agent"], r["eid"]) for r in rows] == [
        (1, "1.2.3.4", "curl/8", "e1"), (2, "1.2.3.4", "curl/8", "e2"), (3, None, None, "e3")]
    assert rows[2]["at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 5000, tzinfo=UTC)
    assert [r["_sequence"] for r in rows] == [9, 9, 9]


def test_a_payload_that_no_longer_fits_is_dead_lettered_and_derived_columns_stay_aligned():
    stream = StreamConfig(name="s", table="a.b", columns=(
        Column("a", "long"), Column("eid", "string", source="id"),
        Column("ip", "string", source="ip")))
    framed = (frame_events("s", 1, ["e1"], [b'{"a":1}'], meta=b'{"ip":"h1"}')
              + frame_events("s", 2, ["e2"], [b'{"a":"not a long"}'], meta=b'{"ip":"h2"}')
              + frame_events("s", 3, ["e3"], [b'{"a":3}'], meta=b'{"ip":"h3"}'))
    builder = BatchBuilder()
    builder.add_framed(framed, 3)
    data = builder.finish()
    out = decode_batch_file(data, EntryFile(1, "k", len(data), 0),
                            {"s": stream_specs([stream])[0].plan()})
    rows = out.tables["s"].to_pylist()
    assert [(r["a"], r["eid"], r["ip"]) for r in rows] == [(1, "e1", "h1"), (3, "e3", "h3")]
    assert out.dead.event_id == ["e2"]
    assert out.dead.reason == ["payload_mismatch"]


def test_the_local_engine_refuses_sql_columns_instead_of_leaving_them_null(tmp_path):
    config = collector_config(tmp_path, streams=(ORDERS,))
    with pytest.raises(ValueError, match="sql mapping columns, which only the Spark engine"):
        run_local(run_spec(config, []))


def test_a_run_with_sql_columns_takes_the_spark_row_path(tmp_path, spark):
    """Packed runs never show Spark a row, so a stream with sql columns needs the row
    path: chosen automatically, and forcing the packed path is refused, not silently null."""
    config = collector_config(tmp_path, streams=(ORDERS,))
    spec = msgspec.structs.replace(run_spec(config, []), batches=((0, "batches/x", 1, 0),))
    assert needs_rows(spec)
    plain = tmp_path / "plain"
    plain.mkdir()
    assert not needs_rows(run_spec(collector_config(plain), []))
    with pytest.raises(ValueError, match="only the row path computes them"):
        run_spark(spark, spec, packed=True)


# -- the whole way: HTTP and gRPC ingestors → Spark collector → Iceberg ----------------------


def order(i: int, **extra: Any) -> dict[str, Any]:
    return {"url": f"/Shop/{i}", "price": f"{i}.505",
            "order": {"id": f"o{i}", "qty": i, "items": [{"sku": f"sku{i}"}],
                      "placed": "2026-11-23T10:00:00Z", "coupon": i},
            "tags": ["a", i], **extra}


async def ingest_orders(config: Config) -> None:
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        ok = await client.post("/v1/streams/orders/events", json=[order(1), order(2)],
                               headers={"User-Agent": "shop/1.0", "X-Tenant": "t1"})
        assert ok.status_code == 202, ok.text
        # No User-Agent: the default; a price Spark cannot cast gives null, not a failed run.
        ok = await client.post("/v1/streams/orders/events",
                               json=order(3, price="n/a"),
                               headers={"User-Agent": "", "X-Tenant": "t2"})
        assert ok.status_code == 202, ok.text
        bad = await client.post("/v1/streams/orders/events",
                                json=[order(4), {"order": {"qty": "many"}}])
        assert bad.status_code == 400
        assert {d["field"] for d in bad.json()["details"]} == {"order_id"}
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        request = ingest_pb2.PublishRequest(stream="orders", events=[
            ingest_pb2.Event(json=msgspec.json.encode(order(5)))])
        reply = await ingest_pb2_grpc.IngestStub(channel).Publish(
            request, metadata=(("user-agent-ignored", "x"), ("x-tenant", "t3")))
        assert reply.accepted == 1


async def publish_kafka_order(config: Config) -> None:
    """Order 6 as the Kafka listener frames it: its record's metadata under "kf" in the
    envelope meta (the listener has its own tests; this is the collector's half)."""
    canonical = CompiledStream(ORDERS).from_json(msgspec.json.encode([order(6)]))
    meta = msgspec.json.encode({"kf": kafka_meta("shop", 1, 77, 1_700_000_000_005, b"\xffk",
                                                 [("trace", b"t6")])})
    builder = BatchBuilder()
    builder.add_framed(frame_events("orders", int(time.time() * 1000), ["o6"],
                                    canonical.payloads, meta=meta), 1)
    store = open_store_of(config)
    producer = ManifestProducer(store, ManifestConfig())
    try:
        await publish_batch(store, producer, builder.finish(), record_count=1,
                            streams=("orders",))
    finally:
        await producer.close()
        await store.close()


@pytest.mark.parametrize("output", ["embedded", "cluster"])
async def test_mapped_columns_land_in_iceberg_from_http_and_grpc(tmp_path, spark, output):
    config = collector_config(tmp_path, streams=(ORDERS,), output=output)
    await ingest_orders(config)
    await publish_kafka_order(config)
    await collect_all(config, output_engine(spark, output))
    rows = {r["order_id"]: r for r in read_table(config, "shop.orders").to_pylist()}
    assert sorted(rows) == ["o1", "o2", "o3", "o5", "o6"]
    kafka = rows.pop("o6")
    assert (kafka["kafka_key"], kafka["kafka_offset"], kafka["ip"]) == (b"\xffk", 77, None)
    assert kafka["kafka_at"] == dt.datetime(2023, 11, 14, 22, 13, 20, 5000, tzinfo=UTC)
    assert msgspec.json.decode(kafka["kafka_headers"]) == [{"key": "trace", "value": "t6"}]
    assert (kafka["qty"], kafka["url_lower"]) == (6, "/shop/6")
    assert {r["kafka_offset"] for r in rows.values()} == {None}  # HTTP/gRPC: no Kafka record
    one = rows["o1"]
    assert one["_event_id"] == one["eid"] == "o1"  # the event id came from the path
    assert (one["qty"], one["first_sku"], one["coupon"]) == (1, "sku1", "1")
    assert one["placed"] == dt.datetime(2026, 11, 23, 10, tzinfo=UTC)
    assert msgspec.json.decode(one["tags"]) == ["a", 1]
    assert msgspec.json.decode(one["body"]) == order(1)
    assert (one["ip"], one["agent"], one["tenant"]) == ("127.0.0.1", "shop/1.0", "t1")
    assert one["received"] == one["_received_at"]
    assert one["received_ms"] == int(one["_received_at"].timestamp() * 1000)
    assert one["received_day"] == one["_received_at"].date()
    assert (one["url_lower"], one["price_dec"], one["month"], one["pg_len"]) == (
        "/shop/1", 1.51, "2026-11", 7)
    assert one["seq_plus"] == one["_sequence"] + 1
    assert rows["o3"]["price_dec"] is None
    assert rows["o3"]["url_lower"] == "/shop/3"
    assert (rows["o3"]["agent"], rows["o3"]["tenant"]) == ("", "t2")
    grpc_row = rows["o5"]
    assert (grpc_row["ip"], grpc_row["tenant"], grpc_row["url_lower"]) == (
        "127.0.0.1", "t3", "/shop/5")
    assert grpc_row["agent"].startswith("grpc-python")  # the gRPC client's own user agent


def test_sql_spark_cannot_compile_is_refused_at_start_naming_the_column(tmp_path, spark):
    stream = StreamConfig(name="s", table="a.b", columns=(
        Column("url", "string"), Column("bad", "string", sql="element_at(url, 1)")))
    config = collector_config(tmp_path, streams=(stream,))
    with pytest.raises(ConfigError, match=r"stream 's', column 'bad': sql "
                       r"'element_at\(url, 1\)' does not compile on Spark"):
        check_on_spark(spark, run_spec(config, []).streams)
    check_on_spark(spark, run_spec(collector_config(tmp_path, streams=(ORDERS,)), []).streams)


# -- the command line ---------------------------------------------------------------------


def test_streams_show_says_where_each_column_comes_from(tmp_path):
    path = write_config(tmp_path, (ORDERS,))
    shown = run_cli(["streams", "show", "orders", "--config", str(path)], tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert "path $.order.qty (default 1)" in lines["qty"]
    assert "header User-Agent" in lines["agent"]
    assert "sql strftime(placed, '%Y-%m') (duckdb)" in lines["month"]
    assert " ip " in lines["ip"]
    as_json = run_cli(["streams", "show", "orders", "--json", "--config", str(path)], tmp_path)
    columns = {c["name"]: c for c in msgspec.json.decode(as_json.stdout)["columns"]}
    assert (columns["url"]["mapping"], columns["eid"]["mapping"]) == (None, "id")


def test_demo_events_put_path_values_where_the_stream_reads_them():
    import random

    from icefloe_app.cli.demo_events import EventFactory

    stream = CompiledStream(ORDERS)
    factory = EventFactory(ORDERS, random.Random(7))
    events = [factory.make() for _ in range(50)]
    assert all("order" in e and "order_id" not in e for e in events)
    canonical = stream.from_json(msgspec.json.encode(events))
    assert len(set(canonical.body_ids or [])) == 50  # ids read from $.order.id


def test_the_collector_refuses_to_start_on_sql_spark_cannot_compile(tmp_path):
    stream = StreamConfig(name="s", table="a.b", columns=(
        Column("url", "string"), Column("bad", "string", sql="element_at(url, 1)")))
    path = write_config(tmp_path, (stream,))
    done = run_cli(["collector", "--config", str(path)], tmp_path, timeout=SPARK_TIMEOUT_S)
    assert done.returncode == 2, done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("icefloe: error")]
    assert error.startswith("icefloe: error: stream 's', column 'bad': sql "
                            "'element_at(url, 1)' does not compile on Spark: "), error
    assert "DATATYPE_MISMATCH" in error.split("Spark: ", 1)[1].upper()


def test_overlapping_paths_and_raw_strings_fall_back_to_the_walked_root():
    stream = compiled(Column("user", "json", path="$.u"), Column("id", "long", path="$.u.id"),
                      Column("tag", "string", path="$.t", raw=True))
    assert payload(stream, b'{"u":{"id":5},"t":"plain"}') == {
        "user": '{"id":5}', "id": 5, "tag": "plain"}
    assert payload(stream, b'{"u":null,"t":[1]}') == {"tag": "[1]"}
    with pytest.raises(InvalidEvents) as info:
        stream.from_json(b'{"u":{"id":"5"}}')
    assert info.value.violations[0].as_dict() == {
        "index": 0, "field": "id", "reason": "value at $.u.id: expected `int`, got `str`"}
