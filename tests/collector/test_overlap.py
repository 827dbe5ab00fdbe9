"""Overlapped runs (#43): the next run read ahead while this one commits, acks in the
background, runs sized by time.

Real local store, real SQLite Iceberg catalog, real collectors (decode in-process, no
Spark). Each test backs one rule of :mod:`collector.overlap`: a run read ahead is used only
after the run before it committed (a failed commit drops it and acknowledges nothing; a
fence drops it), an entry is acknowledged only after its commit, a crash between a commit
and its background ack redelivers entries that the tables drop as replayed, the run read
ahead stays within ``read_ahead_bytes``, and every run claims one catalog version.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.overlap import Overlap
from collector.run_size import (
    AHEAD_PARTITION_BYTES,
    MIN_BYTES,
    PARTITION_BYTES,
    RunSizer,
    ahead_cap,
    run_cap,
)
from collector.runner import Runner
from collector.service import Collector, Fenced
from icefloe.catalog_version import VERSION_PROP
from icefloe.config import Config
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import LocalEngine
from tests.collector_support import (
    Crash,
    assert_exact,
    buy,
    click,
    collector_config,
    drain,
    ids,
    open_store_of,
    publish_sync,
    start,
)

BATCHES = 8


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, max_run_entries=2, dequeue_every=1)


def fill(config: Config, batches: int = BATCHES) -> None:
    """``batches`` batch files of 3 clicks and 2 buys each (ids c0.., b0..)."""
    publish_sync(config, [[click(3 * b + i) for i in range(3)] + [buy(2 * b + i)
                                                                 for i in range(2)]
                          for b in range(batches)])


async def acked(collector: Collector) -> int:
    return (await collector.consumer.shard(0).snapshot()).consumer.acked_through


async def run_all(overlap: Overlap) -> int:
    runs = 0
    while (await overlap.run()).entries:
        runs += 1
    await overlap.settle()
    return runs


def versions(config: Config, table: str) -> list[str]:
    """The catalog version of each snapshot that added rows to ``table``, oldest first."""
    loaded = open_catalog(config.catalog).load_table(table)
    return [str(s.summary[VERSION_PROP]) for s in loaded.metadata.snapshots
            if s.summary is not None and int(s.summary.get("added-records", 0) or 0)]


async def test_runs_overlap_and_stay_exact_with_one_catalog_version_per_run(
        config: Config) -> None:
    fill(config)
    collector = await start(config, LocalEngine())
    overlap = Overlap(collector)
    runs = await run_all(overlap)
    assert runs == BATCHES // 2
    assert overlap.used >= 1, "no run's job ran ahead"
    assert await acked(collector) == BATCHES - 1
    assert_exact(config, "web.clicks", ids("c", 3 * BATCHES))
    assert_exact(config, "shop.buys", ids("b", 2 * BATCHES))
    clicks, buys = versions(config, "web.clicks"), versions(config, "shop.buys")
    assert clicks == buys, "a run's tables share its version"
    assert len(set(clicks)) == len(clicks) == runs, "one version per run"
    await collector.store.close()


async def test_a_failed_commit_acknowledges_nothing_and_drops_the_run_read_ahead(
        config: Config) -> None:
    fill(config)
    armed = {"on": False}

    def hook(stage: str) -> None:
        if armed["on"] and stage == "after_commit:web.clicks":
            raise Crash(stage)
    collector = await start(config, LocalEngine(), hook=hook)
    overlap = Overlap(collector)
    assert (await overlap.run()).cut  # a backlog: the next run is read ahead from now on
    await overlap.acks.wait()
    assert await acked(collector) == 1
    armed["on"] = True
    with pytest.raises(Crash):
        await overlap.run()  # read ahead its successor, then failed after one commit
    assert overlap.cursor is None
    assert overlap.discarded >= 1
    await asyncio.sleep(0)
    await overlap.acks.wait()
    assert await acked(collector) == 1, "the failed run was acknowledged"
    armed["on"] = False
    await run_all(overlap)  # the failed run again: clicks replayed, buys committed
    assert_exact(config, "web.clicks", ids("c", 3 * BATCHES))
    assert_exact(config, "shop.buys", ids("b", 2 * BATCHES))
    await collector.store.close()


async def test_a_failed_background_ack_is_written_again_when_idle_and_fails_a_run_if_it_must(
        config: Config) -> None:
    """A transient failure of the last run's ack is not left behind while the queue is idle
    (no later run would carry it): the next run that finds nothing waits for the acks,
    writes it again, and fails (counted, as a synchronous ack failure is) if that fails too."""
    from icefloe.errors import TransientStoreError
    from icefloe.store.faults import FaultRule, FaultyAsyncStore

    fill(config, 1)
    faulty = FaultyAsyncStore(open_store_of(config))
    collector = Collector(config, faulty, open_catalog(config.catalog), LocalEngine())
    await collector.acquire(takeover=True)
    await asyncio.to_thread(collector.prepare_tables)
    overlap = Overlap(collector)
    outage = faulty.add(FaultRule("fail", ops=frozenset({"put"}),
                                  key_prefix=config.manifest.key, times=2))
    assert (await overlap.run()).entries == 1  # committed; its ack fails in the background
    for _ in range(500):  # the background ack meets the outage
        if outage.fired:
            break
        await asyncio.sleep(0.01)
    assert outage.fired == 1
    assert await acked(collector) == -1
    with pytest.raises(TransientStoreError, match="injected fail"):
        await overlap.run()  # idle: writes the ack again, which fails again
    assert outage.fired == 2
    assert (await overlap.run()).entries == 0  # idle: writes it again, and it lands
    assert await acked(collector) == 0
    shard = await collector.consumer.shard(0).snapshot()
    assert len(shard.entries) == 0  # dequeued in the same write (dequeue_every = 1)
    assert_exact(config, "web.clicks", ids("c", 3))
    await faulty.close()


async def test_a_quiet_shards_acknowledged_entries_are_dequeued_while_others_run(
        tmp_path: Path) -> None:
    """With acks in the background a dequeue write touches the shards its runs read; a
    shard that went quiet (its ingestor scaled away) is dequeued beside it, as the
    synchronous path's full dequeue does, not only at a clean stop."""
    from icefloe.manifest import ShardedProducer, grow_shards
    from tests.collector_support import publish

    config = collector_config(tmp_path, max_run_entries=1, dequeue_every=2)
    config = msgspec.structs.replace(
        config, manifest=msgspec.structs.replace(config.manifest, shards=2))
    store = open_store_of(config)
    try:
        await grow_shards(store, config.manifest.key, 2,
                          backoff=config.manifest.build().conflict_backoff)
        for shard, batches in ((1, [[click(100, "q")]]), (0, [[click(i)] for i in range(6)])):
            producer = ShardedProducer(store, config.manifest.build(), shard=shard)
            await publish(store, batches, producer)
            await producer.close()
    finally:
        await store.close()
    collector = await start(config, LocalEngine())
    overlap = Overlap(collector)
    runs = 0
    while (await overlap.run()).entries:
        runs += 1
        await overlap.acks.wait()
    assert runs == 7
    shards = await collector.consumer.snapshot()
    assert shards[1].consumer.acked_through == 0
    assert len(shards[1].entries) == 0, "the quiet shard kept its acknowledged entry"
    assert len(shards[0].entries) <= 1  # at most the last run's, dequeued at the next
    assert_exact(config, "web.clicks", ids("c", 6) | {"q100"})
    await collector.store.close()


