"""Catalog versions (#37 item 2): ``AT (VERSION => n)`` is one moment of every table.

DuckLake's version is catalog-wide, so ``a AT (VERSION => 3) JOIN b AT (VERSION => 3)``
reads both tables as they were after run 3. Before, icefloe numbered each table's snapshots
on their own (a table the run did not touch fell behind), and every takeover added an
empty fencing snapshot that took a number. Here: a real collector (real local store, real
SQLite catalog, decode in-process) writes two tables in the same runs, a second collector
takes over, another engine writes a table of its own with pyiceberg, and every query is
planned by ``icefloe query``'s planner and answered by the embedded DuckDB engine.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from collector.service import Collector
from icefloe.config import Config
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import LocalEngine
from pipeline.read.query import QueryError, plan
from tests.collector_support import buy, click, collector_config, open_store_of, publish_sync
from tests.collector_support import start as start_collector

VERSION = "icefloe.version"  # the snapshot property each run records
EXT = "ext.rates"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, dedup_window_s=0, dequeue_every=1, max_run_entries=1)


def ask(config: Config, sql: str) -> list[dict[str, Any]]:
    """Plan ``sql`` as ``icefloe query`` does and run it on the embedded DuckDB engine."""
    from pipeline.read.embedded import choose, run_embedded

    pinned = plan(sql, config)
    choice = choose(config, pinned, "duckdb")
    assert choice.duck_sql is not None
    assert choice.planned is not None
    result, _ = run_embedded(config, pinned, choice.duck_sql, choice.planned)
    return result.to_pylist()


def counts_at(config: Config, version: int, other: str = "shop.buys") -> dict[str, int]:
    """Rows of web.clicks and ``other`` at ``version``, read in one query."""
    return ask(config, f"SELECT c.n AS clicks, o.n AS other FROM "
                       f"(SELECT count(*) AS n FROM web.clicks AT (VERSION => {version})) c "
                       f"CROSS JOIN (SELECT count(*) AS n FROM {other} "
                       f"AT (VERSION => {version})) o")[0]


def recorded(config: Config, table: str) -> list[str | None]:
    """The version property of each snapshot of ``table``, in commit order."""
    loaded = open_catalog(config.catalog).load_table(table)
    return [(s.summary.additional_properties if s.summary else {}).get(VERSION)
            for s in sorted(loaded.snapshots(), key=lambda s: s.sequence_number or 0)]


async def run_all(collector: Collector) -> int:
    runs = 0
    while (await collector.run_once()).entries:
        runs += 1
    return runs


async def test_one_version_reads_one_moment_of_two_tables(config: Config) -> None:
    """Runs 1-4 (one manifest entry each): clicks; clicks + buys; buys; clicks + buys."""
    publish_sync(config, [[click(0), click(1)], [click(2), buy(0)], [buy(1)],
                          [click(3), buy(2)]])
    collector = await start_collector(config, LocalEngine())
    try:
        assert await run_all(collector) == 4
    finally:
        await collector.store.close()
    # every run is one version, in every table it wrote (run 2 wrote both as version 2)
    assert recorded(config, "web.clicks") == ["1", "2", "4"]
    assert recorded(config, "shop.buys") == ["2", "3", "4"]
    # a AT (VERSION => n) JOIN b AT (VERSION => n): both as they were after run n
    assert counts_at(config, 2) == {"clicks": 3, "other": 1}
    assert counts_at(config, 3) == {"clicks": 3, "other": 2}  # per table: 4 and 2
    assert counts_at(config, 4) == {"clicks": 4, "other": 3}
    rows = ask(config, "SELECT c._event_id AS c, b._event_id AS b FROM web.clicks "
                       "AT (VERSION => 3) AS c JOIN shop.buys AT (VERSION => 3) AS b "
                       "ON c._sequence < b._sequence ORDER BY c, b")
    assert rows == [{"c": "c0", "b": "b0"}, {"c": "c0", "b": "b1"}, {"c": "c1", "b": "b0"},
                    {"c": "c1", "b": "b1"}, {"c": "c2", "b": "b1"}]
    # before its first commit a table has no state at that version: said, not guessed
    with pytest.raises(QueryError, match=r"'shop.buys' had no state at catalog version 1: "
                                         r"its first is version 2"):
        counts_at(config, 1)


async def test_a_takeovers_fencing_snapshot_takes_no_version(config: Config) -> None:
    publish_sync(config, [[click(0)], [click(1), buy(0)]])
    old = await start_collector(config, LocalEngine())
    assert await run_all(old) == 2
    new = await start_collector(config, LocalEngine())  # fences every table: empty appends
    publish_sync(config, [[click(2), buy(1)]])
    try:
        assert await run_all(new) == 1
        # the fence carried version 2 forward; the next run is version 3
        assert recorded(config, "web.clicks") == ["1", "2", "2", "3"]
        assert counts_at(config, 2) == {"clicks": 2, "other": 1}
        assert counts_at(config, 3) == {"clicks": 3, "other": 2}
        # and the replaced collector can claim no version any more
        from icefloe.catalog_version import claim_version
        from icefloe.errors import FencedError

        with pytest.raises(FencedError):
            await claim_version(new.store, epoch=old.epoch)
    finally:
        await old.store.close()
        await new.store.close()


def external_commit(config: Config, rate: float) -> None:
    """A commit of another engine (pyiceberg, no icefloe properties) to its own table."""
    catalog = open_catalog(config.catalog)
    schema = pa.schema([pa.field("rate", pa.float64())])
    try:
        table = catalog.load_table(EXT)
    except Exception:
        catalog.create_namespace("ext")
        table = catalog.create_table(EXT, schema)
    time.sleep(0.02)  # commit times (ms) strictly after the run before
    table.append(pa.Table.from_pylist([{"rate": rate}], schema))
    time.sleep(0.02)


async def test_a_table_of_another_engine_resolves_by_commit_time(config: Config) -> None:
    """Run 1; the other engine commits once; run 2; it commits twice; run 3."""
    publish_sync(config, [[click(0)], [click(1)], [click(2)]])
    collector = await start_collector(config, LocalEngine())
    try:
        assert (await collector.run_once()).entries == 1
        external_commit(config, 1.0)
        assert (await collector.run_once()).entries == 1
        external_commit(config, 2.0)
        external_commit(config, 3.0)
        assert (await collector.run_once()).entries == 1
    finally:
        await collector.store.close()
    assert recorded(config, EXT) == [None, None, None]
    # at version 2 the other table held what it had committed when run 2 committed
    assert counts_at(config, 2, EXT) == {"clicks": 2, "other": 1}  # per table: 2 rows
    assert counts_at(config, 3, EXT) == {"clicks": 3, "other": 3}
    with pytest.raises(QueryError, match=r"'ext.rates' had no commit yet at catalog "
                                         r"version 1 .*by commit time"):
        counts_at(config, 1, EXT)
    # alone, nothing places a version in time: refused, naming the forms that work
    with pytest.raises(QueryError, match=r"'ext.rates' records no catalog versions .* "
                                         r"AT \(TIMESTAMP => .* FOR VERSION AS OF"):
        plan(f"SELECT * FROM {EXT} AT (VERSION => 2)", config)


async def test_a_compaction_does_not_move_the_moment_of_the_version_it_carries(
        config: Config) -> None:
    """Run 1; the other engine commits; run 2; it commits again; then maintenance compacts
    web.clicks, carrying version 2 forward on a snapshot committed after that second
    commit. Version 2 of the other table is still read as of run 2's commit (the time
    version 2 was introduced), not as of the compaction."""
    from pipeline.iceberg.maintenance import compact

    publish_sync(config, [[click(0)], [click(1)]])
    collector = await start_collector(config, LocalEngine())
    try:
        assert (await collector.run_once()).entries == 1
        external_commit(config, 1.0)
        assert (await collector.run_once()).entries == 1
        external_commit(config, 2.0)  # after run 2: not part of version 2
        clicks = open_catalog(config.catalog).load_table("web.clicks")
        result = compact(clicks, epoch=collector.epoch or 0, min_input_files=2)
        assert result.files_removed == 2
    finally:
        await collector.store.close()
    assert recorded(config, "web.clicks")[-2:] == ["2", "2"]  # the compaction carries 2
    assert counts_at(config, 2, EXT) == {"clicks": 2, "other": 1}


async def test_time_travel_before_expired_snapshots_says_they_were_expired(
        config: Config) -> None:
    """Runs 1-3, then the snapshot of run 1 is expired (pyiceberg's expiry, which also
    clears the kept snapshot's parent pointer): every form of time travel to it says the
    snapshots were expired and what can still be read, by either reader."""
    from pipeline.iceberg.maintenance import expire_snapshots
    from pipeline.read.query import AsOf, pin
    from pipeline.read.tables import load_table_to_query
    from pipeline.read.versions import CatalogVersions

    publish_sync(config, [[click(0)], [click(1)], [click(2)]])
    collector = await start_collector(config, LocalEngine())
    try:
        assert await run_all(collector) == 3
    finally:
        await collector.store.close()
    table = open_catalog(config.catalog).load_table("web.clicks")
    first, second = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0)[:2]
    assert expire_snapshots(table, keep_last=2, max_age_s=0) == 1
    table = open_catalog(config.catalog).load_table("web.clicks")
    assert table.snapshot_by_id(second.snapshot_id).parent_snapshot_id is None  # cleared
    kept = re.escape(dt.datetime.fromtimestamp(second.timestamp_ms / 1000, dt.UTC).isoformat(
        timespec="milliseconds"))
    with pytest.raises(QueryError, match=r"'web.clicks' can no longer be read at catalog "
                       r"version 1: its snapshots before version 2 were expired \(snapshot "
                       r"expiry.*read it at version 2 or later"):
        plan("SELECT * FROM web.clicks AT (VERSION => 1)", config)
    when = dt.datetime.fromtimestamp(first.timestamp_ms / 1000, dt.UTC).isoformat()
    with pytest.raises(QueryError, match=rf"'web.clicks' can no longer be read at .*: the "
                       rf"snapshots before its oldest kept one \(committed at {kept}\) were "
                       rf"expired .*read it at that time or later"):
        plan(f"SELECT * FROM web.clicks AT (TIMESTAMP => '{when}')", config)
    old = first.snapshot_id
    with pytest.raises(QueryError, match=rf"FOR VERSION AS OF {old}: table 'web.clicks' has "
                       rf"no snapshot {old}: if it was one of its snapshots, it was expired "
                       rf"and can no longer be read: its snapshots before "
                       rf"{second.snapshot_id} \(committed at {kept}\) were expired "
                       rf".*read a snapshot it keeps") as refused:
        plan(f"SELECT * FROM web.clicks FOR VERSION AS OF {old}", config)
    assert "AT (VERSION =>" not in str(refused.value)  # no catalog version of that number
    # a catalog version given to the snapshot-id form is still named
    with pytest.raises(QueryError, match=r"has no snapshot 2; for catalog version 2 write "
                                         r"AT \(VERSION => 2\); if 2 was a snapshot of it, "
                                         r"it was expired: its snapshots before"):
        plan("SELECT * FROM web.clicks FOR VERSION AS OF 2", config)
    # both readers (pyiceberg's table, the query's own LocalTable) say the same
    for reader in (table, load_table_to_query(config.catalog, "web.clicks")):
        for as_of in (AsOf(version=1), AsOf(timestamp_ms=first.timestamp_ms),
                      AsOf(snapshot_id=old, spelled=f"FOR VERSION AS OF {old}")):
            with pytest.raises(QueryError, match="expired"):
                pin(reader, "web.clicks", as_of, CatalogVersions([reader]))


async def test_ambiguous_version_forms_are_refused_by_name(config: Config) -> None:
    publish_sync(config, [[click(0)], [click(1)]])
    collector = await start_collector(config, LocalEngine())
    try:
        assert await run_all(collector) == 2
    finally:
        await collector.store.close()
    table = open_catalog(config.catalog).load_table("web.clicks")
    first = min(table.snapshots(), key=lambda s: s.sequence_number or 0).snapshot_id
    # a snapshot id given as a catalog version: the per-table form is named
    with pytest.raises(QueryError, match=rf"AT \(VERSION => {first}\) reads catalog "
                                         rf"version {first}, and {first} is a snapshot id .* "
                                         rf"write web.clicks FOR VERSION AS OF {first}"):
        plan(f"SELECT * FROM web.clicks AT (VERSION => {first})", config)
    # a catalog version given to Spark's snapshot-id form: the catalog form is named
    with pytest.raises(QueryError, match=r"FOR VERSION AS OF 2: Spark's FOR VERSION AS OF "
                                         r"takes a snapshot id .* write AT \(VERSION => 2\)"):
        plan("SELECT * FROM web.clicks FOR VERSION AS OF 2", config)
    with pytest.raises(QueryError, match=r"no catalog version 9 yet; the newest is 2"):
        plan("SELECT * FROM web.clicks AT (VERSION => 9)", config)
    # each form reads what it names
    assert list(plan(f"SELECT * FROM web.clicks FOR VERSION AS OF {first}",
                     config).snapshots.values()) == [first]
    assert ask(config, "SELECT count(*) AS n FROM web.clicks AT (VERSION => 1)") == [{"n": 1}]


async def test_the_store_counter_outlives_a_restart(config: Config) -> None:
    """A new collector on the same store continues the numbering (no reuse)."""
    publish_sync(config, [[click(0)]])
    first = await start_collector(config, LocalEngine())
    try:
        assert await run_all(first) == 1
    finally:
        await first.store.close()
    publish_sync(config, [[click(1)]])
    second = await start_collector(config, LocalEngine())
    try:
        assert await run_all(second) == 1
    finally:
        await second.store.close()
    assert [v for v in recorded(config, "web.clicks") if v] == ["1", "1", "2"]
    store = open_store_of(config)
    try:
        assert b'"version":2' in (await store.get("catalog/version.json")).data
    finally:
        await store.close()


async def test_a_run_over_several_shards_is_one_version(tmp_path: Path) -> None:
    """Entries of manifest shards 0 and 2 in one run: every table it writes records the
    same version (not one per shard or per commit)."""
    import msgspec

    from icefloe.manifest import ShardedProducer, grow_shards
    from tests.collector_support import publish

    base = collector_config(tmp_path, dedup_window_s=0, dequeue_every=1)
    config = msgspec.structs.replace(base, manifest=msgspec.structs.replace(
        base.manifest, shards=3))
    store = open_store_of(config)
    try:
        await grow_shards(store, config.manifest.key, 3,
                          backoff=config.manifest.build().conflict_backoff)
        for shard, events in ((0, [click(0), click(1)]), (2, [buy(0), click(2)])):
            producer = ShardedProducer(store, config.manifest.build(), shard=shard)
            try:
                await publish(store, [events], producer)  # type: ignore[arg-type]
            finally:
                await producer.close()
    finally:
        await store.close()
    collector = await start_collector(config, LocalEngine())
    try:
        assert await run_all(collector) == 1
    finally:
        await collector.store.close()
    assert recorded(config, "web.clicks") == ["1"]
    assert recorded(config, "shop.buys") == ["1"]
    assert counts_at(config, 1) == {"clicks": 3, "other": 1}
