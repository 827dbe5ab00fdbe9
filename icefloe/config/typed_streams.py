"""Config loading for ``format = "protobuf"`` and ``"avro"`` streams (#39).

Why at load time: a typed stream's columns are its type's, so the loader reads the schema
file (relative to the config file), derives the columns and puts them in the stream like
declared ones; every later part (the table, the validator's metadata, the query engine)
then sees an ordinary stream. What a typed stream cannot do yet is refused here, by name,
rather than ignored.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from icefloe.errors import ConfigError
from icefloe.streams.layout import check_raw_partition
from icefloe.streams.model import StreamConfig, TypedSchema
from icefloe.typed.codec import TypeChangeError, TypedPayloadError
from icefloe.typed.columns import check_id_field, typed_columns

TYPED_FORMATS = ("protobuf", "avro")

_REFUSED: dict[str, tuple[Any, str]] = {
    "unknown_fields": ("ignore", "the type decides which fields exist (Protobuf and Avro "
                                 "skip unknown fields by their own rules)"),
    "on_invalid": ("reject", "not supported yet for typed streams: a payload that does not "
                             "parse refuses its request"),
    "payload": ("json", "a typed stream's events are its messages, not opaque entries"),
}


def prepare_raw(raw: dict[str, Any], where: str) -> None:
    """Before decoding the TOML: a typed stream declares no ``columns`` (they are derived);
    an empty list stands in until :func:`with_typed_columns` fills it. Also what only the
    text as written shows: ``partition`` next to ``partition_by`` (any stream; decoded,
    ``partition = "day"`` is the default)."""
    for index, stream in enumerate(raw.get("streams") or ()):
        if isinstance(stream, dict):
            check_raw_partition(stream, f"{where}: streams[{index}]")
        if not isinstance(stream, dict) or stream.get("format") not in TYPED_FORMATS:
            continue
        if "columns" in stream:
            raise ConfigError(
                f"{where}: streams[{index}] ({stream.get('name')!r}): a format = "
                f"{stream['format']!r} stream takes its columns from its type; remove "
                "`columns`")
        stream["columns"] = []


def with_typed_columns(streams: Sequence[StreamConfig], base: Path, where: str
                       ) -> tuple[StreamConfig, ...]:
    """Each typed stream with its schema's text read and its columns derived."""
    return tuple(_typed(s, base, where) if s.format in TYPED_FORMATS else _json(s, where)
                 for s in streams)


def _json(stream: StreamConfig, where: str) -> StreamConfig:
    if stream.schema is not None:
        raise ConfigError(f"{where}: stream {stream.name!r}: `schema` is for format = "
                          "\"protobuf\" or \"avro\" streams; this one is JSON")
    return stream


def _typed(stream: StreamConfig, base: Path, where: str) -> StreamConfig:
    label = f"{where}: stream {stream.name!r} (format = {stream.format!r})"
    for key, (default, why) in _REFUSED.items():
        if getattr(stream, key) != default:
            raise ConfigError(f"{label}: `{key}` is not available: {why}")
    if stream.schema is not None:
        _check_schema_keys(stream.format, stream.schema, label)
    if stream.schema is not None and stream.schema.subject:
        return _subject(stream, label)
    schema = _with_text(stream.format, stream.schema, base, label)
    try:
        columns = typed_columns(stream.format, schema)
    except (TypeChangeError, TypedPayloadError, ValueError) as exc:
        raise ConfigError(f"{label}: {exc}") from None
    if stream.event_id_field is not None:
        check_id_field(stream.event_id_field, columns, label)
    return msgspec.structs.replace(stream, schema=schema, columns=columns)


def _check_schema_keys(format: str, schema: TypedSchema, label: str) -> None:
    """Keys of ``schema`` that would be accepted and mean nothing: refused by name."""
    if schema.subject_version:
        # (the field is the resolver's record of the version it read: it is overwritten
        # at each resolution, and the ingestor takes any version of the subject)
        raise ConfigError(f"{label}: `subject_version` cannot be set: a subject stream "
                          "always follows its subject's latest version (pinning a version "
                          "is not supported); remove subject_version")
    if format == "avro" and schema.enums != "string":
        raise ConfigError(f"{label}: `enums` = {schema.enums!r} is for Protobuf streams; an "
                          "Avro stream keeps enums as their symbol text (supported: enums "
                          "= \"string\", the default); remove enums")


def _subject(stream: StreamConfig, label: str) -> StreamConfig:
    """A stream whose type is a schema registry subject: no text and no columns yet (the
    loader does not read the registry; :mod:`icefloe.registry.subjects` resolves it)."""
    schema = stream.schema
    assert schema is not None
    files = [f"`{key}`" for key in ("descriptor_set", "schema_file")
             if getattr(schema, key)]
    if files or schema.text:
        raise ConfigError(f"{label}: takes its type from `subject` ({schema.subject!r}) or "
                          f"from a file, not both: remove {' and '.join(files) or '`text`'}")
    if stream.format == "protobuf" and not schema.message:
        raise ConfigError(f"{label}: a Protobuf subject stream names its message: schema = "
                          f"{{ subject = \"{schema.subject}\", message = \"pkg.Message\" }}")
    if stream.format == "avro" and schema.message:
        raise ConfigError(f"{label}: `message` is Protobuf's; an Avro subject stream names "
                          "only its `subject`")
    return msgspec.structs.replace(stream, columns=())


def _with_text(format: str, schema: TypedSchema | None, base: Path, label: str
               ) -> TypedSchema:
    """``schema`` with its file's contents in ``text`` (base64 for a descriptor set)."""
    if format == "protobuf":
        if schema is None or not schema.message or not (schema.descriptor_set or schema.text):
            raise ConfigError(f"{label}: needs schema = {{ message = \"pkg.Message\", "
                              "descriptor_set = \"file.binpb\" }")
        if schema.schema_file:
            raise ConfigError(f"{label}: `schema_file` is an Avro schema; a Protobuf "
                              "stream names a `descriptor_set`")
        if schema.descriptor_set and schema.text:
            raise ConfigError(f"{label}: give the type in `descriptor_set` or in `text`, "
                              "not both (the file's contents would replace `text`)")
        if schema.descriptor_set:
            data = _read(base / schema.descriptor_set, label)
            return msgspec.structs.replace(schema, text=base64.b64encode(data).decode())
        return schema
    if schema is None or not (schema.schema_file or schema.text):
        raise ConfigError(f"{label}: needs schema = {{ schema_file = \"file.avsc\" }}")
    if schema.message or schema.descriptor_set:
        raise ConfigError(f"{label}: `message` and `descriptor_set` are Protobuf's; an Avro "
                          "stream names a `schema_file`")
    if schema.schema_file and schema.text:
        raise ConfigError(f"{label}: give the schema in `schema_file` or in `text`, not "
                          "both (the file's contents would replace `text`)")
    if schema.schema_file:
        data = _read(base / schema.schema_file, label)
        try:
            return msgspec.structs.replace(schema, text=data.decode())
        except UnicodeDecodeError:
            raise ConfigError(f"{label}: {schema.schema_file} is not UTF-8 text") from None
    return schema


def _read(path: Path, label: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{label}: cannot read {path}: {exc.strerror}") from None
