"""Spark clusters that scale (issue #43 item 3): one drain on a standalone cluster of 1 and
of 2 one-core workers, the cluster output path (executors write the data files).

Each size runs in its own driver process (``_cluster_scale_trial.py``): a warm-up run, then
runs of one 100-event batch file (a run's **fixed cost**: plan, job scheduling, task
launch, the executors' writes, the commit, with almost no data), then the drain of a copy of
one pre-filled store (5M events in a full run). While a trial runs, the CPU seconds of the
driver (its Python and JVM) and of the workers (with their executors and Python workers)
are read from ``/proc``.

This machine has 2 cores: the driver, the master and the workers share them, so the
**measured** scaling from 1 to 2 workers is a floor. The **model** gives what separate cores
would: a drain of N events in R runs takes ``R·F + N·max(e/w, d)`` seconds on ``w`` workers,
where ``F`` is the measured fixed cost per run, ``e`` the executors' measured CPU seconds
per event (one worker) and ``d`` the driver's CPU seconds per event beyond its fixed part —
the driver's share does not shrink with workers. That holds the drain's run count fixed
(runs capped by entries, as measured here); the collector sizes its runs by time by
default (``collector.target_run_s``), so a second model gives each run ``T`` seconds of job
and the fixed cost once: ``T / (F + T) · min(w/e, 1/d)`` events/s. The target: each added
worker adds ≥ 0.8 of one worker's rate, in the model of the default sizing.

Usage: python bench/cluster_scale_bench.py [--quick] [--json PATH] [--events N]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, print_table, write_json
from _scale_processes import spark_lock
from collector_bench import make_config, prefill

from icefloe.config import Config
from testing.spark_standalone import Standalone, spark_env

PER_BATCH = 5000


@dataclass
class Trial:
    workers: int
    fixed_run_s: float
    fixed_commit_s: float
    events_per_s: float
    drain_s: float
    runs: int
    commit_s: float
    executor_cpu_s: float
    driver_cpu_s: float
    wall_s: float


def run_trial(root: Path, template: Path, events: int, workers: int) -> Trial:
    """One cluster size, in its own driver process, CPU read around it."""
    cluster = Standalone(root / f"spark-{workers}", workers=workers)
    cluster.start()
    try:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("_cluster_scale_trial.py")),
             "--master", cluster.url, "--template", str(template),
             "--work", str(root / f"work-{workers}"), "--events", str(events),
             "--cluster-pids", ",".join(str(p.pid) for p in cluster.procs)],
            env=spark_env(), stdout=subprocess.PIPE, text=True, check=True, timeout=3600)
        data = json.loads(done.stdout.strip().splitlines()[-1])
        return Trial(workers, data["fixed_run_s"], data["fixed_commit_s"],
                     data["events_per_s"], data["drain_s"], data["runs"], data["commit_s"],
                     data["executor_cpu_s"], data["driver_cpu_s"], time.monotonic() - started)
    finally:
        cluster.stop()


def modeled_rate(one: Trial, events: int, workers: int) -> float:
    """Events/s on ``workers`` workers with a core each and one for the driver (see the
    module's docstring); fed by the one-worker trial only. The driver's CPU of the drain
    counts whole as per-event work (its fixed part too): a conservative model."""
    per_event_exec = one.executor_cpu_s / events
    per_event_driver = one.driver_cpu_s / events
    seconds = one.runs * one.fixed_run_s + events * max(per_event_exec / workers,
                                                        per_event_driver)
    return events / seconds


def time_sized_rate(one: Trial, events: int, workers: int, run_s: float) -> float:
    """Events/s on ``workers`` workers (a core each, one for the driver) when runs are
    sized by time, as the collector sizes them by default (``collector.target_run_s``:
    a run holds about ``run_s`` of what the jobs read per second, :mod:`collector.run_size`).
    Each run then pays the fixed cost once for ``run_s`` of job, whatever the cluster's
    size, so a larger cluster takes larger runs rather than paying the fixed cost more
    often: ``run_s / (F + run_s) · min(w / e, 1 / d)``, fed by the one-worker trial."""
    per_event_exec = one.executor_cpu_s / events
    per_event_driver = one.driver_cpu_s / events
    job_rate = min(workers / per_event_exec, 1 / per_event_driver)
    return run_s / (one.fixed_run_s + run_s) * job_rate


def results(trials: dict[int, Trial], events: int) -> list[Result]:
    one, two = trials[1], trials[2]
    rows = []
    for t in (one, two):
        label = f"standalone, {t.workers} worker{'s' if t.workers > 1 else ''} x 1 core"
        rows += [
            Result(f"{label}: drain of {events:,} events", t.events_per_s, "events/s",
                   one.events_per_s if t is two else None),
            Result(f"{label}: fixed cost per run (100-event runs)", t.fixed_run_s, "s"),
            Result(f"{label}:   of which the commit", t.fixed_commit_s, "s"),
            Result(f"{label}: runs in the drain", t.runs, "runs"),
            Result(f"{label}: commit seconds in the drain (driver)", t.commit_s, "s"),
            Result(f"{label}: cluster's CPU per event in the drain (workers, executors)",
                   1e6 * t.executor_cpu_s / events, "CPU-us"),
            Result(f"{label}: driver's CPU per event in the drain (Python + JVM)",
                   1e6 * t.driver_cpu_s / events, "CPU-us"),
        ]
    measured = two.events_per_s / one.events_per_s - 1
    model1, model2 = modeled_rate(one, events, 1), modeled_rate(one, events, 2)
    rows += [
        Result("measured: rate added by the 2nd worker, per worker (2 cores shared by "
               "driver, master and workers)", measured, "x one worker"),
        Result("model, a core per worker and one for the driver: 1 worker", model1,
               "events/s"),
        Result("model: 2 workers", model2, "events/s", model1),
        Result(f"model: rate added by the 2nd worker, the drain's {one.runs} runs held "
               "fixed", model2 / model1 - 1, "x one worker"),
    ]
    run_s = Config().collector.target_run_s
    timed1, timed2 = (time_sized_rate(one, events, w, run_s) for w in (1, 2))
    rows += [
        Result(f"model, runs sized by time ({run_s:g} s, the default): 1 worker", timed1,
               "events/s"),
        Result("model, runs sized by time: 2 workers", timed2, "events/s", timed1),
        Result("model, runs sized by time: rate added by the 2nd worker (target >= 0.8)",
               timed2 / timed1 - 1, "x one worker", 0.8),
        Result("model: workers a driver core keeps busy (executors' CPU per event / the "
               "driver's)", one.executor_cpu_s / one.driver_cpu_s, "workers"),
    ]
    return rows


def main() -> None:
    parser = bench_parser(__doc__, "200k events instead of 5M")
    parser.add_argument("--events", type=int, default=None,
                        help="events to drain (default 5,000,000; --quick 200,000)")
    args = parser.parse_args()
    events = args.events or (200_000 if args.quick else 5_000_000)
    batches = max(1, events // PER_BATCH)
    events = batches * PER_BATCH
    trials: dict[int, Trial] = {}
    with spark_lock(), tempfile.TemporaryDirectory(prefix="cluster-scale-") as tmp:
        root = Path(tmp)
        template = make_config(root / "template")
        print(f"pre-filling {events:,} events in {batches} batch files ...", flush=True)
        prefill(template, batches, PER_BATCH)
        for workers in (1, 2):
            print(f"standalone cluster, {workers} worker(s): warm-up, fixed-cost runs, "
                  "drain ...", flush=True)
            trials[workers] = run_trial(root, root / "template", events, workers)
            t = trials[workers]
            print(f"  {t.events_per_s:,.0f} events/s in {t.runs} runs; fixed "
                  f"{t.fixed_run_s:.2f} s per run; trial {t.wall_s:.0f} s", flush=True)
    rows = results(trials, events)
    print_table(f"Spark standalone cluster, cluster output path, {events:,} events", rows)
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
