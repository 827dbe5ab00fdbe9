"""Compaction benchmark: what a lightly fed partition costs in rewritten bytes.

A partition that gets a few small files between two maintenance passes used to have its
compacted file rewritten whole on every pass until it reached half the target size (64 MiB
by default): the bytes compaction writes grew with the number of passes, not with the data.
Compaction now merges files of about the same size (a file more than twice the size of the
partition's other small files together waits for them: ``plan_compaction``'s tiers).

One run, on a local warehouse and a SQLite Iceberg catalog, with icefloe's own commits
(``commit_rows``, one data file per commit) and its default compaction settings (8 files,
128 MiB target), measures the same feed twice, side by side:

* tiered (what the collector runs) against the baseline, every small file a candidate
  (``compact(..., tiered=False)``, the rule before);
* the feed: ``START`` commits of ``START_ROWS`` rows, compacted into one file, then
  ``PASSES`` maintenance passes with ``PER_PASS`` commits of ``SMALL_ROWS`` rows before
  each (one day's partition, incompressible payloads);
* per variant: bytes compaction wrote over the passes, write amplification (bytes written
  by compaction over bytes committed), data files live at the end, seconds spent
  compacting, and that both tables hold the same rows.

Full run: 8 x 20,000 rows, then 40 passes of 8 x 200 rows. ``--quick``: 8 x 5,000 rows, 12
passes of 8 x 100 rows.

Usage: python bench/compaction_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog import Catalog

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, local_config, print_table, write_json

from icefloe.config import Column, StreamConfig
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import commit_rows
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.maintenance import compact
from pipeline.iceberg.tables import ensure_stream_table

STREAM = StreamConfig(name="clicks", table="bench.clicks", columns=(
    Column("user_id", "string", required=True), Column("payload", "string")))
DAY = dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Feed:
    start: int
    start_rows: int
    passes: int
    per_pass: int
    small_rows: int


FULL = Feed(start=8, start_rows=20_000, passes=40, per_pass=8, small_rows=200)
QUICK = Feed(start=8, start_rows=5_000, passes=12, per_pass=8, small_rows=100)


@dataclass
class Outcome:
    written: int = 0
    committed: int = 0
    seconds: float = 0.0
    files: int = 0
    rows: int = 0


def rows_of(sequence: int, n: int) -> pa.Table:
    return pa.table({
        "user_id": [f"user-{sequence}-{i}" for i in range(n)],
        "payload": [os.urandom(40).hex() for _ in range(n)],
        "_event_id": [f"e{sequence}-{i}" for i in range(n)],
        "_received_at": pa.array([DAY] * n, pa.timestamp("us", tz="UTC")),
        "_sequence": pa.array([sequence] * n, pa.int64()),
    }, schema=table_arrow_schema(STREAM))


def live_bytes(catalog: Catalog, name: str) -> dict[str, int]:
    table = catalog.load_table(name)
    return {task.file.file_path: task.file.file_size_in_bytes
            for task in table.scan().plan_files()}


def feed(root: Path, spec: Feed, tiered: bool) -> Outcome:
    catalog = open_catalog(local_config(root, env={}).catalog)
    ensure_stream_table(catalog, STREAM)
    outcome = Outcome()
    sequence = 0

    def commit(rows: int) -> None:
        nonlocal sequence
        before = live_bytes(catalog, STREAM.table)
        commit_rows(catalog, STREAM.table, rows_of(sequence, rows), sequence=sequence,
                    epoch=1, append=WriteThenAdd(STREAM.name))
        after = live_bytes(catalog, STREAM.table)
        outcome.committed += sum(size for path, size in after.items() if path not in before)
        sequence += 1

    def maintain(count: bool) -> None:
        started = time.perf_counter()
        result = compact(catalog.load_table(STREAM.table), epoch=1, tiered=tiered)
        if count:
            outcome.seconds += time.perf_counter() - started
            outcome.written += result.bytes_added

    for _ in range(spec.start):
        commit(spec.start_rows)
    maintain(count=False)  # the partition's first compacted file: the same in both
    for _ in range(spec.passes):
        for _ in range(spec.per_pass):
            commit(spec.small_rows)
        maintain(count=True)
    outcome.files = len(live_bytes(catalog, STREAM.table))
    outcome.rows = catalog.load_table(STREAM.table).scan().to_arrow().num_rows
    return outcome


def run(quick: bool) -> list[Result]:
    spec = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="icefloe-compaction-bench-") as tmp:
        tiered = feed(Path(tmp) / "tiered", spec, tiered=True)
        every = feed(Path(tmp) / "every", spec, tiered=False)
    if tiered.rows != every.rows:
        raise SystemExit(f"the two tables differ: {tiered.rows} rows against {every.rows}")
    label = f"{spec.passes} passes, {spec.per_pass} commits of {spec.small_rows} rows each"
    return [
        Result(f"bytes written by compaction, {label} (baseline: every pass)",
               tiered.written / 2**20, "MiB", every.written / 2**20),
        Result("write amplification: compaction bytes / committed bytes (baseline: every pass)",
               tiered.written / tiered.committed, "x", every.written / every.committed),
        Result("seconds compacting (baseline: every pass)", tiered.seconds, "s",
               every.seconds),
        Result("data files live at the end (baseline: every pass)", tiered.files, "files",
               every.files),
        Result("rows in the table (both the same)", tiered.rows, "rows"),
    ]


def main() -> None:
    parser = bench_parser(__doc__, "12 passes on 40k rows (under a minute)")
    args = parser.parse_args()
    results = run(args.quick)
    print_table("compaction of a lightly fed partition (baseline = every small file a "
                "candidate, same run)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
