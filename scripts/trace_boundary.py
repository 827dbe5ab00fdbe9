"""Count how often one embedded collector run's commit crosses the collector/pipeline line.

Runs ONE named test (default :data:`TEST`: ``run_collector(once=True)`` on the in-process
``LocalEngine``, one run of 25 rows into one table) with a profile function installed
(``sys.setprofile`` in this thread, ``threading.setprofile`` for the threads the test
starts: the collector commits in a worker thread), and traces every call of
:data:`ENTRY` (``collector.service.Collector.commit_run``: a run's output to its tables).

What is counted, precisely: inside one ``commit_run`` call, on the thread running it, every
Python ``call`` and ``return`` event moves control to a frame; that frame's *side* is the
top package of its module (``__name__``) if it is ``collector`` or ``pipeline``, else the
side of the nearest such frame below it on the stack (other code — ``icefloe``, pyarrow,
pyiceberg, the standard library — is transparent). A **crossing** is a ``call`` or
``return`` after which the side differs from the side before it. ``commit_run`` itself is
on the collector side, so a single call into ``pipeline`` and its return is 2 crossings,
and a callback from pipeline into collector code adds 2 more. Other threads (the event
loop running the store coroutines ``block_on`` hands it) are separate stacks and are not
counted.

Usage: ``python scripts/trace_boundary.py [pytest node id]``; prints one JSON line with the
crossings of each ``commit_run`` call and the modules each side touched. Exit status 0 if
the test passed. :func:`trace` is what ``tests/system/test_layers.py`` calls.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEST = "tests/collector/test_run_once.py::test_once_commits_the_queue_and_returns"
SIDES = ("collector", "pipeline")


@dataclass
class Call:
    """One traced ``commit_run`` call."""

    crossings: int = 0
    modules: dict[str, set[str]] = field(default_factory=lambda: {s: set() for s in SIDES})
    path: list[str] = field(default_factory=list)
    """The side changes in order, ``module.function`` of the frame control moved to."""


def _side_of(frame: FrameType | None) -> tuple[str | None, FrameType | None]:
    """The side (top package among :data:`SIDES`) of ``frame`` or the nearest frame below
    it that has one, and that frame."""
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        top = name.split(".", 1)[0]
        if top in SIDES:
            return top, frame
        frame = frame.f_back
    return None, None


class Tracer:
    """The profile function: per thread, records while a ``commit_run`` runs on it."""

    def __init__(self, entry: Any) -> None:
        self.entry = entry
        self.calls: list[Call] = []
        self.local = threading.local()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        state = getattr(self.local, "state", None)
        if state is None:
            if event == "call" and frame.f_code is self.entry:
                call = Call()
                self.calls.append(call)
                self.local.state = (frame, call, "collector")
            return
        root, call, side = state
        if event == "return" and frame is root:
            self.local.state = None
            return
        target = frame if event == "call" else frame.f_back
        now, where = _side_of(target)
        if now is None or where is None:
            return
        call.modules[now].add(where.f_globals["__name__"])
        if now != side:
            call.crossings += 1
            call.path.append(f"{event}->{where.f_globals['__name__']}."
                             f"{where.f_code.co_name}")
            self.local.state = (root, call, now)


def trace(test: str = TEST) -> tuple[int, list[Call]]:
    """Run ``test`` under the tracer; the pytest exit code and each ``commit_run`` call."""
    import pytest

    from collector.service import Collector

    tracer = Tracer(Collector.commit_run.__code__)
    sys.setprofile(tracer)
    threading.setprofile(tracer)
    try:
        code = pytest.main(["-q", "-p", "no:cacheprovider", "-x", str(ROOT / test)
                            if "::" not in test else str(ROOT / test.split("::")[0])
                            + "::" + test.split("::", 1)[1]])
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return int(code), tracer.calls


def main() -> int:
    sys.path.insert(0, str(ROOT))
    test = sys.argv[1] if len(sys.argv) > 1 else TEST
    code, calls = trace(test)
    print(json.dumps({"test": test, "exit": code,
                      "crossings": [c.crossings for c in calls],
                      "path": [c.path for c in calls],
                      "modules": [{s: sorted(m) for s, m in c.modules.items()}
                                  for c in calls]}))
    return code


if __name__ == "__main__":
    sys.exit(main())
