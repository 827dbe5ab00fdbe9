"""The live progress line of ``icefloe up``: accepted, committed, queue and lag.

Why two modes: on a terminal one line redrawn every second reads like a dashboard; in a
log file (a service manager, CI) the same redraws would be noise, so a plain line is
printed only every ``quiet_every_s`` and only when something changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class Snapshot:
    accepted: float
    rejected: float
    committed: float | None  # None: no collector in this process
    queue_entries: float | None
    lag_s: float | None


def render(s: Snapshot) -> str:
    parts = [f"accepted {int(s.accepted):,}"]
    if s.rejected:
        parts.append(f"rejected {int(s.rejected):,}")
    if s.committed is not None:
        parts.append(f"committed {int(s.committed):,}")
    if s.queue_entries is not None:
        parts.append(f"queue {int(s.queue_entries):,} files")
    if s.lag_s is not None:
        parts.append(f"lag {s.lag_s:.1f} s")
    return "  " + " · ".join(parts)


async def show_progress(read: Callable[[], Snapshot], stop: asyncio.Event, *,
                        out: TextIO = sys.stdout, tty: bool | None = None,
                        interval_s: float = 1.0, quiet_every_s: float = 10.0) -> None:
    """Draw the progress line until ``stop``; ends with a final line and a newline."""
    tty = out.isatty() if tty is None else tty
    printed = ""
    last_print = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
        text = render(read())
        if tty:
            out.write("\r\x1b[2K" + text)
            out.flush()
        elif text != printed and (time.monotonic() - last_print >= quiet_every_s
                                  or stop.is_set()):
            out.write(text + "\n")
            out.flush()
            printed, last_print = text, time.monotonic()
    if tty:
        out.write("\n")
        out.flush()
