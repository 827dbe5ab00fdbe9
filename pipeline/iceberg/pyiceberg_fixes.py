"""A fix for a pyiceberg bug icefloe's nested types run into: null lists of structs.

Why: pyiceberg's Arrow projection (used when it writes *and* when it scans) rebuilds a
list whose elements are structs from the list's offsets alone (a workaround for Arrow
issue 38809), which drops the list's validity: a null ``list<struct<...>>`` comes back as
``[]``. :func:`install` wraps that one step so the rebuilt list carries the original nulls.
It is idempotent and a no-op once pyiceberg keeps the nulls itself
(``tests/pipeline/test_pyiceberg_fixes.py`` says when the wrapper is no longer needed).
Readers outside icefloe (plain pyiceberg scans) still see ``[]`` until pyiceberg is fixed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

_MARK = "_icefloe_keeps_null_lists"
_TARGET = "pyiceberg.io.pyarrow"


def install() -> None:
    """Wrap ``ArrowProjectionVisitor.list`` once per process."""
    from pyiceberg.io.pyarrow import ArrowProjectionVisitor  # lazy: pandas

    original = ArrowProjectionVisitor.list
    if getattr(original, _MARK, False):
        return

    def list_keeping_nulls(self: Any, list_type: Any, list_array: pa.Array | None,
                           value_array: pa.Array | None) -> pa.Array | None:
        result = original(self, list_type, list_array, value_array)
        if result is None or list_array is None or not list_array.null_count or \
                result.null_count == list_array.null_count:
            return result
        return type(result).from_arrays(result.offsets, result.values, type=result.type,
                                        mask=list_array.is_null())

    setattr(list_keeping_nulls, _MARK, True)
    # (a patch of pyiceberg's method, marked with what it wraps: see the module doc)
    list_keeping_nulls.wrapped = original  # type: ignore[attr-defined]
    ArrowProjectionVisitor.list = list_keeping_nulls  # type: ignore[method-assign]


def install_when_imported() -> None:
    """:func:`install` now if pyiceberg's Arrow module is loaded, else right after it loads.

    Why not import it here: ``pyiceberg.io.pyarrow`` imports ``pyarrow.dataset`` and with it
    pandas (~0.7 s), which a one-second ``icefloe query`` that never scans through pyiceberg
    cannot pay. Whoever imports it later, directly or through pyiceberg, gets it fixed.
    """
    if _TARGET in sys.modules:
        install()
    elif not any(isinstance(f, _FixAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _FixAfterImport())


class _FixAfterImport(importlib.abc.MetaPathFinder):
    """Finds ``pyiceberg.io.pyarrow`` through the other finders, and installs the fix once
    its module has run; then leaves ``sys.meta_path``."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_then_install(module: ModuleType) -> None:
            run(module)
            install()

        loader.exec_module = exec_then_install  # type: ignore[method-assign]  # the patch
        return spec
