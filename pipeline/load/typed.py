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

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from icefloe.formats.envelope import TypedRecords
from icefloe.typed.codec import FORMAT_AVRO, FORMAT_NAMES, FORMAT_PROTOBUF
from icefloe.typed.kinds import avro_kind, protobuf_kind
from pipeline.load.spec import TypedPlan
from pipeline.load.split import ColumnarTyped

_CODES = {"protobuf": FORMAT_PROTOBUF, "avro": FORMAT_AVRO}
Rows = TypedRecords | ColumnarTyped
"""A stream's version 2 records: lists (the exact split) or arrays (the columnar one)."""


@dataclass(slots=True)
class TypedRows:
    """The decoded rows (``table`` row i is record ``kept[i]`` of the batch's rows) and
    the records that could not be read: ``(position, reason, message)``."""

    table: pa.Table
    kept: np.ndarray
    bad: list[tuple[int, str, str]] = field(default_factory=list)


def payload_array(rows: Rows) -> pa.BinaryArray:
    """The rows' payloads as one Arrow array (as they are, from the columnar split)."""
    if isinstance(rows.payloads, pa.Array):
        return rows.payloads
    return pa.array(rows.payloads, pa.binary())


def decode_typed(rows: Rows, plan: TypedPlan) -> TypedRows:
    """Decode ``rows`` with ``plan``'s type; a record of another format, with an unknown
    writer schema, or that does not parse is reported in ``bad`` (never guessed)."""
    spec = plan.typed
    formats = np.asarray(rows.formats, dtype=np.int64)
    want = _CODES[spec.format]
    bad = [(int(p), "payload_format",
            f"stream {rows.stream!r} takes {spec.format} payloads; this record holds "
            f"{FORMAT_NAMES.get(int(formats[p]), f'format {int(formats[p])}')}")
           for p in np.flatnonzero(formats != want)]
    positions = np.flatnonzero(formats == want)
    if spec.format == "protobuf":
        table, kept = _protobuf(rows, plan, positions, bad)
    else:
        table, kept = _avro(rows, plan, positions, bad)
    if table.schema != plan.payload:  # the decoders promise it: never write a drifted table
        raise TypeError(f"stream {rows.stream!r}: decoded schema {table.schema} is not the "
                        f"table's payload schema {plan.payload}")
    bad.sort()
    return TypedRows(table, kept, bad)


def _taken(rows: Rows, positions: np.ndarray) -> pa.BinaryArray:
    payloads = payload_array(rows)
    return payloads if len(positions) == len(payloads) else payloads.take(pa.array(positions))


def _protobuf(rows: Rows, plan: TypedPlan, positions: np.ndarray,
              bad: list[tuple[int, str, str]]) -> tuple[pa.Table, np.ndarray]:
    from pipeline.load.protobuf_arrow import decode_protobuf  # here: ptars loads on use

    spec = plan.typed
    kind = protobuf_kind(spec.text, spec.message, spec.enums)
    table, failed = decode_protobuf(kind, _taken(rows, positions))
    return table, _kept(positions, failed, bad)


def _avro(rows: Rows, plan: TypedPlan, positions: np.ndarray,
          bad: list[tuple[int, str, str]]) -> tuple[pa.Table, np.ndarray]:
    from pipeline.load.avro_arrow import decode_avro_by_id  # here: polars loads only on use

    spec = plan.typed
    reader = avro_kind(spec.text)
    writers = dict(spec.writers)
    ids = np.asarray(rows.schema_ids, dtype=np.int64)[positions]
    known = np.isin(ids, np.array(list(writers), dtype=np.int64))
    for position, schema_id in zip(positions[~known], ids[~known], strict=True):
        bad.append((int(position), "unknown_schema",
                    f"stream {rows.stream!r}: writer schema id {int(schema_id)} is not one of "
                    "the stream's schemas (not an Avro schema without references in the "
                    "schema registry document this run read, where the ingestor kept the "
                    "record's writer schema): the record is not read with another schema"))
    positions, ids = positions[known], ids[known]
    kinds = {int(i): avro_kind(writers[int(i)]) for i in np.unique(ids)}
    if not len(positions):
        return plan.payload.empty_table(), positions
    table, failed = decode_avro_by_id(reader, _taken(rows, positions), ids, kinds)
    return table, _kept(positions, failed, bad)


def _kept(positions: np.ndarray, failed: list[tuple[int, str]],
          bad: list[tuple[int, str, str]]) -> np.ndarray:
    """The positions of the rows the decoded table holds, once the decoder's failures
    (indexes into ``positions``) are moved to ``bad``."""
    if not failed:
        return positions
    bad.extend((int(positions[index]), "payload_mismatch", message)
               for index, message in failed)
    return np.delete(positions, [index for index, _ in failed])
