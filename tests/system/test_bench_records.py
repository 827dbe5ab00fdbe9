"""bench/README.md's figures that have a record file are the record's, never typed apart:
each table row below is rendered from ``bench/records/*.json`` (written by the benchmark's
own ``--json``) and must appear in the README as is."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def short(value: float) -> str:
    """``952486.3`` → ``952.5 k``; ``1921522.5`` → ``1.92 M`` (the README's style)."""
    return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.1f} k"


def test_the_template_vs_path_table_is_its_record() -> None:
    record = json.loads((ROOT / "bench/records/mappings_templates.json").read_text())
    readme = (ROOT / "bench/README.md").read_text()
    for unit in ("rows/s", "rows/CPU-s"):
        path, template = [r for r in record["results"] if r["unit"] == unit]
        assert "path column" in path["name"]
        assert "template" in template["name"]
        row = (f"| {unit} | {short(path['value'])} | {short(template['value'])} | "
               f"{template['ratio']:.3f} |")
        assert row in readme, row
