"""icefloe: an object-store-native ingest cluster.

The ``icefloe`` package is the shared core: batch files, record envelopes, the object-store
layer, the fenced manifest queue, configuration and the CLI. It runs no servers itself; the
``ingestor``, ``collector`` and ``pipeline`` packages build on it.

``icefloe.define``, ``icefloe.Key`` and ``icefloe.Precision`` (Python model classes as
streams, :mod:`icefloe.pymodels`) are loaded on first use, so ``import icefloe`` stays as
cheap for the servers as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from icefloe.pymodels import KEY, Key, ModelStream, Precision, define

__version__ = "0.1.0"
__all__ = ["KEY", "Key", "ModelStream", "Precision", "define"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from icefloe import pymodels  # lazy: only producers that define streams pay for it

        return getattr(pymodels, name)
    raise AttributeError(f"module 'icefloe' has no attribute {name!r}")
