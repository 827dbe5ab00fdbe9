"""Sinks with import conditions: rows are staged as Parquet in the store so the manifest
moves on, and committed when the age, size or count condition holds — exactly once across
crashes before the ack and between the commit and the staging cleanup. Real local store,
real SQLite catalog, in-process decode."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from icefloe.config import Config
from icefloe.errors import TableFencedError
from icefloe.registry import Conditions, RegistryStore, ops
from tests.collector_support import (
    CLICKS,
    Crash,
    Gate,
    assert_exact,
    change_registry,
    click,
    collector_config,
    crash_at,
    ids,
    open_store_of,
    publish,
    read_table,
    start,
)

SLOW = Conditions(max_age_s=3600, max_bytes=500_000_000, max_events=25)


def sinks(conditions: Conditions) -> tuple[ops.SinkSpec, ...]:
    return (ops.SinkSpec(name="clicks", table="web.clicks", columns=CLICKS.columns,
                         conditions=conditions),)


async def registry_with(config: Config, conditions: Conditions) -> None:
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=sinks(conditions))))


async def collector_for(config: Config, hook: Any = None, engine: Any = None) -> Any:
    import asyncio

    from collector.routing import Routes
    from pipeline.load.run import LocalEngine

    collector = await start(config, engine or LocalEngine(), hook=hook)
    registry = await RegistryStore(collector.store, config.admin.registry_key).read()
    collector.routes = Routes(registry)
    await asyncio.to_thread(collector.prepare_tables)
    return collector


def batch(prefix: str, count: int, received_ms: int | None = None
          ) -> list[tuple[str, str, int, bytes]]:
    events = [click(i, prefix) for i in range(count)]
    if received_ms is None:
        return events
    return [(s, i, received_ms, p) for s, i, _, p in events]


def rows_in(config: Config) -> int:
    return read_table(config, "web.clicks").num_rows


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, (CLICKS,))


async def test_should_stage_until_the_count_condition_and_free_the_manifest(config: Config
                                                                             ) -> None:
    await registry_with(config, SLOW)
    collector = await collector_for(config)
    store = open_store_of(config)
    for prefix in ("a", "b"):
        await publish(store, [batch(prefix, 10)], registry_version=1)
        result = await collector.run_once()
        assert result.staged == {"web.clicks": 10}
    assert rows_in(config) == 0
    # the manifest moved on: both entries are acknowledged and can be dequeued
    assert await collector.dequeue() == 2
    state = collector.staging.states["web.clicks"]
    assert (state.rows, len(state.files), state.through_sequence) == (20, 2, 1)
    await publish(store, [batch("c", 10)], registry_version=1)
    await collector.run_once()  # 30 >= 25 events: committed
    assert_exact(config, "web.clicks", ids("a", 10) | ids("b", 10) | ids("c", 10))
    assert collector.staging.states["web.clicks"].files == ()
    listing = await store.list("staging/web.clicks/")
    assert [o.key for o in listing.objects] == ["staging/web.clicks/state.json"]
    metrics = collector.metrics.registry
    assert metrics.get_sample_value("icefloe_collector_staged_commits_total",
                                    {"table": "web.clicks", "reason": "events"}) == 1
    await store.close()
    await collector.store.close()


async def test_should_commit_on_age_even_without_new_events(config: Config) -> None:
    await registry_with(config, msgspec.structs.replace(SLOW, max_age_s=60,
                                                        max_events=1000))
    collector = await collector_for(config)
    store = open_store_of(config)
    now_ms = int(time.time() * 1000)
    await publish(store, [batch("fresh", 5, now_ms)], registry_version=1)
    await collector.run_once()
    assert await asyncio.to_thread(collector.commit_due_staged) == {}  # not 60 s yet
    await publish(store, [batch("old", 5, now_ms - 61_000)], registry_version=1)
    await collector.run_once()  # the oldest staged row is now 61 s old: committed at once
    assert_exact(config, "web.clicks", ids("fresh", 5) | ids("old", 5))
    await store.close()
    await collector.store.close()


async def test_should_commit_on_size(config: Config) -> None:
    await registry_with(config, msgspec.structs.replace(SLOW, max_bytes=100,
                                                        max_events=1000))
    collector = await collector_for(config)
    store = open_store_of(config)
    await publish(store, [batch("s", 3)], registry_version=1)
    await collector.run_once()  # any Parquet file is over 100 bytes
    assert_exact(config, "web.clicks", ids("s", 3))
    metrics = collector.metrics.registry
    assert metrics.get_sample_value("icefloe_collector_staged_commits_total",
                                    {"table": "web.clicks", "reason": "bytes"}) == 1
    await store.close()
    await collector.store.close()


@pytest.mark.parametrize("stage", ["after_stage:web.clicks", "after_commits",
                                   "after_staged_commit:web.clicks"])
async def test_should_be_exactly_once_across_crashes(config: Config, stage: str) -> None:
    await registry_with(config, msgspec.structs.replace(SLOW, max_events=15))
    store = open_store_of(config)
    await publish(store, [batch("a", 10)], registry_version=1)
    first = await collector_for(config, hook=crash_at(stage) if "commit:" not in stage
                                else None)
    if "staged_commit" in stage:
        await first.run_once()  # 10 staged, not due
        first.hook = crash_at(stage)
        await publish(store, [batch("b", 10)], registry_version=1)
        with pytest.raises(Crash):
            await first.run_once()  # committed 20, crashed before the staging cleanup
        assert rows_in(config) == 20
    else:
        with pytest.raises(Crash):
            await first.run_once()
        await publish(store, [batch("b", 10)], registry_version=1)
    await first.store.close()

    second = await collector_for(config)  # takes over (a new epoch), replays the queue
    while (await second.run_once()).entries:
        pass
    await asyncio.to_thread(second.commit_due_staged)
    await publish(store, [batch("c", 10)], registry_version=1)
    await second.run_once()
    await asyncio.to_thread(second.commit_due_staged)
    # a and b committed once (20 >= 15 events); c waits in staging, once
    assert_exact(config, "web.clicks", ids("a", 10) | ids("b", 10))
    state = second.staging.states["web.clicks"]
    staged = await second.staging.read(state)
    assert sorted(staged.column("_event_id").to_pylist()) == sorted(ids("c", 10))
    await store.close()
    await second.store.close()


async def test_should_drain_when_the_conditions_go_back_to_defaults(config: Config) -> None:
    await registry_with(config, SLOW)
    collector = await collector_for(config)
    store = open_store_of(config)
    await publish(store, [batch("a", 5)], registry_version=1)
    await collector.run_once()
    assert rows_in(config) == 0
    await change_registry(config, lambda r: ops.update_sink(r, "clicks", "clicks",
                                                   ops.SinkPatch(conditions=Conditions())))
    await publish(store, [batch("b", 5)], registry_version=2)
    await collector.run_once()  # reads version 2: staged rows go first, then direct
    await asyncio.to_thread(collector.commit_due_staged)
    assert_exact(config, "web.clicks", ids("a", 5) | ids("b", 5))
    assert collector.staging.states["web.clicks"].files == ()
    await publish(store, [batch("c", 5)], registry_version=2)
    result = await collector.run_once()
    assert result.staged == {}
    assert result.rows == {"web.clicks": 5}
    await store.close()
    await collector.store.close()


async def test_should_import_the_other_staged_tables_when_one_fails(config: Config) -> None:
    """A staged table whose import fails on its own (its metadata lost) counts against
    that table only: the staged tables after it still import in the same pass (they
    waited for its park before)."""
    from testing.catalog_pointer import lost, metadata_pointer

    twin = ops.SinkSpec(name="twin", table="web.twin", columns=CLICKS.columns,
                        conditions=SLOW)
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(*sinks(SLOW), twin))))
    collector = await collector_for(config)
    store = open_store_of(config)
    await publish(store, [batch("a", 5)], registry_version=1)
    await collector.run_once()
    staged = list(collector.staging.states)
    assert sorted(staged) == ["web.clicks", "web.twin"]
    first, second = staged
    metadata_pointer(config.catalog.uri, first,
                     lost(metadata_pointer(config.catalog.uri, first) or ""))
    registry = await change_registry(config, lambda r: ops.update_sink(ops.update_sink(
        r, "clicks", "clicks", ops.SinkPatch(conditions=Conditions())), "clicks", "twin",
        ops.SinkPatch(conditions=Conditions())))
    from collector.routing import Routes

    collector.routes = Routes(registry)
    done = await asyncio.to_thread(collector.commit_due_staged)  # drains: both due
    assert done == {second: 5}
    assert_exact(config, second, ids("a", 5))
    assert collector.bulkheads.failures == {first: 1}
    await store.close()
    await collector.store.close()


async def test_should_sweep_orphaned_staged_files(config: Config) -> None:
    from collector.staging import StagingArea

    store = open_store_of(config)
    area = StagingArea(store)
    await store.put("staging/web.clicks/000000000001-000000000001-X.parquet", b"orphan")
    assert await area.sweep("web.clicks", older_than_s=3600) == 0  # too young
    assert await area.sweep("web.clicks", older_than_s=0) == 1
    assert (await store.list("staging/web.clicks/")).objects == []
    await store.close()


def test_should_commit_an_aged_sink_from_the_running_collector_while_idle(
        tmp_path: Path) -> None:
    """run_collector as in production: nothing new arrives, the age condition still fires."""
    import asyncio

    from collector.metrics import CollectorMetrics
    from collector.runner import run_collector
    from icefloe.store import open_async_store
    from pipeline.load.run import LocalEngine

    config = collector_config(tmp_path, (CLICKS,), poll_interval_s=0.05)
    config = msgspec.structs.replace(config, admin=msgspec.structs.replace(
        config.admin, registry_poll_s=0.1))
    asyncio.run(registry_with(config, msgspec.structs.replace(SLOW, max_age_s=1,
                                                              max_events=1000)))

    async def main() -> float:
        stop = asyncio.Event()
        metrics = CollectorMetrics()
        task = asyncio.create_task(run_collector(config, stop=stop, engine=LocalEngine(),
                                                 serve_metrics=False, metrics=metrics))
        store = open_async_store(config.store.url)
        sent = time.monotonic()
        await publish(store, [batch("i", 7, int(time.time() * 1000))], registry_version=1)
        await store.close()
        while not metrics.registry.get_sample_value(
                "icefloe_collector_staged_commits_total",
                {"table": "web.clicks", "reason": "age"}):
            assert not task.done(), task.exception()
            assert time.monotonic() - sent < 30, "the age condition never fired"
            await asyncio.sleep(0.02)
        took = time.monotonic() - sent
        stop.set()
        assert await task == 0
        return took

    took = asyncio.run(main())
    assert took >= 1.0  # not before the oldest row was a second old
    assert_exact(config, "web.clicks", ids("i", 7))


async def test_should_record_a_staged_file_once_when_the_state_write_lost_its_answer(
        config: Config) -> None:
    """The state PUT lands but its response is lost: the retry sees its own file listed
    and does not add it again (else the rows would be committed twice)."""
    from icefloe.store.adapters import ThreadedAsyncStore
    from icefloe.store.faults import FaultRule, FaultyAsyncStore
    from icefloe.store.local import LocalStore
    from icefloe.store.retry import RetryingAsyncStore

    await registry_with(config, SLOW)
    collector = await collector_for(config)
    lost = FaultRule("lose_response", ops=frozenset({"put"}),
                     key_prefix="staging/web.clicks/state.json", times=1)
    root = Path(config.store.url.removeprefix("file://"))
    collector.staging.store = RetryingAsyncStore(FaultyAsyncStore(
        ThreadedAsyncStore(LocalStore(root)), [lost]))
    store = open_store_of(config)
    await publish(store, [batch("a", 10)], registry_version=1)
    result = await collector.run_once()
    assert lost.fired == 1
    assert result.staged == {"web.clicks": 10}
    state = await collector.staging.load("web.clicks")
    assert len(state.files) == 1
    assert state.rows == 10
    await store.close()
    await collector.store.close()


async def test_should_fence_a_replaced_collector_from_the_takeover_on(config: Config
                                                                      ) -> None:
    from collector.staging import StagingArea

    await registry_with(config, SLOW)
    store = open_store_of(config)
    await publish(store, [batch("a", 5)], registry_version=1)
    old = await collector_for(config)
    await old.run_once()  # staged at the old epoch
    staged = await old.staging.read(old.staging.states["web.clicks"])
    newer = await collector_for(config)  # takes over: claims the staging state
    assert newer.staging.states["web.clicks"].epoch == newer.epoch
    later = pa.array([9] * staged.num_rows, pa.int64())
    rows = staged.set_column(staged.schema.get_field_index("_sequence"), "_sequence", later)
    with pytest.raises(TableFencedError):
        await StagingArea(store).stage("web.clicks", rows, committed={}, epoch=old.epoch,
                                       through={0: 9})
    await store.close()
    await old.store.close()
    await newer.store.close()



async def test_should_refuse_a_replaced_collector_staging_a_table_for_the_first_time(
        tmp_path: Path) -> None:
    """The old collector read its run before the takeover and stages the table for the
    first time after it; the new one claimed (created) the state, so the old write is
    refused. Before: accepted, and the new collector's longer run staged the same rows
    again (27 rows for 18 events; with no dedup window they were committed)."""
    from collector.service import Fenced

    config = collector_config(tmp_path, (CLICKS,), dedup_window_s=0)
    await registry_with(config, SLOW)
    store = open_store_of(config)
    await publish(store, [batch("a", 9)], registry_version=1)
    gate = Gate()
    old = await collector_for(config, engine=gate)
    running = asyncio.create_task(old.run_once())
    assert await asyncio.to_thread(gate.entered.wait, 10)
    await publish(store, [batch("b", 9)], registry_version=1)
    newer = await collector_for(config)  # takes over while the old job runs
    gate.go.set()
    with pytest.raises(Fenced):
        await running
    assert (await newer.run_once()).staged == {"web.clicks": 18}
    await publish(store, [batch("c", 9)], registry_version=1)
    await newer.run_once()  # 27 events >= 25: committed
    assert_exact(config, "web.clicks", ids("a", 9) | ids("b", 9) | ids("c", 9))
    assert newer.staging.states["web.clicks"].epoch == newer.epoch
    await store.close()
    await old.store.close()
    await newer.store.close()


async def test_should_stop_a_replaced_collector_that_creates_a_staging_state(
        config: Config) -> None:
    """A state the new collector never saw (its sink got conditions later): the old one
    creates it, confirms the manifest epoch before relying on it, and stops."""
    from icefloe.errors import FencedError

    old = await collector_for(config)
    newer = await collector_for(config)
    rows = pa.table({"_sequence": pa.array([0], pa.int64()),
                     "_received_at": pa.array([0], pa.timestamp("us", tz="UTC"))})
    with pytest.raises(FencedError):
        await old.staging.stage("web.later", rows, committed={}, epoch=old.epoch,
                                through={0: 0})
    # the new collector takes the state over and its own writes go on
    await newer.staging.claim("web.later", newer.epoch)
    assert (await newer.staging.load("web.later")).epoch == newer.epoch
    await old.store.close()
    await newer.store.close()


async def test_should_stamp_staging_states_of_tables_the_new_collector_does_not_route(
        config: Config) -> None:
    """A state the old collector created before the takeover, for a table the new one does
    not route yet: stamped on takeover, so the old one's next write there is refused."""
    old = await collector_for(config)
    rows = pa.table({"_sequence": pa.array([0], pa.int64()),
                     "_received_at": pa.array([0], pa.timestamp("us", tz="UTC"))})
    await old.staging.stage("web.elsewhere", rows, committed={}, epoch=old.epoch,
                            through={0: 0})
    newer = await collector_for(config)
    assert "web.elsewhere" not in newer.staging.states  # not routed: never committed here
    later = rows.set_column(0, "_sequence", pa.array([1], pa.int64()))
    with pytest.raises(TableFencedError):
        await old.staging.stage("web.elsewhere", later, committed={}, epoch=old.epoch,
                                through={0: 1})
    state = await newer.staging.load("web.elsewhere")
    assert (state.epoch, state.through_sequence, len(state.files)) == (newer.epoch, 0, 1)
    await old.store.close()
    await newer.store.close()


