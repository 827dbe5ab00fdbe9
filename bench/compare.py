"""Before/after pairs: does a change cost anything? Runs benchmarks on two commits,
interleaved (before, after, before, after, ...), and reports each figure's medians.

Why interleaved: on a shared machine the load drifts over minutes; alternating the two sides
spreads that drift over both instead of charging it to whichever ran second. Each side runs
from a detached git worktree of its commit (``PYTHONPATH`` pointing at it, the shared
``.venv``, the compiled hot loops of this checkout copied in), each benchmark with
``--quick``.

Reported per figure: the median of the after runs (``value``), the median of the before runs
(``baseline``) and a ratio oriented so that above 1 is better: after/before for rates,
before/after for latencies (units ``ms`` and ``s``).

Usage: python bench/compare.py --before REV --after REV [--pairs 3] [--bench ingest ...]
                               [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import Result, print_table, write_json

ROOT = Path(__file__).resolve().parents[1]
LOWER_IS_BETTER = {"ms", "s"}


def worktree(rev: str, where: Path) -> Path:
    """A detached worktree of ``rev`` with this checkout's compiled loops copied in."""
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(where), rev],
                   cwd=ROOT, check=True)
    for built in (ROOT / "icefloe" / "formats").glob("_speedups*.so"):
        shutil.copy2(built, where / "icefloe" / "formats" / built.name)
    return where


def run_bench(tree: Path, bench: str, out: Path) -> dict[str, tuple[float, str]]:
    """One ``--quick`` run of ``bench`` in ``tree``: figure name → (value, unit)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, str(tree / "bench" / f"{bench}_bench.py"), "--quick",
                           "--json", str(out)], cwd=tree, env=env, check=False,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"compare: {bench} failed in {tree}:\n{done.stderr[-2000:]}")
    rows = json.loads(out.read_text())["results"]
    return {r["name"]: (r["value"], r["unit"]) for r in rows}


def compare(before: str, after: str, pairs: int, benches: list[str]) -> list[Result]:
    runs: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    units: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": worktree(before, Path(tmp) / "before"),
                 "after": worktree(after, Path(tmp) / "after")}
        try:
            for turn in range(pairs):
                for side in ("before", "after"):
                    for bench in benches:
                        print(f"pair {turn + 1}/{pairs}: {side} {bench}", flush=True)
                        found = run_bench(trees[side], bench, Path(tmp) / "out.json")
                        for name, (value, unit) in found.items():
                            runs[side].setdefault(f"{bench}: {name}", []).append(value)
                            units[f"{bench}: {name}"] = unit
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                               check=False)
    results = []
    for name in sorted(set(runs["before"]) & set(runs["after"])):
        old, new = statistics.median(runs["before"][name]), statistics.median(runs["after"][name])
        better = (old / new if units[name] in LOWER_IS_BETTER else new / old) if old and new \
            else None
        results.append(Result(name, new, units[name], old,
                              None if better is None else round(better, 3)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the commit before the change")
    parser.add_argument("--after", required=True, help="the commit after the change")
    parser.add_argument("--pairs", type=int, default=3, help="before/after pairs (3)")
    parser.add_argument("--bench", action="append", default=None,
                        help="a benchmark to run (ingest, collector, ...; repeatable; "
                             "default: ingest and collector)")
    parser.add_argument("--quick", action="store_true",
                        help="one pair of queue_bench only (a check that the script works)")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    args = parser.parse_args()
    benches = args.bench or ["ingest", "collector"]
    pairs = 1 if args.quick else args.pairs
    if args.quick:
        benches = ["queue"]
    results = compare(args.before, args.after, pairs, benches)
    print_table(f"after {args.after} vs before {args.before}: medians of {pairs} interleaved "
                "pairs (ratio > 1: after is better)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
