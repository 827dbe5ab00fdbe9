"""One ``cluster_scale_bench.py`` trial in its own driver process (a process has one
SparkContext): on the given standalone master, with the cluster output path,

1. a warm-up run (the JVM's and the executors' Python workers' first use, not counted);
2. ``--small`` runs of one 100-event batch file each: a run's fixed cost (plan, job
   scheduling, task launch, the executors' file writes, the commit) with almost no data;
3. the drain of a copy of the pre-filled template store, runs sized by the defaults.

Prints one JSON line: fixed seconds per run (mean of the small runs; their commit part
apart), the drain's events/s, runs and seconds, its commit seconds (driver side), and the
CPU seconds the drain cost the driver (Python + JVM) and the cluster (master, workers and
their executors, read from ``/proc`` while the application still runs).

    python bench/_cluster_scale_trial.py --master spark://... --template DIR --work DIR \
        --events N [--small 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import drain
from _proc_cpu import process_table, tree_cpu
from collector_bench import STREAM, make_config, prefill

from pipeline.load.run import SparkClusterEngine
from pipeline.spark import get_spark
from testing.spark_standalone import DRIVER_CONF


def commit_sum(collector: object) -> float:
    """Seconds the collector spent committing (driver side) so far."""
    return float(collector.metrics.commit_seconds.labels(STREAM.table)._sum.get())  # type: ignore[attr-defined]


def small_runs(root: Path, engine: SparkClusterEngine, count: int) -> tuple[float, float]:
    """Mean seconds of one tiny run, and of its commit."""
    totals, commits = [], []
    for i in range(count):
        config = make_config(root / f"small-{i}", output="cluster")
        prefill(config, 1, 100)
        started = time.perf_counter()
        _, collector = asyncio.run(drain(config, engine, 100))
        totals.append(time.perf_counter() - started)
        commits.append(commit_sum(collector))
    return sum(totals) / count, sum(commits) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", required=True)
    parser.add_argument("--template", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--small", type=int, default=5)
    parser.add_argument("--cluster-pids", default="",
                        help="the master's and workers' pids, comma-separated: their trees "
                             "(executors, Python workers) are read around the drain")
    args = parser.parse_args()
    spark = get_spark(args.master, "icefloe-bench-cluster-scale",
                      {"spark.driver.memory": "2g", **DRIVER_CONF})
    engine = SparkClusterEngine(spark, args.partitions)
    warm = make_config(args.work / "warm-up", output="cluster")
    prefill(warm, 20, 1000)
    asyncio.run(drain(warm, engine, 20_000))
    fixed_s, fixed_commit_s = small_runs(args.work, engine, args.small)
    shutil.copytree(args.template / "store", args.work / "drain" / "store")
    config = make_config(args.work / "drain", output="cluster",
                         spark_partitions=args.partitions, max_run_entries=100,
                         max_run_bytes=512 * 1024 * 1024)
    cluster = [int(pid) for pid in args.cluster_pids.split(",") if pid]
    table = process_table()
    exec_before, driver_before = tree_cpu(cluster, table), tree_cpu([os.getpid()], table)
    started = time.perf_counter()
    rate, collector = asyncio.run(drain(config, engine, args.events, until_empty=True))
    seconds = time.perf_counter() - started
    table = process_table()  # before spark.stop(): the executors live as long as the app
    exec_cpu = tree_cpu(cluster, table) - exec_before
    driver_cpu = tree_cpu([os.getpid()], table) - driver_before
    runs = int(sum(s.value for m in collector.metrics.run_seconds.collect()
                   for s in m.samples if s.name.endswith("_count")))
    spark.stop()
    print(json.dumps({"fixed_run_s": fixed_s, "fixed_commit_s": fixed_commit_s,
                      "events_per_s": rate, "drain_s": seconds, "runs": runs,
                      "commit_s": commit_sum(collector), "executor_cpu_s": exec_cpu,
                      "driver_cpu_s": driver_cpu}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
