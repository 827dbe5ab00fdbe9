"""The door of a ``format = "protobuf"`` or ``"avro"`` stream (#39): payloads checked
against the stream's type and kept as the producer's bytes.

Why check here when the collector decodes anyway: a producer must learn at once, with the
field named, that a message does not parse with the declared type (400 /
INVALID_ARGUMENT), and nothing of such a request may be stored. The bytes that pass are
kept as they are (envelope version 2), framing removed, so the collector can read them with
the type the table has when it commits.

Framings: a Protobuf stream takes the bare message (never starts with byte 0: field number
0 does not exist, which is how a Confluent-framed message is told apart and refused until
Protobuf streams read the registry). An Avro stream takes Avro's single-object encoding
(``C3 01``, the fingerprint of the stream's schema, the datum) and Confluent's wire format
(byte 0, the writer schema's registry id, the datum): the writer schema comes from the
schema registry (:mod:`ingestor.writer_schemas`) and must be one the stream's schema can
read by Avro's resolution rules; the record keeps its id, so the collector reads it with
that writer schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from icefloe.streams.model import StreamConfig
from icefloe.typed.codec import FORMAT_AVRO, FORMAT_PROTOBUF, TypedPayloadError
from icefloe.typed.kinds import avro_kind, stream_kind
from ingestor.errors import Unavailable
from ingestor.writer_schemas import NotYetKnown, WriterSchemas

if TYPE_CHECKING:
    from icefloe.typed.avro import AvroType
    from icefloe.typed.protobuf import ProtobufType

MAX_VIOLATIONS = 100


class TypedDoor:
    """Checks one typed stream's payloads; built once per stream config."""

    def __init__(self, config: StreamConfig, writers: WriterSchemas | None = None) -> None:
        self.name = config.name
        self.id_field = config.event_id_field
        self._writers = writers
        self._readable: dict[int, AvroType] = {}
        self.format = config.format
        self.code = FORMAT_PROTOBUF if config.format == "protobuf" else FORMAT_AVRO
        self.kind: ProtobufType | AvroType = stream_kind(config)
        self._fingerprint = b""
        if self.code == FORMAT_AVRO:
            self._fingerprint = self._avro().fingerprint()

    def _avro(self) -> AvroType:
        from icefloe.typed.avro import AvroType  # imported here: only Avro streams need it

        assert isinstance(self.kind, AvroType)
        return self.kind

    def _protobuf(self) -> ProtobufType:
        from icefloe.typed.protobuf import ProtobufType  # imported here: Protobuf only

        assert isinstance(self.kind, ProtobufType)
        return self.kind

    def messages(self, payloads: Sequence[bytes]) -> tuple[list[bytes], list[int]]:
        """The bodies to store and their writer schema ids, or :class:`TypedPayloadError`
        per bad payload, collected as ``(index, error)`` in :class:`BadPayloads`."""
        if self.code == FORMAT_PROTOBUF and all(p and p[0] for p in payloads) \
                and self._protobuf().check_many(payloads):  # the usual request: one parse
            return list(payloads), [0] * len(payloads)
        bodies: list[bytes] = []
        ids: list[int] = []
        bad: list[tuple[int, TypedPayloadError]] = []
        for index, payload in enumerate(payloads):
            try:
                body, schema_id = self._one(payload)
            except TypedPayloadError as exc:
                bad.append((index, exc))
                if len(bad) >= MAX_VIOLATIONS:
                    break
                continue
            bodies.append(body)
            ids.append(schema_id)
        if bad:
            raise BadPayloads(self.name, self.format, bad)
        return bodies, ids

    def _one(self, payload: bytes) -> tuple[bytes, int]:
        if not payload:
            raise TypedPayloadError(f"an empty payload is not a {self.format} message")
        if self.code == FORMAT_PROTOBUF:
            if payload[0] == 0:
                raise TypedPayloadError(
                    "the payload starts with byte 0, Confluent's wire format (magic byte and "
                    "schema id); this stream's type comes from a descriptor set: send the bare "
                    "message")
            self._protobuf().check(payload)
            return payload, 0
        return self._avro_body(payload)

    def _avro_body(self, payload: bytes) -> tuple[bytes, int]:
        from icefloe.typed.avro import unframe  # imported here: only Avro streams need it

        kind = self._avro()
        framing, key, body = unframe(payload)
        if framing == "confluent":
            assert isinstance(key, int)
            writer = self._registered(key)
            writer.check(body, writer)
            return body, key
        if key != self._fingerprint:
            got = key.hex() if isinstance(key, bytes) else str(key)
            raise TypedPayloadError(
                f"the payload's schema fingerprint {got} is not this stream's "
                f"({self._fingerprint.hex()}): it was written with another schema")
        kind.check(body, kind)
        return body, 0

    def _registered(self, schema_id: int) -> AvroType:
        """The registry's schema ``schema_id`` as a writer this stream can read."""
        known = self._readable.get(schema_id)
        if known is not None:
            return known
        if self._writers is None:
            raise TypedPayloadError(f"the payload names schema registry id {schema_id}, but "
                                    "this ingestor reads no schema registry")
        try:
            found = self._writers.lookup(schema_id)
        except NotYetKnown:
            raise Unavailable(f"schema id {schema_id} is not known to this ingestor yet (it "
                              "is reading the schema registry again): retry",
                              code="schema_not_yet_known", retry_after_s=1.0) from None
        if found is None:
            raise TypedPayloadError(f"schema id {schema_id} is not in the schema registry")
        schema_type, text, references = found
        if schema_type != "AVRO":
            raise TypedPayloadError(f"schema id {schema_id} is a {schema_type} schema; this "
                                    "stream takes Avro")
        if references:
            raise TypedPayloadError(f"schema id {schema_id} uses schema references, which "
                                    "streams do not resolve yet")
        writer = avro_kind(text)
        problems = self._avro().incompatibilities(writer)
        if problems:
            raise TypedPayloadError(f"this stream's schema cannot read records written with "
                                    f"schema id {schema_id}: {'; '.join(problems)}")
        self._readable[schema_id] = writer
        return writer

    def from_json(self, objects: Sequence[bytes]) -> list[bytes]:
        """Protobuf's canonical JSON (one object per element) → binary messages."""
        if self.code != FORMAT_PROTOBUF:
            raise BadPayloads(self.name, self.format, [(0, TypedPayloadError(
                "an Avro stream takes binary Avro (single-object encoding), not JSON"))])
        out: list[bytes] = []
        bad: list[tuple[int, TypedPayloadError]] = []
        kind = self._protobuf()
        for index, text in enumerate(objects):
            try:
                out.append(kind.from_json(text))
            except TypedPayloadError as exc:
                bad.append((index, exc))
        if bad:
            raise BadPayloads(self.name, self.format, bad)
        return out


