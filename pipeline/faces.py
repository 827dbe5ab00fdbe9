"""Lazy package faces: a package lists its public names and the module each lives in, and a
name is imported on first use (PEP 562).

Why lazy: ``collector/`` imports ``pipeline.load`` and ``pipeline.iceberg`` only through
their faces (tests/system/test_layers.py), and a face that imported every module it lists
would load Spark or pyiceberg's Arrow writer into every process that touches one name.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_face(package: str, home: Mapping[str, str], names: Sequence[str]
              ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: ``home`` maps each public name to
    the module that defines it; a loaded name is kept in the package's namespace, so the
    lookup runs once per name."""

    def getattr_(name: str) -> Any:
        where = home.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        vars(sys.modules[package])[name] = value
        return value

    def dir_() -> list[str]:
        return sorted([*vars(sys.modules[package]), *names])

    return getattr_, dir_
