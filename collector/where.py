"""Events no sink of their source takes (routing by content): their dead letters.

The predicates themselves are evaluated by :mod:`pipeline.where`, on the driver (embedded
output path) or on the executors (cluster output path); what both paths do with the events
no predicate took is here, so their dead letters are the same rows; so is what both do with
the events a predicate raised an error on (Spark SQL's ANSI arithmetic: an integer overflow,
a division by zero): reason ``where_error``, a mapping error of that event, never a routing
decision.
"""

from __future__ import annotations

import msgspec
import pyarrow as pa

UNROUTED_REASON = "unrouted"
WHERE_ERROR_REASON = "where_error"
WHERE_ERROR = "__icefloe_where_error"
"""The column of a source's rows that carries the first ``where`` error of each row."""


def unrouted_dead_letters(source: str, rows: pa.Table, locations: dict[int, str]
                          ) -> pa.Table:
    """Dead-letter rows for ``source``'s events no sink took: reason ``unrouted``, the
    event's decoded fields as JSON in ``raw`` (what a redrive sends again once a sink
    takes them), its entry's sequence and batch file."""
    message = f"no sink of source {source!r} takes this event (every where is false or null)"
    return _dead_letters(source, rows, locations, UNROUTED_REASON,
                         pa.array([message] * rows.num_rows, pa.string()))


def where_error_dead_letters(source: str, rows: pa.Table, locations: dict[int, str]
                             ) -> pa.Table:
    """Dead-letter rows for ``source``'s events a ``where`` raised an error on (their
    :data:`WHERE_ERROR` column holds the message): reason ``where_error``, ``raw`` as
    for :func:`unrouted_dead_letters`."""
    messages = rows.column(WHERE_ERROR)
    return _dead_letters(source, rows.drop_columns([WHERE_ERROR]), locations,
                         WHERE_ERROR_REASON, messages)


def reasoned_dead_letters(source: str, rows: pa.Table, locations: dict[int, str],
                          reason: str, messages: pa.Array | pa.ChunkedArray) -> pa.Table:
    """Dead letters of ``source``'s decoded ``rows`` with ``reason`` and a message per
    row, ``raw`` as for :func:`unrouted_dead_letters` (a table template's refused rows:
    :mod:`collector.dynamic`)."""
    return _dead_letters(source, rows, locations, reason, messages)


def _dead_letters(source: str, rows: pa.Table, locations: dict[int, str], reason: str,
                  messages: pa.Array | pa.ChunkedArray) -> pa.Table:
    from pipeline.iceberg import dead_letter_arrow_schema  # lazy: sqlglot

    schema = dead_letter_arrow_schema()
    fields = [n for n in rows.column_names if not n.startswith("_")]
    raws = [msgspec.json.encode({k: v for k, v in row.items() if v is not None})
            for row in rows.select(fields).to_pylist()]
    sequences = rows.column("_sequence")
    return pa.table({
        "stream": pa.array([source] * rows.num_rows, pa.string()),
        "sequence": sequences,
        "location": pa.array([locations.get(s, "") for s in sequences.to_pylist()],
                             pa.string()),
        "record_index": pa.nulls(rows.num_rows, pa.int64()),
        "event_id": rows.column("_event_id"),
        "reason": pa.array([reason] * rows.num_rows, pa.string()),
        "message": messages,
        "raw": pa.array(raws, pa.binary()),
        "received_at": rows.column("_received_at").cast(schema.field("received_at").type),
    }, schema=schema)
