"""``output = "cluster"`` never wedges on a registry the admin API accepts.

A run ends where its routing changes (a sink disabled or enabled, deleted and re-created, a
table passing to another source), so each table has one sink per run; the cluster path
writes fan-out (several sinks of one source) and staged sinks (import conditions) itself,
its executors writing every table's files and every staged file in one job (#28). Every
test: each event committed exactly once, the queue drained, no
``RoutingUnsupportedError``, and no run handed to the embedded path. Real Spark (local
mode: executors are real Python workers), real local store, real SQLite catalog.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.compute as pc
import pytest
from collector_support import (
    CLICKS,
    Crash,
    assert_exact,
    change_registry,
    click,
    collector_config,
    crash_at,
    open_store_of,
    publish,
    read_table,
    start,
)

from collector.routing import Routes, cut_by_routing, embedded_reason
from collector.service import Fenced
from icefloe.config import Column, Config
from icefloe.manifest.model import Entry
from icefloe.registry import Registry, RegistryStore, ops
from icefloe.registry.model import Conditions
from pipeline.load.cluster import ClusterRunOutput
from pipeline.load.run import SparkClusterEngine

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
    return (await change_registry(config, fn)).version


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
    manifest = (await collector.consumer.snapshot())[0]
    assert manifest.consumer.acked_through == manifest.next_sequence - 1
    return runs


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


def cluster_only(collector: Any) -> None:
    """No run of ``collector`` took the embedded path."""
    assert not collector.metrics.embedded_runs.collect()[0].samples


class Spy:
    """The engine, counting the runs its executors wrote (the cluster output type)."""

    def __init__(self, engine: SparkClusterEngine) -> None:
        self.inner = engine
        self.name, self.partitions = engine.name, engine.partitions
        self.cluster_runs = 0

    def run(self, spec: Any) -> Any:
        output = self.inner.run(spec)
        self.cluster_runs += isinstance(output, ClusterRunOutput)
        return output

    def run_embedded(self, spec: Any) -> Any:
        raise AssertionError("this run must stay on the cluster output path")


async def test_fan_out_on_the_cluster_path(config, engine) -> None:
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK,))))
    await queue(config, version, batch("a", 8))  # one sink
    version = await change(config, lambda r: ops.create_sink(r, "clicks", SLIM))
    await queue(config, version, batch("b", 8), batch("c", 8))  # two sinks
    spy = Spy(engine)
    collector = await collector_for(config, spy)
    assert await drain_all(collector) == [1, 2]
    assert spy.cluster_runs == 2
    assert_exact(config, "web.clicks", ids("a", "b", "c"))
    assert_exact(config, "web.slim", ids("b", "c"))
    assert read_table(config, "web.slim").column_names == [
        "user_id", "_event_id", "_received_at", "_sequence", "_shard"]
    slim = read_table(config, "web.slim")
    assert sorted(slim.column("user_id").to_pylist()) == sorted(
        read_table(config, "web.clicks").filter(pc.is_in(
            read_table(config, "web.clicks").column("_event_id"),
            slim.column("_event_id"))).column("user_id").to_pylist())
    cluster_only(collector)
    # Retries of b (same ids) in a later run: each table's window drops them.
    await queue(config, version, batch("b", 8), batch("d", 8))
    assert await drain_all(collector) == [2]
    assert_exact(config, "web.clicks", ids("a", "b", "c", "d"))
    assert_exact(config, "web.slim", ids("b", "c", "d"))
    assert collector.metrics.duplicates.labels("clicks")._value.get() == 16
    cluster_only(collector)
    await collector.store.close()


STAGED = msgspec.structs.replace(CLICKS_SINK, conditions=Conditions(max_age_s=3600,
                                                                   max_events=16))


def staged_keys(collector: Any, table: str = "web.clicks") -> list[str]:
    return [f.key for f in collector.staging.states[table].files]


async def test_import_conditions_stage_on_the_executors(config, engine) -> None:
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(STAGED, SLIM))))
    await queue(config, version, batch("a", 8), batch("a2", 8))
    spy = Spy(engine)
    collector = await collector_for(config, spy)
    result = await collector.run_once()
    assert spy.cluster_runs == 1
    assert result.staged == {"web.clicks": 16}  # staged by the executors, one file a task
    # ... and committed at once: 16 events. The other sink got its rows in the same job.
    assert_exact(config, "web.clicks", ids("a", "a2"))
    assert_exact(config, "web.slim", ids("a", "a2"))
    await queue(config, version, batch("b", 8))
    assert (await collector.run_once()).staged == {"web.clicks": 8}
    assert read_table(config, "web.clicks").num_rows == 16  # below 16 events: staged
    keys = staged_keys(collector)
    assert keys
    assert all(k.startswith("staging/web.clicks/") for k in keys)
    staged = await collector.staging.read(collector.staging.states["web.clicks"])
    assert staged.column_names == ["user_id", "url", "n", "ts", "_event_id",
                                   "_received_at", "_sequence", "_source"]
    await queue(config, version, batch("b", 8), batch("c", 8))  # b again: retried ids
    assert await drain_all(collector) == [2]  # 8 + 16 staged: committed, b once
    assert_exact(config, "web.clicks", ids("a", "a2", "b", "c"))
    assert_exact(config, "web.slim", ids("a", "a2", "b", "c"))
    assert not collector.staging.states["web.clicks"].files
    # Conditions back to the defaults: rows still staged go first, then direct commits.
    await queue(config, version, batch("d", 8))
    assert (await collector.run_once()).staged == {"web.clicks": 8}
    version = await change(config, lambda r: ops.update_sink(
        r, "clicks", "clicks", ops.SinkPatch(conditions=Conditions())))
    await queue(config, version, batch("e", 8))
    assert await drain_all(collector) == [1]  # staged behind d, then d and e committed
    await queue(config, version, batch("f", 8))
    assert await drain_all(collector) == [1]
    assert_exact(config, "web.clicks", ids("a", "a2", "b", "c", "d", "e", "f"))
    assert spy.cluster_runs == 6
    cluster_only(collector)
    await collector.store.close()


@pytest.mark.parametrize("stage", ["after_write", "after_stage:web.clicks",
                                   "after_commits"])
async def test_a_crash_between_stage_and_ack_then_restart(config, engine, stage) -> None:
    """The executors staged (or wrote and did not record yet), the run is not acked: the
    replay stages nothing twice, and the import commits each row once."""
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(STAGED,))))
    await queue(config, version, batch("a", 8), batch("b", 8))  # 16 events: due
    spy = Spy(engine)
    crashing = await start(config, spy, hook=crash_at(stage))
    crashing.routes = Routes(await RegistryStore(crashing.store,
                                                 config.admin.registry_key).read())
    await asyncio.to_thread(crashing.prepare_tables)
    with pytest.raises(Crash):
        await crashing.run_once()
    await crashing.store.close()
    assert spy.cluster_runs == 1
    await queue(config, version, batch("c", 16))  # due on its own
    restarted = await collector_for(config, spy)
    results = []
    while (result := await restarted.run_once()).entries:
        results.append(result)
    assert_exact(config, "web.clicks", ids("a", "b") | ids("c", count=16))
    if stage != "after_write":  # the replay found its rows staged (or committed) already
        assert results[0].replayed == 16
    assert not restarted.staging.states["web.clicks"].files
    cluster_only(restarted)
    await restarted.store.close()


async def test_a_takeover_with_rows_staged_on_the_executors(config, engine) -> None:
    """Staging claimed by epoch (#22 case 5): a takeover lands after the old collector's
    executors staged a run, before it recorded the files — the record is refused, the old
    one stops, and the new one imports what was staged plus the replay, each row once."""
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(STAGED,))))
    await queue(config, version, batch("a", 8))
    spy = Spy(engine)
    old = await collector_for(config, spy)
    assert (await old.run_once()).staged == {"web.clicks": 8}
    loop = asyncio.get_running_loop()
    taken: list[Any] = []

    def take_over(stage: str) -> None:  # runs in the old collector's commit thread
        if stage == "after_write" and not taken:
            taken.append(asyncio.run_coroutine_threadsafe(collector_for(config, spy),
                                                          loop).result())

    old.hook = take_over
    await queue(config, version, batch("b", 4))
    with pytest.raises(Fenced):
        await old.run_once()
    new = taken[0]
    assert new.epoch > old.epoch
    state = await new.staging.load("web.clicks")
    assert (state.rows, state.epoch) == (8, new.epoch)  # b's files were never recorded
    await queue(config, version, batch("c", 4))
    assert await drain_all(new) == [2]  # b (replayed) and c: 16 staged, imported
    assert_exact(config, "web.clicks", ids("a") | {f"{p}{i}" for p in "bc" for i in range(4)})
    assert spy.cluster_runs == 3
    assert await new.staging.sweep("web.clicks", 0) >= 1  # the refused run's files
    cluster_only(new)
    await old.store.close()
    await new.store.close()


async def test_a_re_created_source_with_other_columns(config, engine) -> None:
    """The old record's sink had a column the new one lacks: the source decodes both, which
    the cluster writer would put into tables that lack them; those runs go embedded."""
    old = ops.SinkSpec(name="old", table="web.old", columns=(
        Column("user_id", "string", required=True), Column("n", "long")))
    new = ops.SinkSpec(name="new", table="web.new", columns=(
        Column("user_id", "string", required=True), Column("url", "string")))
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(old,))))
    await queue(config, version, batch("o", 8))
    await change(config, lambda r: ops.delete_source(r, "clicks"))
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(new,))))
    await queue(config, version, batch("n", 8))
    collector = await collector_for(config, engine)
    assert await drain_all(collector) == [1, 1]
    assert_exact(config, "web.old", ids("o"))
    assert_exact(config, "web.new", ids("n"))
    assert sorted(read_table(config, "web.old").column("n").to_pylist()) == list(range(8))
    assert read_table(config, "web.new").column_names == [
        "user_id", "url", "_event_id", "_received_at", "_sequence", "_shard"]
    cluster_only(collector)  # each sink's projection: no columns it lacks
    await collector.store.close()


async def test_a_crash_between_the_tables_of_a_fan_out_run_then_restart(tmp_path, engine
                                                                       ) -> None:
    """Both tables' files are written by one job; the crash lands after the first table's
    commit (one after another: ``commit_workers = 1``): the replay does not commit it
    twice, the other table gets its rows, and the files the crash left behind are never in
    a table."""
    config = collector_config(tmp_path, (CLICKS,), output="cluster", dequeue_every=1,
                              commit_workers=1)
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK, SLIM))))
    await queue(config, version, batch("a", 8), batch("b", 8))
    spy = Spy(engine)
    crashing = await start(config, spy, hook=crash_at("after_commit:web.clicks"))
    crashing.routes = Routes(await RegistryStore(crashing.store,
                                                 config.admin.registry_key).read())
    await asyncio.to_thread(crashing.prepare_tables)
    with pytest.raises(Crash):
        await crashing.run_once()
    await crashing.store.close()
    assert spy.cluster_runs == 1
    assert_exact(config, "web.clicks", ids("a", "b"))
    assert read_table(config, "web.slim").num_rows == 0
    version = await change(config, lambda r: ops.delete_sink(r, "clicks", "slim"))
    await queue(config, version, batch("c", 8))
    restarted = await collector_for(config, spy)
    results = []
    while (result := await restarted.run_once()).entries:
        results.append(result)
    assert [r.entries for r in results] == [2, 1]  # the replay, then one sink again
    # web.clicks holds the run: its window (rebuilt from the table) drops the replay.
    assert results[0].rows == {"web.clicks": 0, "web.slim": 16}
    assert_exact(config, "web.clicks", ids("a", "b", "c"))
    assert_exact(config, "web.slim", ids("a", "b"))
    assert spy.cluster_runs == 3
    cluster_only(restarted)
    await restarted.store.close()


def entry(sequence: int, version: int, *streams: str) -> Entry:
    return Entry(sequence=sequence, location=f"b/{sequence}", size=1, crc32c=0,
                 record_count=1, streams=streams, ingested_at=0.0, producer_id="p",
                 producer_batch=sequence, registry_version=version)


def test_a_run_is_cut_where_its_routing_changes() -> None:
    """Pure: where runs end, and which runs the cluster path hands to the embedded one."""
    reg = ops.create_source(Registry(), ops.SourceSpec(id="clicks", sinks=(CLICKS_SINK,)))
    reg = ops.create_source(reg, ops.SourceSpec(id="buys", sinks=(ops.SinkSpec(
        name="buys", table="shop.buys", columns=CLICKS.columns),)))                # v2
    reg = ops.set_sink_enabled(reg, "clicks", "clicks", False)                    # v3
    reg = ops.set_sink_enabled(reg, "clicks", "clicks", True)                     # v4
    reg = ops.create_sink(reg, "clicks", SLIM)                                    # v5
    routes = Routes(reg)
    run = [entry(0, 2, "clicks"), entry(1, 2, "buys"), entry(2, 3, "buys"),
           entry(3, 4, "clicks", "buys"), entry(4, 3, "clicks")]
    # buys routes alike at 2 and 3; clicks is off at 3: the run ends there.
    assert cut_by_routing(routes, run) == run[:4]
    assert cut_by_routing(routes, run[4:]) == run[4:]  # the first entry is always taken
    assert embedded_reason(routes, run[:4]) is None
    assert embedded_reason(routes, run[4:]) is None  # goes nowhere
    fan_out = [entry(5, 5, "clicks"), entry(6, 5, "clicks", "buys")]
    assert cut_by_routing(routes, [*run[:2], *fan_out]) == run[:2]
    assert cut_by_routing(routes, fan_out) == fan_out
    assert embedded_reason(routes, fan_out) is None  # fan-out: the cluster path writes it


def test_an_import_chunk_never_ends_between_overlapping_staged_files() -> None:
    """The executors stage one file per task, so one run's files overlap in sequences; a
    chunk committed through its highest sequence must take all of them, or the replay
    filter would drop the rest's rows."""
    from collector.staged_path import chunk_of
    from icefloe.staging import StagedFile

    def staged(first: int, last: int) -> StagedFile:
        return StagedFile(f"k{first}-{last}", first, last, 1, 100, 0)

    files = (staged(0, 3), staged(1, 4), staged(2, 4), staged(5, 6), staged(7, 9))
    assert chunk_of(files, 150) == files[:3]  # over the limit, but 1..4 overlap 0..3
    assert chunk_of(files, 400) == files[:4]
    assert chunk_of(files[3:], 50) == files[3:4]  # disjoint: one file at least
