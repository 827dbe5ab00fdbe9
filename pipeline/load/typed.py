"""A typed stream's binary payloads of one batch → one Arrow table (#39). Runs on executors.

Why here and not in the ingestor: the batch keeps the producer's bytes as they were sent
(envelope version 2), so the decode can resolve every record against the type the table
has *now* — an Avro record written with an older schema is read through Avro's resolution
rules into the newest columns, a Protobuf message with unknown fields keeps to the fields
its stream knows. The formats' own decoders (:mod:`pipeline.load.protobuf_arrow`,
:mod:`pipeline.load.avro_arrow`) build the columns; this module routes rows to them and
says which rows could not be read, so the caller dead-letters those and keeps the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from icefloe.formats.envelope import TypedRecords
from icefloe.typed.codec import FORMAT_AVRO, FORMAT_NAMES, FORMAT_PROTOBUF
from icefloe.typed.kinds import avro_kind, protobuf_kind
from pipeline.load.spec import TypedPlan

_CODES = {"protobuf": FORMAT_PROTOBUF, "avro": FORMAT_AVRO}


@dataclass(slots=True)
class TypedRows:
    """The decoded rows (``table`` row i is record ``kept[i]`` of the batch's rows) and
    the records that could not be read: ``(position, reason, message)``."""

    table: pa.Table
    kept: list[int] = field(default_factory=list)
    bad: list[tuple[int, str, str]] = field(default_factory=list)


def decode_typed(rows: TypedRecords, plan: TypedPlan) -> TypedRows:
    """Decode ``rows`` with ``plan``'s type; a record of another format, with an unknown
    writer schema, or that does not parse is reported in ``bad`` (never guessed)."""
    spec = plan.typed
    want = _CODES[spec.format]
    bad: list[tuple[int, str, str]] = []
    positions: list[int] = []
    for position, fmt in enumerate(rows.formats):
        if fmt != want:
            bad.append((position, "payload_format",
                        f"stream {rows.stream!r} takes {spec.format} payloads; this record "
                        f"holds {FORMAT_NAMES.get(fmt, f'format {fmt}')}"))
        else:
            positions.append(position)
    if spec.format == "protobuf":
        table, kept = _protobuf(rows, plan, positions, bad)
    else:
        table, kept = _avro(rows, plan, positions, bad)
    if table.schema != plan.payload:  # the decoders promise it: never write a drifted table
        raise TypeError(f"stream {rows.stream!r}: decoded schema {table.schema} is not the "
                        f"table's payload schema {plan.payload}")
    bad.sort()
    return TypedRows(table, kept, bad)


def _protobuf(rows: TypedRecords, plan: TypedPlan, positions: list[int],
              bad: list[tuple[int, str, str]]) -> tuple[pa.Table, list[int]]:
    # imported here: its Arrow decoder library loads only where a Protobuf stream is decoded
    from pipeline.load.protobuf_arrow import decode_protobuf

    spec = plan.typed
    kind = protobuf_kind(spec.text, spec.message, spec.enums)
    table, failed = decode_protobuf(kind, [rows.payloads[p] for p in positions])
    return _kept(table, positions, failed, bad)


def _avro(rows: TypedRecords, plan: TypedPlan, positions: list[int],
          bad: list[tuple[int, str, str]]) -> tuple[pa.Table, list[int]]:
    # imported here: its Arrow decoder library loads only where an Avro stream is decoded
    from pipeline.load.avro_arrow import decode_avro

    spec = plan.typed
    reader = avro_kind(spec.text)
    writers = dict(spec.writers)
    known: list[int] = []
    for position in positions:
        schema_id = rows.schema_ids[position]
        if schema_id in writers:
            known.append(position)
        else:
            bad.append((position, "unknown_schema",
                        f"stream {rows.stream!r}: writer schema id {schema_id} is not one "
                        "of the stream's schemas"))
    table, failed = decode_avro(reader, [rows.payloads[p] for p in known],
                                [avro_kind(writers[rows.schema_ids[p]]) for p in known])
    return _kept(table, known, failed, bad)


def _kept(table: pa.Table, positions: Sequence[int], failed: list[tuple[int, str]],
          bad: list[tuple[int, str, str]]) -> tuple[pa.Table, list[int]]:
    """The positions of the rows ``table`` holds, once the decoder's failures (indexes
    into ``positions``) are moved to ``bad``."""
    dropped = {index for index, _ in failed}
    bad.extend((positions[index], "payload_mismatch", message) for index, message in failed)
    return table, [p for i, p in enumerate(positions) if i not in dropped]
