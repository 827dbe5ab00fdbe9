"""Each sink's ``where``, evaluated per Arrow batch: code run by the executors.

The cluster path persists a run's frame with one boolean column per ``where`` of the
run's spec (whether the sink's predicate takes the row) and one string column of the
error it raised (:func:`where_flags`, inside ``mapInArrow`` on the executors); the
driver reads only the flags, with the keys. :func:`where_verdict` is the same judgement
for one table of rows (the simulator's executors).
"""


from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.streams.model import Column
from pipeline.columns import ARROW_TYPES, ENVELOPE
from pipeline.load.frame import STREAM, struct_column
from pipeline.load.spec import RunSpec, StreamSpec, WhereSpec
from pipeline.where import judge, referenced, where_error_messages

if TYPE_CHECKING:
    pass

WHERE = "__icefloe_where_"
"""Prefix of the persisted run's boolean columns, one per ``where`` of the run's spec
(:func:`where_column`): whether that sink's predicate takes the row."""
WHERE_ERROR = "__icefloe_where_error_"
"""Prefix of the persisted run's string columns, one per ``where``: the error its predicate
raised on the row (Spark SQL's ANSI arithmetic), null where none."""


def where_column(index: int) -> str:
    """The persisted run's boolean column of the spec's ``index``-th ``where``."""
    return f"{WHERE}{index}"


def where_error_column(index: int) -> str:
    """The persisted run's column of the errors of the spec's ``index``-th ``where``."""
    return f"{WHERE_ERROR}{index}"


def _declared(column: pa.Array | pa.ChunkedArray, kind: pa.DataType
              ) -> pa.Array | pa.ChunkedArray:
    """A column as Spark hands it back (no uuid, times in nanoseconds, maybe large
    strings) in its declared Arrow type."""
    return column if column.type == kind else column.cast(kind)


def declared_rows(rows: pa.Table, stream: StreamSpec) -> pa.Table:
    kinds = [ARROW_TYPES[kind] for _, kind in stream.columns] + [k for _, k in ENVELOPE]
    return pa.Table.from_arrays([_declared(rows.column(i), kind)
                                 for i, kind in enumerate(kinds)], names=rows.column_names)


def where_flags(spec: RunSpec, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` of the wide run with one boolean column per ``where`` of ``spec``
    (:func:`where_column`): TRUE where the sink takes the row — a row of its stream, of an
    entry whose version it receives, that the predicate of that version takes (FALSE and
    NULL do not). Runs on the executors; the embedded path applies the same evaluator to
    the same decoded values on the driver (:func:`collector.routing.where_mask`)."""
    rows = pa.Table.from_batches([batch])
    arrays, names = list(batch.columns), list(batch.schema.names)
    errors, error_names = [], []
    index = {s.name: i for i, s in enumerate(spec.streams)}
    for j, where in enumerate(spec.wheres):
        i = index[where.stream]
        flag, failed = _where_mask(where, rows, i, spec.streams[i])
        arrays.append(flag)
        names.append(where_column(j))
        errors.append(failed)
        error_names.append(where_error_column(j))
    return pa.RecordBatch.from_arrays(arrays + errors, names=names + error_names)


def _where_mask(where: WhereSpec, rows: pa.Table, index: int, stream: StreamSpec
                ) -> tuple[pa.Array, pa.Array]:
    """:func:`where_verdict` over the wide batch ``rows``: FALSE (no error) on other
    streams' rows."""
    names = {n for case in where.cases if case.sql is not None
             for n in referenced(case.sql, where.columns)}
    flag, failed = where_verdict(where, predicate_rows(rows, index, stream,
                                                        tuple(sorted(names))))
    mine = pc.fill_null(pc.equal(rows.column(STREAM), where.stream), False)
    mine = mine.combine_chunks() if isinstance(mine, pa.ChunkedArray) else mine
    failed = pc.if_else(mine, failed, pa.scalar(None, pa.string()))
    return pc.and_(mine, flag), (failed.combine_chunks()
                                 if isinstance(failed, pa.ChunkedArray) else failed)


def where_flag(where: WhereSpec, rows: pa.Table) -> pa.Array:
    """Which of ``rows`` (one stream's decoded rows: its columns by name in their declared
    types, and the envelope) the sink of ``where`` takes: a row of an entry in one of its
    cases that the case's predicate takes (None: every row). No nulls."""
    return where_verdict(where, rows)[0]


def where_verdict(where: WhereSpec, rows: pa.Table) -> tuple[pa.Array, pa.Array]:
    """:func:`where_flag`, and per row the message of the error the predicate raised on
    it (null: none), named as the embedded path names it
    (:func:`collector.routing.where_verdict`, through the same
    :func:`pipeline.where.judge`)."""
    sequences = rows.column("_sequence")
    columns = tuple(Column(name, kind) for name, kind in where.columns)
    taken: Any = None
    errors: Any = pa.nulls(rows.num_rows, pa.string())
    for case in where.cases:
        chosen = pc.is_in(sequences, pa.array(case.sequences(), pa.int64()))
        if case.sql is not None:
            verdict = judge(case.sql, columns, rows)
            if verdict.errors is not None:
                failed = where_error_messages(where.sink, where.table, case.sql,
                                              verdict.errors)
                errors = pc.coalesce(errors, pc.if_else(chosen, failed, pa.scalar(
                    None, pa.string())))
            chosen = pc.and_kleene(chosen, verdict.taken)
        taken = chosen if taken is None else pc.or_kleene(taken, chosen)
    if taken is None:
        return pa.array(np.zeros(rows.num_rows, dtype=bool)), errors
    taken = taken.combine_chunks() if isinstance(taken, pa.ChunkedArray) else taken
    return pc.fill_null(taken, False), errors


def predicate_rows(rows: pa.Table, index: int, stream: StreamSpec,
                    names: tuple[str, ...]) -> pa.Table:
    """The decoded values a predicate reads (``names``), as the embedded path holds them:
    the stream's columns under their own names in their declared types, and the envelope;
    a name the stream does not decode is left out (the evaluator reads it as NULL)."""
    kinds = dict(stream.columns)
    arrays, out = [], []
    for name, kind in ENVELOPE:
        arrays.append(_declared(rows.column(name), kind))
        out.append(name)
    for name in names:
        if name in kinds:
            arrays.append(_declared(rows.column(f"{struct_column(index)}__{name}"),
                                    ARROW_TYPES[kinds[name]]))
            out.append(name)
    return pa.Table.from_arrays(arrays, names=out)
