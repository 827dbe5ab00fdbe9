"""``template`` columns (Keboola's Jsonnet) through Spark, on both output paths: the
executors evaluate each template in the decode, a failing ``Body(path)`` dead-letters its
record and nothing else, the two other streams of the same batch files commit untouched, and
each entry takes the template of the registry version it was accepted under (a sink PATCH
between two queued entries). Real Spark (local mode: executors are real Python workers),
real local store, real SQLite catalog; the issues' records are framed as the ingestor frames
them (its validator and request meta)."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import msgspec
import pytest
from collector_support import (
    BASE_MS,
    BUYS,
    CLICKS,
    assert_exact,
    buy,
    change_registry,
    click,
    collector_config,
    ids,
    open_store_of,
    output_engine,
    read_table,
    start,
)

from collector.routing import Routes
from icefloe.config import Column, Config
from icefloe.config.manifest import ManifestConfig
from icefloe.formats.batch import BatchBuilder, Compression
from icefloe.formats.envelope import frame_events
from icefloe.manifest import ManifestProducer
from icefloe.manifest.publish import publish_batch
from icefloe.registry import Registry, RegistryStore, ops
from icefloe.registry.streams import source_streams
from ingestor.validate import CompiledStream

OLD = "'old #' + Body('issue.id') + ' from ' + Ip()"
NEW = "{id: Body('issue.id'), kind: Header('X-Github-Event', 'none'), day: Now('%Y')}"
ISSUES_COLUMNS = (Column("n", "string", path="$.n"), Column("v", "string", template=OLD))


def sinks() -> list[ops.SourceSpec]:
    return [ops.SourceSpec(id="clicks", sinks=(ops.SinkSpec(
                name="clicks", table="web.clicks", columns=CLICKS.columns),)),
            ops.SourceSpec(id="buys", sinks=(ops.SinkSpec(
                name="buys", table="shop.buys", columns=BUYS.columns),)),
            ops.SourceSpec(id="issues", sinks=(ops.SinkSpec(
                name="issues", table="in_c_github.issues", columns=ISSUES_COLUMNS),))]


def issues_records(registry: Registry, prefix: str) -> tuple[bytes, int]:
    """Three issue events of one request (the second without ``issue.id``), framed as the
    ingestor frames them under ``registry``: the event's JSON text in the template column's
    field, the client address and headers in the meta."""
    stream = next(s for s in source_streams(registry) if s.name == "issues")
    compiled = CompiledStream(stream)
    headers = {"x-github-event": "issues", "content-type": "application/json"}
    meta = compiled.request_meta("203.0.113.9", headers.get, lambda: headers.items())
    events = [{"n": f"{prefix}0", "issue": {"id": "7"}}, {"n": f"{prefix}1", "issue": {}},
              {"n": f"{prefix}2", "issue": {"id": "9"}}]
    payloads = compiled.from_json(msgspec.json.encode(events)).payloads
    return frame_events("issues", BASE_MS, [f"i{prefix}{i}" for i in range(3)], payloads,
                        meta=meta), 3


async def queue(config: Config, registry: Registry, prefix: str) -> None:
    """One batch file holding 4 clicks, 4 buys and the 3 issue events, accepted under
    ``registry``'s version."""
    builder = BatchBuilder()
    for stream, event_id, received, payload in ([click(i, f"c{prefix}") for i in range(4)]
                                                + [buy(i, f"b{prefix}") for i in range(4)]):
        builder.add_framed(frame_events(stream, received, [event_id], [payload]), 1)
    builder.add_framed(*issues_records(registry, prefix))
    store = open_store_of(config)
    producer = ManifestProducer(store, ManifestConfig())
    try:
        await publish_batch(store, producer, builder.finish(Compression.ZSTD),
                            record_count=builder.record_count,
                            streams=("buys", "clicks", "issues"),
                            registry_version=registry.version)
    finally:
        await producer.close()
        await store.close()


@pytest.mark.parametrize("output", ["embedded", "cluster"])
async def test_templates_on_spark_with_three_streams(tmp_path: Path, spark: Any,
                                                     output: str) -> None:
    config = collector_config(tmp_path, (CLICKS, BUYS), output=output, dequeue_every=1)

    def create(r: Registry) -> Registry:
        for spec in sinks():
            r = ops.create_source(r, spec)
        return r
    first = await change_registry(config, create)
    await queue(config, first, "a")
    patched = (ISSUES_COLUMNS[0], Column("v", "string", template=NEW))
    second = await change_registry(config, lambda r: ops.update_sink(
        r, "issues", "issues", ops.SinkPatch(columns=patched)))
    await queue(config, second, "b")

    collector = await start(config, output_engine(spark, output))
    try:
        collector.routes = Routes(await RegistryStore(
            collector.store, config.admin.registry_key).read())
        await asyncio.to_thread(collector.prepare_tables)
        while (await collector.run_once()).entries:
            pass
        if output == "cluster":  # every run stayed on the cluster path
            assert not collector.metrics.embedded_runs.collect()[0].samples
    finally:
        await collector.store.close()

    assert_exact(config, "web.clicks", ids("ca", 4) | ids("cb", 4))
    assert_exact(config, "shop.buys", ids("ba", 4) | ids("bb", 4))
    rows = {r["n"]: r["v"] for r in read_table(config, "in_c_github.issues").to_pylist()}
    year = f'"{dt.datetime.fromtimestamp(BASE_MS / 1000, dt.UTC).year}"'
    assert rows == {  # entry a: the template of its version; entry b: the PATCHed one
        "a0": '"old #7 from 203.0.113.9"', "a2": '"old #9 from 203.0.113.9"',
        "b0": '{"day":' + year + ',"id":"7","kind":"issues"}',  # Jsonnet sorts the keys
        "b2": '{"day":' + year + ',"id":"9","kind":"issues"}'}
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    assert sorted((d["event_id"], d["reason"], d["stream"]) for d in dead) == [
        ("ia1", "template_error", "issues"), ("ib1", "template_error", "issues")]
    for letter in dead:
        assert letter["message"] == ("column 'v' of stream 'issues': path \"issue.id\" not "
                                     "found in the body")
        assert msgspec.json.decode(letter["raw"])["issue"] == {}
