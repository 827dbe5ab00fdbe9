"""A maintenance pass spreads over the gaps between runs (collector/runner.py).

Maintenance runs between runs, so whatever it takes holds the next run back. A pass used to
maintain every table in one gap; with many tables (or slow orphan listings) every table's
freshness paid for all of them. Here a real collector (local store, SQLite catalog, decode
in-process) with two tables: each gap maintains tables until about a commit interval is
spent, the pass goes on in the next gaps, and a table is maintained once per pass."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from collector.runner import Runner
from icefloe.config import Config
from pipeline.load.run import LocalEngine
from tests.collector_support import buy, click, collector_config, drain, publish_sync, start

TABLES = ("web.clicks", "shop.buys")


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
    assert sorted(first.values()) == [0, 1]
    await runner._housekeeping()  # the next gap: the other table, the pass ends
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
