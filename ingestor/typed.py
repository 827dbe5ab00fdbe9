"""The door of a ``format = "protobuf"`` or ``"avro"`` stream (#39): payloads checked
against the stream's type and kept as the producer's bytes.

Why check here when the collector decodes anyway: a producer must learn at once, with the
field named, that a message does not parse with the declared type (400 /
INVALID_ARGUMENT), and nothing of such a request may be stored. The bytes that pass are
kept as they are (envelope version 2), framing removed, so the collector can read them with
the type the table has when it commits.

Framings: a Protobuf stream takes the bare message (never starts with byte 0: field number
0 does not exist, which is how a Confluent-framed message is told apart). A stream whose
type is a registry subject (``schema = { subject = ... }``) also takes Confluent's framing
(byte 0, the schema id, the message-index array): the id must be a version of the stream's
subject and the index must name the stream's message; the framing is removed and the id
kept. An Avro stream takes Avro's single-object encoding
(``C3 01``, the fingerprint of the stream's schema, the datum) and Confluent's wire format
(byte 0, the writer schema's registry id, the datum): the writer schema comes from the
schema registry (:mod:`ingestor.writer_schemas`) and must be one the stream's schema can
read by Avro's resolution rules; the record keeps its id, so the collector reads it with
that writer schema. For a subject stream, that id must be a version of its subject. A
single-object record is stored with the registry id of the stream's schema, which the
ingestor keeps in the registry document before it accepts the first such record (503
``schema_not_yet_known`` until then). The ingest service never stores one with 0, which
the collector reads as whatever schema the stream has when it decodes: a record queued
across a schema change would be read with the wrong writer (fields swapped, cut short).

A subject stream whose subject has no version yet (its producer has not registered it)
answers 503 ``schema_not_yet_known`` while the ingestor reads the registry again: the
producer's retry after it registered is accepted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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

    def __init__(self, config: StreamConfig, writers: WriterSchemas | None = None,
                 problem: str | None = None) -> None:
        """``problem``: why this subject stream's subject gives it no type (another schema
        type, its message missing): every request is refused with it."""
        self.name = config.name
        self.id_field = config.event_id_field
        self.problem = problem
        self._writers = writers
        self._readable: dict[int, AvroType] = {}
        self.format = config.format
        self.code = FORMAT_PROTOBUF if config.format == "protobuf" else FORMAT_AVRO
        self.subject = config.schema.subject if config.schema is not None else None
        self._fingerprint = b""
        self._own: int | None = None
        """The registry id single-object records are stored with, once known."""
        self._message_index: list[int] = []
        self.pending = bool(self.subject) and not (config.schema and config.schema.text)
        """A subject stream whose subject had no version when this door was built."""
        if self.pending:
            return
        self.kind: ProtobufType | AvroType = stream_kind(config)
        if self.code == FORMAT_AVRO:
            self._fingerprint = self._avro().fingerprint()
            if writers is not None:  # kept in the registry document before it is needed
                self._own = writers.own_id(self._avro().text)
                if self._own is not None:
                    self._readable[self._own] = self._avro()
        elif self.subject:
            self._message_index = message_index(self._protobuf())

    def _not_yet(self) -> None:
        """Refuse while the stream's subject has no version (see the module doc), or
        gives it no type (400 naming why)."""
        if self.problem:
            raise BadPayloads(self.name, self.format, [(0, TypedPayloadError(
                self.problem))])
        if self._writers is not None:
            self._writers.refresh_soon()
        raise Unavailable(f"stream {self.name!r} takes its type from schema registry subject "
                          f"{self.subject!r}, which has no version this ingestor knows yet "
                          "(register the schema; it reads the registry again): retry",
                          code="schema_not_yet_known", retry_after_s=1.0)

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
        if self.pending:
            self._not_yet()
        # the usual request: one parse (an empty payload, or one starting with byte 0 as
        # Confluent's framing does, fails it: field number 0 does not exist)
        if self.code == FORMAT_PROTOBUF and self._protobuf().check_many(payloads):
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
            if payload[0] == 0 and self.subject:
                return self._protobuf_framed(payload)
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
        return body, self._own_id()

    def _own_id(self) -> int:
        """The writer id of a single-object record: the registry id of the stream's schema
        (:meth:`WriterSchemas.own_id`); 503 while it is not known to be in the registry
        document. A door without a registry (tests, benchmarks: never the ingest service)
        answers 0, the stream's own schema as the collector has it."""
        if self._own is not None:
            return self._own
        if self._writers is None:
            return 0
        found = self._writers.own_id(self._avro().text)
        if found is None:
            raise Unavailable(
                f"stream {self.name!r}: its Avro schema (fingerprint "
                f"{self._fingerprint.hex()}) is not yet kept in the schema registry "
                "document, which single-object records are stored by (the ingestor is "
                "writing it): retry", code="schema_not_yet_known", retry_after_s=1.0)
        self._own = found
        self._readable[found] = self._avro()
        return found

    async def own_writer(self) -> None:
        """Keep an Avro stream's schema in the registry document now (the ingest service,
        before it serves: its first single-object record need not wait)."""
        if self.pending or self.code != FORMAT_AVRO or self._writers is None:
            return
        await self._writers.record(self._avro().text)

    def _protobuf_framed(self, payload: bytes) -> tuple[bytes, int]:
        """A Confluent-framed Protobuf message of a subject stream: the bare message and
        its schema id."""
        if len(payload) < 6:
            raise TypedPayloadError(f"the payload starts with byte 0 (Confluent's wire "
                                    f"format) but its {len(payload)} bytes cut off the "
                                    "schema id and message index")
        schema_id = int.from_bytes(payload[1:5], "big")
        schema_type, _, _ = self._lookup(schema_id)
        if schema_type != "PROTOBUF":
            raise TypedPayloadError(f"schema id {schema_id} is a {schema_type} schema; this "
                                    "stream takes Protobuf")
        indexes, start = read_message_indexes(payload, 5)
        if indexes != self._message_index:
            raise TypedPayloadError(
                f"the payload's message index {indexes} (schema id {schema_id}) does not "
                f"name this stream's message {self._protobuf().full_name} (index "
                f"{self._message_index} of subject {self.subject!r})")
        body = payload[start:]
        self._protobuf().check(body)
        return body, schema_id

    def _lookup(self, schema_id: int) -> tuple[str, str, bool]:
        """The registry's ``schema_id`` (503 while it may be new; 400 when it does not
        exist, or is not a version of this stream's subject)."""
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
        if self.subject and schema_id not in self._writers.subject_ids(self.subject):
            raise TypedPayloadError(f"schema id {schema_id} is not a version of subject "
                                    f"{self.subject!r}, this stream's type")
        return found

    def _registered(self, schema_id: int) -> AvroType:
        """The registry's schema ``schema_id`` as a writer this stream can read."""
        known = self._readable.get(schema_id)
        if known is not None:
            return known
        schema_type, text, references = self._lookup(schema_id)
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
        if self.pending:
            self._not_yet()
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


