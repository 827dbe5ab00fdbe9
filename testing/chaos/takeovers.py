"""Where a collector change's time goes, from the kill to the next commit.

Why measured here and not only as freshness: freshness mixes every fault of a run (store
stalls, ingestor kills) and the machine's load; a takeover's own steps are what a warm
standby can cut. Each change is split into the lease wait (kill -9 -> the new collector's
epoch bump, its ``active:`` log line; for a ``--takeover`` the bump is the start), the
fencing of every table (bump -> ``fenced N tables``), and the rest of the start-up plus
the first run (fenced -> the first snapshot of the new epoch that added rows, read from
Iceberg with pyiceberg like the rest of the verdict).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from icefloe.config import Config

_ACTIVE = re.compile(r"took the queue at epoch (\d+)")
_FENCED = re.compile(r"fenced \d+ tables at epoch (\d+)")


@dataclass
class Change:
    """One collector change the harness caused."""

    kind: str
    """``kill`` (kill -9 of the active one, the warm standby takes over when the lease
    lapses) or ``takeover`` (a ``--takeover`` collector fences the active one)."""
    at: float
    """Wall time of the kill, or of starting the ``--takeover`` collector."""
    log_path: Path | None
    """The log of the collector that becomes active."""
    epoch: int | None = None
    """Its epoch (from its ``ready`` line; None: it never became active)."""
    store_faults: bool = False
    """A store-fault burst was in force during the change."""


def log_times(path: Path | None, epoch: int) -> tuple[float | None, float | None]:
    """Wall times of the ``active: ... at epoch N`` and ``fenced ... at epoch N`` lines of a
    text log (``%(asctime)s`` first, local time, as :func:`icefloe.logs.setup_logging`
    writes it)."""
    active = fenced = None
    if path is None or not path.exists():
        return None, None
    for line in path.read_text(errors="replace").splitlines():
        for pattern in (_ACTIVE, _FENCED):
            found = pattern.search(line)
            if found is None or int(found.group(1)) != epoch:
                continue
            try:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if pattern is _ACTIVE and active is None:
                active = stamp
            elif pattern is _FENCED and fenced is None:
                fenced = stamp
    return active, fenced


def first_commits(config: Config, tables: list[str], epochs: set[int]) -> dict[int, float]:
    """Per epoch, the wall time of its first snapshot that added rows in any of
    ``tables`` (a takeover's fence adds none)."""
    from pyiceberg.exceptions import NoSuchTableError

    from pipeline.iceberg.catalog import open_catalog

    catalog = open_catalog(config.catalog)
    first: dict[int, float] = {}
    for name in tables:
        try:
            snapshots = catalog.load_table(name).snapshots()
        except NoSuchTableError:
            continue
        for snapshot in snapshots:
            summary = snapshot.summary
            if summary is None or int(summary.get("added-records") or 0) <= 0:
                continue
            epoch = int(summary.get("icefloe.epoch") or -1)
            if epoch in epochs:
                first[epoch] = min(first.get(epoch, float("inf")),
                                   snapshot.timestamp_ms / 1000.0)
    return first


def summarise(changes: list[Change], config: Config, tables: list[str]) -> list[dict[str, Any]]:
    """One row per change: seconds from the kill (or the takeover's epoch bump) to the
    first commit, and its parts."""
    epochs = {c.epoch for c in changes if c.epoch is not None}
    commits = first_commits(config, tables, epochs)
    rows = []
    for change in changes:
        row: dict[str, Any] = {"kind": change.kind, "epoch": change.epoch,
                               "store_faults": change.store_faults}
        if change.epoch is not None:
            active, fenced = log_times(change.log_path, change.epoch)
            commit = commits.get(change.epoch)
            start = change.at if change.kind == "kill" else active
            row.update(_parts(start, active, fenced, commit))
        rows.append(row)
    return rows


def _parts(start: float | None, active: float | None, fenced: float | None,
           commit: float | None) -> dict[str, float | None]:
    def span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(b - a, 2)

    return {"to_first_commit_s": span(start, commit), "lease_wait_s": span(start, active),
            "fence_s": span(active, fenced), "start_and_first_run_s": span(fenced, commit)}


def describe(rows: list[dict[str, Any]]) -> list[str]:
    """Report lines, one per change."""
    lines = []
    for row in rows:
        if row.get("to_first_commit_s") is None:
            lines.append(f"    {row['kind']:<8} epoch {row['epoch']}: no commit measured")
            continue
        lines.append(
            f"    {row['kind']:<8} epoch {row['epoch']}: first commit "
            f"{row['to_first_commit_s']:.2f} s = lease {_s(row['lease_wait_s'])} + fence "
            f"{_s(row['fence_s'])} + start, first run {_s(row['start_and_first_run_s'])}"
            + ("  (store faults)" if row["store_faults"] else ""))
    return lines


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
