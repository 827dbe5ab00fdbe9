"""Schema evolution from the data (issue #27 item 1) the whole way: HTTP and gRPC ingest of
an ``unknown_fields = "evolve"`` stream → batch files → collector → Iceberg columns, read
back through pyiceberg (and Spark, in the test that takes the ``spark`` fixture). Conflicts
and refused names go to the dead letters with their reason; a crash between the schema
commit and the data commit is harmless."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import httpx
import msgspec
import pytest
from collector_support import Crash, collector_config, crash_at, drain, read_table, start
from ingest_support import grpc_serving, http_serving, running

from icefloe.config import Column, StreamConfig
from icefloe.registry import Registry, RegistryStore
from icefloe.registry import ops as registry_ops
from icefloe.registry.streams import source_streams
from icefloe.store import open_async_store
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from icefloe_app.api.app import AdminApi
from icefloe_app.api.auth import AdminAuth
from icefloe_app.api.tasks import Tasks
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import LocalEngine
from tests.app.test_admin_api import serving

PAGES = StreamConfig(name="pages", table="web.pages", unknown_fields="evolve",
                     columns=(Column("user_id", "string", required=True),))


async def ingest_http(config: Any, events: list[dict[str, Any]]) -> None:
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        ok = await client.post("/v1/streams/pages/events", json=events)
        assert ok.status_code == 202, ok.text


async def ingest_grpc(config: Any, events: list[dict[str, Any]]) -> None:
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        request = ingest_pb2.PublishRequest(stream="pages", events=[
            ingest_pb2.Event(json=msgspec.json.encode(e)) for e in events])
        reply = await ingest_pb2_grpc.IngestStub(channel).Publish(request)
        assert reply.accepted == len(events)


async def collect(config: Any, engine: Any = None, hook: Any = None) -> None:
    collector = await start(config, engine or LocalEngine(), hook=hook)
    try:
        await drain(collector)
    finally:
        await collector.store.close()


def columns(config: Any) -> dict[str, str]:
    schema = open_catalog(config.catalog).load_table("web.pages").schema()
    return {f.name: str(f.field_type) for f in schema.fields}


def dead_letters(config: Any) -> list[dict[str, Any]]:
    return read_table(config, "icefloe.dead_letters").to_pylist()


FIRST = [
    {"user_id": "u1", "n": 5, "price": 2.5, "ok": True, "plan": "pro",
     "geo": {"city": "Oslo", "zip": 150}, "tags": ["a", "b"], "blank": None},
    {"user_id": "u2", "n": 6, "price": 3, "misc": [1, "x"]},
]


async def test_new_fields_add_typed_columns_over_http_and_grpc(tmp_path):
    config = collector_config(tmp_path, streams=(PAGES,))
    await ingest_http(config, FIRST[:1])
    await ingest_grpc(config, FIRST[1:])
    await collect(config)
    kinds = columns(config)
    assert kinds["n"] == "long"
    assert kinds["price"] == "double"
    assert kinds["ok"] == "boolean"
    assert kinds["plan"] == "string"
    assert kinds["geo"].startswith("struct<")
    assert "city" in kinds["geo"]
    assert kinds["tags"] == "list<string>"
    assert kinds["misc"] == "string"  # json text: the elements' shapes differ
    assert "blank" not in kinds  # null only: no column yet
    rows = {r["user_id"]: r for r in read_table(config, "web.pages").to_pylist()}
    assert rows["u1"]["n"] == 5
    assert rows["u1"]["price"] == 2.5
    assert rows["u1"]["ok"] is True
    assert rows["u1"]["geo"] == {"city": "Oslo", "zip": 150}
    assert rows["u1"]["tags"] == ["a", "b"]
    assert rows["u2"]["price"] == 3.0
    assert msgspec.json.decode(rows["u2"]["misc"]) == [1, "x"]


async def test_conflicts_and_case_twins_are_dead_lettered_with_the_reason(tmp_path):
    config = collector_config(tmp_path, streams=(PAGES,))
    await ingest_http(config, FIRST)
    await collect(config)
    await ingest_http(config, [
        {"user_id": "u3", "n": "five"},           # string into a long column
        {"user_id": "u4", "n": 1.5},              # a fraction into a long column
        {"user_id": "u5", "Plan": "free"},        # differs from 'plan' only in case
        {"user_id": "u6", "misc": {"any": "thing"}, "n": 7},  # json takes any value
        {"user_id": "u7", "geo": {"city": 5}},    # wrong type inside a struct
    ])
    await collect(config)
    kept = {r["user_id"] for r in read_table(config, "web.pages").to_pylist()}
    assert kept == {"u1", "u2", "u6"}
    assert {d["reason"] for d in dead_letters(config)} == {"schema_evolution"}
    messages = sorted(d["message"] for d in dead_letters(config))
    assert any("string \"five\" does not fit long" in m for m in messages)
    assert any("number 1.5 does not fit long" in m for m in messages)
    assert any("'Plan'" in m and "case" in m for m in messages)
    assert any("'geo.city'" in m for m in messages)
    assert "Plan" not in columns(config)


async def test_a_crash_between_the_schema_change_and_the_data_is_harmless(tmp_path):
    config = collector_config(tmp_path, streams=(PAGES,))
    await ingest_http(config, FIRST)
    with pytest.raises(Crash):
        await collect(config, hook=crash_at("after_evolve:web.pages"))
    assert columns(config)["n"] == "long"  # the schema change landed, the rows did not
    assert read_table(config, "web.pages").num_rows == 0
    await collect(config)  # a takeover: reads the evolved schema, plans nothing, writes
    rows = read_table(config, "web.pages")
    assert sorted(rows.column("user_id").to_pylist()) == ["u1", "u2"]
    assert sorted(rows.column("n").to_pylist()) == [5, 6]


async def test_limits_dead_letter_bad_names_and_depth_and_overflow_past_the_width(tmp_path):
    config = collector_config(tmp_path, streams=(PAGES,), evolve_max_columns=6,
                              evolve_max_name_length=8, evolve_max_depth=2)
    await ingest_http(config, [{"user_id": "u1", "a": 1}, {"user_id": "u2", "b": 1},
                               {"user_id": "u3", "a_long_name": 1},
                               {"user_id": "u4", "a": 2, "d": None},
                               {"user_id": "u5", "a": 3, "deep": [[[1]]]}])
    await collect(config)
    rows = {r["user_id"]: r for r in read_table(config, "web.pages").to_pylist()}
    assert set(rows) == {"u1", "u2", "u4"}  # past evolve_max_columns: kept, in _overflow
    assert msgspec.json.decode(rows["u2"]["_overflow"]) == {"b": 1}
    assert rows["u1"]["_overflow"] is None
    messages = " ".join(d["message"] for d in dead_letters(config))
    assert "evolve_max_columns" not in messages
    assert "evolve_max_name_length" in messages
    assert "evolve_max_depth" in messages


async def test_the_ingestor_keeps_unknown_fields_only_when_evolving(tmp_path):
    from ingestor.validate import CompiledStream

    evolving = CompiledStream(PAGES)
    [payload] = evolving.from_json(b'{"user_id": "u", "x": {"y": [1, 2]}}').payloads
    assert msgspec.json.decode(payload) == {"user_id": "u",
                                            "_icefloe_extra": '{"x":{"y":[1,2]}}'}
    plain = CompiledStream(msgspec.structs.replace(PAGES, unknown_fields="ignore"))
    [payload] = plain.from_json(b'{"user_id": "u", "x": 1}').payloads
    assert msgspec.json.decode(payload) == {"user_id": "u"}


def test_the_cluster_output_path_accepts_evolve(tmp_path):
    from icefloe.config.validate import validate

    config = collector_config(tmp_path, streams=(PAGES,), output="cluster")
    validate(config, "t")  # both outputs evolve (tests/collector/test_cluster_evolve.py)


async def test_evolved_columns_read_back_through_spark(tmp_path, spark):
    from pipeline.load.run import SparkEngine
    from pipeline.read.iceberg_source import read_table as spark_read_table

    config = collector_config(tmp_path, streams=(PAGES,))
    await ingest_http(config, FIRST)
    await collect(config, SparkEngine(spark, 2))
    frame = spark_read_table(spark, config.catalog, "web.pages")
    rows = {r["user_id"]: r.asDict(recursive=True) for r in frame.collect()}
    assert rows["u1"]["n"] == 5
    assert rows["u1"]["geo"] == {"city": "Oslo", "zip": 150}
    assert rows["u1"]["tags"] == ["a", "b"]
    assert rows["u2"]["price"] == 3.0


def test_the_admin_api_creates_and_patches_evolving_sinks(tmp_path):
    admin_serving = serving(tmp_path, open_async_store, threading.Event())
    admin = next(admin_serving)
    try:
        created = admin.task(admin.client.post("/v1/sources/clicks/sinks", json={
            "name": "wide", "table": "web.wide", "unknown_fields": "evolve",
            "columns": [{"name": "user_id", "type": "string"}]}))
        assert created["result"]["sink"]["unknown_fields"] == "evolve"
        bad = admin.client.patch("/v1/sources/clicks/sinks/wide/settings", json={
            "settings": [{"key": "unknown_fields", "value": "guess"}]})
        assert bad.status_code == 400, bad.text
        patched = admin.client.patch("/v1/sources/clicks/sinks/clicks/settings", json={
            "settings": [{"key": "unknown_fields", "value": "evolve"}]})
        assert patched.status_code == 200, patched.text
    finally:
        next(admin_serving, None)

    async def read() -> Registry:
        store = open_async_store(admin.config.store.url)
        try:
            return await RegistryStore(store, admin.config.admin.registry_key).read()
        finally:
            await store.close()

    registry = asyncio.run(read())
    sinks = registry.source("clicks").live_sinks()
    assert {s.name: s.unknown_fields for s in sinks} == {"clicks": "evolve", "wide": "evolve"}
    [stream] = source_streams(registry)
    assert stream.unknown_fields == "evolve"  # ingestors keep what the sinks add


def test_the_admin_api_accepts_evolve_on_the_cluster_output_path(tmp_path):
    async def go() -> None:
        store = open_async_store((tmp_path / "store").as_uri())
        api = AdminApi(RegistryStore(store), Tasks(lambda stream: None), AdminAuth(()),
                       pending=lambda source: asyncio.sleep(0, 0), cluster_output=True)
        sink = registry_ops.SinkSpec(name="a", table="web.a", columns=PAGES.columns,
                                     unknown_fields="evolve")
        try:
            after = await api.check(lambda r: registry_ops.create_source(
                r, registry_ops.SourceSpec(id="s", sinks=(sink,))), "s")
            assert after.source("s").live_sinks()[0].unknown_fields == "evolve"
            patched = await api.check(lambda r: registry_ops.create_sink(
                registry_ops.create_source(r, registry_ops.SourceSpec(id="s")), "s",
                sink), "s")
            assert [k.unknown_fields for k in patched.source("s").live_sinks()] == ["evolve"]
        finally:
            await store.close()
    asyncio.run(go())


async def test_an_int_column_left_by_an_older_config_widens_to_long(tmp_path):
    older = msgspec.structs.replace(PAGES, unknown_fields="ignore", columns=(
        *PAGES.columns, Column("qty", "int")))
    config = collector_config(tmp_path, streams=(older,))
    await ingest_http(config, [{"user_id": "u1", "qty": 3}])
    await collect(config)
    assert columns(config)["qty"] == "int"
    config = collector_config(tmp_path, streams=(PAGES,))  # qty no longer declared
    await ingest_http(config, [{"user_id": "u2", "qty": 2**40}, {"user_id": "u3", "qty": "x"}])
    await collect(config)
    assert columns(config)["qty"] == "long"  # widened, not refused
    rows = {r["user_id"]: r["qty"] for r in read_table(config, "web.pages").to_pylist()}
    assert rows == {"u1": 3, "u2": 2**40}
    [dead] = dead_letters(config)
    assert "does not fit long" in dead["message"]


def test_only_evolving_sinks_of_a_source_receive_its_undeclared_fields():
    import pyarrow as pa

    from collector.routing import Routes, project
    from icefloe.registry.model import Registry, Sink, Source

    source = Source(id="pages", sinks=(
        Sink(name="wide", table="web.wide", columns=PAGES.columns, unknown_fields="evolve"),
        Sink(name="narrow", table="web.narrow", columns=PAGES.columns)))
    routes = Routes(Registry(version=1, sources=(source,)))
    [decode] = routes.decode_streams
    assert decode.unknown_fields == "evolve"
    # read as one json column, and the client (write token name) that sent them
    assert [c.name for c in decode.columns[-2:]] == ["_icefloe_extra", "_icefloe_client"]
    rows = pa.table({"user_id": ["u"], "_icefloe_extra": ['{"x":1}'], "_event_id": ["e"],
                     "_received_at": pa.array([0], pa.timestamp("us", tz="UTC")),
                     "_sequence": [1]})
    wide, narrow = routes.targets["pages"]
    assert "_icefloe_extra" in project(rows, wide).column_names
    assert "_icefloe_extra" not in project(rows, narrow).column_names
