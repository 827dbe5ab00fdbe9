"""Batch file bytes → one Arrow table per stream, plus dead letters. Runs in Spark workers.

Why columnar: a stream's canonical payloads (minified JSON, declared fields only, RFC 3339
UTC timestamps) are joined by newlines in the batch file's record order, so one
``pyarrow.json.read_json`` call with the stream's explicit schema parses a whole batch with
no Python object per event (~6 times cheaper than dicts). Envelope fields (``_event_id``,
``_received_at``, ``_sequence``) are added as whole columns.

Why a per-row fallback: if the block parse fails (a payload that no longer matches the
configured schema, or corrupt bytes that still passed the checksum), only the bad rows may go
to dead letters; the rest of the batch must still land. Only *deterministic* problems become
dead letters — a store or network error is raised, so the collector retries instead of
skipping data.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from icefloe.errors import BatchFormatError
from icefloe.formats.batch import decode_block
from icefloe.formats.envelope import StreamColumns, split_by_stream
from icefloe.streams.invalid import INVALID_REASON, parse_invalid, stream_of_invalid
from pipeline.columns import ENVELOPE, TIMESTAMP, dead_letter_arrow_schema
from pipeline.load.mapped import add_derived, apply_templates
from pipeline.load.native_arrow import read_type, restore
from pipeline.load.spec import EntryFile, StreamPlan, TypedPlan
from pipeline.load.split import ColumnarStream, split_columnar
from pipeline.load.typed import Rows, decode_typed


@dataclass(slots=True)
class DeadLetters:
    """Rows for ``icefloe.dead_letters``, accumulated column-wise."""

    stream: list[str | None] = field(default_factory=list)
    sequence: list[int] = field(default_factory=list)
    location: list[str] = field(default_factory=list)
    record_index: list[int | None] = field(default_factory=list)
    event_id: list[str | None] = field(default_factory=list)
    reason: list[str] = field(default_factory=list)
    message: list[str] = field(default_factory=list)
    raw: list[bytes | None] = field(default_factory=list)
    received_at_ms: list[int | None] = field(default_factory=list)

    def add(self, ref: EntryFile, *, reason: str, message: str, stream: str | None = None,
            index: int | None = None, event_id: str | None = None, raw: bytes | None = None,
            received_at_ms: int | None = None) -> None:
        self.stream.append(stream)
        self.sequence.append(ref.sequence)
        self.location.append(ref.location)
        self.record_index.append(index)
        self.event_id.append(event_id)
        self.reason.append(reason)
        self.message.append(message)
        self.raw.append(raw)
        self.received_at_ms.append(received_at_ms)

    def __len__(self) -> int:
        return len(self.reason)

    _FIELDS = ("stream", "sequence", "location", "record_index", "event_id", "reason",
               "message", "raw", "received_at_ms")

    def encode_rows(self) -> list[bytes]:
        """Each row as one msgpack value: how dead letters ride in a single column."""
        encode = msgspec.msgpack.encode
        return [encode(row) for row in zip(*(getattr(self, f) for f in self._FIELDS),
                                           strict=True)]

    @classmethod
    def decode_rows(cls, rows: list[bytes]) -> DeadLetters:
        out = cls()
        columns = [getattr(out, f) for f in cls._FIELDS]
        for raw in rows:
            for column, value in zip(columns, msgspec.msgpack.decode(raw), strict=True):
                column.append(value)
        return out

    def to_arrow(self) -> pa.Table:
        received = pa.array(self.received_at_ms, pa.int64())
        return pa.table({
            "stream": pa.array(self.stream, pa.string()),
            "sequence": pa.array(self.sequence, pa.int64()),
            "location": pa.array(self.location, pa.string()),
            "record_index": pa.array(self.record_index, pa.int64()),
            "event_id": pa.array(self.event_id, pa.string()),
            "reason": pa.array(self.reason, pa.string()),
            "message": pa.array(self.message, pa.string()),
            "raw": pa.array(self.raw, pa.binary()),
            "received_at": pc.multiply(received, 1000).cast(TIMESTAMP),
        }, schema=dead_letter_arrow_schema())


@dataclass(slots=True)
class Decoded:
    """One batch file decoded: ``tables[stream]`` rows (payload + meta columns), dead letters."""

    tables: dict[str, pa.Table] = field(default_factory=dict)
    dead: DeadLetters = field(default_factory=DeadLetters)


def _parse_block(ndjson: bytes, schema: pa.Schema) -> pa.Table:
    """``read_json`` with the explicit schema; ``date`` columns are read as text and cast,
    because Arrow's JSON reader only takes dates as day numbers while canonical payloads
    carry ISO dates (``2026-11-23``)."""
    dates = [i for i, f in enumerate(schema) if pa.types.is_date32(f.type)]
    read_schema = schema
    for i in dates:
        read_schema = read_schema.set(i, pa.field(schema.field(i).name, pa.string()))
    natives = _native_columns(schema)
    for i, read in natives:
        read_schema = read_schema.set(i, pa.field(schema.field(i).name, read))
    table = pajson.read_json(
        io.BytesIO(ndjson),
        read_options=pajson.ReadOptions(use_threads=False, block_size=max(len(ndjson), 1 << 16)),
        parse_options=pajson.ParseOptions(explicit_schema=read_schema,
                                          unexpected_field_behavior="ignore"),
    ).select(schema.names)
    for i in dates:
        table = table.set_column(i, schema.field(i), pc.cast(table.column(i), pa.date32()))
    for i, _ in natives:
        table = table.set_column(i, schema.field(i), restore(table.column(i), schema.field(i).type))
    return table


def _native_columns(schema: pa.Schema) -> list[tuple[int, pa.DataType]]:
    """``(position, type read as)`` of the columns the JSON reader cannot parse as declared
    (binary, uuid, time, map, nested dates; see :mod:`pipeline.load.native_arrow`)."""
    found = []
    for i, f in enumerate(schema):
        if pa.types.is_date32(f.type):
            continue
        read = read_type(f.type)
        if read != f.type:
            found.append((i, read))
    return found


def _meta_columns(ids: Sequence[str] | pa.Array, received_ms: Sequence[int] | np.ndarray,
                  sequence: int) -> list[pa.Array]:
    count = len(ids)
    received = pc.multiply(pa.array(received_ms, pa.int64()), 1000).cast(TIMESTAMP)
    id_column = ids if isinstance(ids, pa.Array) else pa.array(ids, pa.string())
    return [id_column, received, pa.repeat(pa.scalar(sequence, pa.int64()), count)]


def _with_meta(payload: pa.Table, ids: Sequence[str] | pa.Array,
               received_ms: Sequence[int] | np.ndarray, sequence: int) -> pa.Table:
    columns = list(payload.columns) + _meta_columns(ids, received_ms, sequence)
    names = payload.column_names + [name for name, _ in ENVELOPE]
    return pa.Table.from_arrays(columns, names=names)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]


def _as_lists(cols: StreamColumns | ColumnarStream) -> StreamColumns:
    if isinstance(cols, StreamColumns):
        return cols
    return StreamColumns(cols.stream, cols.event_ids.to_pylist(), cols.received_at_ms.tolist(),
                         cols.record_indexes.tolist(), cols.ndjson,
                         None if cols.metas is None else cols.metas.to_pylist())


Plan: TypeAlias = "pa.Schema | StreamPlan | TypedPlan"
"""How to decode one stream: its payload schema, a plan that also derives columns, or a
typed stream's type."""


