"""``icefloe query`` benchmark: a cold CLI process per answer, DuckDB engine vs Spark engine.

Builds one ``web.clicks`` table of N rows (1M; ``--quick``: 200k) on a SQLite catalog and a
local warehouse, then runs ``python -m icefloe query --engine E --format json SQL`` as a
fresh process, several times, for two questions: a ``count(*)`` and a ``GROUP BY`` with a
sum. Every run is a cold process (imports, catalog, planning, reading, answer), which is
what a user at a shell pays. Values are the p50 over the runs, in milliseconds, with the
child's CPU time (user + sys) next to it: on a shared machine the wall clock moves with the
neighbours' load, the CPU time much less. The Spark engine is the baseline of each row.

The CPU rows have no Spark baseline: the JVM's CPU is not the CLI process's. Two more rows
say where the embedded engine's time goes: the same answer inside an already-warm process
(plan, choose, read, DuckDB; imports paid), and the import floor of a cold DuckDB answer:
the modules it cannot skip (:data:`FLOOR`: icefloe's config, sqlglot's two dialects, duckdb;
a plain local table is read without pyiceberg), imported and nothing else.

Usage: python bench/query_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, print_table, write_json

from icefloe.config import Column, StreamConfig, load_config
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.read.embedded import choose, run_embedded
from pipeline.read.query import plan

ROOT = Path(__file__).resolve().parents[1]
CLICKS = StreamConfig(name="clicks", table="web.clicks", columns=(
    Column("user_id", "string", required=True), Column("url", "string"),
    Column("n", "long"), Column("ts", "timestamp")))
T0 = dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
QUERIES = {
    "count": "SELECT count(*) AS n FROM web.clicks",
    "group-by": "SELECT url, count(*) AS views, sum(n) AS total FROM clicks GROUP BY url",
}


def write_config(root: Path) -> Path:
    """An ``icefloe.toml`` with the clicks stream on a catalog under ``root``."""
    path = root / "icefloe.toml"
    path.write_text(
        f'[store]\nurl = "{(root / "store").as_uri()}"\n'
        f'[catalog]\nuri = "sqlite:///{root / "catalog.db"}"\n'
        f'warehouse = "{(root / "warehouse").as_uri()}"\n'
        '[[streams]]\nname = "clicks"\ntable = "web.clicks"\ncolumns = [\n'
        '  {name = "user_id", type = "string", required = true},\n'
        '  {name = "url", type = "string"}, {name = "n", type = "long"},\n'
        '  {name = "ts", type = "timestamp"}]\n')
    return path


def fill(config_path: Path, rows: int) -> int:
    """``rows`` click rows (1,024 users, 16 urls) in one commit; the table's file bytes."""
    config = load_config(config_path)
    table = ensure_stream_table(open_catalog(config.catalog), CLICKS)
    i = pa.array(range(rows), pa.int64())
    times = pa.array([T0] * rows, pa.timestamp("us", tz="UTC"))
    data = pa.table({
        "user_id": pc.binary_join_element_wise("u", pc.cast(pc.bit_wise_and(i, 1023),
                                                            pa.string()), ""),
        "url": pc.binary_join_element_wise("/p/", pc.cast(pc.bit_wise_and(i, 15),
                                                          pa.string()), ""),
        "n": i, "ts": times, "_event_id": pc.cast(i, pa.string()), "_received_at": times,
        "_sequence": i})
    table.append(data.cast(table_arrow_schema(CLICKS)))
    return sum(t.file.file_size_in_bytes for t in table.scan().plan_files())


def timed(argv: list[str], cwd: Path) -> tuple[float, float, str]:
    """Wall ms, CPU ms (user + sys of the child) and stdout of one cold process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False,
                          timeout=600)
    wall = (time.perf_counter() - start) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... failed: {done.stderr.strip()[-500:]}")
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000
    return wall, cpu, done.stdout


def query(config: Path, engine: str, sql: str, runs: int) -> tuple[float, float, list[dict]]:
    """p50 wall ms, p50 CPU ms and the answer of ``runs`` cold ``icefloe query`` calls."""
    argv = [sys.executable, "-m", "icefloe", "query", "--config", str(config),
            "--engine", engine, "--format", "json", "--limit", "0", sql]
    walls, cpus, answer = [], [], []
    for _ in range(runs):
        wall, cpu, out = timed(argv, ROOT)
        walls.append(wall)
        cpus.append(cpu)
        answer = sorted(json.loads(out), key=lambda r: json.dumps(r, sort_keys=True))
    return statistics.median(walls), statistics.median(cpus), answer


def warm(config_path: Path, sql: str, runs: int) -> float:
    """p50 ms of plan + choose + read + answer in this (already importing) process."""
    config = load_config(config_path)
    samples = []
    for _ in range(runs + 1):  # the first run pays duckdb's import
        start = time.perf_counter()
        pinned = plan(sql, config)
        choice = choose(config, pinned, "duckdb")
        assert choice.duck_sql is not None
        assert choice.planned is not None
        run_embedded(config, pinned, choice.duck_sql, choice.planned)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples[1:])


FLOOR = ("icefloe.config", "duckdb",
         "sqlglot.dialects.spark", "sqlglot.dialects.duckdb")


def import_floor(runs: int) -> tuple[float, float]:
    argv = [sys.executable, "-c", f"import {', '.join(FLOOR)}"]
    samples = [timed(argv, ROOT)[:2] for _ in range(runs)]
    return (statistics.median(s[0] for s in samples),
            statistics.median(s[1] for s in samples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200k rows, fewer runs (< 1 min)")
    parser.add_argument("--json", metavar="PATH", help="write results as JSON")
    args = parser.parse_args()
    rows = 200_000 if args.quick else 1_000_000
    duck_runs, spark_runs = (3, 1) if args.quick else (7, 3)
    root = Path(tempfile.mkdtemp(prefix="icefloe-query-bench-"))
    results: list[Result] = []
    try:
        config = write_config(root)
        size = fill(config, rows)
        print(f"web.clicks: {rows:,} rows, {size / 2**20:.1f} MiB of Parquet")
        for name, sql in QUERIES.items():
            duck_wall, duck_cpu, duck_answer = query(config, "duckdb", sql, duck_runs)
            # --quick measures Spark on the count only, to stay under a minute
            spark = (None if args.quick and name != "count"
                     else query(config, "spark", sql, spark_runs))
            if spark is not None and spark[2] != duck_answer:
                raise SystemExit(f"{name}: the engines disagree: {spark[2]} vs {duck_answer}")
            label = f"{name}, {rows // 1000}k rows, cold process p50"
            results.append(Result(f"{label}: duckdb vs spark (wall)", duck_wall, "ms",
                                  None if spark is None else spark[0]))
            results.append(Result(f"{label}: duckdb (CPU)", duck_cpu, "ms"))
            results.append(Result(f"{name}, {rows // 1000}k rows: duckdb in a warm process",
                                  warm(config, sql, duck_runs), "ms"))
        floor_wall, floor_cpu = import_floor(duck_runs)
        results.append(Result("import floor: icefloe config + sqlglot + duckdb (wall)",
                              floor_wall, "ms"))
        results.append(Result("import floor: icefloe config + sqlglot + duckdb (CPU)",
                              floor_cpu, "ms"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_table(f"icefloe query, DuckDB engine vs Spark engine (runs: {duck_runs} duckdb, "
                f"{spark_runs} spark)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
