"""Bulkheads and evolution quotas on the cluster output path (issue #36): the holes the
embedded path had closed and ``collector.output = "cluster"`` had not.

* One table's failure in the run's shared Spark write job failed every table: now the
  job is retried as one job per table, the failing table counts a failed attempt of its
  own (and parks after ``park_after_failures``), the others commit in the same run; its
  rows are staged while it is parked and land exactly once when it is fixed. The fault
  is a storage fault of that table's data location only (a file where its data
  directory goes: the executors' Parquet writes fail, root or not).
* A run with an evolving sink takes the embedded shape on the same session: an event
  over its client's quota, or past ``evolve_max_columns``, keeps its declared columns
  and its undeclared fields go to ``_overflow`` — the embedded path's table exactly —
  and a parked evolving table has its rows staged as they came, not evolved first.

Real Spark (local mode, real Python workers), real SQLite catalog, real local store,
real ingestor over HTTP for the quota cases.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import msgspec
import pytest
from collector_support import (
    CLICKS,
    assert_exact,
    click,
    collector_config,
    drain,
    publish_sync,
    read_table,
    start,
)

from collector.service import Collector
from icefloe.clock import ManualClock
from icefloe.config import StreamConfig
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import SparkClusterEngine, SparkEngine
from testing.catalog_pointer import lost
from tests.collector.test_bulkheads import (
    BUYS,
    PAGES,
    VIEWS,
    all_ids,
    batch,
    metadata_location,
    page,
    run_until_parked,
)
from tests.collector.test_evolve_quota import (
    CLIENT_A,
    CLIENT_B,
    TOKEN_A,
    TOKEN_B,
    overflow,
    pages,
    send,
)


@pytest.fixture
def engine(spark: Any) -> SparkClusterEngine:
    return SparkClusterEngine(spark, 2)


def embedded_runs(collector: Collector, reason: str) -> float:
    return collector.metrics.embedded_runs.labels(reason)._value.get()


def data_dir(config: Any, table: str) -> Path:
    """Where the executors write ``table``'s data files (its location provider's)."""
    from pyiceberg.table.locations import load_location_provider

    loaded = open_catalog(config.catalog).load_table(table)
    where = load_location_provider(loaded.location(), loaded.properties) \
        .new_data_location("probe.parquet")
    root = f"{loaded.location().rstrip('/')}/data/"
    assert where.startswith(root), where  # the fault below covers every data file
    return Path(urlparse(root).path)


def break_storage(path: Path) -> None:
    """A file where the table's data directory goes: creating any data file there fails."""
    assert not path.exists()
    path.write_text("not a directory")


async def test_one_tables_failing_write_parks_it_and_the_other_tables_commit(tmp_path,
                                                                             engine):
    """Three streams on the cluster path; web.views' data location fails every write."""
    config = collector_config(tmp_path, streams=(CLICKS, BUYS, VIEWS), output="cluster",
                              dequeue_every=1, park_after_failures=2, park_retry_s=3600)
    collector = await start(config, engine)
    try:
        broken = data_dir(config, "web.views")
        break_storage(broken)
        publish_sync(config, [batch("1", 5)])
        with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the write fails with
            await collector.run_once()
        # the same run committed the other two tables; the failure is web.views' own
        assert_exact(config, "web.clicks", all_ids("c", "1"))
        assert_exact(config, "shop.buys", all_ids("b", "1"))
        assert collector.bulkheads.failures == {"web.views": 1}
        await run_until_parked(collector, "web.views", 1)  # the retry: its 2nd failure
        assert set(collector.bulkheads.parked) == {"web.views"}

        result = await collector.run_once()  # parked: staged (by the executors); acked
        assert (result.entries, result.staged) == (1, {"web.views": 5})
        publish_sync(config, [batch("2", 5)])
        result = await collector.run_once()
        assert (result.rows, result.staged) == (
            {"web.clicks": 5, "shop.buys": 5}, {"web.views": 5})
        assert (await collector.run_once()).entries == 0  # the queue moved on
        assert_exact(config, "web.clicks", all_ids("c", "1", "2"))
        assert_exact(config, "shop.buys", all_ids("b", "1", "2"))
        assert collector.staging.states["web.views"].rows == 10

        collector.bulkheads.retry_all_now()  # still broken: stays parked, nothing lost
        assert await asyncio.to_thread(collector.commit_due_staged) == {}
        assert collector.bulkheads.is_parked("web.views")

        os.unlink(broken)  # the operator fixes the storage
        collector.bulkheads.retry_all_now()
        assert await asyncio.to_thread(collector.commit_due_staged) == {"web.views": 10}
        assert not collector.bulkheads.is_parked("web.views")
        assert_exact(config, "web.views", all_ids("v", "1", "2"))  # exactly once

        publish_sync(config, [batch("3", 5)])  # back on the normal (cluster) path
        result = await collector.run_once()
        assert result.rows == {"web.clicks": 5, "shop.buys": 5, "web.views": 5}
        assert not result.staged
        for table, letter in (("web.clicks", "c"), ("shop.buys", "b"), ("web.views", "v")):
            assert_exact(config, table, all_ids(letter, "1", "2", "3"))
        counted = {sample.labels["table"] for metric in
                   collector.metrics.table_failures.collect() for sample in metric.samples
                   if sample.name.endswith("_total")}
        assert counted == {"web.views"}  # the others never counted a failure
        assert not collector.metrics.embedded_runs.collect()[0].samples
    finally:
        await collector.store.close()


