"""Refusals caused by the client, logged so an operator can see them without drowning.

Why a rate limit: a broken or hostile client can send thousands of bad requests a second,
and a log line (let alone a traceback) per request would cost more than the refusal and
push everything else out of the log. So each reason (the stable error code) gets at most
``lines_per_window`` lines per ``window_s``; past that, lines are only counted, and the
first line after the window says how many were left out. Every refusal is counted in
``icefloe_ingest_client_errors_total{code}`` either way, and the suppressed lines in
``icefloe_ingest_client_error_logs_suppressed_total``.

Client errors are the 4xx refusals other than backpressure (429): bad input, missing or
wrong tokens, unknown streams, oversized or slow bodies. None of them logs a traceback:
a traceback means a bug, and stays reserved for the 500s.
"""

from __future__ import annotations

import logging
from typing import Final

from prometheus_client import Counter

from icefloe.clock import SYSTEM, Clock
from ingestor.errors import IngestError

log = logging.getLogger("icefloe.ingestor.refused")

LINES_PER_WINDOW: Final = 10
WINDOW_S: Final = 60.0
_BACKPRESSURE_STATUS: Final = 429


def is_client_error(error: IngestError) -> bool:
    """A 4xx the client caused and must fix (not 429, which asks it to slow down)."""
    return 400 <= error.http_status < 500 and error.http_status != _BACKPRESSURE_STATUS


class ClientErrorLog:
    """Counts client errors by code and logs a bounded sample of them (see module doc)."""

    def __init__(self, errors: Counter, suppressed: Counter, *,
                 lines_per_window: int = LINES_PER_WINDOW, window_s: float = WINDOW_S,
                 clock: Clock = SYSTEM) -> None:
        self._errors = errors
        self._suppressed = suppressed
        self.lines_per_window = lines_per_window
        self.window_s = window_s
        self._clock = clock
        self._windows: dict[str, list[float]] = {}  # code -> [start, lines, left out]
        self._children: dict[str, Counter] = {}

    def record(self, stream: str, error: IngestError) -> None:
        """Count one refusal of ``stream`` (a configured name or "-") and maybe log it."""
        code = error.code
        child = self._children.get(code)
        if child is None:
            child = self._children[code] = self._errors.labels(code)
        child.inc()
        now = self._clock.monotonic()
        window = self._windows.get(code)
        if window is None or now - window[0] >= self.window_s:
            left_out = 0 if window is None else int(window[2])
            window = self._windows[code] = [now, 0.0, 0.0]
            if left_out:
                log.info("%d more %s refusal(s) were not logged in the last %g s",
                         left_out, code, self.window_s,
                         extra={"code": code, "suppressed": left_out})
        if window[1] >= self.lines_per_window:
            window[2] += 1
            self._suppressed.inc()
            return
        window[1] += 1
        log.info("refused a request to stream %s: %s (%d %s)", stream, error.message[:200],
                 error.http_status, code, extra={"code": code, "stream": stream})