async def test_a_run_read_ahead_is_dropped_when_the_collector_is_fenced(
        config: Config) -> None:
    fill(config)
    old = await start(config, LocalEngine())
    overlap = Overlap(old)
    assert (await overlap.run()).cut
    assert overlap._ahead is not None  # the next run is being read ahead
    new = await start(config, LocalEngine())  # takes over
    with pytest.raises(Fenced):
        await overlap.run()
    assert overlap.cursor is None
    assert overlap._ahead is None
    committed_by_old = {s.summary["icefloe.epoch"] for name in ("web.clicks", "shop.buys")
                        for s in open_catalog(config.catalog).load_table(name)
                        .metadata.snapshots
                        if s.summary is not None
                        and int(s.summary.get("added-records", 0) or 0)}
    assert committed_by_old == {str(old.epoch)}  # the first run only
    await drain(new)
    assert_exact(config, "web.clicks", ids("c", 3 * BATCHES))
    assert_exact(config, "shop.buys", ids("b", 2 * BATCHES))
    await old.store.close()
    await new.store.close()


async def test_a_crash_between_the_commit_and_its_background_ack_redelivers_and_dedups(
        config: Config) -> None:
    fill(config, 2)
    first = await start(config, LocalEngine())
    overlap = Overlap(first)
    result = await overlap.run()
    assert result.rows == {"web.clicks": 6, "shop.buys": 4}
    await overlap.acks.close()  # the process dies before the ack was written
    assert overlap.acks.writes == 0
    assert await acked(first) == -1
    second = await start(config, LocalEngine())
    replay = Overlap(second)
    again = await replay.run()
    assert again.entries == 2
    assert not any(again.rows.values())
    assert again.replayed + again.duplicates == 10  # every row dropped, none twice
    await replay.settle()
    assert await acked(second) == 1
    assert_exact(config, "web.clicks", ids("c", 6))
    assert_exact(config, "shop.buys", ids("b", 4))
    await first.store.close()
    await second.store.close()


