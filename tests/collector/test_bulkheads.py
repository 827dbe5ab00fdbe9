"""Bulkheads (design invariant 7): a failure that belongs to one table parks that table
after ``park_after_failures`` attempts; the other tables keep committing, the parked
table's rows wait in its staging area (so the queue is acknowledged and moves on), and once
the table is fixed they land exactly once. Real Spark, a real SQLite catalog, a local store;
each failure class is injected into one of three streams."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
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
    publish_sync,
    read_table,
    start,
)
from pyiceberg.types import IntegerType, StringType

from collector.http import HttpServer
from collector.service import Collector
from icefloe.config import Column, StreamConfig
from icefloe.registry import ops
from icefloe.registry.streams import config_registry
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import SparkEngine
from testing.catalog_pointer import lost, metadata_pointer

VIEWS = StreamConfig(name="views", table="web.views", columns=(
    Column("page", "string", required=True), Column("ms", "long")))


def view(i: int, prefix: str = "v") -> tuple[str, str, int, bytes]:
    return ("views", f"{prefix}{i}", BASE_MS + i,
            msgspec.json.encode({"page": f"/p{i}", "ms": i}))


def batch(prefix: str, count: int) -> list[tuple[str, str, int, bytes]]:
    """``count`` events of each of the three streams (ids ``<c|b|v><prefix><i>``)."""
    return ([click(i, f"c{prefix}") for i in range(count)]
            + [buy(i, f"b{prefix}") for i in range(count)]
            + [view(i, f"v{prefix}") for i in range(count)])


def all_ids(letter: str, *prefixes: str, count: int = 5) -> set[str]:
    return set().union(*(ids(f"{letter}{p}", count) for p in prefixes))


@pytest.fixture
def config(tmp_path: Path):
    return collector_config(tmp_path, streams=(CLICKS, BUYS, VIEWS), dequeue_every=1,
                            park_after_failures=2, park_retry_s=3600)


@pytest.fixture
def engine(spark):
    return SparkEngine(spark, 2)


def metadata_location(config: Any, table: str, location: str | None = None) -> str:
    """Read (and with ``location``, overwrite) a table's pointer in the SQLite catalog: what
    a broken or restored metadata file looks like to the collector."""
    found = metadata_pointer(config.catalog.uri, table, location)
    assert found is not None, table
    return found


async def run_until_parked(collector: Collector, table: str, attempts: int) -> None:
    """``attempts`` runs fail (the table's own failure), the last one parks the table."""
    for _attempt in range(attempts):
        assert not collector.bulkheads.is_parked(table)
        with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the table fails with
            await collector.run_once()
    assert collector.bulkheads.is_parked(table)


def parked_metric(collector: Collector, table: str) -> float | None:
    return collector.metrics.registry.get_sample_value(
        "icefloe_collector_table_parked", {"table": table})


async def test_a_table_whose_metadata_is_lost_is_parked_and_lands_once_fixed(config, engine):
    """The commit class: a table's metadata file is gone (another tool, a bad restore)."""
    publish_sync(config, [batch("1", 5)])
    collector = await start(config, engine)
    try:
        assert (await collector.run_once()).entries == 1
        good = metadata_location(config, "shop.buys")
        metadata_location(config, "shop.buys", lost(good))
        publish_sync(config, [batch("2", 5)])
        await run_until_parked(collector, "shop.buys", 2)
        # the failed attempts committed the other tables already (the retry replays them)
        assert_exact(config, "web.clicks", all_ids("c", "1", "2"))
        assert_exact(config, "web.views", all_ids("v", "1", "2"))
        assert parked_metric(collector, "shop.buys") == 1
        assert "shop.buys" in collector.metrics.health.body()["parked"]  # type: ignore[operator]
        assert collector.metrics.health.ready()[0]  # the others commit: still ready

        result = await collector.run_once()  # parked: staged; the others commit; acked
        assert result.entries == 1
        assert result.staged == {"shop.buys": 5}
        publish_sync(config, [batch("3", 5)])
        assert (await collector.run_once()).entries == 1
        assert (await collector.run_once()).entries == 0  # the queue moved on
        assert_exact(config, "web.clicks", all_ids("c", "1", "2", "3"))
        assert_exact(config, "web.views", all_ids("v", "1", "2", "3"))
        assert collector.staging.states["shop.buys"].rows == 10

        collector.bulkheads.retry_all_now()  # still broken: stays parked, nothing lost
        assert await asyncio.to_thread(collector.commit_due_staged) == {}
        assert collector.bulkheads.is_parked("shop.buys")

        metadata_location(config, "shop.buys", good)  # the operator restores it, and
        # asks for a retry now (`icefloe sinks retry-parked`: a registry version, no change)
        collector.bulkheads.parked["shop.buys"].next_retry = float("inf")
        assert await asyncio.to_thread(collector.commit_due_staged) == {}
        nudged = await change_registry(
            config, lambda r: ops.nudge(config_registry(config.streams)))  # as seeded
        await asyncio.to_thread(collector.apply_registry, nudged)
        assert await asyncio.to_thread(collector.commit_due_staged) == {"shop.buys": 10}
        assert not collector.bulkheads.is_parked("shop.buys")
        assert parked_metric(collector, "shop.buys") == 0
        assert_exact(config, "shop.buys", all_ids("b", "1", "2", "3"))

        publish_sync(config, [batch("4", 5)])  # back on the normal path
        result = await collector.run_once()
        assert result.rows["shop.buys"] == 5
        assert not result.staged
        assert_exact(config, "shop.buys", all_ids("b", "1", "2", "3", "4"))
    finally:
        await collector.store.close()


async def test_a_restart_while_parked_keeps_the_staged_rows_and_commits_them_once(
        config, engine):
    """Parked rows are in the object store, not in memory: a new collector finds them,
    keeps new rows behind them, and imports them once the table is fixed."""
    publish_sync(config, [batch("1", 5)])
    first = await start(config, engine)
    await first.run_once()
    good = metadata_location(config, "web.views")
    metadata_location(config, "web.views", lost(good))
    publish_sync(config, [batch("2", 5)])
    await run_until_parked(first, "web.views", 2)
    await first.run_once()
    await first.store.close()

    metadata_location(config, "web.views", good)
    publish_sync(config, [batch("3", 5)])
    second = await start(config, engine)  # takes over; the table is readable again
    try:
        result = await second.run_once()
        assert result.entries == 1
        assert_exact(config, "web.views", all_ids("v", "1", "2", "3"))
        assert_exact(config, "web.clicks", all_ids("c", "1", "2", "3"))
        assert second.staging.states["web.views"].rows == 0
    finally:
        await second.store.close()


async def test_a_column_retyped_by_another_engine_parks_only_its_table(config, engine):
    """The type class: another engine replaced a column's type; the stream still sends the
    declared one. Only that table waits."""
    publish_sync(config, [batch("1", 5)])
    collector = await start(config, engine)
    try:
        await collector.run_once()
        table = open_catalog(config.catalog).load_table("shop.buys")
        with table.update_schema(allow_incompatible_changes=True) as update:
            update.delete_column("amount")
        table = open_catalog(config.catalog).load_table("shop.buys")
        with table.update_schema() as update:
            update.add_column("amount", IntegerType())  # the stream sends 1.5, 3.0, ...
        publish_sync(config, [batch("2", 5)])
        await run_until_parked(collector, "shop.buys", 2)
        reason = collector.bulkheads.parked["shop.buys"].reason
        assert "truncated" in reason, reason
        assert (await collector.run_once()).staged == {"shop.buys": 5}
        assert_exact(config, "web.clicks", all_ids("c", "1", "2"))
        assert_exact(config, "web.views", all_ids("v", "1", "2"))
        assert_exact(config, "shop.buys", all_ids("b", "1"))
        failures = collector.metrics.registry.get_sample_value(
            "icefloe_collector_table_failures_total",
            {"table": "shop.buys", "kind": "CatalogError"})
        assert failures == 2
    finally:
        await collector.store.close()


async def test_a_required_column_added_elsewhere_parks_only_its_table(config, engine):
    """The schema class: another engine added a required column the stream never sends."""
    publish_sync(config, [batch("1", 5)])
    collector = await start(config, engine)
    try:
        await collector.run_once()
        table = open_catalog(config.catalog).load_table("web.clicks")
        with table.update_schema(allow_incompatible_changes=True) as update:
            update.add_column("region", StringType(), required=True)
        publish_sync(config, [batch("2", 5)])
        await run_until_parked(collector, "web.clicks", 2)
        assert (await collector.run_once()).staged == {"web.clicks": 5}
        assert_exact(config, "shop.buys", all_ids("b", "1", "2"))
        assert_exact(config, "web.views", all_ids("v", "1", "2"))
        # (pyiceberg itself cannot read that table now: its older files lack the column)
        assert collector.table_sequences["web.clicks"] == {0: 0}
        assert collector.staging.states["web.clicks"].rows == 5
    finally:
        await collector.store.close()


async def test_a_parked_table_past_its_bound_holds_its_entries_not_the_other_tables(
        tmp_path, engine):
    """``park_max_bytes`` bounds the area: beyond it the parked table's rows are not
    staged, the run fails at its end naming the bound, its entries stay queued — and the
    other tables still commit every attempt."""
    from collector.bulkhead import ParkFullError

    config = collector_config(tmp_path, streams=(CLICKS, BUYS, VIEWS), dequeue_every=1,
                              park_after_failures=1, park_retry_s=3600, park_max_bytes=1)
    publish_sync(config, [batch("1", 3)])
    collector = await start(config, engine)
    try:
        await collector.run_once()
        good = metadata_location(config, "shop.buys")
        metadata_location(config, "shop.buys", lost(good))
        publish_sync(config, [batch("2", 3), batch("3", 3)])
        await run_until_parked(collector, "shop.buys", 1)
        assert (await collector.run_once()).staged == {"shop.buys": 6}  # both entries
        publish_sync(config, [batch("4", 3)])
        with pytest.raises(ParkFullError, match="park_max_bytes"):
            await collector.run_once()  # the area is over its bound now
        assert_exact(config, "web.clicks", all_ids("c", "1", "2", "3", "4", count=3))
        assert len(await collector.consumer.read(max_entries=10)) == 1  # still queued
        metadata_location(config, "shop.buys", good)
        collector.bulkheads.retry_all_now()
        await asyncio.to_thread(collector.commit_due_staged)
        assert (await collector.run_once()).rows["shop.buys"] == 3
        assert_exact(config, "shop.buys", all_ids("b", "1", "2", "3", "4", count=3))
        assert read_table(config, "icefloe.dead_letters").num_rows == 0
    finally:
        await collector.store.close()


PEOPLE = StreamConfig(name="people", table="app.people", columns=(
    Column("user_id", "string"), Column("n", "long")), primary_key=("user_id",))


async def test_rows_without_a_key_of_a_table_whose_park_area_is_full_land_once_retried(
        tmp_path, engine):
    """A parked table past ``park_max_bytes`` fails before its rows without a key are
    split off as dead letters. The run's other dead letters must not commit then: the
    retry (table fixed) adds those rows, and a dead-letter table already covering the
    run's sequences would drop them as replays: in neither table."""
    from collector.bulkhead import ParkFullError

    config = collector_config(tmp_path, streams=(CLICKS, PEOPLE), dequeue_every=1,
                              park_after_failures=1, park_retry_s=3600, park_max_bytes=1)

    def person(i: int, key: bool = True) -> tuple[str, str, int, bytes]:
        body = {"user_id": f"p{i}", "n": i} if key else {"n": i}
        return ("people", f"p{i}", BASE_MS + i, msgspec.json.encode(body))

    publish_sync(config, [[click(0, "c0"), person(0)]])
    collector = await start(config, engine)
    try:
        await collector.run_once()
        good = metadata_location(config, "app.people")
        metadata_location(config, "app.people", lost(good))
        publish_sync(config, [[person(1)]])
        await run_until_parked(collector, "app.people", 1)
        assert (await collector.run_once()).staged == {"app.people": 1}
        # keyless people, and a click that is not JSON: a dead letter of another table
        publish_sync(config, [[person(2, key=False), person(3, key=False),
                               ("clicks", "bad", BASE_MS, b"{not json")]])
        with pytest.raises(ParkFullError):
            await collector.run_once()
        metadata_location(config, "app.people", good)
        collector.bulkheads.retry_all_now()
        await asyncio.to_thread(collector.commit_due_staged)
        await collector.run_once()
        dead = read_table(config, "icefloe.dead_letters")
        reasons = sorted(r.split(":", 1)[0] for r in dead.column("reason").to_pylist())
        assert sorted(dead.column("event_id").to_pylist()) == ["bad", "p2", "p3"], reasons
        assert sorted(read_table(config, "app.people").column("user_id").to_pylist()) == [
            "p0", "p1"]
    finally:
        await collector.store.close()


NESTED = StreamConfig(name="profiles", table="app.profiles", columns=(
    Column("user_id", "string", required=True), Column("tags", "list<string>"),
    Column("address", "struct<city: string, zip: string>")), primary_key=("user_id",))


async def test_an_upsert_of_a_key_with_nested_columns_replaces_it(tmp_path, engine):
    """Before: the first update of an existing key failed in Arrow's join (nested non-key
    columns), and the run was retried forever."""
    config = collector_config(tmp_path, streams=(NESTED, CLICKS), dequeue_every=1)

    def profile(i: int, uid: str, city: str, tags: list[str] | None):
        body = {"user_id": uid, "tags": tags, "address": {"city": city, "zip": "1"}}
        return ("profiles", f"p{i}", BASE_MS + i, msgspec.json.encode(body))

    publish_sync(config, [[profile(0, "u1", "Oslo", ["a"]), profile(1, "u2", "Rome", None)]])
    collector = await start(config, engine)
    try:
        await collector.run_once()
        publish_sync(config, [[profile(2, "u1", "Bergen", ["b", "c"]), click(1)]])
        result = await collector.run_once()
        assert result.rows == {"app.profiles": 1, "web.clicks": 1}
        rows = {r["user_id"]: r for r in read_table(config, "app.profiles").to_pylist()}
        assert set(rows) == {"u1", "u2"}
        assert rows["u1"]["address"]["city"] == "Bergen"
        assert rows["u1"]["tags"] == ["b", "c"]
        assert rows["u2"]["tags"] is None
        assert rows["u2"]["address"]["city"] == "Rome"
    finally:
        await collector.store.close()


async def test_a_run_that_hangs_makes_the_collector_stalled_and_unready(config, engine):
    """The memory class as the audit saw it: the driver runs out of memory inside a job
    and the run never finishes. No run fails, so only the stall check can say so:
    ``/readyz`` 503 naming it, and ``icefloe_collector_stalled`` 1."""
    release = threading.Event()

    def hang(stage: str) -> None:
        if stage == "after_job":
            release.wait(30)

    publish_sync(config, [batch("1", 2)])
    collector = await start(config, engine)
    collector.hook = hang
    collector.metrics.health.set_role("active")
    collector.metrics.health.stall_after_s = 0.5
    server = HttpServer("127.0.0.1", 0, collector.metrics.registry, collector.metrics.health)
    try:
        collector.metrics.health.run_started()
        run = asyncio.create_task(collector.run_once())
        url = f"http://127.0.0.1:{server.port}"
        body: dict[str, Any] = {}
        for _ in range(200):  # until the stall shows (the job itself takes a while)
            status, body = await asyncio.to_thread(_get, f"{url}/readyz")
            if status == 503:
                break
            await asyncio.sleep(0.1)
        assert status == 503, body
        assert body["reason"].startswith("stalled:"), body
        _, text = await asyncio.to_thread(_get, f"{url}/metrics", raw=True)
        assert "icefloe_collector_stalled 1.0" in text
        release.set()
        result = await run
        collector.metrics.health.run_ok(result.entries)
        status, body = await asyncio.to_thread(_get, f"{url}/readyz")
        assert status == 200
        assert body["ready"] is True
    finally:
        release.set()
        server.shutdown()
        await collector.store.close()


def _get(url: str, raw: bool = False) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            data = response.read()
            return response.status, data.decode() if raw else msgspec.json.decode(data)
    except urllib.error.HTTPError as exc:
        data = exc.read()
        return exc.code, data.decode() if raw else msgspec.json.decode(data)


async def test_a_table_parked_longer_than_the_queue_holds_loses_nothing(config, engine):
    """``manifest.max_entries`` is 3; while a table is parked, ten more entries are
    accepted one by one (each would be refused with queue_full if the parked table held
    the queue), the others commit each run, and the parked table gets all of them once."""
    from collector_support import open_store_of, publish

    from icefloe.config.manifest import ManifestConfig
    from icefloe.manifest import ManifestProducer

    publish_sync(config, [batch("0", 2)])
    collector = await start(config, engine)
    store = open_store_of(config)
    producer = ManifestProducer(store, ManifestConfig(max_entries=3))
    try:
        await collector.run_once()
        good = metadata_location(config, "web.views")
        metadata_location(config, "web.views", lost(good))
        await publish(store, [batch("1", 2)], producer=producer)
        await run_until_parked(collector, "web.views", 2)
        await collector.run_once()
        await collector.dequeue()
        prefixes = ["0", "1"]
        for n in range(2, 12):
            await publish(store, [batch(str(n), 2)], producer=producer)  # never queue_full
            prefixes.append(str(n))
            assert (await collector.run_once()).entries == 1
            await collector.dequeue()
            assert_exact(config, "web.clicks", all_ids("c", *prefixes, count=2))
        assert collector.staging.states["web.views"].rows == 2 * 11
        metadata_location(config, "web.views", good)
        collector.bulkheads.retry_all_now()
        await asyncio.to_thread(collector.commit_due_staged)
        assert_exact(config, "web.views", all_ids("v", *prefixes, count=2))
        assert_exact(config, "shop.buys", all_ids("b", *prefixes, count=2))
    finally:
        await producer.close()
        await store.close()
        await collector.store.close()


async def test_bad_payloads_and_throwing_mappings_of_one_stream_hold_no_other(tmp_path,
                                                                              engine):
    """The decode and mapping classes, each in one of three streams: undecodable events are
    dead letters, a sql value that throws is null (counted); every table commits in the
    same run and the queue moves on."""
    clicks = StreamConfig(name="clicks", table="web.clicks", columns=(
        *CLICKS.columns, Column("rx", "string", sql="regexp_extract(url, url, 0)")))
    config = collector_config(tmp_path, streams=(clicks, BUYS, VIEWS), dequeue_every=1)
    bad_views = [("views", f"vx{i}", BASE_MS + i, msgspec.json.encode({"page": "/", "ms": "x"}))
                 for i in range(3)]
    bad_click = ("clicks", "cx", BASE_MS, msgspec.json.encode(
        {"user_id": "u", "url": "(", "n": 1, "ts": "2026-11-23T10:00:00Z"}))
    publish_sync(config, [batch("1", 4) + bad_views + [bad_click]])
    collector = await start(config, engine)
    try:
        result = await collector.run_once()
        assert result.dead_letters == 3
        assert (await collector.run_once()).entries == 0
        assert_exact(config, "web.views", all_ids("v", "1", count=4))
        assert_exact(config, "shop.buys", all_ids("b", "1", count=4))
        assert_exact(config, "web.clicks", all_ids("c", "1", count=4) | {"cx"})
        rx = {r["_event_id"]: r["rx"] for r in read_table(config, "web.clicks").to_pylist()}
        assert rx["cx"] is None
        assert rx["c11"] == "/p/1"
        dead = read_table(config, "icefloe.dead_letters").to_pylist()
        assert {d["event_id"] for d in dead} == {"vx0", "vx1", "vx2"}
    finally:
        await collector.store.close()


async def test_the_collector_loop_parks_a_table_and_unparks_it_after_the_fix(tmp_path,
                                                                              engine):
    """The real loop (``Runner``: retries with backoff, staged imports between runs): the
    broken table is parked while the others drain, and once its metadata is back the loop
    itself retries the staged rows (``park_retry_s``) and unparks it, exactly once."""
    from collector.runner import Runner

    config = collector_config(tmp_path, streams=(CLICKS, BUYS, VIEWS), dequeue_every=1,
                              park_after_failures=3, park_retry_s=0.5,
                              retry_max_delay_s=0.5, commit_interval_s=0.2)
    publish_sync(config, [batch("1", 3)])
    collector = await start(config, engine)
    stop = asyncio.Event()
    task = asyncio.create_task(Runner(collector, stop).run())
    try:
        await until(lambda: collector.table_sequences.get("web.views") == {0: 0})
        good = metadata_location(config, "web.views")
        metadata_location(config, "web.views", lost(good))
        publish_sync(config, [batch("2", 3), batch("3", 3)])
        await until(lambda: collector.table_sequences.get("web.clicks") == {0: 2})
        await until(lambda: collector.bulkheads.is_parked("web.views"))
        assert_exact(config, "shop.buys", all_ids("b", "1", "2", "3", count=3))
        await until(lambda: collector.staging.states["web.views"].rows == 6)
        metadata_location(config, "web.views", good)
        await until(lambda: not collector.bulkheads.is_parked("web.views"))
        assert_exact(config, "web.views", all_ids("v", "1", "2", "3", count=3))
        assert collector.staging.states["web.views"].rows == 0
    finally:
        stop.set()
        await task
        await collector.store.close()


async def until(condition: Any, timeout_s: float = 120.0) -> None:
    """Wait for ``condition()`` (polling: the loop runs in this event loop's threads)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


PAGES = StreamConfig(name="pages", table="web.pages", unknown_fields="evolve",
                     columns=(Column("user_id", "string", required=True),))


def page(i: int, **extra: Any) -> tuple[str, str, int, bytes]:
    """An evolving stream's event as an ingestor stores it (undeclared fields kept)."""
    body: dict[str, Any] = {"user_id": f"u{i}"}
    if extra:
        body["_icefloe_extra"] = msgspec.json.encode(extra).decode()
    return ("pages", f"p{i}", BASE_MS + i, msgspec.json.encode(body))


async def test_an_evolving_table_parked_keeps_its_new_fields_and_evolves_at_import(
        tmp_path, engine):
    """A parked evolving sink cannot evolve a table nobody can load: its rows are staged
    as they came (undeclared fields kept), and the import evolves the table first."""
    config = collector_config(tmp_path, streams=(PAGES, CLICKS), dequeue_every=1,
                              park_after_failures=2, park_retry_s=3600)
    publish_sync(config, [[page(0, plan="pro"), click(0)]])
    collector = await start(config, engine)
    try:
        await collector.run_once()
        good = metadata_location(config, "web.pages")
        metadata_location(config, "web.pages", lost(good))
        publish_sync(config, [[page(1, plan="free", tier=2), page(2), click(1)]])
        await run_until_parked(collector, "web.pages", 2)
        assert (await collector.run_once()).staged == {"web.pages": 2}
        assert_exact(config, "web.clicks", {"c0", "c1"})
        metadata_location(config, "web.pages", good)
        collector.bulkheads.retry_all_now()
        assert await asyncio.to_thread(collector.commit_due_staged) == {"web.pages": 2}
        rows = {r["user_id"]: r for r in read_table(config, "web.pages").to_pylist()}
        assert rows["u1"]["plan"] == "free"
        assert rows["u1"]["tier"] == 2
        assert rows["u2"]["tier"] is None
        assert rows["u0"]["plan"] == "pro"
        assert read_table(config, "icefloe.dead_letters").num_rows == 0
    finally:
        await collector.store.close()


def long_click(i: int, url: str) -> tuple[str, str, int, bytes]:
    return ("clicks", f"cl{i}", BASE_MS + i, msgspec.json.encode(
        {"user_id": "u", "url": url, "n": i, "ts": "2026-11-23T10:00:00Z"}))


def sql_errors(collector: Collector, column: str) -> float:
    return collector.metrics.registry.get_sample_value(
        "icefloe_collector_sql_errors_total", {"stream": "clicks", "column": column}) or 0.0


async def test_a_sql_value_past_its_byte_limit_costs_its_row_value_not_the_run(tmp_path,
                                                                                 engine):
    """The memory class: a mapping whose value for one row outgrows
    ``collector.sql_max_value_bytes`` (a JVM asked for gigabytes would have ended the
    collector, #36) loses that row's value (null, counted); its other rows keep theirs and
    the three tables commit in the same run."""
    clicks = StreamConfig(name="clicks", table="web.clicks", columns=(
        *CLICKS.columns, Column("big", "string", sql="regexp_replace(url, '.', '0123456789')")))
    config = collector_config(tmp_path, streams=(clicks, BUYS, VIEWS), dequeue_every=1,
                              sql_max_value_bytes=4096)
    publish_sync(config, [[*batch("1", 4), long_click(0, "/" + "x" * 999)]])
    collector = await start(config, engine)
    try:
        result = await collector.run_once()
        assert sum(result.rows.values()) == 13
        assert_exact(config, "web.clicks", all_ids("c", "1", count=4) | {"cl0"})
        assert_exact(config, "shop.buys", all_ids("b", "1", count=4))
        assert_exact(config, "web.views", all_ids("v", "1", count=4))
        big = {r["_event_id"]: r["big"] for r in read_table(config, "web.clicks").to_pylist()}
        assert big["cl0"] is None
        assert big["c11"] == "0123456789" * 4
        assert sql_errors(collector, "big") == 1
    finally:
        await collector.store.close()


SLOW_ROWS = 4000


async def test_sql_mappings_past_the_run_time_limit_cost_their_values_not_the_run(tmp_path,
                                                                                  engine):
    """The evaluation-time class: mappings slower than ``collector.sql_max_run_s`` per run
    have their Spark job cancelled; the run still commits every row of the three streams
    (the slow column null, counted) instead of holding the queue."""
    clicks = StreamConfig(name="clicks", table="web.clicks", columns=(
        *CLICKS.columns, Column("d", "long", sql="levenshtein(url, reverse(url))")))
    config = collector_config(tmp_path, streams=(clicks, BUYS, VIEWS), dequeue_every=1,
                              sql_max_run_s=0.05)  # less than any Spark job takes
    # many rows of ~1 ms each: longer than the budget however warm the JVM is, and
    # cancelled at a row boundary (one slow row would hold its task past the cancel)
    slow = [long_click(i, "ab" * 500 + str(i)) for i in range(SLOW_ROWS)]
    publish_sync(config, [batch("1", 2) + slow])
    collector = await start(config, engine)
    try:
        started = asyncio.get_running_loop().time()
        result = await collector.run_once()
        took = asyncio.get_running_loop().time() - started
        assert sum(result.rows.values()) == 6 + SLOW_ROWS
        assert_exact(config, "web.clicks", all_ids("c", "1", count=2) |
                     {f"cl{i}" for i in range(SLOW_ROWS)})
        assert_exact(config, "shop.buys", all_ids("b", "1", count=2))
        assert_exact(config, "web.views", all_ids("v", "1", count=2))
        rows = read_table(config, "web.clicks").to_pylist()
        missing = sum(r["d"] is None for r in rows)
        assert missing > 0
        assert sql_errors(collector, "d") == missing
        assert took < 30, took  # two budgets, plus the read without the sql columns
    finally:
        await collector.store.close()
