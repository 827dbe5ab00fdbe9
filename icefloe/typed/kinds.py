"""A typed stream's parsed type, from its config alone, parsed once per process.

Why cached by the config's text: the ingestor checks every payload with the type, the
collector and every Spark executor decode batches with it, and the config carries the
schema's text (:class:`icefloe.streams.model.TypedSchema`) rather than a path, so each of
them rebuilds the same type from the same bytes — once.
"""

from __future__ import annotations

import base64
import functools
from typing import TYPE_CHECKING

from icefloe.streams.model import StreamConfig, TypedSchema

if TYPE_CHECKING:
    from icefloe.typed.avro import AvroType
    from icefloe.typed.protobuf import ProtobufType


@functools.lru_cache(maxsize=64)
def protobuf_kind(text: str, message: str, enums: str = "string") -> ProtobufType:
    """The message ``message`` of a base64 descriptor set ``text``."""
    from icefloe.typed.protobuf import ProtobufType  # here: loads only where one is used

    return ProtobufType.from_descriptor_set(base64.b64decode(text), message,
                                            enums="int" if enums == "int" else "string")


@functools.lru_cache(maxsize=256)
def avro_kind(text: str) -> AvroType:
    """The Avro schema of JSON ``text`` (a stream's reader schema, or a writer's)."""
    from icefloe.typed.avro import AvroType  # here: fastavro loads only where one is used

    return AvroType.from_schema(text)


def stream_kind(stream: StreamConfig) -> ProtobufType | AvroType:
    """The type of a ``format = "protobuf"`` or ``"avro"`` stream (ValueError for JSON)."""
    return schema_kind(stream.format, stream.schema)


def schema_kind(format: str, schema: TypedSchema | None) -> ProtobufType | AvroType:
    if schema is None or not schema.text:
        raise ValueError(f"a format = {format!r} stream needs its schema's text (the "
                         "config loader reads it from the schema file)")
    if format == "protobuf":
        return protobuf_kind(schema.text, schema.message or "", schema.enums)
    if format == "avro":
        return avro_kind(schema.text)
    raise ValueError(f"format {format!r} has no type: only protobuf and avro streams do")