async def test_should_merge_many_staged_files_and_commit_in_chunks(
        config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long age condition: staged files are merged once there are too many, and the
    commit goes in several appends of bounded size — every row once, in order."""
    import collector.staged_path as staged_path
    import collector.staging as staging

    monkeypatch.setattr(staging, "MAX_FILES", 4)
    monkeypatch.setattr(staging, "MERGE_FILES", 3)
    monkeypatch.setattr(staged_path, "MAX_STAGED_FILES", 4)
    monkeypatch.setattr(staged_path, "COMMIT_CHUNK_BYTES", 1)  # one file per append
    await registry_with(config, msgspec.structs.replace(SLOW, max_events=60))
    collector = await collector_for(config)
    store = open_store_of(config)
    for i in range(5):
        await publish(store, [batch(f"r{i}-", 10)], registry_version=1)
        await collector.run_once()
    state = collector.staging.states["web.clicks"]
    assert len(state.files) == 3  # 5 files: the oldest 3 merged into one
    assert (state.files[0].first_sequence, state.files[0].last_sequence) == (0, 2)
    assert state.rows == 50
    listing = await store.list("staging/web.clicks/")
    assert len([o for o in listing.objects if o.key.endswith(".parquet")]) == 3
    await publish(store, [batch("r5-", 10)], registry_version=1)
    await collector.run_once()  # 60 events: committed, one append per staged file
    expected = set().union(*(ids(f"r{i}-", 10) for i in range(6)))
    assert_exact(config, "web.clicks", expected)
    from pipeline.iceberg.catalog import open_catalog

    table = open_catalog(config.catalog).load_table("web.clicks")
    appends = [s for s in table.snapshots() if s.summary and
               s.summary.get("icefloe.sequence") is not None]
    assert [int(s.summary["icefloe.sequence"]) for s in appends] == [2, 3, 4, 5]
    await store.close()
    await collector.store.close()


def sharded(config: Config) -> Config:
    return msgspec.structs.replace(
        config, manifest=msgspec.structs.replace(config.manifest, shards=2))


async def publish_on(config: Config, shard: int, prefix: str, count: int) -> int:
    """One batch of ``count`` clicks appended to ``shard``; its sequence there."""
    from icefloe.manifest import ShardedProducer, grow_shards, read_shard_count

    store = open_store_of(config)
    try:
        if shard + 1 > await read_shard_count(store, config.manifest.key):
            await grow_shards(store, config.manifest.key, shard + 1,
                              backoff=config.manifest.build().conflict_backoff)
        producer = ShardedProducer(store, config.manifest.build(), shard=shard)
        try:
            sequences = await publish(store, [batch(prefix, count)], producer,  # type: ignore[arg-type]
                                      registry_version=1)
        finally:
            await producer.close()
    finally:
        await store.close()
    return sequences[0]


def shards_of(config: Config) -> dict[str, tuple[int, int]]:
    rows = read_table(config, "web.clicks")
    return {r["_event_id"]: (r["_shard"], r["_sequence"]) for r in rows.to_pylist()}


def committed_sequences(config: Config) -> str:
    from pipeline.iceberg.catalog import open_catalog

    table = open_catalog(config.catalog).load_table("web.clicks")
    return table.current_snapshot().summary.additional_properties["icefloe.sequences"]


async def test_should_stage_per_shard_and_import_on_the_condition(config: Config) -> None:
    """Two shards whose sequences overlap (both start at 0): what is staged is recorded per
    shard, every entry is acknowledged once staged, and the import on the count condition
    commits each row once with its shard and sequence and records both shards."""
    config = sharded(config)
    await registry_with(config, SLOW)
    await publish_on(config, 0, "a", 10)
    await publish_on(config, 0, "b", 5)
    await publish_on(config, 1, "c", 5)
    collector = await collector_for(config)
    assert (await collector.run_once()).staged == {"web.clicks": 20}
    state = collector.staging.states["web.clicks"]
    assert (state.staged_through, state.through_sequence) == ({0: 1, 1: 0}, 1)
    assert state.files[0].through == {0: 1, 1: 0}
    assert {n: m.consumer.acked_through
            for n, m in (await collector.consumer.snapshot()).items()} == {0: 1, 1: 0}
    assert rows_in(config) == 0
    await publish_on(config, 1, "d", 5)  # shard 1's sequence 1, below shard 0's
    await collector.run_once()  # 25 events: imported
    assert_exact(config, "web.clicks", ids("a", 10) | ids("b", 5) | ids("c", 5) | ids("d", 5))
    placed = shards_of(config)
    assert (placed["a0"], placed["b0"], placed["c0"], placed["d0"]) == \
        ((0, 0), (0, 1), (1, 0), (1, 1))
    assert committed_sequences(config) == "0:1,1:1"
    assert collector.staging.states["web.clicks"].files == ()
    await collector.store.close()


async def test_should_stage_per_shard_on_the_executors(tmp_path: Path, spark: Any) -> None:
    """The cluster output path on two shards: the executors' staged files carry each
    shard's last sequence, the state is staged through the run's last sequence per shard,
    and the import commits each row once with its shard and sequence (#25 with #28)."""
    from icefloe.staging import merge_through
    from pipeline.load.run import SparkClusterEngine

    config = sharded(collector_config(tmp_path, (CLICKS,), output="cluster"))
    await registry_with(config, SLOW)
    await publish_on(config, 0, "a", 10)
    await publish_on(config, 0, "b", 5)
    await publish_on(config, 1, "c", 5)
    collector = await collector_for(config, engine=SparkClusterEngine(spark, 2))
    assert (await collector.run_once()).staged == {"web.clicks": 20}
    state = collector.staging.states["web.clicks"]
    assert state.staged_through == {0: 1, 1: 0}
    assert merge_through(f.through for f in state.files) == {0: 1, 1: 0}
    assert rows_in(config) == 0
    await publish_on(config, 1, "d", 5)
    await collector.run_once()  # 25 events: imported
    assert_exact(config, "web.clicks", ids("a", 10) | ids("b", 5) | ids("c", 5) | ids("d", 5))
    placed = shards_of(config)
    assert (placed["a0"], placed["b0"], placed["c0"], placed["d0"]) == \
        ((0, 0), (0, 1), (1, 0), (1, 1))
    assert committed_sequences(config) == "0:1,1:1"
    embedded = sum(sample.value for metric in collector.metrics.embedded_runs.collect()
                   for sample in metric.samples if sample.name.endswith("_total"))
    assert embedded == 0
    await collector.store.close()


@pytest.mark.parametrize("stage", ["after_stage:web.clicks", "after_commits",
                                   "after_staged_commit:web.clicks"])
async def test_should_replay_exactly_per_shard_across_crashes(config: Config,
                                                              stage: str) -> None:
    """A crash between staging and the ack (or between the import and the staging
    cleanup) on two shards: the next collector takes over, replays every shard from its
    ack and stages or commits nothing twice."""
    config = sharded(config)
    await registry_with(config, msgspec.structs.replace(SLOW, max_events=15))
    await publish_on(config, 0, "a", 5)
    await publish_on(config, 1, "b", 5)
    first = await collector_for(config, hook=None if "staged_commit" in stage
                                else crash_at(stage))
    if "staged_commit" in stage:
        await first.run_once()  # 10 staged, not due
        first.hook = crash_at(stage)
        await publish_on(config, 1, "c", 5)
        await publish_on(config, 0, "d", 5)
        with pytest.raises(Crash):
            await first.run_once()  # imported 20, crashed before the staging cleanup
        assert rows_in(config) == 20
    else:
        with pytest.raises(Crash):
            await first.run_once()  # staged a and b, not acknowledged
        await publish_on(config, 1, "c", 5)
        await publish_on(config, 0, "d", 5)
    await first.store.close()

    second = await collector_for(config)  # takes over (a new epoch), replays the queue
    while (await second.run_once()).entries:
        pass
    await asyncio.to_thread(second.commit_due_staged)
    await publish_on(config, 1, "e", 5)
    await second.run_once()
    await asyncio.to_thread(second.commit_due_staged)
    assert_exact(config, "web.clicks", ids("a", 5) | ids("b", 5) | ids("c", 5) | ids("d", 5))
    assert committed_sequences(config) == "0:1,1:1"
    state = second.staging.states["web.clicks"]
    assert state.staged_through == {0: 1, 1: 2}
    staged = await second.staging.read(state)
    assert sorted(staged.column("_event_id").to_pylist()) == sorted(ids("e", 5))
    await second.store.close()


async def test_should_fence_a_replaced_collector_staging_rows_of_any_shard(config: Config
                                                                           ) -> None:
    """Takeover on two shards: the new collector stamps the staging state, so the old
    one's next staging write (rows of shard 1) is refused and nothing it saw is lost."""
    from collector.service import Fenced

    config = sharded(config)
    await registry_with(config, SLOW)
    await publish_on(config, 1, "a", 5)
    old = await collector_for(config)
    await old.run_once()  # shard 1 staged at the old epoch
    staged = await old.staging.read(old.staging.states["web.clicks"])
    newer = await collector_for(config)  # takes over: claims the staging state
    assert newer.staging.states["web.clicks"].epoch == newer.epoch
    later = pa.array([(1 << 40) | 9] * staged.num_rows, pa.int64())
    rows = staged.set_column(staged.schema.get_field_index("_sequence"), "_sequence", later)
    with pytest.raises(TableFencedError):
        await old.staging.stage("web.clicks", rows, committed={}, epoch=old.epoch,
                                through={1: 9})
    await publish_on(config, 0, "b", 5)
    with pytest.raises(Fenced):
        await old.run_once()
    await publish_on(config, 1, "c", 15)
    await newer.run_once()  # 25 events: imported by the new collector alone
    assert_exact(config, "web.clicks", ids("a", 5) | ids("b", 5) | ids("c", 15))
    assert committed_sequences(config) == "0:0,1:1"
    await old.store.close()
    await newer.store.close()


async def test_should_import_rows_staged_before_the_shards_grew(config: Config) -> None:
    """Rows staged on one manifest (a format-1 state, read as shard 0) and rows of shard
    1 after growing to two shards are imported together, each once."""
    await registry_with(config, SLOW)
    await publish_on(config, 0, "a", 10)
    collector = await collector_for(config)
    await collector.run_once()
    data = (await collector.store.get("staging/web.clicks/state.json")).data
    assert data.startswith(b'{"format":1,')
    assert b"through_sequences" not in data
    await publish_on(config, 1, "b", 10)  # grows the store to two shards
    await collector.run_once()
    state = collector.staging.states["web.clicks"]
    assert (state.format, state.staged_through) == (2, {0: 0, 1: 0})
    await publish_on(config, 1, "c", 5)
    await collector.run_once()  # 25 events: imported
    assert_exact(config, "web.clicks", ids("a", 10) | ids("b", 10) | ids("c", 5))
    assert committed_sequences(config) == "0:0,1:1"
    await collector.store.close()
