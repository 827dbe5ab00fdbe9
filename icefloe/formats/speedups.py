"""The optional compiled hot loops (:mod:`icefloe.formats._speedups`), or None.

Why optional: they are built from Cython source by ``make`` (``scripts/build_speedups.py``)
where a C compiler exists; everywhere else icefloe runs the pure-Python reference code,
with the same results, only slower. ``ICEFLOE_SPEEDUPS=0`` turns them off (to compare, or to
rule them out when debugging).
"""

from __future__ import annotations

import os
from types import ModuleType

ENV = "ICEFLOE_SPEEDUPS"


def enabled() -> bool:
    """False when ``ICEFLOE_SPEEDUPS`` turns every compiled module off (this one and
    :mod:`icefloe.otlp.wire`'s)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _load() -> ModuleType | None:
    if not enabled():
        return None
    try:
        # (compiled where a C compiler is, scripts/build_speedups.py: no source to check)
        from icefloe.formats import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    module: ModuleType = _speedups
    return module


compiled: ModuleType | None = _load()
"""The compiled module, or None (not built, or turned off)."""