def parse_stream(cols: StreamColumns | ColumnarStream, plan: Plan, ref: EntryFile,
                 dead: DeadLetters, kept: list[int] | None = None) -> pa.Table:
    """A stream's rows of one batch; rows that do not parse go to ``dead``. When the slow
    path drops rows, the positions of the rows it kept are appended to ``kept``."""
    if isinstance(plan, TypedPlan):
        raise TypeError(f"stream {cols.stream!r} is typed: its records decode with "
                        "decode_typed, not as JSON lines")
    if isinstance(plan, StreamPlan):
        return _parse_planned(cols, plan, ref, dead)
    schema = plan
    try:
        payload = _parse_block(cols.ndjson, schema)
        if payload.num_rows == len(cols.event_ids):
            return _with_meta(payload, cols.event_ids, cols.received_at_ms, ref.sequence)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    # Slow path: parse each row alone so that only the bad ones are dead-lettered.
    cols = _as_lists(cols)
    lines = cols.ndjson.split(b"\n")[: len(cols.event_ids)]
    good: list[pa.Table] = []
    ids: list[str] = []
    received: list[int] = []
    for position, (line, event_id, at_ms, index) in enumerate(zip(
            lines, cols.event_ids, cols.received_at_ms, cols.record_indexes, strict=False)):
        try:
            row = _parse_block(line + b"\n", schema)
            if row.num_rows != 1:
                raise pa.ArrowInvalid(f"payload parsed into {row.num_rows} rows, expected 1")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            dead.add(ref, reason="payload_mismatch", message=_first_line(exc),
                     stream=cols.stream, index=index, event_id=event_id, raw=line,
                     received_at_ms=at_ms)
            continue
        good.append(row)
        ids.append(event_id)
        received.append(at_ms)
        if kept is not None:
            kept.append(position)
    payload = (pa.concat_tables(good) if good
               else schema.empty_table())
    return _with_meta(payload, ids, received, ref.sequence)


