"""Each table template's verdict per row, evaluated per Arrow batch: code run by the executors.

The cluster output path persists a run's frame with three string columns per table
template of the run's spec (:func:`table_columns`): the table the row names (null where
refused or a row of another stream), the rule it broke and the message saying so — the
embedded path's :func:`pipeline.table_names.table_names` on the same decoded values, so
both paths name the same tables and refuse the same rows. The driver reads only these
columns with the keys; the values a name is made of never leave the executors.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.streams.model import Column
from pipeline.load.frame import STREAM
from pipeline.load.spec import RunSpec, TableSpec
from pipeline.load.wheres import predicate_rows
from pipeline.table_names import table_names

TABLE = "__icefloe_table_"
"""Prefix of the persisted run's columns of each template's verdict."""


def table_columns(index: int) -> tuple[str, str, str]:
    """The persisted run's columns of the spec's ``index``-th template: the table name, the
    rule broken, the message."""
    return f"{TABLE}{index}", f"{TABLE}rule_{index}", f"{TABLE}message_{index}"


def named_columns(table: TableSpec, rows: pa.Table) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Per row of ``rows`` (one stream's decoded rows, its columns by name in their
    declared types): the table ``table``'s template names, the rule, the message."""
    columns = tuple(Column(name, kind) for name, kind in table.columns)
    named = table_names(table.template, columns, table.limits, rows)
    return named.tables, named.rules, named.messages


def table_name_flags(spec: RunSpec, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` of the wide run with :func:`table_columns` of every template of ``spec``
    (null on other streams' rows). Runs on the executors."""
    rows = pa.Table.from_batches([batch])
    arrays, names = list(batch.columns), list(batch.schema.names)
    index = {s.name: i for i, s in enumerate(spec.streams)}
    nothing = pa.scalar(None, pa.string())
    for j, table in enumerate(spec.tables):
        i = index[table.stream]
        mine = pc.fill_null(pc.equal(rows.column(STREAM), table.stream), False)
        mine = mine.combine_chunks() if isinstance(mine, pa.ChunkedArray) else mine
        decoded = predicate_rows(rows, i, spec.streams[i],
                                 tuple(name for name, _ in table.columns))
        for name, value in zip(table_columns(j), named_columns(table, decoded), strict=True):
            arrays.append(pc.if_else(mine, value, nothing))
            names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)
