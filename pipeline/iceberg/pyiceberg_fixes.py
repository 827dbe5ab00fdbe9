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

from typing import Any

import pyarrow as pa

_MARK = "_icefloe_keeps_null_lists"


def install() -> None:
    """Wrap ``ArrowProjectionVisitor.list`` once per process."""
    from pyiceberg.io.pyarrow import ArrowProjectionVisitor

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
    list_keeping_nulls.wrapped = original  # type: ignore[attr-defined]
    ArrowProjectionVisitor.list = list_keeping_nulls  # type: ignore[method-assign]