def _parse_planned(cols: StreamColumns | ColumnarStream, plan: StreamPlan, ref: EntryFile,
                   dead: DeadLetters) -> pa.Table:
    """A stream with derived columns: parse the payloads, then add the derived columns
    from the envelope (rows kept after a slow-path parse keep their own envelope data)."""
    rows: list[int] = []
    table = parse_stream(cols, plan.payload, ref, dead, rows)
    if table.num_rows == len(cols.event_ids):
        ids, received, metas = cols.event_ids, cols.received_at_ms, cols.metas
    else:  # some rows became dead letters: line the envelope data up with the kept rows
        lists = _as_lists(cols)
        ids = [lists.event_ids[i] for i in rows]
        received = [lists.received_at_ms[i] for i in rows]
        metas = None if lists.metas is None else [lists.metas[i] for i in rows]
    payload = table.drop_columns([name for name, _ in ENVELOPE])
    full = add_derived(payload, plan, ids, received, metas)
    full, failed = apply_templates(full, plan, received, metas, ref.sequence)
    if failed:
        full, table = _drop_failed(full, table, failed, cols, rows, ref, dead)
    return pa.Table.from_arrays(
        full.columns + [table.column(name) for name, _ in ENVELOPE],
        names=full.column_names + [name for name, _ in ENVELOPE])


