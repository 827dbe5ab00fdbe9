"""Chaos benchmark: what faults cost — the same load with and without them, side by side.

Two chaos runs with the same seed, clients and cluster: a baseline with no fault at all,
then one with the seeded schedule (kill -9 of ingestors and collectors, takeovers, store
error bursts, lost responses, slowness). Reported: acknowledged events/s and freshness
(p50/p99 of the time from receipt to visibility in Iceberg), each against the baseline,
plus the correctness verdict of both runs (any loss or duplicate fails the benchmark).

    .venv/bin/python bench/chaos.py --quick          # 2 x 15 s of load, ~2-3 min with Spark
    .venv/bin/python bench/chaos.py --duration 10m --json bench/results/chaos.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the harness lives in testing/ (never shipped): import it from this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, print_table, write_json

from testing.chaos.__main__ import parse_duration
from testing.chaos.report import render
from testing.chaos.run import Options, Run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="15 s of load per run")
    parser.add_argument("--duration", type=parse_duration, default=90.0)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--store", choices=["local", "s3"], default="local")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    duration = 15.0 if args.quick else args.duration
    runs = {}
    for label, faults in (("no faults", False), ("faults", True)):
        print(f"\n== {label}: {duration:g} s of load ==", flush=True)
        runs[label] = Run(Options(duration_s=duration, seed=args.seed, store=args.store,
                                  faults=faults)).execute()
        print(render(runs[label]))
    base, hit = runs["no faults"], runs["faults"]
    results = [
        Result("acked events/s under faults", hit["throughput_events_per_s"], "events/s",
               base["throughput_events_per_s"]),
    ]
    for q in ("p50", "p99"):
        value = hit["freshness_s"]["all"][q]
        reference = base["freshness_s"]["all"][q]
        if value is not None and reference is not None:
            results.append(Result(f"freshness {q} under faults", value, "s", reference))
    results += [
        Result("lost events", hit["events"]["lost"], "events", base["events"]["lost"]),
        Result("duplicated events", hit["events"]["duplicates"], "events",
               base["events"]["duplicates"]),
        Result("faults injected", sum(hit["faults_injected"].values()), "faults"),
        Result("kill -9", sum(hit["kills"].values()), "processes"),
    ]
    print_table("chaos: faults vs. the same run without them", results)
    write_json(args.json, results)
    return 0 if base["ok"] and hit["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
