"""The schema registry document: schemas by global id, subjects with their versions, and
compatibility levels.

Why one document, like the stream registry: every change (a new id, a new version, a
delete, a level) is one compare-and-swap of one object, so two admin processes registering
at once can never hand out one id twice or put two schemas under one version — the loser
re-reads and re-applies its request (checks included) to the winner's document.

What never changes once written: a schema record (an id always names the same schema text,
type and references; ids come from ``next_id``, which only grows) and the id of a subject's
version. A stream can later name a subject and read a version or an id from here.

Encoding: JSON (``msgspec``), ``format`` 1; unknown fields are refused so an older process
never silently drops what a newer one wrote.
"""

from __future__ import annotations

import msgspec

FORMAT = 1
TYPES = ("AVRO", "PROTOBUF", "JSON")
LEVELS = ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
          "FULL_TRANSITIVE", "NONE")
DEFAULT_LEVEL = "BACKWARD"


class Reference(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Another subject's version a schema uses: ``name`` is how the schema refers to it
    (a Protobuf import path, an Avro type's full name, a JSON Schema ``$ref``)."""

    name: str
    subject: str
    version: int


class SchemaRecord(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One schema under its global id; written once, never changed or reused."""

    id: int
    schema_type: str
    schema: str
    """The text of the first registration (what ``GET /schemas/ids/{id}`` answers)."""
    canonical: str
    """What identity is decided by: the same canonical text, type and references are the
    same schema (whitespace and attribute order do not make a new id)."""
    references: tuple[Reference, ...] = ()
    registered_at: float = 0.0


class SubjectVersion(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    version: int
    id: int
    deleted: bool = False
    """Soft-deleted: hidden from listings and ``latest``; a permanent delete removes it."""
    registered_at: float = 0.0


class Subject(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    versions: tuple[SubjectVersion, ...] = ()
    compatibility: str | None = None
    """This subject's level; None: the global one."""
    next_version: int = 1
    """Version numbers are never reused, even after a permanent delete."""

    def live(self) -> tuple[SubjectVersion, ...]:
        return tuple(v for v in self.versions if not v.deleted)

    def find(self, version: int) -> SubjectVersion | None:
        return next((v for v in self.versions if v.version == version), None)


class SchemaDocument(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int = FORMAT
    version: int = 0
    """Grows with every write (so every write changes the bytes, as the CAS needs)."""
    updated_at: float = 0.0
    next_id: int = 1
    compatibility: str = DEFAULT_LEVEL
    schemas: tuple[SchemaRecord, ...] = ()
    subjects: tuple[Subject, ...] = ()

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> SchemaDocument:
        doc = msgspec.json.decode(data, type=cls)
        if doc.format != FORMAT:
            raise ValueError(f"unknown schema registry format {doc.format} (this icefloe "
                             f"reads {FORMAT})")
        return doc

    def schema(self, schema_id: int) -> SchemaRecord | None:
        return next((s for s in self.schemas if s.id == schema_id), None)

    def subject(self, name: str) -> Subject | None:
        return next((s for s in self.subjects if s.name == name), None)

    def level(self, subject: str) -> str:
        found = self.subject(subject)
        if found is not None and found.compatibility is not None:
            return found.compatibility
        return self.compatibility
