"""A maintenance pass spreads over the gaps between runs (collector/runner.py).

Maintenance runs between runs, so whatever it takes holds the next run back. A pass used to
maintain every table in one gap; with many tables (or slow orphan listings) every table's
freshness paid for all of them. Here a real collector (local store, SQLite catalog, decode
in-process) with two tables and its dead letters: each gap maintains tables until about a
commit interval is spent, the pass goes on in the next gaps, and a table is maintained once
per pass. The dead-letter table is maintained like the others (it used to be left out, its
snapshots and small files growing with every run that had dead letters)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.runner import Runner
from icefloe.config import Config
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import committed_state
from pipeline.load.run import LocalEngine
from tests.collector_support import (
    BASE_MS,
    buy,
    click,
    collector_config,
    drain,
    publish_sync,
    read_table,
    start,
)


def data_files(table: Any) -> list[str]:
    return [task.file.file_path for task in table.scan().plan_files()]

TABLES = ("web.clicks", "shop.buys", "icefloe.dead_letters")
"""Every table a pass maintains: the sink tables, and the dead letters last."""


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, dedup_window_s=0, dequeue_every=1,
                            maintenance_interval_s=3600, commit_interval_s=0.001)


def maintained(collector: Any) -> dict[str, int]:
    """Maintenance runs per table so far, by result ``ok``."""
    return {name: int(collector.metrics.maintenance.labels(name, "ok")._value.get())
            for name in TABLES}


async def ready(config: Config) -> tuple[Any, Runner]:
    """A collector whose two tables hold a run's rows, and a runner due for maintenance."""
    collector = await start(config, LocalEngine())
    publish_sync(config, [[click(1), buy(1)]])
    await drain(collector)
    runner = Runner(collector, asyncio.Event())
    runner._next_maintenance = collector.clock.monotonic()  # due now
    return collector, runner


async def test_a_pass_maintains_one_table_per_gap_when_each_fills_the_budget(
        config: Config) -> None:
    collector, runner = await ready(config)
    await runner._housekeeping()  # a 1 ms budget: one table fills it, the pass goes on
    first = maintained(collector)
    assert sorted(first.values()) == [0, 0, 1]
    await runner._housekeeping()  # the next gap: the next table
    assert sorted(maintained(collector).values()) == [0, 1, 1]
    await runner._housekeeping()  # then the dead letters, and the pass ends
    assert maintained(collector) == {name: 1 for name in TABLES}
    await runner._housekeeping()  # the next pass is an interval away
    assert maintained(collector) == {name: 1 for name in TABLES}
    await collector.store.close()


async def test_a_pass_goes_on_within_the_budget(tmp_path: Path) -> None:
    config = collector_config(tmp_path, dedup_window_s=0, dequeue_every=1,
                              maintenance_interval_s=3600, commit_interval_s=3600.0)
    collector, runner = await ready(config)
    await runner._housekeeping()  # a budget no table fills: the whole pass in one gap
    assert maintained(collector) == {name: 1 for name in TABLES}
    await collector.store.close()


async def test_a_table_gone_since_the_pass_began_is_skipped(
        config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    collector, runner = await ready(config)
    await runner._housekeeping()  # one table of the pass
    done = next(name for name, n in maintained(collector).items() if n == 1)
    monkeypatch.setattr(type(collector.routes), "live_tables",
                        lambda routes: [done])  # the other left the routes meanwhile
    await runner._housekeeping()
    await runner._housekeeping()
    assert maintained(collector) == {name: int(name == done) for name in TABLES}
    await collector.store.close()


def undecodable(i: int) -> tuple[str, str, int, bytes]:
    """A click whose ``n`` is no number: a dead letter."""
    return ("clicks", f"x{i}", BASE_MS + i, msgspec.json.encode({"user_id": "u", "n": "x"}))


DEAD = "icefloe.dead_letters"


async def test_the_dead_letter_table_is_compacted_and_expired_and_keeps_its_offset(
        tmp_path: Path) -> None:
    """A steady stream of undecodable events gives the dead-letter table a snapshot (and a
    small file) per run; a maintenance pass compacts and expires it like a sink's table,
    its ``icefloe.sequence`` stays, and a collector taking over replays nothing into it."""
    config = collector_config(tmp_path, dedup_window_s=0, dequeue_every=1, max_run_entries=1,
                              maintenance_interval_s=3600, commit_interval_s=3600.0,
                              compact_min_files=2, snapshot_keep_last=1,
                              snapshot_max_age_s=0)
    publish_sync(config, [[click(i), undecodable(i)] for i in range(4)])
    collector = await start(config, LocalEngine())
    try:
        assert await drain(collector) == 4
        before = open_catalog(config.catalog).load_table(DEAD)
        state = committed_state(before)
        assert len(data_files(before)) == 4
        assert len(before.snapshots()) >= 4
        runner = Runner(collector, asyncio.Event())
        runner._next_maintenance = collector.clock.monotonic()  # due now
        await runner._housekeeping()
        assert maintained(collector)[DEAD] == 1
        after = open_catalog(config.catalog).load_table(DEAD)
        assert len(data_files(after)) == 1  # compacted
        assert len(after.snapshots()) == 1  # expired: only the current one is kept
        assert committed_state(after).sequences == state.sequences  # the offset carried
        assert committed_state(after).sequence == state.sequence
        assert sorted(r["event_id"] for r in after.scan().to_arrow().to_pylist()) == \
            [f"x{i}" for i in range(4)]
    finally:
        await collector.store.close()
    publish_sync(config, [[undecodable(4)]])
    successor = await start(config, LocalEngine())  # takes over: fences, reads the offset
    try:
        assert await drain(successor) == 1
    finally:
        await successor.store.close()
    rows = read_table(config, DEAD).to_pylist()
    assert sorted(r["event_id"] for r in rows) == [f"x{i}" for i in range(5)]  # once each


async def test_a_failed_maintenance_of_the_dead_letters_holds_no_other_table(
        config: Config, monkeypatch: pytest.MonkeyPatch) -> None:
    import collector.runner as runner_module

    real = runner_module.run_maintenance

    def failing(table: Any, **kwargs: Any) -> Any:
        if ".".join(table.name()) == DEAD:
            raise OSError("dead-letter metadata unreadable")
        return real(table, **kwargs)

    monkeypatch.setattr(runner_module, "run_maintenance", failing)
    collector, runner = await ready(config)
    try:
        runner.maintain()  # a whole pass
        assert maintained(collector) == {name: int(name != DEAD) for name in TABLES}
        assert collector.metrics.maintenance.labels(DEAD, "error")._value.get() == 1
        publish_sync(config, [[click(2), undecodable(2)]])
        assert await drain(collector) == 1  # the collector goes on, dead letters too
        assert [r["event_id"] for r in read_table(config, DEAD).to_pylist()] == ["x2"]
    finally:
        await collector.store.close()
