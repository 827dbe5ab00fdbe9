"""Upsert benchmark: copy-on-write commits against plain appends of the same batches.

Measures, in one run on a local warehouse and a SQLite Iceberg catalog, the commit step
the collector runs per table (``commit_rows``; decode and Spark are the same either way):

* a table of ``BASE`` rows (10 commits, so 10 data files, keys in order), then batches of
  ``BATCH`` rows of which 1 %, 10 % or 100 % hit existing keys, drawn at random over the
  whole table (the costly case: every file holds some), committed with a ``primary_key``
  (:class:`pipeline.iceberg.upsert.CopyOnWrite`) — rows/s and seconds per commit, against
  the same batches appended (``WriteThenAdd``) to an identical table in the same run;
* 1 % existing keys that all fall in one file's key range (ids that arrive in order):
  column bounds leave the other files alone;
* files and rows rewritten per commit;
* one second of events at 10k events/s (a 10k-row run, 10 % existing keys, random) on the
  full table: its commit time is the least a row waits to be visible at that load (the
  end-to-end freshness run is ``bench/collector_bench.py``'s, for appends).

Full run: 1M-row table, 100k-row batches, 3 batches per case. ``--quick``: 100k rows,
10k-row batches, 2 batches.

Usage: python bench/upsert_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, local_config, print_table, write_json

from icefloe.config import Column, StreamConfig
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import commit_rows
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.iceberg.upsert import CopyOnWrite

STREAM = StreamConfig(name="users", table="bench.users", columns=(
    Column("user_id", "string", required=True), Column("plan", "string"),
    Column("score", "long"), Column("country", "string"), Column("updated", "timestamp")),
    primary_key=("user_id",))
NOW = dt.datetime(2026, 11, 26, 12, tzinfo=dt.UTC)


def rows_of(keys: np.ndarray, sequence: int) -> pa.Table:
    """One batch: ``keys`` (ints) as ``user-%08d`` rows of entry ``sequence``."""
    n = len(keys)
    ids = [f"user-{k:08d}" for k in keys.tolist()]
    return pa.table({
        "user_id": ids, "plan": [("free", "pro", "team")[k % 3] for k in keys.tolist()],
        "score": pa.array(keys * 7 + sequence, pa.int64()),
        "country": [("de", "fr", "us", "jp")[k % 4] for k in keys.tolist()],
        "updated": pa.array([NOW] * n, pa.timestamp("us", tz="UTC")),
        "_event_id": [f"e{sequence}-{i}" for i in range(n)],
        "_received_at": pa.array([NOW] * n, pa.timestamp("us", tz="UTC")),
        "_sequence": pa.array(np.full(n, sequence), pa.int64()),
    }, schema=table_arrow_schema(STREAM))


def fresh_table(root: Path, name: str, base: int, files: int):
    """A catalog with ``bench.users`` holding ``base`` rows in ``files`` appends."""
    catalog = open_catalog(local_config(root / name, env={}).catalog)
    ensure_stream_table(catalog, STREAM)
    per = base // files
    for i in range(files):
        keys = np.arange(i * per, (i + 1) * per)
        commit_rows(catalog, STREAM.table, rows_of(keys, i), sequence=i, epoch=1,
                    append=WriteThenAdd(STREAM.name))
    return catalog


def batch_keys(rng: np.random.Generator, base: int, size: int, hit: float,
               clustered: bool) -> np.ndarray:
    """``size`` distinct keys, ``hit`` of them existing (random, or in one file's range)."""
    existing = int(size * hit)
    if clustered:
        start = int(rng.integers(0, base - existing))
        old = np.arange(start, start + existing)
    else:
        old = rng.choice(base, existing, replace=False)
    new = np.arange(base, base + size - existing) + int(rng.integers(0, 10**7)) * 10
    return np.concatenate([old, new])


def run_case(root: Path, label: str, *, base: int, files: int, size: int, batches: int,
             hit: float, clustered: bool) -> tuple[float, float, float, float, int]:
    """Seconds per commit (upsert, append), rows copied and files rewritten per commit,
    and the final row count of the upsert table (a check)."""
    upsert_catalog = fresh_table(root, f"{label}-upsert", base, files)
    append_catalog = fresh_table(root, f"{label}-append", base, files)
    rng = np.random.default_rng(27)
    upsert_s = append_s = 0.0
    copied = rewritten = 0
    for b in range(batches):
        sequence = files + b
        rows = rows_of(batch_keys(rng, base, size, hit, clustered), sequence)
        hook = CopyOnWrite(STREAM.primary_key)
        started = time.perf_counter()
        commit_rows(upsert_catalog, STREAM.table, rows, sequence=sequence, epoch=1,
                    append=hook)
        upsert_s += time.perf_counter() - started
        copied += hook.rows_copied
        rewritten += hook.files_rewritten
        started = time.perf_counter()
        commit_rows(append_catalog, STREAM.table, rows, sequence=sequence, epoch=1,
                    append=WriteThenAdd(STREAM.name))
        append_s += time.perf_counter() - started
    final = upsert_catalog.load_table(STREAM.table).scan(
        selected_fields=("user_id",)).to_arrow().num_rows
    return (upsert_s / batches, append_s / batches, copied / batches, rewritten / batches,
            final)


def main() -> None:
    parser = bench_parser(__doc__, "100k-row table, 10k-row batches (about a minute)")
    args = parser.parse_args()
    base, size, batches = (100_000, 10_000, 2) if args.quick else (1_000_000, 100_000, 3)
    files = 10
    results: list[Result] = []
    cases = [("1% existing keys, random", 0.01, False), ("10% existing keys, random", 0.1,
             False), ("100% existing keys, random", 1.0, False),
             ("1% existing keys, one key range", 0.01, True)]
    sizes = {label: size for label, _, _ in cases}
    run_label = f"{size // 10:,}-row run, 10% existing, random"
    cases.append((run_label, 0.1, False))
    sizes[run_label] = size // 10
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, hit, clustered) in enumerate(cases):
            size = sizes[label]
            print(f"{label}: {base:,}-row table, {batches} batches of {size:,} ...",
                  flush=True)
            upsert_s, append_s, copied, rewritten, final = run_case(
                Path(tmp), f"case{i}", base=base, files=files, size=size, batches=batches,
                hit=hit, clustered=clustered)
            expected = base + batches * (size - int(size * hit))
            assert final == expected, f"{label}: {final} rows, expected {expected}"
            results.append(Result(f"{label}: upsert rows/s", size / upsert_s, "rows/s",
                                  size / append_s))
            results.append(Result("  upsert commit (append: baseline)", upsert_s, "s",
                                  append_s))
            results.append(Result("  data files rewritten per commit", rewritten, "files"))
            results.append(Result("  rows copied into rewritten files per commit", copied,
                                  "rows"))
    print_table(f"upserts (copy-on-write) vs appends: {base:,}-row table, "
                f"{max(sizes.values()):,}-row batches (commit step, local warehouse, SQLite "
                "catalog)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
