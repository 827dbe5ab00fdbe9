"""An OTLP export request's protobuf bytes straight to canonical rows, when compiled.

Why: :func:`icefloe.otlp.rows.export_rows` over the parsed message costs ~9 µs per log
record in Python; :mod:`icefloe.otlp._wire` (Cython, built with the other speedups by
``scripts/build_speedups.py``) reads the wire format once and writes the same bytes. It
answers for the signals it knows (logs and traces) and only when it can be sure to read the
bytes as the protobuf runtime would; otherwise — not built, ``ICEFLOE_SPEEDUPS=0``, metrics,
or a request it refers (malformed, not UTF-8, merged messages, a time past 2^63: see its
module doc) — :func:`wire_rows` gives None and the caller runs the reference path, which
gives the same rows or its own refusal. tests/core/test_otlp_wire.py holds them equal.
"""

from __future__ import annotations

from collections.abc import Callable
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
_DECODERS: dict[str, tuple[str, Callable[[bytes], list[bytes]]]] = {} if compiled is None \
    else {"logs": ("logs", compiled.log_rows), "traces": ("spans", compiled.span_rows)}


def wire_rows(signal: str, body: bytes) -> ExportRows | None:
    """``export_rows(signal, <body parsed>, canonical=True)`` read from the bytes, or None
    when the reference path must read them (see above)."""
    decoder = _DECODERS.get(signal)
    if decoder is None or compiled is None:
        return None
    kind, decode = decoder
    try:
        rows = decode(body)
    except compiled.Reference:
        return None
    return ExportRows({kind: rows} if rows else {}, 0, "", canonical=True)
