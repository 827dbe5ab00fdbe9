"""The docs' generated parts are current, and no benchmark figure is typed by hand.

scripts/gen_docs.py fills the marked parts (figures from bench/results/*.json, the command
table from the parsers, the metric lists from the metric classes). These tests fail when a
marked part is stale, when a result file cannot say where it came from, and when a figure
sits outside a marker, where nothing would keep it true.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_docs  # noqa: E402  (a script, not a package)

BENCH_PAGES = ("docs/benchmarks.md", "bench/README.md")
"""Pages about measurements: every table there is generated, and no rate is typed in their
prose either (a setup parameter is written "per second", a measured rate comes from a
marker)."""

RATE = re.compile(r"\d[\d,.]*\s*(?:[kMG]\s*)?(?:events|rows|records|requests|req|spans|entries|"
                  r"CAS|conflicts|MB|GB|msgs)(?:/s|/CPU-s)\b")
FIGURE_HEADERS = re.compile(r"\b(ratio|baseline|measured|p50|p99|throughput)\b", re.I)


def outside_markers(text: str) -> str:
    """``text`` without its generated parts, fenced code and inline code."""
    text = gen_docs.MARKER.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def tables(text: str) -> list[list[str]]:
    """The Markdown tables of ``text``, each as its lines."""
    found: list[list[str]] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return found


def test_every_generated_part_is_current() -> None:
    before = os.environ.get("COLUMNS")
    assert gen_docs.main(["--check"]) == 0, "run `.venv/bin/python scripts/gen_docs.py`"
    # the usage table formats wide; the process's (and so pytest's report's) width is kept
    assert os.environ.get("COLUMNS") == before


@pytest.mark.parametrize("path", sorted(
    [p.name for p in gen_docs.RESULTS.glob("*.json")
     if (ROOT / "bench" / f"{p.stem}_bench.py").is_file()]
    + [str(p.relative_to(gen_docs.RESULTS)) for p in gen_docs.RESULTS.glob("*-runs/*.json")]))
def test_every_result_file_says_where_it_came_from(path: str) -> None:
    result = json.loads((gen_docs.RESULTS / path).read_text())
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", result["date"])
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", result["commit"]), result["commit"]
    assert result["command"].startswith(".venv/bin/python bench/"), result["command"]
    assert {"cpu", "cores", "memory_gib", "python"} <= set(result["hardware"])
    assert result["results"], "a result file without results"
    for row in result["results"]:
        assert set(row) == {"name", "value", "unit", "baseline", "ratio"}, row


def test_every_target_names_a_measured_figure() -> None:
    targets = tomllib.loads(gen_docs.TARGETS.read_text())
    for name, figures in targets.items():
        measured = {r["name"] for r in gen_docs.load_result(name)["results"]}
        assert set(figures) - measured == set(), f"targets of {name} name no figure"
        for target in figures.values():
            gen_docs.verdict({"value": 1.0, "ratio": 1.0}, target)  # parses


def test_no_figure_table_outside_a_marker() -> None:
    """A table that holds measurements (a ratio or baseline column, or a rate like
    ``12 k events/s``) must be generated; on the benchmark pages any figure at all."""
    typed = []
    for path in gen_docs.markdown_files():
        name = str(path.relative_to(ROOT))
        text = outside_markers(path.read_text())
        if name in BENCH_PAGES:
            typed += [f"{name}: {m.group(0)!r}" for m in RATE.finditer(text)]
            typed += [f"{name}: table {t[0]!r}" for t in tables(text)
                      if not t[0].startswith("| script |")]
            continue
        for table in tables(text):
            if FIGURE_HEADERS.search(table[0]) or any(RATE.search(row) for row in table):
                typed.append(f"{name}: table {table[0]!r}")
    assert typed == [], "figures typed by hand: put them in bench/results/*.json and a marker"


def test_the_command_table_and_the_metric_lists_are_generated() -> None:
    kinds: dict[str, set[str]] = {"commands": set(), "metrics": set()}
    for path in gen_docs.markdown_files():
        for marker in gen_docs.MARKER.finditer(path.read_text()):
            if marker.group("kind") in kinds:
                kinds[marker.group("kind")].add(marker.group("args").strip())
    assert kinds["commands"] == {""}, "one generated command table"
    assert kinds["metrics"] == {"ingestor", "collector", "admin"}


def test_a_stale_part_is_refilled_and_a_typed_figure_is_found(tmp_path: Path) -> None:
    stale = ("<!-- commands:start -->\n| `icefloe nothing` | typed |\n<!-- commands:end -->\n")
    fresh = gen_docs.filled(stale)
    assert "icefloe nothing" not in fresh
    assert "| `icefloe up " in fresh
    assert gen_docs.filled(fresh) == fresh
    page = "| figure | ratio |\n|---|---|\n| HTTP | 0.73 |\n"
    assert FIGURE_HEADERS.search(tables(outside_markers(page))[0][0])
    assert RATE.search("| ingest | 12.3 k events/s |")


def test_should_show_a_figure_that_rounds_onto_its_bound_with_the_digits_that_decide_it() -> None:
    """A ratio of 0.797 printed "0.80" beside "≥ 0.8: not met" reads as a wrong verdict."""
    assert gen_docs.against("0.80", 0.7968, 0.8) == "0.797"
    assert gen_docs.against("0.80", 0.8008, 0.8) == "0.801"
    assert gen_docs.against("0.80", 0.79996, 0.8) == "0.79996"
    assert gen_docs.against("0.80", 0.8, 0.8) == "0.80"  # exactly the bound: as it is
    assert gen_docs.against("0.85", 0.8512, 0.8) == "0.85"  # clear of it: as rounded
    assert gen_docs.against("500", 499.7, 500.0) == "499.700"
    assert gen_docs.against("0.80", 0.7968, None) == "0.80"  # no target


def test_the_table_of_kept_runs_counts_each_rows_rounds_against_its_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose round fell short says so (8 of 9, its lowest ratio); a folder with no
    run is an error naming it, not an empty table."""
    kept = tmp_path / "ingest-runs"
    kept.mkdir()
    rows = [{"name": f"HTTP, run {r}, round {n} (target >= 0.8)", "value": 1.0, "unit": "x",
             "baseline": 1.0, "ratio": 0.9 if (r, n) != (2, 3) else 0.7969}
            for r in (1, 2, 3) for n in (1, 2, 3)]
    (kept / "a.json").write_text(json.dumps({"date": "2026-01-02T00:00:00Z", "commit": "b" * 40,
                                             "load_1m": 1.5, "results": rows}))
    (kept / "b.json").write_text(json.dumps({"date": "2026-01-01T00:00:00Z", "commit": "a" * 40,
                                             "load_1m": 0.5, "results": rows[:3]}))
    monkeypatch.setattr(gen_docs, "RESULTS", tmp_path)
    monkeypatch.setattr(gen_docs, "load_targets", lambda: {"ingest": {
        row["name"]: "ratio >= 0.8" for row in rows}})
    table = gen_docs.runs("ingest").splitlines()
    assert table[2] == "| 2026-01-01T00:00:00Z | `aaaaaaa` | 0.5 | 3 of 3, 0.900 |"
    assert table[3] == "| 2026-01-02T00:00:00Z | `bbbbbbb` | 1.5 | 8 of 9, 0.797 |"
    with pytest.raises(gen_docs.DocsError, match="nope-runs holds no result file"):
        gen_docs.runs("nope")
