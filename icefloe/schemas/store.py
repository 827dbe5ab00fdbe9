"""The schema registry's operations on its document in the object store.

Why compare-and-swap here too (as :mod:`icefloe.registry.store`): every change reads the
document, computes the next one as a pure function of it (compatibility checks included)
and writes it with ``If-Match``; a process that loses the race re-reads and runs its change
again on the winner's document. So two processes registering at once take different ids,
an identical schema registered by both ends with one id, and an id once written is never
given to another schema (:func:`_unchanged_history` refuses any write that would).

Parsed schemas are cached by id: a record never changes, so neither does its parse.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import ManifestCorruptError, SchemaRegistryError
from icefloe.schemas import compat, formats
from icefloe.schemas.formats import Parsed
from icefloe.schemas.model import (
    LEVELS,
    TYPES,
    Reference,
    SchemaDocument,
    SchemaRecord,
    Subject,
    SubjectVersion,
)
from icefloe.store.base import AsyncObjectStore
from icefloe.store.cas import CasStats, Versioned, cas_document, load_document
from icefloe.store.retry import RetryPolicy

DEFAULT_KEY = "registry/schemas.json"
MAX_CACHED = 512


def schema_key(registry_key: str) -> str:
    """The schema registry's object: ``schemas.json`` next to the stream registry's
    (``[admin] registry_key``), so one setting places both."""
    folder, _, _ = registry_key.rpartition("/")
    return f"{folder}/schemas.json" if folder else "schemas.json"


@dataclass(frozen=True)
class Candidate:
    """A schema in a request: its type, text and references (as sent)."""

    schema_type: str
    schema: str
    references: tuple[Reference, ...] = ()


def subject_not_found(subject: str) -> SchemaRegistryError:
    return SchemaRegistryError(404, 40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: int | str) -> SchemaRegistryError:
    return SchemaRegistryError(404, 40402, f"Version {version} not found for subject "
                                           f"'{subject}'.")


def schema_not_found(what: str = "Schema not found") -> SchemaRegistryError:
    return SchemaRegistryError(404, 40403, what)


def check_level(level: str) -> str:
    if level not in LEVELS:
        raise SchemaRegistryError(422, 42203, f"Invalid compatibility level {level!r}; one "
                                              f"of {', '.join(LEVELS)}")
    return level


def parse_version(text: str) -> int | None:
    """A version path segment: a number ≥ 1, or ``latest``/``-1`` (None)."""
    if text in ("latest", "-1"):
        return None
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1 or number > 2**31 - 1:
        raise SchemaRegistryError(422, 42202, f"The specified version '{text}' is not a "
                                              "valid version id. Allowed values are between "
                                              "[1, 2^31-1] and the string \"latest\"")
    return number


def _decode(data: bytes) -> SchemaDocument:
    try:
        return SchemaDocument.decode(data)
    except ValueError as exc:
        raise ManifestCorruptError(f"the schema registry cannot be read: {exc}") from None


class SchemaStore:
    """Reads and changes the schema registry document at ``key``."""

    def __init__(self, store: AsyncObjectStore, key: str = DEFAULT_KEY, *,
                 clock: Clock = SYSTEM, backoff: RetryPolicy | None = None) -> None:
        self.store = store
        self.key = key
        self.clock = clock
        """Stamps registrations and times the CAS backoff."""
        self.backoff = backoff or RetryPolicy(max_attempts=50, budget_s=30.0)
        self.stats = CasStats()
        self._parsed: OrderedDict[object, Parsed] = OrderedDict()

    async def read(self) -> SchemaDocument:
        loaded: Versioned[SchemaDocument] = await load_document(
            self.store, self.key, _decode, SchemaDocument, clock=self.clock)
        return loaded.value

    async def _update(self, change: Callable[[SchemaDocument], SchemaDocument | None]
                      ) -> SchemaDocument:
        """Apply ``change`` (None: nothing to write) by CAS; the document after it."""

        def mutate(doc: Versioned[SchemaDocument]) -> SchemaDocument | None:
            new = change(doc.value)
            if new is None:
                return None
            _unchanged_history(doc.value, new)
            return msgspec.structs.replace(new, version=doc.value.version + 1,
                                           updated_at=self.clock.time())

        loaded, written = await cas_document(
            self.store, self.key, _decode, SchemaDocument, mutate, backoff=self.backoff,
            stats=self.stats, what="schema registry", clock=self.clock)
        return written if written is not None else loaded.value

    # -- parsing ---------------------------------------------------------------------------

    def _remember(self, key: object, parsed: Parsed) -> Parsed:
        self._parsed[key] = parsed
        while len(self._parsed) > MAX_CACHED:
            self._parsed.popitem(last=False)
        return parsed

    def parsed(self, doc: SchemaDocument, record: SchemaRecord, name: str = formats.ROOT_PROTO
               ) -> Parsed:
        key = ("id", record.id, name)
        found = self._parsed.get(key)
        if found is not None:
            return found
        refs = self._refs(doc, record.references)
        return self._remember(key, formats.parse(record.schema_type, record.schema, refs, name))

    def _refs(self, doc: SchemaDocument, references: Sequence[Reference]
              ) -> dict[str, Parsed]:
        """The parsed schemas ``references`` name (each registered before the schema that
        names it, so references cannot form a cycle)."""
        out: dict[str, Parsed] = {}
        for ref in references:
            subject = doc.subject(ref.subject)
            entry = None if subject is None else (
                subject.find(ref.version) if ref.version > 0 else
                (subject.live() or (None,))[-1])
            record = None if entry is None else doc.schema(entry.id)
            if record is None:
                raise formats.invalid(f"reference {ref.name!r}: subject {ref.subject!r} "
                                      f"has no version {ref.version}")
            out[ref.name] = self.parsed(doc, record, ref.name)
        return out

    def candidate(self, doc: SchemaDocument, candidate: Candidate) -> Parsed:
        """Parse a schema of a request (cached by its text and resolved references)."""
        if candidate.schema_type not in TYPES:
            raise formats.invalid(f"unknown schemaType {candidate.schema_type!r}; one of "
                                  f"{', '.join(TYPES)}")
        refs = self._refs(doc, candidate.references)
        key = ("text", candidate.schema_type, candidate.schema,
               tuple((n, p.canonical) for n, p in refs.items()))
        found = self._parsed.get(key)
        if found is not None:
            return found
        return self._remember(key, formats.parse(candidate.schema_type, candidate.schema,
                                                 refs))

    async def prepare(self, candidate: Candidate, subject: str | None = None) -> Parsed:
        """Parse off the event loop (protoc runs as a child process), before the CAS, so
        the change itself finds the parse cached; with ``subject``, its live versions too
        (what a compatibility check reads)."""
        doc = await self.read()

        def parse_all() -> Parsed:
            found = None if subject is None else doc.subject(subject)
            for entry in found.live() if found is not None else ():
                record = doc.schema(entry.id)
                if record is not None:
                    self.parsed(doc, record)
            return self.candidate(doc, candidate)
        return await asyncio.to_thread(parse_all)

    # -- reading ---------------------------------------------------------------------------

    @staticmethod
    def subject_of(doc: SchemaDocument, name: str, *, deleted: bool = False) -> Subject:
        subject = doc.subject(name)
        if subject is None or not (subject.versions if deleted else subject.live()):
            raise subject_not_found(name)
        return subject

    def version_of(self, doc: SchemaDocument, name: str, version: str, *,
                   deleted: bool = False) -> tuple[SubjectVersion, SchemaRecord]:
        number = parse_version(version)
        subject = self.subject_of(doc, name, deleted=deleted)
        pool = subject.versions if deleted else subject.live()
        entry = pool[-1] if number is None else next(
            (v for v in pool if v.version == number), None)
        if entry is None:
            raise version_not_found(name, version)
        record = doc.schema(entry.id)
        assert record is not None
        return entry, record

    @staticmethod
    def record(doc: SchemaDocument, schema_id: int) -> SchemaRecord:
        record = doc.schema(schema_id)
        if record is None:
            raise schema_not_found()
        return record

    def _same(self, doc: SchemaDocument, parsed: Parsed, refs: tuple[Reference, ...]
              ) -> SchemaRecord | None:
        return next((r for r in doc.schemas if r.schema_type == parsed.schema_type
                     and r.canonical == parsed.canonical and r.references == refs), None)

    def lookup(self, doc: SchemaDocument, subject: str, candidate: Candidate, *,
               deleted: bool = False) -> tuple[SubjectVersion, SchemaRecord]:
        found = self.subject_of(doc, subject, deleted=deleted)
        record = self._same(doc, self.candidate(doc, candidate), candidate.references)
        pool = found.versions if deleted else found.live()
        entry = None if record is None else next(
            (v for v in reversed(pool) if v.id == record.id), None)
        if entry is None or record is None:
            raise schema_not_found()
        return entry, record

    def incompatibilities(self, doc: SchemaDocument, subject: str, parsed: Parsed,
                          against: Sequence[SubjectVersion], level: str | None = None
                          ) -> list[str]:
        earlier = [self.parsed(doc, self.record(doc, v.id)) for v in against]
        return compat.check(level or doc.level(subject), parsed, earlier)

    # -- changing --------------------------------------------------------------------------

    async def register(self, subject: str, candidate: Candidate) -> tuple[int, int]:
        """Register under ``subject``: ``(id, version)``. The same schema registered again
        answers its existing id and version; an incompatible one is refused (409)."""
        await self.prepare(candidate, subject)
        result: list[tuple[int, int]] = []

        def change(doc: SchemaDocument) -> SchemaDocument | None:
            result.clear()
            parsed = self.candidate(doc, candidate)
            current = doc.subject(subject) or Subject(subject)
            record = self._same(doc, parsed, candidate.references)
            if record is not None:
                for entry in current.live():
                    if entry.id == record.id:
                        result.append((record.id, entry.version))
                        return None
            problems = self.incompatibilities(doc, subject, parsed, current.live())
            if problems:
                raise SchemaRegistryError(
                    409, 409, f"Schema being registered is incompatible with an earlier "
                    f"schema for subject \"{subject}\" (compatibility {doc.level(subject)}), "
                    f"details: [{'; '.join(problems)}]")
            schemas, next_id = doc.schemas, doc.next_id
            now = self.clock.time()
            if record is None:
                record = SchemaRecord(next_id, parsed.schema_type, candidate.schema,
                                      parsed.canonical, candidate.references, now)
                schemas, next_id = (*schemas, record), next_id + 1
            version = current.next_version
            updated = msgspec.structs.replace(
                current, next_version=version + 1,
                versions=(*current.versions, SubjectVersion(version, record.id,
                                                            registered_at=now)))
            result.append((record.id, version))
            return msgspec.structs.replace(doc, schemas=schemas, next_id=next_id,
                                           subjects=_put(doc.subjects, updated))

        await self._update(change)
        return result[0]

    async def keep(self, candidate: Candidate) -> int:
        """The id of ``candidate``, kept under a new id (no subject, no compatibility
        check) unless the document already has it: the schema an ingestor stores an Avro
        stream's single-object records with (:mod:`ingestor.writer_schemas`). Like every
        record, it is never changed or removed, so the id names that text for as long as
        records of it may be queued; registering the same schema under a subject later
        gives it this id."""
        result: list[int] = []

        def change(doc: SchemaDocument) -> SchemaDocument | None:
            result.clear()
            parsed = self.candidate(doc, candidate)
            record = self._same(doc, parsed, candidate.references)
            if record is not None:
                result.append(record.id)
                return None
            record = SchemaRecord(doc.next_id, parsed.schema_type, candidate.schema,
                                  parsed.canonical, candidate.references, self.clock.time())
            result.append(record.id)
            return msgspec.structs.replace(doc, schemas=(*doc.schemas, record),
                                           next_id=doc.next_id + 1)

        await self._update(change)
        return result[0]

    async def delete_subject(self, subject: str, *, permanent: bool) -> list[int]:
        """Soft delete every live version, or (``permanent``, after a soft delete) remove
        the subject; the version numbers deleted."""
        result: list[int] = []

        def change(doc: SchemaDocument) -> SchemaDocument | None:
            result.clear()
            found = self.subject_of(doc, subject, deleted=True)
            live = found.live()
            if permanent:
                if live:
                    raise SchemaRegistryError(404, 40405, f"Subject '{subject}' was not "
                                              "deleted first before being permanently "
                                              "deleted")
                _not_referenced(doc, subject, [v.version for v in found.versions])
                result.extend(v.version for v in found.versions)
                kept = msgspec.structs.replace(found, versions=(), compatibility=None)
                return msgspec.structs.replace(doc, subjects=_put(doc.subjects, kept))
            if not live:
                raise SchemaRegistryError(404, 40404, f"Subject '{subject}' was soft "
                                          "deleted.Set permanent=true to delete permanently")
            _not_referenced(doc, subject, [v.version for v in live])
            result.extend(v.version for v in live)
            gone = tuple(msgspec.structs.replace(v, deleted=True) for v in found.versions)
            return msgspec.structs.replace(doc, subjects=_put(
                doc.subjects, msgspec.structs.replace(found, versions=gone)))

        await self._update(change)
        return list(result)

    async def delete_version(self, subject: str, version: str, *, permanent: bool) -> int:
        """Soft delete one version, or (``permanent``, after a soft delete) remove it."""
        result: list[int] = []

        def change(doc: SchemaDocument) -> SchemaDocument | None:
            result.clear()
            found = self.subject_of(doc, subject, deleted=True)
            number = parse_version(version)
            if not permanent and number is not None:
                gone = found.find(number)
                if gone is not None and gone.deleted:
                    raise SchemaRegistryError(404, 40406, f"Subject '{subject}' Version "
                                              f"{number} was soft deleted.Set permanent=true "
                                              "to delete permanently")
            entry, _ = self.version_of(doc, subject, version, deleted=permanent)
            if permanent and not entry.deleted:
                raise SchemaRegistryError(404, 40407, f"Subject '{subject}' Version "
                                          f"{entry.version} was not deleted first before "
                                          "being permanently deleted")
            _not_referenced(doc, subject, [entry.version])
            result.append(entry.version)
            versions = tuple(v for v in found.versions if v.version != entry.version) \
                if permanent else tuple(msgspec.structs.replace(v, deleted=True)
                                        if v.version == entry.version else v
                                        for v in found.versions)
            return msgspec.structs.replace(doc, subjects=_put(
                doc.subjects, msgspec.structs.replace(found, versions=versions)))

        await self._update(change)
        return result[0]

    async def set_level(self, subject: str | None, level: str) -> str:
        check_level(level)

        def change(doc: SchemaDocument) -> SchemaDocument | None:
            if subject is None:
                return None if doc.compatibility == level else \
                    msgspec.structs.replace(doc, compatibility=level)
            found = doc.subject(subject) or Subject(subject)
            if found.compatibility == level:
                return None
            return msgspec.structs.replace(doc, subjects=_put(
                doc.subjects, msgspec.structs.replace(found, compatibility=level)))

        await self._update(change)
        return level

    async def clear_level(self, subject: str) -> str:
        """Remove a subject's own level; the level it had."""
        result: list[str] = []

        def change(doc: SchemaDocument) -> SchemaDocument | None:
            result.clear()
            found = doc.subject(subject)
            if found is None or found.compatibility is None:
                raise subject_not_found(subject)
            result.append(found.compatibility)
            return msgspec.structs.replace(doc, subjects=_put(
                doc.subjects, msgspec.structs.replace(found, compatibility=None)))

        await self._update(change)
        return result[0]


