"""Shared plumbing for icefloe benchmarks: hardware facts, result rows, table and JSON output.

Every benchmark prints a readable table and, with ``--json PATH``, writes
``{"hardware": {...}, "results": [{"name", "value", "unit", "baseline", "ratio"}, ...]}``
so runs on different machines can be compared.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Result:
    """One measured figure and the baseline it was measured against in the same run."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None

    def __post_init__(self) -> None:
        if self.baseline and self.ratio is None:
            self.ratio = round(self.value / self.baseline, 3)


def hardware() -> dict[str, object]:
    """What the numbers ran on."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        mem_gib = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem_gib,
            "python": sys.version.split()[0], "platform": platform.platform()}


def print_table(title: str, results: list[Result]) -> None:
    print(f"\n{title}")
    headers = ["benchmark", "value", "unit", "baseline", "ratio"]
    rows = [[r.name, f"{r.value:,.1f}", r.unit,
             "" if r.baseline is None else f"{r.baseline:,.1f}",
             "" if r.ratio is None else f"{r.ratio:.2f}"] for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.rjust(w) if i else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths, strict=True))))


def write_json(path: str | None, results: list[Result]) -> None:
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"hardware": hardware(),
                                      "results": [asdict(r) for r in results]}, indent=2))
    print(f"\nwrote {path}")
