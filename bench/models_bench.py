"""SQL models benchmark: latency of an incremental model run after one collector commit.

Measures, in one run on a SQLite Iceberg catalog and Spark local[2], over a ``web.pageviews``
table of N rows plus one small commit (100 rows) per round:

* the example merge model (``examples/models``: staging view → ``mart.daily_traffic`` by
  day and url) run incrementally after each commit, against a ``--full-refresh`` of the
  same model in the same run (the baseline: what a non-incremental rebuild costs);
* an ``append`` model (new rows only) after each commit, against its full refresh;
* a rerun with nothing new ("up to date": change detection only, no Spark job).

Values are medians over the rounds, in seconds. Ingest-time column mappings (the other half
of issue #8) are not built, so the mapping-heavy throughput figure is not measured here.

Usage: python bench/models_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import datetime as dt
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, print_table, write_json

from icefloe.config import Config, load_config
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.models import prepare, run_models
from pipeline.spark import get_spark

ROOT = Path(__file__).resolve().parents[1]
APPEND_MODEL = ("-- materialized: append\n-- target: mart.views\n"
                "SELECT url, _sequence FROM web.pageviews\n")
START = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def lake(root: Path) -> Config:
    """The example config on a fresh SQLite catalog under ``root``."""
    example = load_config(ROOT / "examples" / "icefloe.toml")
    return msgspec.structs.replace(example, catalog=msgspec.structs.replace(
        example.catalog, uri=f"sqlite:///{root / 'catalog.db'}",
        warehouse=(root / "warehouse").as_uri()))


def commit(config: Config, sequence: int, first: int, count: int) -> None:
    """One "collector commit": ``count`` page views with ``_sequence`` = ``sequence``."""
    stream = config.stream("pageviews")
    if stream is None:
        raise SystemExit("examples/icefloe.toml lost its pageviews stream")
    rows = [{"user_id": f"u{i % 500}", "session_id": f"s{i % 2000}",
             "url": f"/p/{i % 300}", "referrer": None, "duration_ms": i % 9000,
             "ts": START + dt.timedelta(minutes=i % 40_000), "_event_id": f"e{i}",
             "_received_at": START, "_sequence": sequence} for i in range(first, first + count)]
    table = ensure_stream_table(open_catalog(config.catalog), stream)
    table.append(pa.Table.from_pylist(rows, schema=table_arrow_schema(stream)))


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> None:
    parser = bench_parser(__doc__, "short run (20k rows, 3 rounds)")
    args = parser.parse_args()
    rows, rounds = (20_000, 3) if args.quick else (200_000, 8)
    spark = get_spark("local[2]", "icefloe-models-bench")
    with tempfile.TemporaryDirectory(prefix="icefloe-models-bench-") as tmp:
        root = Path(tmp)
        config = lake(root)
        for sequence, first in enumerate(range(0, rows, 10_000), start=1):
            commit(config, sequence, first, min(10_000, rows - first))
        folder = root / "models"
        shutil.copytree(ROOT / "examples" / "models", folder)
        (folder / "views.sql").write_text(APPEND_MODEL)
        project = prepare(folder, config)
        run_models(spark, project, config)  # first run: builds both targets, warms Spark
        sequence, first = rows // 10_000 + 1, rows
        merge_s: list[float] = []
        append_s: list[float] = []
        idle_s: list[float] = []
        for _ in range(rounds):
            commit(config, sequence, first, 100)
            sequence, first = sequence + 1, first + 100
            merge_s.append(timed(lambda: run_models(spark, project, config,
                                                    ["staging_sessions", "mart_daily_traffic"])))
            append_s.append(timed(lambda: run_models(spark, project, config, ["views"])))
            idle_s.append(timed(lambda: run_models(spark, project, config, ["views"])))
        full_merge = timed(lambda: run_models(spark, project, config,
                                              ["staging_sessions", "mart_daily_traffic"],
                                              full_refresh=True))
        full_append = timed(lambda: run_models(spark, project, config, ["views"],
                                               full_refresh=True))
    spark.stop()
    results = [
        Result(f"merge model after a 100-row commit ({rows:,} rows)",
               statistics.median(merge_s), "s", baseline=full_merge),
        Result(f"append model after a 100-row commit ({rows:,} rows)",
               statistics.median(append_s), "s", baseline=full_append),
        Result("rerun with nothing new (up to date)", statistics.median(idle_s), "s"),
    ]
    print_table("SQL models: incremental run latency (baseline: --full-refresh)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