@pytest.mark.parametrize("entries_ahead", [0, 1])
async def test_the_run_read_ahead_stays_within_read_ahead_bytes(
        tmp_path: Path, entries_ahead: int) -> None:
    (tmp_path / "probe").mkdir()
    probe = collector_config(tmp_path / "probe")
    fill(probe, 1)
    prober = await start(probe, LocalEngine())
    size = (await prober.consumer.read())[0].entry.size
    await prober.store.close()
    config = collector_config(tmp_path, max_run_entries=2, dequeue_every=1)
    fill(config)
    collector = await start(config, LocalEngine())
    overlap = Overlap(collector)
    partitions = max(1, collector.engine.partitions)
    assert overlap.ahead_bytes == ahead_cap(config.collector.read_ahead_bytes, partitions)
    assert overlap.ahead_bytes >= partitions * AHEAD_PARTITION_BYTES
    # a bound below what these tiny batch files take: one entry fits, or none
    overlap.ahead_bytes = size * entries_ahead + size // 2 if entries_ahead else size // 2
    assert (await overlap.run()).cut
    assert overlap._ahead is not None
    ahead = await overlap._ahead
    assert len(ahead.entries) == entries_ahead
    assert sum(e.size for e in ahead.entries) <= overlap.ahead_bytes
    assert (ahead.output is None) == (entries_ahead == 0)
    await run_all(overlap)
    assert_exact(config, "web.clicks", ids("c", 3 * BATCHES))
    await collector.store.close()


async def test_the_runner_overlaps_and_leaves_a_tidy_manifest(config: Config) -> None:
    fill(config)
    collector = await start(config, LocalEngine())
    stop = asyncio.Event()
    runner = Runner(collector, stop, once=True)
    assert runner.overlap is not None  # on by default
    assert await runner.run() == 0
    shard = await collector.consumer.shard(0).snapshot()
    assert shard.consumer.acked_through == BATCHES - 1
    assert not shard.entries
    assert_exact(config, "web.clicks", ids("c", 3 * BATCHES))
    await collector.store.close()


async def test_overlap_off_keeps_the_runs_in_line(tmp_path: Path) -> None:
    config = collector_config(tmp_path, max_run_entries=2, overlap=False)
    collector = await start(config, LocalEngine())
    assert Runner(collector, asyncio.Event()).overlap is None
    await collector.store.close()


def test_runs_are_sized_by_time_and_by_parallelism(tmp_path: Path) -> None:
    sizer = RunSizer(target_s=2.0, max_bytes=1 << 30, partitions=4)
    assert sizer.budget() == 1 << 30  # no job measured yet: the byte limit alone
    sizer.observe(MIN_BYTES // 2, 10.0)  # too small to say anything
    assert sizer.rate is None
    sizer.observe(50 * MIN_BYTES, 5.0)
    assert sizer.budget() == 20 * MIN_BYTES
    sizer.observe(50 * MIN_BYTES, 50.0)  # slower now: the budget follows, smoothed
    assert 10 * MIN_BYTES < sizer.budget() < 20 * MIN_BYTES
    assert RunSizer(0.0, 123, 4, rate=1e9).budget() == 123  # 0: by the byte limit only
    # by parallelism: the byte cap grows with the partitions, never below max_run_bytes
    assert run_cap(512 << 20, 4) == 512 << 20
    assert run_cap(512 << 20, 500) == 500 * PARTITION_BYTES
    assert ahead_cap(256 << 20, 4) == 256 << 20
    config = collector_config(tmp_path)
    collector: Any = Collector.__new__(Collector)
    collector.config = config

    class E:
        def __init__(self, size: int) -> None:
            self.size = size
    entries: Any = [E(100) for _ in range(10)]
    assert len(collector._take(entries, 250)) == 2
    assert len(collector._take(entries, 250, 4)) == 4  # one per Spark partition, at least
    assert len(collector._take(entries, 10_000, 4)) == 10
