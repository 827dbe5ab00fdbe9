"""The schema registry's Avro schemas as an ingestor knows them: Confluent-framed records.

Why a cache with a "not yet" answer: a Confluent producer registers its schema with the
registry (on the admin port) and sends records naming the new id at once. An ingestor
reads the registry document (``schemas.json`` in the store) when it starts and again when a
record names an id above the highest it knows: that id may have been registered a moment
ago, so the request is answered 503 (retry, nothing accepted) while the document is read
again. An id at or below the highest known that is not in the document was never
registered (or is another kind of schema): that is the client's error, 400. Ids are never
reused and a schema never changes, so what is cached stays true.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from icefloe.schemas.store import SchemaStore, schema_key
from icefloe.store.base import AsyncObjectStore

log = logging.getLogger("icefloe.ingestor")


class NotYetKnown(Exception):
    """An id above every id this ingestor has read: maybe registered just now."""


class WriterSchemas:
    """Registry id → (schema type, schema text), refreshed on demand."""

    def __init__(self, store: AsyncObjectStore, registry_key: str) -> None:
        self._store = SchemaStore(store, schema_key(registry_key))
        self._known: dict[int, tuple[str, str, bool]] = {}
        self._highest = 0
        self._refreshing: asyncio.Task[None] | None = None

    def lookup(self, schema_id: int) -> tuple[str, str, bool] | None:
        """``(type, text, has_references)`` of ``schema_id``; None if it does not exist.

        Raises:
            NotYetKnown: ``schema_id`` is above the highest id read (a refresh starts).
        """
        found = self._known.get(schema_id)
        if found is not None:
            return found
        if schema_id > self._highest:
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
        doc = await self._store.read()
        for record in doc.schemas:
            self._known[record.id] = (record.schema_type, record.canonical,
                                      bool(record.references))
            self._highest = max(self._highest, record.id)
