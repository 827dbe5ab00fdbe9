"""The wide frame a run is read as: its column names and its Arrow schema.

Why one wide schema: a run covers every stream, and a Spark data source has one schema.
Each row carries ``_stream`` and the envelope columns, the payload of stream *i* in columns
``s<i>__<name>`` (null for other streams), and dead letters as msgpack rows in one binary
column ``_dead`` (with ``_stream`` null) — rare rows should not cost nine null columns on
every good row. The Spark data source (:mod:`pipeline.load.source`) yields it, the ``sql``
mappings (:mod:`pipeline.load.mapped`) are written against it, and the driver splits it per
stream (:mod:`pipeline.load.run`, :mod:`pipeline.load.cluster`): all of them name its
columns from here.
"""

from __future__ import annotations

import pyarrow as pa

from pipeline.columns import ARROW_TYPES, ENVELOPE
from pipeline.load.spec import StreamSpec

FORMAT = "icefloe"
"""The data source's name: ``spark.read.format(FORMAT)``."""
DEAD = "_dead"
STREAM = "_stream"
ROW = "_row"
"""A row's stable id in a persisted cluster-path run (``monotonically_increasing_id``)."""
KEY_COLUMNS = (ROW, "_event_id", "_received_at", "_sequence")
"""The keys of a cluster-path run: what the driver collects of each row."""


def struct_column(index: int) -> str:
    return f"s{index}"


def wide_arrow_schema(streams: tuple[StreamSpec, ...]) -> pa.Schema:
    """``_stream``, envelope columns, each stream's columns, ``_dead``."""
    fields = [pa.field(STREAM, pa.string())]
    fields += [pa.field(name, kind) for name, kind in ENVELOPE]
    for i, s in enumerate(streams):
        fields += [pa.field(f"{struct_column(i)}__{name}", ARROW_TYPES[kind])
                   for name, kind in s.columns]
    fields.append(pa.field(DEAD, pa.binary()))
    return pa.schema(fields)
