"""The benchmarks' result files: what ``bench/_common.write_json`` lets through.

Why: the docs render every figure of record from these files (``scripts/gen_docs.py``); a
hook that stopped seeing what it measures produces a percentile of no samples (NaN), which
would be rendered as if it had been measured.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def common() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module("_common")
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_a_figure_of_nothing_is_refused_by_name_and_nothing_is_written(
        common: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    results = [common.Result("measured", 2.0, "s", 1.0),
               common.Result("freshness p99", math.nan, "s"),
               common.Result("slope margin", 1.0, "entries/s", math.inf)]
    with pytest.raises(SystemExit) as refused:
        common.write_json(str(path), results)
    message = str(refused.value)
    assert "2 figure(s) are NaN or infinite" in message
    assert "'freshness p99'" in message
    assert "'slope margin'" in message
    assert "'measured'" not in message
    assert not path.exists()


def test_measured_figures_are_written_with_their_provenance(
        common: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    common.write_json(str(path), [common.Result("rate", 3.0, "events/s", 4.0)])
    written = json.loads(path.read_text())
    assert written["results"] == [{"name": "rate", "value": 3.0, "unit": "events/s",
                                   "baseline": 4.0, "ratio": 0.75}]
    assert {"date", "command", "commit", "hardware"} <= written.keys()


def test_no_result_of_record_holds_a_figure_of_nothing() -> None:
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        rows = json.loads(path.read_text())["results"]
        bad = [r["name"] for r in rows for key in ("value", "baseline", "ratio")
               if isinstance(r.get(key), float) and not math.isfinite(r[key])]
        assert not bad, f"{path.name}: {bad}"
