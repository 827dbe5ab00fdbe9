"""The schema registry's Avro schemas as an ingestor knows them: Confluent-framed records.

Why a cache with a "not yet" answer: a Confluent producer registers its schema with the
registry (on the admin port) and sends records naming the new id at once. An ingestor
reads the registry document (``schemas.json`` in the store) when it starts and again when a
record names an id above the highest it knows: that id may have been registered a moment
ago, so the request is answered 503 (retry, nothing accepted) while the document is read
again. An id at or below the highest known that is not in the document was never
registered, nor is one still missing after a read that started after it was first asked
for: that is the client's error, 400 (so a wrong id is never retried forever). Ids are
never reused and a schema never changes, so what is cached stays true.

The same document keeps the writer schema of an Avro stream's single-object records: a
single-object record names its writer only by a fingerprint, and the envelope's 4-byte
schema id cannot hold one, so the ingestor keeps the stream's own schema in the document
(:meth:`WriterSchemas.record`, a compare-and-swap that adds it under a new id unless it is
there already) and stores each such record with that id, never with 0. The id is known
durable before the first record that carries it is accepted; until then such a record is
answered 503 (retry). A record once in the document is never changed or removed, so the
collector reads every queued record with the exact schema it was accepted under, however
the stream's schema changes later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from icefloe.clock import SYSTEM, Clock
from icefloe.registry.subjects import subject_ids
from icefloe.schemas.model import SchemaDocument
from icefloe.schemas.store import Candidate, SchemaStore, schema_key
from icefloe.store.base import AsyncObjectStore

log = logging.getLogger("icefloe.ingestor")
MAX_TRACKED = 1024
"""Most unknown ids remembered (they come from clients)."""


class NotYetKnown(Exception):
    """An id above every id this ingestor has read: maybe registered just now."""


class WriterSchemas:
    """Registry id → (schema type, schema text), refreshed on demand."""

    def __init__(self, store: AsyncObjectStore, registry_key: str, clock: Clock = SYSTEM
                 ) -> None:
        self._store = SchemaStore(store, schema_key(registry_key), clock=clock)
        self._own: dict[str, int] = {}
        """A stream's own Avro schema (its canonical text) → its id in the document."""
        self._recording: dict[str, asyncio.Task[None]] = {}
        self._known: dict[int, tuple[str, str, bool]] = {}
        self._highest = 0
        self._refreshing: asyncio.Task[None] | None = None
        self._waiting: set[int] = set()
        """Ids asked for above the highest known, until the next read answers them."""
        self._missing: set[int] = set()
        """Ids a read made after they were asked for did not hold (bounded: client input)."""
        self.document: SchemaDocument | None = None
        """The document last read (subject streams resolve from it)."""
        self.on_document: Callable[[SchemaDocument], None] = lambda doc: None
        """Called after each read (the service re-resolves its subject streams)."""

    @property
    def parser(self) -> SchemaStore:
        """The registry store, whose parse cache resolving subjects reuses."""
        return self._store

    def subject_ids(self, subject: str) -> frozenset[int]:
        """The ids of every version of ``subject`` in the document last read."""
        return subject_ids(self.document, subject) if self.document else frozenset()

    def lookup(self, schema_id: int) -> tuple[str, str, bool] | None:
        """``(type, text, has_references)`` of ``schema_id``; None if it does not exist.

        Raises:
            NotYetKnown: ``schema_id`` is above the highest id read (a refresh starts).
        """
        found = self._known.get(schema_id)
        if found is not None:
            return found
        if schema_id > self._highest and schema_id not in self._missing:
            if len(self._waiting) < MAX_TRACKED:
                self._waiting.add(schema_id)
            self.refresh_soon()
            raise NotYetKnown(schema_id)
        return None

    def refresh_soon(self) -> None:
        """Start one read of the registry document unless one is running."""
        if self._refreshing is None or self._refreshing.done():
            with contextlib.suppress(RuntimeError):  # no running loop: the next lookup retries
                self._refreshing = asyncio.get_running_loop().create_task(
                    self._refresh_logged(), name="writer-schemas")

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:  # a store error: the next unknown id tries again
            log.warning("cannot read the schema registry document: %s", exc)

    async def refresh(self) -> None:
        """Read the registry document and remember every schema in it."""
        asked, self._waiting = self._waiting, set()
        doc = await self._store.read()
        for record in doc.schemas:
            self._known[record.id] = (record.schema_type, record.canonical,
                                      bool(record.references))
            self._highest = max(self._highest, record.id)
        if len(self._missing) > MAX_TRACKED:
            self._missing.clear()
        self._missing |= {i for i in asked if i not in self._known}
        self.document = doc
        self.on_document(doc)

    def own_id(self, canonical: str) -> int | None:
        """The id an Avro stream's single-object records are stored with: the id of the
        stream's schema (``canonical``: :attr:`icefloe.typed.avro.AvroType.text`) in the
        document, once it is known to be there; None until then (a :meth:`record` starts,
        and a later call answers)."""
        found = self._own.get(canonical)
        if found is not None:
            return found
        if self.document is not None:
            record = next((r for r in self.document.schemas if r.schema_type == "AVRO"
                           and not r.references and r.canonical == canonical), None)
            if record is not None:
                self._own[canonical] = record.id
                return record.id
        self.record_soon(canonical)
        return None

    def record_soon(self, canonical: str) -> None:
        """Start one :meth:`record` of ``canonical`` unless one is running."""
        if canonical in self._own:
            return
        running = self._recording.get(canonical)
        if running is None or running.done():
            with contextlib.suppress(RuntimeError):  # no running loop: the next call retries
                self._recording[canonical] = asyncio.get_running_loop().create_task(
                    self._record_logged(canonical), name="writer-schema-record")

    async def _record_logged(self, canonical: str) -> None:
        try:
            await self._keep(canonical)
        except Exception as exc:  # a store error: the next single-object record retries
            log.warning("cannot keep an Avro stream's schema in the schema registry "
                        "document (%s): its single-object records are answered 503 until "
                        "it is kept: %s", self._store.key, exc)

    async def record(self, canonical: str) -> int:
        """Make sure the Avro schema ``canonical`` is in the registry document (added under
        a new id by compare-and-swap unless there: written once, never changed); its id."""
        found = self._own.get(canonical)
        if found is not None:
            return found
        running = self._recording.get(canonical)
        if running is not None and not running.done():
            await asyncio.shield(running)  # it logs its own error: then try again here
            found = self._own.get(canonical)
            if found is not None:
                return found
        return await self._keep(canonical)

    async def _keep(self, canonical: str) -> int:
        schema_id = await self._store.keep(Candidate("AVRO", canonical))
        self._own[canonical] = schema_id
        return schema_id
