"""The packed Spark path: each task's decoded tables travel as Arrow IPC values, not rows.

Why: in a run whose streams have no ``sql`` columns, Spark never needs to look at an
individual event — decoding happens in the Python workers, routing by stream and
deduplication on the driver. Yet the row path (:mod:`pipeline.load.source`'s wide schema)
makes the JVM turn every event into a Spark row and back into Arrow for ``toArrow``,
which measured about half of a run (bench/README.md). Here a task yields one Spark row
per decoded file and stream: ``_stream`` plus ``_part``, the table as a zstd-compressed
Arrow IPC stream (dead letters have ``_stream`` null). The JVM moves a few compressed
binary values per file; the driver reads them back zero-copy. On a cluster the driver
receives ~6x fewer bytes than with rows.

Runs that do have ``sql`` columns use the row path: those expressions are Spark's to
compute (:func:`needs_rows`). The choice is per run: one stream with ``sql`` columns puts
every stream of its runs on the (~1.7x slower) row path. Both paths produce the same
:class:`~pipeline.load.run.RunOutput` — tables in the spec's stream order, rows in file order,
the declared column types (checked here, as the row path's schema checks them) — tested
side by side.

Size: Spark re-batches a partition's packed rows into Arrow batches of up to
``maxRecordsPerBatch`` *rows*, and a packed partition has few rows, so one partition can
become one batch, whose binary column has 32-bit offsets (2 GiB).
:func:`packed_partitions` spreads a run over enough partitions to stay far below that.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from pipeline.columns import columns_arrow_schema, dead_letter_arrow_schema
from pipeline.load.decode import Decoded
from pipeline.load.frame import STREAM
from pipeline.load.spec import RunSpec

PART = "_part"
MAX_PART_ROWS = 65_536
"""Rows per packed value: keeps each binary value a few MB even for a 100k-event file."""

PARTITION_BYTES = 256 * 1024 * 1024
"""Batch-file bytes per packed partition at most: its packed values (zstd Arrow IPC, about
the size of the zstd batch files) stay well under the 2 GiB of one Arrow binary column."""

PACKED_ARROW_SCHEMA = pa.schema([pa.field(STREAM, pa.string()), pa.field(PART, pa.binary())])


def packed_partitions(spec: RunSpec) -> int:
    """The spec's partition count, raised so no partition reads over ``PARTITION_BYTES``."""
    total = sum(size for _, _, size, _ in spec.batches)
    return max(spec.partitions, -(-total // PARTITION_BYTES))


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


def unpack(packed: pa.Table, spec: RunSpec) -> tuple[dict[str, pa.Table], pa.Table]:
    """(tables per stream in the spec's order, dead letters) from the collected packed rows,
    rows in the order they were packed.

    Raises:
        ValueError: a packed table does not have its stream's declared columns and types
            (a decoder bug: refused rather than cast silently at commit).
    """
    tables: dict[str, list[pa.Table]] = {}
    dead: list[pa.Table] = []
    values = (value for chunk in packed.column(PART).chunks for value in chunk)  # zero-copy
    for stream, value in zip(packed.column(STREAM).to_pylist(), values, strict=True):
        table = pa.ipc.open_stream(value.as_buffer()).read_all()
        if stream is None:
            dead.append(table)
        elif table.num_rows:
            tables.setdefault(stream, []).append(table)
    dead_table = pa.concat_tables(dead) if dead else dead_letter_arrow_schema().empty_table()
    out: dict[str, pa.Table] = {}
    for stream in spec.streams:
        parts = tables.pop(stream.name, None)
        if parts is None:
            continue
        table = pa.concat_tables(parts)
        expected = columns_arrow_schema(stream.columns)
        if not table.schema.equals(expected):
            raise ValueError(f"stream {stream.name!r}: decoded columns {table.schema} do not "
                             f"match the declared {expected}")
        out[stream.name] = table
    if tables:
        raise ValueError(f"packed rows of streams not in this run: {sorted(tables)}")
    return out, dead_table
