"""Tables named by the data (#42): what one run touching many tables costs per table.

One stream whose table is a template (``bench.t_{tenant}``), a pre-filled manifest whose
entries hold events of N tenants (1,000; ``--quick``: 100), 20 events per tenant, drained
by the real collector on the SQLite catalog and a local store, with the in-process decode
(no Spark: what is measured is the per-table work after the decode — the split, the table
made on first use, its dedup window and journal, the write and the exactly-once commit).

* **first run**: every table is new: created, then committed (one commit each);
* **next run**: the same N tables again, already there: one commit each;
* **baseline** (same run): the same events into one declared table (one commit);
* the same two runs with ``collector.commit_workers = 4`` (tables committed four at a
  time) against one worker.

Reported: seconds per table of the first and the next run (target: ≤ 0.1 s per table on
the SQLite catalog, which serialises its writes: the commits of a run go one after the
other unless commit_workers overlaps their writes and waits), and the baseline run's
seconds; the tables are checked to hold every event once.

Usage: python bench/dynamic_tables_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from _common import Result, bench_parser, local_config, open_collector, print_table, write_json

from icefloe.config import Column, StreamConfig
from icefloe.manifest.publish import build_batch
from icefloe.streams.model import DynamicTables

PER_TENANT = 20
COLUMNS = (Column("tenant", "string"), Column("n", "long"), Column("url", "string"))


def stream(table: str, tenants: int) -> StreamConfig:
    limits = DynamicTables(max_tables=tenants) if "{" in table else None
    return StreamConfig(name="events", table=table, columns=COLUMNS, partition="none",
                        dynamic_tables=limits)


def batches(tenants: int, round_: int) -> list[tuple[bytes, int, tuple[str, ...]]]:
    """Ten entries, each with events of every tenant (so each run touches all tables)."""
    now_ms = int(time.time() * 1000)
    out = []
    per_entry = PER_TENANT // 10
    for entry in range(10):
        events = [("events", f"r{round_}e{entry}t{t}k{k}", now_ms, msgspec.json.encode(
            {"tenant": f"tenant{t:05d}", "n": k, "url": f"/p/{k}"}))
                  for t in range(tenants) for k in range(per_entry)]
        out.append(build_batch(events))
    return out


async def publish(config: Any, files: list[tuple[bytes, int, tuple[str, ...]]]) -> None:
    from _common import publish_files  # why: the one place that appends like a flush

    await publish_files(config.store.url, files)


async def timed_run(collector: Any) -> tuple[float, int, int]:
    """One run: its seconds, the tables it committed and the rows."""
    started = time.perf_counter()
    result = await collector.run_once()
    seconds = time.perf_counter() - started
    return seconds, len(result.rows), sum(result.rows.values())


async def measure(root: Path, tenants: int, workers: int) -> dict[str, float]:
    from pipeline.load.run import LocalEngine  # why: no Spark: the per-table work is measured

    config = local_config(root / "dynamic", (stream("bench.t_{tenant}", tenants),),
                          metrics_port=0, gc_interval_s=3600, maintenance_interval_s=3600,
                          max_run_entries=10, commit_workers=workers)
    await publish(config, batches(tenants, 0) + batches(tenants, 1))
    collector, store = await open_collector(config, LocalEngine())
    first, first_tables, first_rows = await timed_run(collector)
    second, second_tables, second_rows = await timed_run(collector)
    await store.close()
    assert first_tables == second_tables == tenants, (first_tables, second_tables)
    assert first_rows == second_rows == tenants * PER_TENANT, (first_rows, second_rows)
    base = local_config(root / "static", (stream("bench.all", tenants),), metrics_port=0,
                        gc_interval_s=3600, maintenance_interval_s=3600, max_run_entries=10)
    await publish(base, batches(tenants, 0))
    collector, store = await open_collector(base, LocalEngine())
    baseline, tables, rows = await timed_run(collector)
    await store.close()
    assert tables == 1, tables
    assert rows == tenants * PER_TENANT, rows
    return {"first": first / tenants, "next": second / tenants, "baseline": baseline,
            "first_s": first, "next_s": second}


def main() -> None:
    parser = bench_parser(__doc__, "100 tables instead of 1,000")
    args = parser.parse_args()
    tenants = 100 if args.quick else 1000
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(measure(Path(tmp) / "warm", 5, 1))
        got = asyncio.run(measure(Path(tmp) / "one", tenants, 1))
        par = asyncio.run(measure(Path(tmp) / "four", tenants, 4))
    results = [
        Result("dynamic tables, first run (every table new): s per table",
               round(got["first"], 4), "s"),
        Result("dynamic tables, next run (every table there): s per table",
               round(got["next"], 4), "s"),
        Result("dynamic tables, next run: s per run (baseline: the same events into one "
               "declared table)", round(got["next_s"], 2), "s", round(got["baseline"], 3)),
        Result("dynamic tables, next run, commit_workers = 4: s per table (baseline: 1 "
               "worker)", round(par["next"], 4), "s", round(got["next"], 4)),
    ]
    print_table(f"dynamic tables: one run over {tenants:,} tables, {PER_TENANT} events each, "
                "SQLite catalog (baseline: the same events into one declared table)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
