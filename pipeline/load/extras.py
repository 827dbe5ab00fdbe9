"""An evolving stream's undeclared fields as Arrow, on whichever machine holds the rows.

Why a module of its own, in ``pipeline``: schema evolution from the data converts the
same way on both output paths — the embedded path on the collector
(:func:`collector.evolve.evolve_rows`), the cluster path on the Spark executors, which never
send the rows to the driver (:mod:`pipeline.load.executors`). Executors may import the
pipeline and the core, not the collector, so the conversion lives here and the collector
calls it too. The rules themselves (types, conflicts, limits) are the pure ones of
:mod:`icefloe.streams.evolution`; this module only turns their answers into Arrow:

* :func:`column_of`: one evolved column of some rows, in the table's Arrow type;
* :func:`summarise`: a batch's distinct :data:`~icefloe.streams.evolution.Observation`\\ s
  with the first row showing each (what the driver plans from);
* :func:`refusals`: the rows a plan refuses, with the reason and the undeclared fields;
* :func:`with_evolved`: a batch with its evolved columns added (the cluster path's write).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from icefloe.streams.evolution import (
    EvolveLimits,
    Observation,
    RunPlan,
    column_value,
    observe,
    parse_extras,
)
from icefloe.streams.typespec import parse_type
from pipeline.columns import ARROW_TYPES

AS_IS = frozenset({"long", "double", "string", "boolean"})
"""Flat types whose fitting Python values Arrow takes as they are (ints into double too)."""
EVOLVED_PREFIX = "__icefloe_evolved__"
"""How an evolved column is named in a cluster write batch (next to the wide frame's)."""
SUMMARY_SCHEMA = pa.schema([("row", pa.int64()), ("observation", pa.binary())])
REFUSAL_SCHEMA = pa.schema([("row", pa.int64()), ("message", pa.string()),
                            ("raw", pa.binary())])


def column_of(extras: Sequence[Mapping[str, Any] | None], name: str, kind: str) -> pa.Array:
    """Column ``name`` of type ``kind`` from rows' parsed undeclared fields (None: a row
    without any); each value fits (the plan refused the rows whose values do not)."""
    values = [extra.get(name) if extra else None for extra in extras]
    if kind not in AS_IS:  # json text, nested values: converted one by one
        spec = parse_type(kind)
        values = [column_value(value, spec) for value in values]
    return pa.array(values, type=ARROW_TYPES[kind])


def summarise(rows: Sequence[int], texts: Sequence[str | None], existing: Mapping[str, str],
              max_depth: int) -> pa.RecordBatch:
    """The distinct observations of a batch (rows ``rows``, undeclared fields ``texts``),
    each with the first row showing it, pickled (observations are nested tuples)."""
    first: dict[Observation, int] = {}
    for row, extra in zip(rows, parse_extras(texts), strict=True):
        if extra:
            seen = observe(extra, existing, max_depth)
            if seen and seen not in first:
                first[seen] = row
    return pa.RecordBatch.from_arrays(
        [pa.array(list(first.values()), pa.int64()),
         pa.array([pickle.dumps(o) for o in first], pa.binary())], schema=SUMMARY_SCHEMA)


def merge_summaries(summary: pa.Table) -> list[Observation]:
    """The run's distinct observations in run order, from every partition's summary.

    Why this equals one pass over every row: each partition's list is its rows' distinct
    observations in row order, each with its first row; sorted by that row and kept at
    first sight, they are the run's distinct observations in first-seen order."""
    summary = summary.sort_by([("row", "ascending")])
    out: dict[Observation, None] = {}
    for blob in summary.column("observation").to_pylist():
        out.setdefault(pickle.loads(blob), None)  # our own executors' bytes
    return list(out)


def refusals(rows: Sequence[int], texts: Sequence[str | None], plan: RunPlan,
             limits: EvolveLimits, table: str) -> pa.RecordBatch:
    """The rows of a batch that ``plan`` refuses: row id, reason, undeclared fields."""
    out_rows, messages, raws = [], [], []
    for row, text, extra in zip(rows, texts, parse_extras(texts), strict=True):
        reason = plan.refusal(extra, limits, table=table)
        if reason is not None:
            out_rows.append(row)
            messages.append(reason)
            raws.append(text.encode() if text else None)
    return pa.RecordBatch.from_arrays(
        [pa.array(out_rows, pa.int64()), pa.array(messages, pa.string()),
         pa.array(raws, pa.binary())], schema=REFUSAL_SCHEMA)


def with_evolved(rows: pa.Table, extra: str, columns: Sequence[tuple[str, str]]) -> pa.Table:
    """``rows`` with each evolved column (name, type) added as ``EVOLVED_PREFIX + name``,
    converted from the undeclared fields in column ``extra``."""
    extras = parse_extras(rows.column(extra).to_pylist())
    for name, kind in columns:
        rows = rows.append_column(EVOLVED_PREFIX + name, column_of(extras, name, kind))
    return rows


def batches_of(batches: Iterator[pa.RecordBatch], row: str, extra: str
               ) -> Iterator[tuple[list[int], list[str | None]]]:
    """Row ids and undeclared-field texts of each non-empty batch."""
    for batch in batches:
        if batch.num_rows:
            yield (batch.column(row).to_pylist(), batch.column(extra).to_pylist())