def _drop_failed(full: pa.Table, table: pa.Table, failed: dict[int, tuple[str, str]],
                 cols: StreamColumns | ColumnarStream, rows: list[int], ref: EntryFile,
                 dead: DeadLetters) -> tuple[pa.Table, pa.Table]:
    """Rows whose ``template`` failed become dead letters (reason ``template_error``, the
    column and Keboola's message, the event's JSON text as ``raw``); the rest is kept."""
    lists = _as_lists(cols)
    ids = table.column("_event_id").to_pylist()
    received = pc.cast(table.column("_received_at"), pa.int64()).to_pylist()
    for row, (column, reason) in sorted(failed.items()):
        source = rows[row] if len(rows) == table.num_rows and rows else row
        index = lists.record_indexes[source] if source < len(lists.record_indexes) else None
        body = payload_text(table, column, row)
        dead.add(ref, reason="template_error",
                 message=f"column {column!r} of stream {cols.stream!r}: {reason}",
                 stream=cols.stream, index=index, event_id=ids[row],
                 raw=None if body is None else body.encode(),
                 received_at_ms=received[row] // 1000 if received[row] is not None else None)
    keep = pa.array([i not in failed for i in range(full.num_rows)])
    return full.filter(keep), table.filter(keep)


def payload_text(table: pa.Table, column: str, row: int) -> str | None:
    """The event's JSON text a template column held before evaluation."""
    value = table.column(column)[row].as_py()
    return value if isinstance(value, str) else None


def decode_batch_file(data: bytes, ref: EntryFile, schemas: Mapping[str, Plan]) -> Decoded:
    """Decode a verified batch file: ``schemas`` maps each configured stream to its payload
    schema. A corrupt file yields one dead letter (its key and reason, not its bytes)."""
    out = Decoded()
    try:
        block, count = decode_block(data)
        fast = split_columnar(block, count)
        split = split_by_stream(block, count) if fast is None else fast
    except BatchFormatError as exc:
        out.dead.add(ref, reason=f"corrupt_batch:{exc.reason}", message=str(exc))
        return out
    for bad in getattr(split, "bad", ()):
        out.dead.add(ref, reason=f"bad_envelope:{bad.reason}", message=bad.message,
                     index=bad.index, raw=bad.data)
    for stream, rows in getattr(split, "typed", {}).items():
        _add_typed(out, ref, rows, schemas.get(stream))
    for stream, cols in split.items():
        origin = stream_of_invalid(stream)
        if origin is not None:  # refused at ingest, kept by on_invalid = "dead_letter"
            _add_invalid(out.dead, ref, origin, _as_lists(cols))
            continue
        schema = schemas.get(stream)
        if schema is None:
            _dead_rows(out.dead, ref, _as_lists(cols), "unknown_stream",
                       f"stream {stream!r} is not configured")
            continue
        if isinstance(schema, TypedPlan):  # JSON records of a typed stream: never guessed
            _dead_rows(out.dead, ref, _as_lists(cols), "payload_format",
                       f"stream {stream!r} takes {schema.typed.format} payloads; this record "
                       "holds JSON")
            continue
        table = parse_stream(cols, schema, ref, out.dead)
        typed = out.tables.get(stream)
        out.tables[stream] = table if typed is None else pa.concat_tables([typed, table])
    return out


def _dead_rows(dead: DeadLetters, ref: EntryFile, cols: StreamColumns, reason: str,
               message: str) -> None:
    for line, event_id, at_ms, index in zip(
            cols.ndjson.split(b"\n"), cols.event_ids, cols.received_at_ms,
            cols.record_indexes, strict=False):
        dead.add(ref, reason=reason, message=message, stream=cols.stream, index=index,
                 event_id=event_id, raw=line, received_at_ms=at_ms)


def _add_typed(out: Decoded, ref: EntryFile, rows: Rows, plan: Plan | None) -> None:
    """A stream's version 2 records: decoded into ``out.tables`` when the stream is typed;
    otherwise (an unknown stream, a JSON stream) each becomes a dead letter saying why."""
    stream = rows.stream
    if not isinstance(plan, TypedPlan):
        reason = "unknown_stream" if plan is None else "payload_format"
        message = f"stream {stream!r} is not configured" if plan is None else \
            f"stream {stream!r} takes JSON payloads; this record holds a binary one"
        for i in range(len(rows.record_indexes)):
            _dead_typed(out.dead, ref, rows, i, reason, message)
        return
    decoded = decode_typed(rows, plan)
    for i, reason, message in decoded.bad:
        _dead_typed(out.dead, ref, rows, i, reason, message)
    kept = decoded.kept
    ids = rows.event_ids
    every = len(kept) == len(ids)
    if isinstance(ids, pa.Array):
        ids = ids if every else ids.take(pa.array(kept))
    else:
        ids = ids if every else [ids[i] for i in kept]
    received = np.asarray(rows.received_at_ms, dtype=np.int64)
    out.tables[stream] = _with_meta(decoded.table, ids, received if every else received[kept],
                                    ref.sequence)


def _dead_typed(dead: DeadLetters, ref: EntryFile, rows: Rows, i: int, reason: str,
                message: str) -> None:
    """Version 2 record ``i`` of ``rows`` as a dead letter (its binary payload as ``raw``)."""
    event_id, payload = rows.event_ids[i], rows.payloads[i]
    dead.add(ref, reason=reason, message=message, stream=rows.stream,
             index=int(rows.record_indexes[i]),
             event_id=event_id.as_py() if isinstance(event_id, pa.Scalar) else event_id,
             raw=payload.as_py() if isinstance(payload, pa.Scalar) else payload,
             received_at_ms=int(rows.received_at_ms[i]))


def _add_invalid(dead: DeadLetters, ref: EntryFile, stream: str, cols: StreamColumns) -> None:
    """Each invalid event an ingestor kept: a dead letter with its reason and the event's
    bytes as sent (``icefloe.streams.invalid``), committed with the entry like any row."""
    for line, event_id, at_ms, index in zip(
            cols.ndjson.split(b"\n"), cols.event_ids, cols.received_at_ms,
            cols.record_indexes, strict=False):
        try:
            message, raw = parse_invalid(line)
        except (msgspec.DecodeError, ValueError) as exc:
            message, raw = f"unreadable invalid-event record: {exc}", line
        dead.add(ref, reason=INVALID_REASON, message=message, stream=stream, index=index,
                 event_id=event_id, raw=raw, received_at_ms=at_ms)


def decode_payload_rows(lines: Sequence[bytes], event_ids: Sequence[str],
                        received_ms: Sequence[int], sequences: Sequence[int],
                        schema: pa.Schema) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Parse canonical payloads one by one (dead-letter redrive): the rows that now fit
    ``schema`` with their ids, receive times and own sequences, and ``(index, reason)`` for
    each that still does not."""
    good: list[pa.Table] = []
    kept: list[int] = []
    still_bad: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        try:
            row = _parse_block(line.rstrip(b"\n") + b"\n", schema)
            if row.num_rows != 1:
                raise pa.ArrowInvalid(f"payload parsed into {row.num_rows} rows, expected 1")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            still_bad.append((index, _first_line(exc)))
            continue
        good.append(row)
        kept.append(index)
    payload = pa.concat_tables(good) if good else schema.empty_table()
    received = pc.multiply(pa.array([received_ms[i] for i in kept], pa.int64()),
                           1000).cast(TIMESTAMP)
    columns = [*payload.columns, pa.array([event_ids[i] for i in kept], pa.string()),
               received, pa.array([sequences[i] for i in kept], pa.int64())]
    names = payload.column_names + [name for name, _ in ENVELOPE]
    return pa.Table.from_arrays(columns, names=names), still_bad