def event_ids(door: TypedDoor, bodies: Sequence[bytes], schema_ids: Sequence[int]
              ) -> list[str | None] | None:
    """The stream's ``event_id_field`` of each checked body, as text (None where unset), or
    None when the stream names no such field: the ids deduplication keys on."""
    name = door.id_field
    if name is None:
        return None
    if door.code == FORMAT_PROTOBUF:
        return door._protobuf().field_texts(bodies, name)
    import io  # here: only Avro streams with an id field read a value per record

    from fastavro import schemaless_reader  # here: as above (the optional Avro extra)

    reader = door._avro()
    out: list[str | None] = []
    for body, schema_id in zip(bodies, schema_ids, strict=True):
        writer = reader if schema_id == 0 else door._readable[schema_id]
        record = schemaless_reader(io.BytesIO(body), writer.fast, reader.fast)
        value = record.get(name) if isinstance(record, dict) else None
        out.append(None if value is None or value == "" else str(value))
    return out


class BadPayloads(ValueError):
    """Payloads of a request that do not parse with the stream's type: ``(index, error)``."""

    def __init__(self, stream: str, format: str,
                 bad: Sequence[tuple[int, TypedPayloadError]]) -> None:
        first_index, first = bad[0]
        where = f" (field {first.field})" if first.field else ""
        super().__init__(f"{len(bad)} event(s) of stream {stream!r} are not valid {format} "
                         f"messages; event {first_index}{where}: {first}; nothing was "
                         "accepted")
        self.bad = list(bad)


def split_delimited(body: bytes) -> list[bytes]:
    """A length-delimited stream of messages (each a varint byte length, then the bytes:
    Java's ``writeDelimitedTo``, Go's ``protodelim``) → the messages."""
    out: list[bytes] = []
    pos, size = 0, len(body)
    while pos < size:
        length, shift, start = 0, 0, pos
        while True:
            if pos >= size:
                raise TypedPayloadError(f"message {len(out)}: its length prefix at offset "
                                        f"{start} is cut off by the end of the body")
            byte = body[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63:
                raise TypedPayloadError(f"message {len(out)}: the varint length at offset "
                                        f"{start} is longer than 10 bytes")
        if length == 0 or pos + length > size:
            raise TypedPayloadError(
                f"message {len(out)}: length {length} at offset {start} "
                + ("is 0" if length == 0 else f"runs past the end of the {size}-byte body"))
        out.append(body[pos:pos + length])
        pos += length
    if not out:
        raise TypedPayloadError("the body holds no messages")
    return out