def message_index(kind: ProtobufType) -> list[int]:
    """Confluent's message-index path of ``kind``'s message in its file: the position of
    the top-level message, then of each nested one (``[0]``: the file's first message)."""
    wanted = kind.full_name
    for file in kind.files:
        prefix = f"{file.package}." if file.package else ""
        found = _index_in(file.message_type, prefix, wanted)
        if found is not None:
            return found
    raise TypedPayloadError(f"message {wanted} is in none of its type's files")


def _index_in(messages: Sequence[Any], prefix: str, wanted: str) -> list[int] | None:
    for position, message in enumerate(messages):
        name = prefix + message.name
        if name == wanted:
            return [position]
        if wanted.startswith(name + "."):
            inner = _index_in(message.nested_type, name + ".", wanted)
            if inner is not None:
                return [position, *inner]
    return None


def read_message_indexes(payload: bytes, pos: int) -> tuple[list[int], int]:
    """Confluent's message-index array at ``pos`` (zigzag varints: the count, then each
    index; a count of 0 means ``[0]``) → the indexes and where the message starts."""
    count, pos = _zigzag(payload, pos)
    if count == 0:
        return [0], pos
    if count < 0 or count > 100:
        raise TypedPayloadError(f"the message-index array's count {count} is not valid")
    out = []
    for _ in range(count):
        value, pos = _zigzag(payload, pos)
        out.append(value)
    return out, pos


def _zigzag(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= len(data):
            raise TypedPayloadError("the message-index array is cut off by the end of the "
                                    "payload")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise TypedPayloadError("a varint of the message-index array is longer than "
                                    "10 bytes")


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