async def test_a_parked_evolving_table_on_the_cluster_path_stages_its_rows_as_they_came(
        tmp_path, engine):
    """Its table cannot be loaded: the cluster path no longer evolves it before staging
    (the run takes the embedded shape), so its rows are staged, undeclared fields kept,
    and the import evolves the table once it loads again."""
    config = collector_config(tmp_path, streams=(PAGES, CLICKS), dequeue_every=1,
                              park_after_failures=2, park_retry_s=3600, output="cluster")
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
        assert (rows["u0"]["plan"], rows["u1"]["plan"], rows["u1"]["tier"]) == (
            "pro", "free", 2)
        assert rows["u2"]["tier"] is None
        assert embedded_runs(collector, "evolve") == 4  # every run held an evolving sink
    finally:
        await collector.store.close()


USER_COLUMNS = ("user_id", "page", "x1", "x2", "x3", "x4", "y1", "y2", "_overflow")


async def evolve_both(root: Path, spark: Any, stream: StreamConfig,
                      rounds: list[list[tuple[str, list[dict[str, Any]]]]], **collector: Any
                      ) -> dict[str, tuple[Any, ...]]:
    """The same rounds of requests (token, events) through the embedded path and the
    cluster path, each with its own ingestor, store and catalog, a collector started per
    round (as in test_evolve_quota). Per path: the table's columns, its rows (user
    columns only: event ids and times are each ingestor's), the dead letters' count, the
    quota ledger, and how many runs the collectors handed to the embedded shape for an
    evolving sink."""
    from icefloe.streams.evolve_quota import PROPERTY

    out: dict[str, tuple[Any, ...]] = {}
    for output, engine in (("embedded", SparkEngine(spark, 2)),
                           ("cluster", SparkClusterEngine(spark, 2))):
        (root / output).mkdir()
        config = collector_config(root / output, streams=(stream,), output=output,
                                  **collector)
        handed = 0.0
        for requests in rounds:
            await send(config, requests)
            running = await start(config, engine)
            running.clock = ManualClock(1_800_000_000.0)  # the quotas' hour
            try:
                await drain(running)
            finally:
                await running.store.close()
            handed += embedded_runs(running, "evolve")
        table = open_catalog(config.catalog).load_table("web.pages")
        rows = sorted(({k: v for k, v in r.items() if k in USER_COLUMNS}
                       for r in read_table(config, "web.pages").to_pylist()),
                      key=lambda r: r["user_id"])
        try:
            dead = read_table(config, "icefloe.dead_letters").num_rows
        except Exception:  # never created: no dead letter
            dead = 0
        ledger = table.properties.get(PROPERTY)
        out[output] = (table.schema().column_names, rows, dead,
                       ledger and msgspec.json.decode(ledger), handed)
    return out


async def test_an_over_quota_event_keeps_its_declared_columns_and_overflows_the_rest(
        tmp_path, spark):
    both = await evolve_both(tmp_path, spark, pages(token_columns_per_hour=2,
                                                    token_columns_total=3), [
        [(TOKEN_A, [{"user_id": "a1", "page": "/a", "x1": 1, "x2": 2, "x3": 3, "x4": 4}]),
         (TOKEN_B, [{"user_id": "b1", "page": "/b", "x3": 7}])]])
    names, rows, dead, ledger, evolve_runs = both["cluster"]
    assert {"x1", "x2", "x3", "_overflow"} <= set(names)
    assert "x4" not in names  # over A's hour: not a column, and not a dead letter
    by_user = {r["user_id"]: r for r in rows}
    assert (by_user["a1"]["page"], by_user["a1"]["x1"], by_user["a1"]["x3"]) == ("/a", 1, 3)
    assert overflow(by_user["a1"]) == {"x4": 4}
    assert (by_user["b1"]["page"], by_user["b1"]["x3"], by_user["b1"]["_overflow"]) == (
        "/b", 7, None)
    assert dead == 0
    assert ledger["clients"] == {CLIENT_A: [2, 2], CLIENT_B: [1, 1]}
    assert (names, rows, dead, ledger) == both["embedded"][:4]
    assert evolve_runs == 1  # the cluster collector handed the run to the embedded shape


async def test_past_the_column_limit_the_cluster_path_keeps_the_event(tmp_path, spark):
    both = await evolve_both(tmp_path, spark, pages(), [
        [(TOKEN_A, [{"user_id": "a1", "x1": 1, "x2": 2}])],  # fills the table's limit
        [(TOKEN_B, [{"user_id": "b1", "page": "/b", "x1": 5, "y1": {"k": "v"}},
                    {"user_id": "b2", "page": "/c", "y2": [1, 2]}])]],
        evolve_max_columns=8)
    names, rows, dead, _, evolve_runs = both["cluster"]
    by_user = {r["user_id"]: r for r in rows}
    assert (by_user["b1"]["page"], by_user["b1"]["x1"]) == ("/b", 5)
    assert overflow(by_user["b1"]) == {"y1": {"k": "v"}}
    assert (by_user["b2"]["page"], overflow(by_user["b2"])) == ("/c", {"y2": [1, 2]})
    assert dead == 0  # before #36 the cluster path dead-lettered b1 and b2 whole
    assert (names, rows, dead) == both["embedded"][:3]
    assert evolve_runs == 2
