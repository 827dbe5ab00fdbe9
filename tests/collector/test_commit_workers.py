"""``collector.commit_workers``: a run's tables overlap their store round trips.

Each table's dedup-journal record is a PUT before its commit; written one table after
another (and after the run's catalog-version claim: a read and a conditional write), a slow
store paid each in series on every run. Here the journal records of a run's two tables are
held at the object-store boundary until both are in flight (a barrier, not a timer): the
run finishes only if they overlap; then every table records the run's one catalog version.
The run's first record is held until the claim's read is in flight (they share a round
trip), and a crash in one table's thread leaves each table exact after a restart. Real
local store, real SQLite catalog, decode in-process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from icefloe.catalog_version import VERSION_KEY
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import LocalEngine
from pipeline.read.versions import run_version
from tests.collector_support import (
    Crash,
    assert_exact,
    buy,
    click,
    collector_config,
    crash_at,
    drain,
    open_store_of,
    publish,
    start,
)

TABLES = ("web.clicks", "shop.buys")


def hold_journals_until_both(collector: Any, seen: list[str]) -> None:
    """Make the collector's journal writes wait until two are in flight (10 s at most:
    then the write fails, and so does the run, naming why)."""
    journal = collector.journal
    original = journal.record
    both = asyncio.Event()

    async def record(table: str, *args: Any) -> str:
        seen.append(table)
        if len(seen) >= 2:
            both.set()
        try:
            await asyncio.wait_for(both.wait(), 10)
        except TimeoutError:
            raise AssertionError(f"the journal record of {table} was written alone: the "
                                 "run's tables did not overlap their store round trips") \
                from None
        return await original(table, *args)

    journal.record = record


async def test_should_overlap_the_tables_journal_puts_and_claim_one_version(
        tmp_path: Path) -> None:
    config = collector_config(tmp_path, commit_workers=2)
    store = open_store_of(config)
    await publish(store, [[click(i) for i in range(5)] + [buy(i) for i in range(4)]])
    await store.close()
    collector = await start(config, LocalEngine())
    seen: list[str] = []
    hold_journals_until_both(collector, seen)
    assert await drain(collector) == 1
    assert sorted(seen) == sorted(TABLES)
    catalog = open_catalog(config.catalog)
    versions = {run_version(catalog.load_table(t).current_snapshot()) for t in TABLES}
    assert len(versions) == 1, versions
    assert None not in versions
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(5)})
    assert_exact(config, "shop.buys", {f"b{i}" for i in range(4)})
    await collector.store.close()


async def test_should_default_to_overlapping_tables(tmp_path: Path) -> None:
    """The default config overlaps them too (one worker per table up to four)."""
    config = collector_config(tmp_path)
    assert config.collector.commit_workers == 4
    store = open_store_of(config)
    await publish(store, [[click(0), buy(0)]])
    await store.close()
    collector = await start(config, LocalEngine())
    seen: list[str] = []
    hold_journals_until_both(collector, seen)
    assert await drain(collector) == 1
    await collector.store.close()


@pytest.mark.parametrize("stage", ["after_commit:web.clicks", "after_journal:shop.buys"])
async def test_should_commit_each_table_once_across_a_crash_in_one_thread(
        tmp_path: Path, stage: str) -> None:
    """A crash in one table's thread (after its commit, or after its journal record): the
    other table's thread finishes or not, and a restart leaves each table exact."""
    config = collector_config(tmp_path, commit_workers=2)
    store = open_store_of(config)
    await publish(store, [[click(i) for i in range(6)] + [buy(i) for i in range(3)]])
    await store.close()
    crashing = await start(config, LocalEngine(), hook=crash_at(stage))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    restarted = await start(config, LocalEngine())
    await drain(restarted)
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(6)})
    assert_exact(config, "shop.buys", {f"b{i}" for i in range(3)})
    await restarted.store.close()


async def test_should_claim_the_runs_version_beside_its_first_journal_record(
        tmp_path: Path) -> None:
    """One table: its journal record is held until the run's version claim reads the
    version document (a barrier at the object-store boundary); committed in series, the
    claim would only start after the record and the run would fail."""
    config = collector_config(tmp_path, commit_workers=1)
    store = open_store_of(config)
    await publish(store, [[click(i) for i in range(3)]])
    await store.close()
    collector = await start(config, LocalEngine())
    claiming = asyncio.Event()
    get, record = collector.store.get, collector.journal.record

    async def watched_get(key: str, *args: Any, **kwargs: Any) -> Any:
        if key == VERSION_KEY:
            claiming.set()
        return await get(key, *args, **kwargs)

    async def held_record(table: str, *args: Any) -> str:
        try:
            await asyncio.wait_for(claiming.wait(), 10)
        except TimeoutError:
            raise AssertionError("the version claim did not start beside the journal "
                                 "record") from None
        return await record(table, *args)

    collector.store.get, collector.journal.record = watched_get, held_record
    assert await drain(collector) == 1
    snapshot = open_catalog(config.catalog).load_table("web.clicks").current_snapshot()
    assert run_version(snapshot) is not None
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(3)})
    await collector.store.close()
