"""A stream whose type is a subject of icefloe's schema registry (#39): ``schema = {
subject = "clicks-value" }``.

Why resolved by the processes and not the config loader: the loader reads files, not the
object store, and a subject's latest version changes while the processes run. The
ingestor resolves its subject streams when it starts and whenever it reads the registry
document again (a record naming an id it does not know yet); the collector resolves them
once per run, from the document it reads after the run's entries (so every id an ingestor
accepted is in it). Resolving fills ``schema.text`` exactly as a schema file would have
(Avro: the version's canonical schema; Protobuf: the version's files as a base64
``FileDescriptorSet``) and derives the columns from it, so everything downstream — the
table, its evolution, the decode — sees an ordinary typed stream. A new version changes
the text, hence the columns: the collector evolves the table before the run's rows land.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Mapping

import msgspec

from icefloe.errors import ConfigError
from icefloe.registry.model import Registry, Source
from icefloe.schemas.model import SchemaDocument, SchemaRecord
from icefloe.schemas.store import SchemaStore
from icefloe.streams.model import Column, StreamConfig, TypedSchema
from icefloe.typed.codec import TypeChangeError, TypedPayloadError
from icefloe.typed.columns import check_id_field, typed_columns

REGISTRY_TYPES = {"avro": "AVRO", "protobuf": "PROTOBUF"}
"""A stream format → the registry's ``schemaType`` its subject must hold."""


class SubjectError(ValueError):
    """A subject stream's subject cannot give it a type: missing, another schema type,
    the message not in it. The message names the stream and the subject."""

    def __init__(self, stream: str, subject: str, why: str, *, missing: bool = False
                 ) -> None:
        super().__init__(f"stream {stream!r}: schema registry subject {subject!r} {why}")
        self.stream = stream
        self.subject = subject
        self.missing = missing
        """The subject has no live version (maybe not registered yet)."""


def is_subject_stream(stream: StreamConfig) -> bool:
    return stream.schema is not None and bool(stream.schema.subject)


def has_subjects(registry: Registry) -> bool:
    """Whether a source of ``registry`` takes its type from a subject."""
    return any(s.schema is not None and s.schema.subject for s in registry.sources)


def subject_ids(doc: SchemaDocument, subject: str) -> frozenset[int]:
    """The schema ids of every version ``subject`` has (soft-deleted ones too: records
    written with them may still be on their way)."""
    found = doc.subject(subject)
    return frozenset(v.id for v in found.versions) if found is not None else frozenset()


def resolve_schema(stream: str, format: str, schema: TypedSchema, doc: SchemaDocument,
                   store: SchemaStore) -> TypedSchema:
    """``schema`` with its subject's latest live version as ``text``.

    Raises:
        SubjectError: the subject has no live version, holds another schema type, uses
            references an Avro stream cannot follow, or lacks the Protobuf message.
    """
    name = schema.subject
    assert name
    found = doc.subject(name)
    if found is None or not found.live():
        raise SubjectError(stream, name, "has no version in the schema registry (register "
                                         "the schema first)", missing=True)
    entry, record = store.version_of(doc, name, "latest")
    wanted = REGISTRY_TYPES.get(format, format)
    if record.schema_type != wanted:
        raise SubjectError(stream, name, f"holds a {record.schema_type} schema (version "
                                         f"{entry.version}, id {record.id}); a format = "
                                         f"{format!r} stream needs {wanted}")
    if format == "avro":
        if record.references:
            raise SubjectError(stream, name, f"version {entry.version} uses schema "
                                             "references, which streams do not resolve yet")
        text = record.canonical
    else:
        text = _descriptor_set(stream, name, schema.message or "", doc, store, record)
    return msgspec.structs.replace(schema, text=text, subject_version=entry.version)


def _descriptor_set(stream: str, subject: str, message: str, doc: SchemaDocument,
                    store: SchemaStore, record: SchemaRecord) -> str:
    from icefloe.typed.protobuf import ProtobufType  # why: protobuf loads only when used

    parsed = store.parsed(doc, record)
    try:
        kind = ProtobufType.from_files(list(parsed.files.values()), message)
    except (TypeChangeError, TypedPayloadError, ValueError, KeyError) as exc:
        raise SubjectError(stream, subject, f"does not give message {message!r}: "
                                            f"{exc}") from None
    return base64.b64encode(kind.descriptor_set()).decode()


def resolve_stream(stream: StreamConfig, doc: SchemaDocument, store: SchemaStore
                   ) -> StreamConfig:
    """A subject stream with its type's text and columns (other streams unchanged)."""
    if not is_subject_stream(stream):
        return stream
    assert stream.schema is not None
    schema = resolve_schema(stream.name, stream.format, stream.schema, doc, store)
    return msgspec.structs.replace(stream, schema=schema, columns=_columns(
        stream.name, stream.format, schema, stream.event_id_field))


def resolve(streams: Iterable[StreamConfig], doc: SchemaDocument, store: SchemaStore
            ) -> tuple[StreamConfig, ...]:
    """Every subject stream of ``streams`` resolved (raises :class:`SubjectError`)."""
    return tuple(resolve_stream(s, doc, store) for s in streams)


def _columns(stream: str, format: str, schema: TypedSchema, id_field: str | None = None
             ) -> tuple[Column, ...]:
    try:
        columns = typed_columns(format, schema)
        if id_field is not None:
            check_id_field(id_field, columns, "its version")
        return columns
    except (TypeChangeError, TypedPayloadError, ValueError, ConfigError) as exc:
        raise SubjectError(stream, schema.subject or "", f"version "
                                                         f"{schema.subject_version}: "
                                                         f"{exc}") from None


def resolve_registry(registry: Registry, doc: SchemaDocument, store: SchemaStore, *,
                     previous: Mapping[tuple[str, int], Source] | None = None,
                     on_error: Callable[[Source, SubjectError], None] | None = None
                     ) -> Registry:
    """``registry`` with every subject source resolved: its schema's text filled and each
    of its sinks' columns the type's (a typed source's sinks take the type's columns).

    A source that cannot be resolved is reported to ``on_error`` and kept as it was in
    ``previous`` (the last resolution, keyed by source id and created version), or
    unresolved; without ``on_error`` the error is raised."""
    sources = []
    for source in registry.sources:
        if source.schema is None or not source.schema.subject:
            sources.append(source)
            continue
        try:
            sources.append(resolve_source(source, doc, store))
        except SubjectError as exc:
            if on_error is None:
                raise
            on_error(source, exc)
            kept = (previous or {}).get((source.id, source.created_version))
            sources.append(kept if kept is not None else source)
    return msgspec.structs.replace(registry, sources=tuple(sources))


def resolve_source(source: Source, doc: SchemaDocument, store: SchemaStore) -> Source:
    """One subject source resolved (raises :class:`SubjectError`)."""
    assert source.schema is not None
    schema = resolve_schema(source.id, source.format, source.schema, doc, store)
    ids = {s.event_id_field for s in source.sinks if s.event_id_field is not None}
    columns = _columns(source.id, source.format, schema, min(ids) if ids else None)
    sinks = tuple(msgspec.structs.replace(s, columns=columns) for s in source.sinks)
    return msgspec.structs.replace(source, schema=schema, sinks=sinks)


def resolved_sources(registry: Registry) -> dict[tuple[str, int], Source]:
    """The resolved subject sources of ``registry`` (``previous`` of the next resolve)."""
    return {(s.id, s.created_version): s for s in registry.sources
            if s.schema is not None and s.schema.subject and s.schema.text}
