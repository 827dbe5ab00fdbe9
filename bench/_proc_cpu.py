"""CPU seconds of process trees, read from ``/proc`` (Linux): where a real-processes run's
CPU goes, by role.

Why trees: a collector's Spark runs in a JVM child of the Python process, a standalone
worker's executors in children of the worker, moto's server in a child of its launcher; a
role's CPU is its process and every descendant's.
"""

from __future__ import annotations

import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime + stime in seconds) of one process; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its last ")"
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def process_table() -> dict[int, tuple[int, float]]:
    """pid → (parent pid, CPU seconds) of every process now alive."""
    table: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                table[int(entry)] = stat
    return table


def tree_cpu(roots: list[int], table: dict[int, tuple[int, float]]) -> float:
    """CPU seconds of ``roots`` and all their live descendants in ``table``.

    A descendant that already exited is not counted (its CPU went to its parent's
    ``cutime``, which this does not read): a run's long-lived processes are what matter."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    seen: set[int] = set()
    stack = [pid for pid in roots if pid in table]
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, ()))
    return sum(table[pid][1] for pid in seen)
