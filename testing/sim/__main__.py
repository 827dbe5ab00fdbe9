"""``python -m testing.sim``: run seeds, print verdicts, and how to reproduce a failure."""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib
import json
import logging
import multiprocessing
import os
import sys
import time
from typing import Any


def _run(seed: int, verbose: bool = False, mutant: str | None = None) -> dict[str, Any]:
    from testing.sim.mutants import applied
    from testing.sim.scenario import Scenario
    from testing.sim.world import run_seed

    started = time.perf_counter()
    with applied(mutant):
        checker = run_seed(seed, verbose=verbose)
    return {"seed": seed, "ok": not checker.violations, "violations": checker.violations,
            "notes": checker.notes[-40:], "scenario": Scenario.draw(seed).describe(),
            "seconds": round(time.perf_counter() - started, 2), "mutant": mutant,
            **checker.summary()}


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        # string hashing is randomised per process, and so is the order of sets of names;
        # a replay must see the same order: restart with a fixed hash seed
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        given = sys.argv[1:] if argv is None else argv
        os.execve(sys.executable, [sys.executable, "-m", "testing.sim", *given], env)
    parser = argparse.ArgumentParser(
        prog="python -m testing.sim",
        description="Run icefloe's deterministic simulator: one seed builds a cluster "
                    "(ingestors, collectors, registry changes, store faults, crashes) on a "
                    "virtual clock and checks exactly-once invariants. Exit 1 if any seed "
                    "violates one.")
    parser.add_argument("--seed", type=int, action="append",
                        help="run this seed (repeatable); prints its whole story")
    parser.add_argument("--seeds", type=int, default=0,
                        help="run seeds FIRST..FIRST+N-1 in parallel processes")
    parser.add_argument("--first", type=int, default=1, help="first seed of --seeds (1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="parallel processes for --seeds (default: CPU count)")
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON")
    parser.add_argument("--mutant", help="run against a known-broken variant (see "
                        "testing/sim/mutants.py): proves the simulator finds that bug")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show icefloe's own logs (single seeds)")
    args = parser.parse_args(argv)
    seeds = list(args.seed or []) + list(range(args.first, args.first + args.seeds))
    if not seeds:
        parser.error("give --seed N or --seeds N")
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    if len(seeds) == 1:
        results.append(_report(_run(seeds[0], args.verbose, args.mutant), detail=True))
    else:
        # a fresh process per seed: some state outlives a run in its process, and a seed
        # run after another must give what ``--seed N`` (the replay) gives
        with concurrent.futures.ProcessPoolExecutor(
                max(1, args.jobs), mp_context=multiprocessing.get_context("spawn"),
                max_tasks_per_child=1,  # quiet also as the process ends
                initializer=functools.partial(logging.disable, logging.CRITICAL)) as pool:
            # by its importable name: a spawned process cannot find ``__main__._run``
            run = importlib.import_module("testing.sim.__main__")._run
            for result in pool.map(run, seeds, [False] * len(seeds),
                                   [args.mutant] * len(seeds)):
                results.append(_report(result, detail=False))
    failed = [r for r in results if not r["ok"]]
    took = time.perf_counter() - started
    print(f"{len(results)} seeds, {len(failed)} failed, {took:.1f} s "
          f"({100 * took / len(results):.0f} s per 100 seeds with {args.jobs} jobs)")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    return 1 if failed else 0


def _report(result: dict[str, Any], *, detail: bool) -> dict[str, Any]:
    status = "ok  " if result["ok"] else "FAIL"
    print(f"{status} seed {result['seed']:>5}  {result['seconds']:6.1f}s  "
          f"acked={result['events_acked']} commits={result['commits']} "
          f"epochs={result['max_epoch']} faults={result['store_faults']} "
          f"sim={result['simulated_s']}s", flush=True)
    if detail or not result["ok"]:
        print("  " + result["scenario"])
        for note in result["notes"] if detail else []:
            print("  . " + note)
        for violation in result["violations"]:
            print("  ! " + violation)
        if not result["ok"]:
            mutant = f" --mutant {result['mutant']}" if result.get("mutant") else ""
            print(f"  reproduce with: make sim SEED={result['seed']}" if not mutant else
                  f"  reproduce with: .venv/bin/python -m testing.sim --seed "
                  f"{result['seed']}{mutant}")
    sys.stdout.flush()
    return result


if __name__ == "__main__":
    sys.exit(main())
