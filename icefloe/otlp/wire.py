"""An OTLP export request's protobuf bytes straight to canonical rows, when compiled.

Why: :func:`icefloe.otlp.rows.export_rows` over the parsed message costs ~9 µs per log
record in Python; :mod:`icefloe.otlp._wire` (Cython, built with the other speedups by
``scripts/build_speedups.py``) reads the wire format once and writes the same bytes. It
answers for logs, traces and metrics (all five kinds of points), and only when it can be
sure to read the bytes as the protobuf runtime would; otherwise — not built,
``ICEFLOE_SPEEDUPS=0``, or a request it refers (malformed, not UTF-8, merged messages, a
time or count past 2^63, a metric without data: see its module doc) —
:func:`wire_rows` gives None and the caller runs the reference path, which gives the same
rows or its own refusal.
tests/core/test_otlp_wire.py holds them equal.
"""

from __future__ import annotations

from types import ModuleType

from icefloe.formats.speedups import enabled
from icefloe.otlp.out import ExportRows

__all__ = ["compiled", "wire_rows"]


def _load() -> ModuleType | None:
    if not enabled():
        return None
    try:
        # (compiled where a C compiler is, scripts/build_speedups.py: no source to check)
        from icefloe.otlp import _wire  # type: ignore[attr-defined]
    except ImportError:
        return None
    module: ModuleType = _wire
    return module


compiled: ModuleType | None = _load()
"""The compiled decoder, or None (not built, or turned off)."""
_KINDS: dict[str, str] = {"logs": "logs", "traces": "spans"}
"""The signals whose requests hold one kind of rows (metrics: a dict per kind)."""


def wire_rows(signal: str, body: bytes) -> ExportRows | None:
    """``export_rows(signal, <body parsed>, canonical=True)`` read from the bytes, or None
    when the reference path must read them (see above)."""
    if compiled is None:
        return None
    try:
        if signal == "metrics":
            found: dict[str, list[bytes]] = compiled.metric_rows(body)
        elif signal in _KINDS:
            rows = (compiled.log_rows if signal == "logs" else compiled.span_rows)(body)
            found = {_KINDS[signal]: rows} if rows else {}
        else:
            return None
    except compiled.Reference:
        return None
    return ExportRows(found, 0, "", canonical=True)
