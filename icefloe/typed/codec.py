"""What the typed formats share: derived columns, errors, and the envelope's format codes.

Why shared: the ingestor, the collector and the admin API handle a Protobuf stream and an
Avro stream the same way (check a payload, derive columns, decode a batch into Arrow,
refuse an incompatible change), so both formats answer to the same small vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

FORMAT_JSON: Final = 0
"""Envelope payload format: canonical JSON (envelope version 1 records are all JSON)."""
FORMAT_PROTOBUF: Final = 1
"""Envelope payload format: a Protobuf message's binary encoding, no framing."""
FORMAT_AVRO: Final = 2
"""Envelope payload format: an Avro datum's binary encoding, no framing; the envelope's
schema id names the writer schema."""

FORMAT_NAMES: Final = {FORMAT_JSON: "json", FORMAT_PROTOBUF: "protobuf", FORMAT_AVRO: "avro"}


class TypedPayloadError(ValueError):
    """A payload that does not parse with its declared type. ``field`` names the field (a
    dotted path) when the failure is in one, so the client's 400 / INVALID_ARGUMENT can say
    which."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class TypeChangeError(ValueError):
    """A new version of a type that its table cannot follow (a Protobuf field number reused
    with another type, an Avro change its reader cannot resolve); the message names the
    field."""


@dataclass(frozen=True, slots=True)
class TypedColumn:
    """A column derived from a producer's type: its name, its icefloe type string (the
    grammar of :mod:`icefloe.streams.typespec`), whether every event has it, its doc, and
    for Protobuf its field number (how a renamed field is recognised as the same column)."""

    name: str
    type: str
    required: bool = False
    doc: str = ""
    field_number: int | None = None
