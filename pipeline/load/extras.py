"""An evolving stream's undeclared fields as Arrow columns of the table's types.

Schema evolution from the data runs on the collector's driver, on the embedded path
(:func:`collector.evolve.evolve_rows`; the cluster output path hands runs with an evolving
sink to it: :func:`collector.routing.embedded_reason`), and so does the overflow redrive.
The rules themselves (types, conflicts, limits) are the pure ones of
:mod:`icefloe.streams.evolution`; this module only turns their answers into Arrow:
:func:`column_of`, one evolved column of some rows, in the table's Arrow type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from icefloe.streams.evolution import column_value
from icefloe.streams.typespec import parse_type
from pipeline.columns import ARROW_TYPES

AS_IS = frozenset({"long", "double", "string", "boolean"})
"""Flat types whose fitting Python values Arrow takes as they are (ints into double too)."""


def column_of(extras: Sequence[Mapping[str, Any] | None], name: str, kind: str) -> pa.Array:
    """Column ``name`` of type ``kind`` from rows' parsed undeclared fields (None: a row
    without any); each value fits (the plan refused the rows whose values do not)."""
    values = [extra.get(name) if extra else None for extra in extras]
    if kind not in AS_IS:  # json text, nested values: converted one by one
        spec = parse_type(kind)
        values = [column_value(value, spec) for value in values]
    return pa.array(values, type=ARROW_TYPES[kind])
