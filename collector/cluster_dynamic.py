"""Table templates on the cluster output path: each template's keys split into its tables.

Why the same split as the embedded path (:class:`collector.dynamic.DynamicTables`), fed
by the executors: each row's table name, the rule it broke and the message are computed
where the rows are (:mod:`pipeline.load.named`, the embedded path's evaluator) and reach
the driver with the keys. :meth:`~collector.dynamic.DynamicTables.admit` then admits
tables in the order of their first row against the same ``max_tables`` count, so both
paths name the same tables and refuse the same rows; a refused row's dead letter needs
the row itself, fetched from the executors (few rows). From here on each table is a
cluster-path table like any other: its plan writes the rows naming it
(:attr:`pipeline.load.WritePlan.named`) in the run's one write job, and it is committed
with its own sequence, window and bulkhead.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from collector.dynamic import DynamicTables, concrete, refused_rows
from collector.routing import Routes, Target
from icefloe.streams.dynamic_tables import is_template
from pipeline.load import ROW, ClusterRunOutput, Named, TableSpec

ClusterTarget = tuple[Target, pa.Table, tuple[int, ...] | None, str | None, str | None]
"""One table of a cluster-path run: target, keys it takes, entries (None: all), ``where``
column, and for a template's table the column of the names its rows gave."""


def table_specs(routes: Routes, versions: Mapping[str, Mapping[int, int]],
                dynamic: DynamicTables) -> tuple[TableSpec, ...]:
    """The run's table templates, one per source and template sink taking part: what the
    executors evaluate (:attr:`pipeline.load.RunSpec.tables`)."""
    out = []
    for source, seen in versions.items():
        for target in routes.takers(source, seen):
            if is_template(target.table):
                out.append(TableSpec(source, target.table,
                                     tuple((c.name, c.type) for c in target.sink.columns),
                                     dynamic.limits_of(target)))
    return tuple(out)


def expand(dynamic: DynamicTables, output: ClusterRunOutput,
           routed: dict[str, ClusterTarget], locations: dict[int, str],
           dead: list[pa.Table]) -> dict[str, ClusterTarget]:
    """``routed`` with each template's keys split into its tables (in routing order, each
    template's tables in order of first row); refused rows' dead letters join ``dead``."""
    out: dict[str, ClusterTarget] = {}
    for table, (target, keys, allowed, where, _) in routed.items():
        columns = output.tables.get((target.source.id, table))
        if not is_template(table) or columns is None:
            out[table] = (target, keys, allowed, where, None)
            continue
        named = Named(*(keys.column(c).combine_chunks() for c in columns))
        parts, refused = dynamic.admit(target, keys.drop_columns(list(columns)), named)
        for part, rules, messages in refused:  # fetched in run order: a rule's refusals
            # are in run order, and those over max_tables share one rule and message
            rows = output.rows_of(target.source.id, part.column(ROW).combine_chunks())
            dead += refused_rows(target, rows, rules, messages, locations)
        for name, part in parts:
            out[name] = (concrete(target, name), part, allowed, where, columns[0])
    return out