def _put(subjects: tuple[Subject, ...], subject: Subject) -> tuple[Subject, ...]:
    """``subjects`` with ``subject`` replaced or added (kept sorted by name)."""
    others = [s for s in subjects if s.name != subject.name]
    return tuple(sorted((*others, subject), key=lambda s: s.name))


def _not_referenced(doc: SchemaDocument, subject: str, versions: Sequence[int]) -> None:
    """Refuse deleting a version another live schema version refers to (Confluent 42206)."""
    live_ids = {v.id for s in doc.subjects for v in s.live()}
    for record in doc.schemas:
        if record.id not in live_ids:
            continue
        for ref in record.references:
            if ref.subject == subject and ref.version in versions:
                raise SchemaRegistryError(422, 42206, f"One or more references exist to the "
                                          f"schema {{subject={subject}, version="
                                          f"{ref.version}}} (schema id {record.id} refers to "
                                          f"it as {ref.name!r})")


def _unchanged_history(before: SchemaDocument, after: SchemaDocument) -> None:
    """A write may add schemas and versions, never change one: every id keeps its record,
    ``next_id`` never goes back, every kept version keeps its id."""
    kept = {r.id: r for r in after.schemas}
    for record in before.schemas:
        if kept.get(record.id) != record:
            raise AssertionError(f"schema id {record.id} would change or vanish")
    if after.next_id < before.next_id or any(r.id >= after.next_id for r in after.schemas):
        raise AssertionError("schema ids would be reused")
    for subject in before.subjects:
        new = after.subject(subject.name)
        for entry in subject.versions:
            same = None if new is None else new.find(entry.version)
            if same is not None and same.id != entry.id:
                raise AssertionError(f"{subject.name} version {entry.version} would change")
