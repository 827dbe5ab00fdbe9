"""Bulkheads: how much a table whose commits fail costs the OTHER tables' freshness.

Three streams, one entry per 100 ms holding events of all three (a publisher in a process
of its own, as ingestors are), the real collector loop (``Runner``) on Spark ``local[2]``.
Two runs of the same length and rate, side by side:

* **baseline**: nothing fails;
* **fault**: a third of the way in, the metadata file of one table (``web.views``)
  disappears (its catalog pointer names a file that is not there): its commits fail, it is
  parked after ``park_after_failures`` attempts, its rows are staged.

Reported: freshness (publish → the commit of that table holding the event) p50 / p99 of the
two healthy tables in both runs and their ratio (target: p99 within 2x of the baseline),
rows staged for the parked table, and a check that, once its pointer is restored, the parked
table holds every event exactly once.

Usage: python bench/bulkhead_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from _common import (
    Result,
    bench_parser,
    local_config,
    open_collector,
    print_table,
    publish_every,
    write_json,
)

from collector.runner import Runner
from icefloe.config import Column, StreamConfig
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import SparkEngine
from testing.catalog_pointer import lost, metadata_pointer

STREAMS = (
    StreamConfig(name="clicks", table="web.clicks", columns=(
        Column("user_id", "string"), Column("url", "string"), Column("n", "long"))),
    StreamConfig(name="buys", table="shop.buys", columns=(
        Column("order_id", "string"), Column("amount", "double"))),
    StreamConfig(name="views", table="web.views", columns=(
        Column("page", "string"), Column("ms", "long"))),
)
BROKEN = "web.views"
HEALTHY = ("web.clicks", "shop.buys")


def events(i: int, per_stream: int) -> list[tuple[str, str, int, bytes]]:
    now_ms = int(time.time() * 1000)
    out = []
    for k in range(per_stream):
        n = i * per_stream + k
        out.append(("clicks", f"c{n}", now_ms, msgspec.json.encode(
            {"user_id": f"u{n % 5000}", "url": f"/p/{n % 997}", "n": n})))
        out.append(("buys", f"b{n}", now_ms, msgspec.json.encode(
            {"order_id": f"o{n}", "amount": n * 0.5})))
        out.append(("views", f"v{n}", now_ms, msgspec.json.encode({"page": "/", "ms": n})))
    return out


def publish_for(store_url: str, seconds: float, per_stream: int) -> dict[int, float]:
    """The publisher process: one entry per 100 ms; returns each sequence's publish time."""
    published = asyncio.run(publish_every(store_url, seconds, lambda i: events(i, per_stream)))
    return {seq: at for seq, (at, _) in published.items()}


def pointer(config: Any, table: str, location: str | None = None) -> str:
    """A table's metadata pointer in the SQLite catalog (set it with ``location``)."""
    found = metadata_pointer(config.catalog.uri, table, location)
    assert found is not None, table
    return found


async def one_run(root: Path, spark: Any, seconds: float, per_stream: int, *,
                  fault: bool) -> dict[str, Any]:
    config = local_config(root, STREAMS, metrics_port=0, gc_interval_s=3600,
                          maintenance_interval_s=3600, park_retry_s=3600)
    collector, store = await open_collector(config, SparkEngine(spark, 2))
    committed: dict[str, dict[int, float]] = {t: {} for t in (*HEALTHY, BROKEN)}
    commit = collector.commits.commit

    def timed(table: str, rows: Any, *args: Any, **kwargs: Any) -> Any:
        outcome = commit(table, rows, *args, **kwargs)
        if table in committed and "_sequence" in rows.column_names:
            now = time.time()
            for seq in set(rows.column("_sequence").to_pylist()):
                committed[table].setdefault(seq, now)
        return outcome

    collector.commits.commit = timed  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(Runner(collector, stop).run())
    good = ""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        pending = pool.apply_async(publish_for, (config.store.url, seconds, per_stream))
        if fault:
            await asyncio.sleep(seconds / 3)
            good = pointer(config, BROKEN)  # what it points at now, to restore later
            pointer(config, BROKEN, lost(good))
        published: dict[int, float] = await asyncio.to_thread(pending.get)
    last = max(published)
    deadline = time.monotonic() + 60
    while (any(last not in committed[t] for t in HEALTHY)
           and time.monotonic() < deadline):
        await asyncio.sleep(0.1)
    stop.set()
    await task
    staged = collector.staging.states.get(BROKEN)
    out: dict[str, Any] = {"published": len(published),
                           "staged_rows": staged.rows if staged else 0,
                           "parked": collector.bulkheads.is_parked(BROKEN)}
    for table in HEALTHY:
        samples = sorted(committed[table][seq] - at for seq, at in published.items()
                         if seq in committed[table])
        assert len(samples) == len(published), f"{table}: {len(samples)} of {len(published)}"
        out[table] = samples
    if fault:  # the operator restores the pointer: the parked rows land, exactly once
        pointer(config, BROKEN, good)
        collector.bulkheads.retry_all_now()
        await asyncio.to_thread(collector.commit_due_staged)
        rows = open_catalog(config.catalog).load_table(BROKEN).scan(
            selected_fields=("_event_id",)).to_arrow()
        ids = rows.column("_event_id").to_pylist()
        assert len(ids) == len(set(ids)) == len(published) * per_stream, \
            f"{BROKEN}: {len(ids)} rows, {len(set(ids))} ids, {len(published) * per_stream}"
        out["exact"] = True
    await store.close()
    return out


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = bench_parser(__doc__, "20 s per run instead of 120 s")
    args = parser.parse_args()
    seconds = 20.0 if args.quick else 120.0
    per_stream = 100  # 1,000 events/s per stream
    from pipeline.spark import get_spark

    print("starting Spark (local[2]) ...", flush=True)
    spark = get_spark("local[2]", "icefloe-bench", {"spark.driver.memory": "2g"})
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(one_run(Path(tmp) / "warm", spark, 5, per_stream, fault=False))
        base = asyncio.run(one_run(Path(tmp) / "base", spark, seconds, per_stream,
                                   fault=False))
        hit = asyncio.run(one_run(Path(tmp) / "fault", spark, seconds, per_stream, fault=True))
    spark.stop()
    for table in HEALTHY:
        for label, q in (("p50", 0.5), ("p99", 0.99)):
            results.append(Result(f"freshness {label} of {table}, one other table broken",
                                  percentile(hit[table], q), "s",
                                  percentile(base[table], q)))
    results.append(Result(f"{BROKEN} rows staged while parked", hit["staged_rows"], "rows"))
    results.append(Result(f"{BROKEN} exactly once after its fix", 1.0 if hit["exact"] else 0,
                          "bool"))
    print_table(f"bulkheads: {per_stream * 10:,} events/s per stream, {seconds:.0f} s per "
                "run (baseline: the same run without the fault)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
