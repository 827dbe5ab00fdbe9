"""Fresh under faults (issue #43 item 5): ``make chaos``'s run, three times, for its freshness.

Each run is what ``make chaos`` starts (seed 1, 90 s of load, the local store, a warm
standby beside the active collector, as ``icefloe up`` has by default): kill -9 of ingestors
and collectors, ``--takeover`` collectors, store error bursts, lost answers and slowness, on
the seeded schedule; then the independent check that every acknowledged event is stored
exactly once. Reported per run: freshness p50/p99 (receipt to visibility in Iceberg, every
row), lost + duplicated events, and each collector change's kill (or epoch bump) to first
commit. Target: p99 <= 10 s in every run, exact.

The same seed gives the same fault schedule, not the same timings: the machine's load moves
where the faults land in the traffic, so three runs say more than one.

Usage: python bench/chaos_fresh_bench.py [--quick] [--json PATH]
    (--quick: one run of 15 s of load; a full run takes ~15 minutes with Spark)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# the harness lives in testing/ (never shipped): import it from this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, print_table, write_json

from testing.chaos.report import render
from testing.chaos.run import Options, Run

SEED = 1
DURATION_S = 90.0
RUNS = 3


def rows(number: int, result: dict[str, Any]) -> list[Result]:
    """One run's rows of record."""
    label = f"run {number}"
    fresh = result["freshness_s"]["all"]
    out = [Result(f"{label}: freshness p50", fresh["p50"], "s"),
           Result(f"{label}: freshness p99 (target <= 10 s)", fresh["p99"], "s"),
           Result(f"{label}: freshness max", fresh["max"], "s"),
           Result(f"{label}: lost + duplicated events",
                  result["events"]["lost"] + result["events"]["duplicates"], "events"),
           Result(f"{label}: acked events/s", result["throughput_events_per_s"], "events/s")]
    firsts = [c["to_first_commit_s"] for c in result.get("collector_changes", [])
              if c.get("to_first_commit_s") is not None]
    if firsts:
        out.append(Result(f"{label}: collector change to first commit (max)", max(firsts),
                          "s"))
    return out


def main() -> int:
    parser = bench_parser(__doc__, "one run of 15 s of load")
    args = parser.parse_args()
    runs, duration = (1, 15.0) if args.quick else (RUNS, DURATION_S)
    results: list[Result] = []
    exact = True
    for number in range(1, runs + 1):
        print(f"\n== run {number} of {runs}: seed {SEED}, {duration:g} s of load ==",
              flush=True)
        result = Run(Options(duration_s=duration, seed=SEED, store="local")).execute()
        print(render(result), flush=True)
        exact = exact and bool(result["ok"])
        results += rows(number, result)
    print_table("chaos (make chaos: seed 1, local store, warm standby), run by run", results)
    write_json(args.json, results)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
