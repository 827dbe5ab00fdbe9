"""``output = "cluster"`` never wedges on a registry the admin API accepts.

A run ends where its routing changes (a sink disabled or enabled, deleted and re-created, a
table passing to another source), so each source has one target per run; a run the cluster
path still cannot write in one shot (fan-out, import conditions) takes the embedded path on
the same Spark session. Every test: each event committed exactly once, the queue drained,
no ``RoutingUnsupportedError``. Real Spark, real local store, real SQLite catalog.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from collector_support import (
    CLICKS,
    assert_exact,
    click,
    collector_config,
    open_store_of,
    publish,
    read_table,
    start,
)

from collector.routing import Routes
from icefloe.config import Column, Config
from icefloe.registry import Registry, RegistryStore, ops
from icefloe.registry.model import Conditions
from pipeline.run import SparkClusterEngine

CLICKS_SINK = ops.SinkSpec(name="clicks", table="web.clicks", columns=CLICKS.columns)
SLIM = ops.SinkSpec(name="slim", table="web.slim", columns=(Column("user_id", "string"),))
Event = tuple[str, str, int, bytes]


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, (CLICKS,), output="cluster", dequeue_every=1)


@pytest.fixture
def engine(spark: Any) -> SparkClusterEngine:
    return SparkClusterEngine(spark, 2)


async def change(config: Config, fn: Callable[[Registry], Registry]) -> int:
    store = open_store_of(config)
    try:
        return (await RegistryStore(store, config.admin.registry_key).update(fn)).version
    finally:
        await store.close()


async def queue(config: Config, version: int, *batches: list[Event]) -> None:
    store = open_store_of(config)
    try:
        await publish(store, batches, registry_version=version)
    finally:
        await store.close()


def batch(prefix: str, count: int, source: str = "clicks") -> list[Event]:
    return [(source, *click(i, prefix)[1:]) for i in range(count)]


def ids(*prefixes: str, count: int = 8) -> set[str]:
    return {f"{p}{i}" for p in prefixes for i in range(count)}


async def collector_for(config: Config, engine: SparkClusterEngine) -> Any:
    collector = await start(config, engine)
    registry = await RegistryStore(collector.store, config.admin.registry_key).read()
    collector.routes = Routes(registry)
    await asyncio.to_thread(collector.prepare_tables)
    return collector


async def drain_all(collector: Any) -> list[int]:
    """Run until the queue is empty (each run must succeed); the entries of each run."""
    runs = []
    while (result := await collector.run_once()).entries:
        runs.append(result.entries)
    manifest = await collector.consumer.snapshot()
    assert manifest.consumer.acked_through == manifest.next_sequence - 1
    return runs


def fallbacks(collector: Any, reason: str) -> float:
    return collector.metrics.embedded_runs.labels(reason)._value.get()


async def test_a_sink_disabled_and_enabled_inside_one_run(config, engine) -> None:
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK,))))
    await queue(config, version, batch("a", 8))
    version = await change(config, lambda r: ops.set_sink_enabled(r, "clicks", "clicks",
                                                                  False))
    await queue(config, version, batch("off", 8))
    version = await change(config, lambda r: ops.set_sink_enabled(r, "clicks", "clicks",
                                                                  True))
    await queue(config, version, batch("b", 8), batch("c", 8))
    collector = await collector_for(config, engine)
    assert await drain_all(collector) == [1, 1, 2]  # cut where the routing changes
    assert_exact(config, "web.clicks", ids("a", "b", "c"))
    assert not collector.metrics.embedded_runs.collect()[0].samples  # all on the cluster path
    await collector.store.close()


async def test_a_sink_deleted_and_re_created_inside_one_run(config, engine) -> None:
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK,))))
    await queue(config, version, batch("a", 8))
    await change(config, lambda r: ops.delete_sink(r, "clicks", "clicks"))
    version = await change(config, lambda r: ops.create_sink(r, "clicks", CLICKS_SINK))
    await queue(config, version, batch("b", 8))
    collector = await collector_for(config, engine)
    assert await drain_all(collector) == [1, 1]
    assert_exact(config, "web.clicks", ids("a", "b"))
    assert not collector.metrics.embedded_runs.collect()[0].samples
    await collector.store.close()


async def test_a_table_moving_between_sources_inside_one_run(config, engine) -> None:
    moved = ops.SinkSpec(name="moved", table="web.clicks", columns=CLICKS.columns)
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK,))))
    await queue(config, version, batch("a", 8))
    await change(config, lambda r: ops.delete_sink(r, "clicks", "clicks"))
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="visits", sinks=(moved,))))
    await queue(config, version, batch("v", 8, source="visits"), batch("w", 8, "visits"))
    collector = await collector_for(config, engine)
    assert await drain_all(collector) == [1, 2]
    assert_exact(config, "web.clicks", ids("a", "v", "w"))
    assert not collector.metrics.embedded_runs.collect()[0].samples
    await collector.store.close()


async def test_fan_out_takes_the_embedded_path(config, engine) -> None:
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK,))))
    await queue(config, version, batch("a", 8))  # one sink: the cluster path
    version = await change(config, lambda r: ops.create_sink(r, "clicks", SLIM))
    await queue(config, version, batch("b", 8), batch("c", 8))  # two sinks: embedded
    collector = await collector_for(config, engine)
    assert await drain_all(collector) == [1, 2]
    assert_exact(config, "web.clicks", ids("a", "b", "c"))
    assert_exact(config, "web.slim", ids("b", "c"))
    assert read_table(config, "web.slim").column_names == [
        "user_id", "_event_id", "_received_at", "_sequence"]
    assert fallbacks(collector, "fan-out") == 1
    await collector.store.close()


async def test_import_conditions_take_the_embedded_path(config, engine) -> None:
    staged = msgspec.structs.replace(CLICKS_SINK, conditions=Conditions(max_age_s=3600,
                                                                       max_events=16))
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(staged,))))
    await queue(config, version, batch("a", 8))
    collector = await collector_for(config, engine)
    result = await collector.run_once()
    assert result.staged == {"web.clicks": 8}  # staged, not committed: below 16 events
    assert read_table(config, "web.clicks").num_rows == 0
    await queue(config, version, batch("b", 8))
    assert await drain_all(collector) == [1]  # 16 events: committed
    assert_exact(config, "web.clicks", ids("a", "b"))
    # Conditions back to the defaults: rows still staged go first, then the cluster path.
    await queue(config, version, batch("c", 8))
    assert (await collector.run_once()).staged == {"web.clicks": 8}
    version = await change(config, lambda r: ops.update_sink(
        r, "clicks", "clicks", ops.SinkPatch(conditions=Conditions())))
    await queue(config, version, batch("d", 8))
    assert await drain_all(collector) == [1]  # staged behind c, then c and d committed
    assert_exact(config, "web.clicks", ids("a", "b", "c", "d"))
    assert fallbacks(collector, "staging") == 4
    await queue(config, version, batch("e", 8))
    assert await drain_all(collector) == [1]
    assert fallbacks(collector, "staging") == 4  # nothing staged any more: cluster path
    assert_exact(config, "web.clicks", ids("a", "b", "c", "d", "e"))
    await collector.store.close()
