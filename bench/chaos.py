"""Chaos benchmark: what faults cost — the same load with and without them, side by side.

Three chaos runs with the same seed, clients and cluster: a baseline with no fault at all;
the seeded schedule (kill -9 of ingestors and collectors, takeovers, store error bursts,
lost responses, slowness) where each replacement collector boots cold; and the same faults
with a warm standby collector beside the active one, every collector fault a kill -9 of
the active one. Reported: acknowledged events/s and freshness (p50/p99 of the time from
receipt to visibility in Iceberg), each against the baseline, the standby's takeover time
(kill -> active), plus the correctness verdict of every run (any loss or duplicate fails).

    .venv/bin/python bench/chaos.py --quick          # 3 x 15 s of load, ~4-6 min with Spark
    .venv/bin/python bench/chaos.py --duration 10m --json bench/results/chaos.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

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
    plans = (("no faults", False, False), ("faults", True, False),
             ("faults, warm standby", True, True))
    for label, faults, standby in plans:
        print(f"\n== {label}: {duration:g} s of load ==", flush=True)
        runs[label] = Run(Options(duration_s=duration, seed=args.seed, store=args.store,
                                  faults=faults, standby=standby)).execute()
        print(render(runs[label]))
    base = runs["no faults"]
    results: list[Result] = []
    for label in ("faults", "faults, warm standby"):
        results += _rows(label, runs[label], base)
    takeovers = runs["faults, warm standby"]["standby_takeover_s"]
    if takeovers:
        results.append(Result("standby takeover, kill -> active (max)", max(takeovers), "s"))
    print_table("chaos: faults vs. the same run without them", results)
    write_json(args.json, results)
    return 0 if all(run["ok"] for run in runs.values()) else 1


def _rows(label: str, hit: dict[str, Any], base: dict[str, Any]) -> list[Result]:
    """One faulty run's figures against the run without faults."""
    rows = [Result(f"acked events/s ({label})", hit["throughput_events_per_s"], "events/s",
                   base["throughput_events_per_s"])]
    for q in ("p50", "p99"):
        value = hit["freshness_s"]["all"][q]
        reference = base["freshness_s"]["all"][q]
        if value is not None and reference is not None:
            rows.append(Result(f"freshness {q} ({label})", value, "s", reference))
    during = hit["freshness_s"]["during_faults"]["p99"]
    if during is not None:
        rows.append(Result(f"freshness p99 of rows received in fault windows ({label})",
                           during, "s"))
    return [
        *rows,
        Result(f"lost / duplicated events ({label})",
               hit["events"]["lost"] + hit["events"]["duplicates"], "events",
               base["events"]["lost"] + base["events"]["duplicates"]),
        Result(f"kill -9 ({label})", sum(hit["kills"].values()), "processes"),
        Result(f"faults injected ({label})", sum(hit["faults_injected"].values()), "faults"),
    ]


if __name__ == "__main__":
    sys.exit(main())
