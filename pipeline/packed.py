"""The packed Spark path: each task's decoded tables travel as Arrow IPC values, not rows.

Why: in a run whose streams have no ``sql`` columns, Spark never needs to look at an
individual event — decoding happens in the Python workers, routing by stream and
deduplication on the driver. Yet the row path (:mod:`pipeline.source`'s wide schema)
makes the JVM turn every event into a Spark row and back into Arrow for ``toArrow``,
which measured about half of a run (bench/README.md). Here a task yields one Spark row
per decoded file and stream: ``_stream`` plus ``_part``, the table as a zstd-compressed
Arrow IPC stream (dead letters have ``_stream`` null). The JVM moves a few compressed
binary values per file; the driver reads them back zero-copy. On a cluster the driver
receives ~6x fewer bytes than with rows.

Runs that do have ``sql`` columns use the row path: those expressions are Spark's to
compute (:func:`needs_rows`). Both paths produce the same :class:`~pipeline.run.RunOutput`
(tested side by side).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from pipeline.decode import Decoded
from pipeline.schema import dead_letter_arrow_schema
from pipeline.spec import RunSpec

PART = "_part"
STREAM = "_stream"
MAX_PART_ROWS = 65_536
"""Rows per packed value: keeps each binary value a few MB even for a 100k-event file."""

PACKED_ARROW_SCHEMA = pa.schema([pa.field(STREAM, pa.string()), pa.field(PART, pa.binary())])


def needs_rows(spec: RunSpec) -> bool:
    """True when a stream of the run has ``sql`` columns, which Spark computes on rows."""
    return any(d.kind == "sql" for stream in spec.streams for d in stream.derived)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=MAX_PART_ROWS)
    return sink.getvalue().to_pybytes()


def pack(decoded: Iterable[Decoded]) -> Iterator[pa.RecordBatch]:
    """One record batch per decoded file: a packed value per stream and slice of rows,
    plus one for the file's dead letters."""
    for out in decoded:
        streams: list[str | None] = []
        parts: list[bytes] = []
        for name, table in out.tables.items():
            for start in range(0, table.num_rows, MAX_PART_ROWS):
                streams.append(name)
                parts.append(_ipc(table.slice(start, MAX_PART_ROWS)))
        if len(out.dead):
            streams.append(None)
            parts.append(_ipc(out.dead.to_arrow()))
        if parts:
            yield pa.RecordBatch.from_arrays(
                [pa.array(streams, pa.string()), pa.array(parts, pa.binary())],
                schema=PACKED_ARROW_SCHEMA)


def unpack(packed: pa.Table) -> tuple[dict[str, pa.Table], pa.Table]:
    """(tables per stream, dead letters) from the collected packed rows, in row order."""
    tables: dict[str, list[pa.Table]] = {}
    dead: list[pa.Table] = []
    streams = packed.column(STREAM).to_pylist()
    index = 0
    for chunk in packed.column(PART).chunks:
        for value in chunk:
            table = pa.ipc.open_stream(value.as_buffer()).read_all()
            stream = streams[index]
            index += 1
            if stream is None:
                dead.append(table)
            elif table.num_rows:
                tables.setdefault(stream, []).append(table)
    dead_table = pa.concat_tables(dead) if dead else dead_letter_arrow_schema().empty_table()
    return {name: pa.concat_tables(parts) for name, parts in tables.items()}, dead_table
