"""The ingestor as a Python object: ``Ingestor.ingest(entries)`` inside your own process.

Why the servers' runtime and not a second writer: :class:`ingestor.runtime.IngestorRuntime`
is what ``icefloe ingestor`` runs behind HTTP and gRPC — it refuses a store without
conditional writes, grows the manifest to ``[manifest] shards``, follows the stream
registry, and owns the one buffer and manifest producer of the process. Entries given here
are validated by the same compiled stream (:meth:`ingestor.validate.CompiledStream.from_events`),
framed and buffered by the same :class:`ingestor.service.IngestService`, and flushed by the
same batcher, so they land as the same batch files and manifest entries a collector reads
— and the handle resolves only when both the batch file and its manifest entry are
durable, the servers' 202 rule.

    async with await Ingestor.open(load_config("icefloe.toml")) as ingestor:
        handle = ingestor.ingest([{"user_id": "u1", "url": "/"}], stream="pageviews")
        await handle          # durable: in a batch file and the manifest
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Iterable, Mapping
from typing import Any

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.store.base import AsyncObjectStore
from ingestor.errors import BadRequest
from ingestor.runtime import IngestorRuntime
from ingestor.service import Caller
from ingestor.validate import InvalidEvents

Entry = Mapping[str, Any] | bytes | str
"""One event: a mapping (encoded as JSON), or the JSON text of one object; for a
``payload = "bytes"`` stream, the entry's bytes, kept as they are."""


class Durable:
    """The handle :meth:`Ingestor.ingest` returns: ``await`` it until the entries are
    durable (it gives how many were accepted); a flush that fails raises the servers'
    error (503/429 kinds: :class:`ingestor.errors.IngestError`) from the ``await``."""

    def __init__(self, future: asyncio.Future[None], count: int,
                 on_durable: Any, dead_lettered: int = 0) -> None:
        self._future = future
        self.count = count
        self.dead_lettered = dead_lettered
        """Invalid entries kept as dead letters (``on_invalid = "dead_letter"``)."""
        self._on_durable = on_durable
        self._counted = False

    def done(self) -> bool:
        """Whether the outcome is known (durable, or failed)."""
        return self._future.done()

    async def wait(self) -> int:
        await asyncio.shield(self._future)
        if not self._counted:
            self._counted = True
            self._on_durable(self.count)
        return self.count

    def __await__(self) -> Generator[Any, None, int]:
        return self.wait().__await__()


def _encoded(entry: Entry) -> bytes:
    if isinstance(entry, bytes):
        return entry
    if isinstance(entry, str):
        return entry.encode()
    return msgspec.json.encode(entry)


class Ingestor:
    """An in-process ingestor over the store, manifest and streams of ``config``."""

    def __init__(self, runtime: IngestorRuntime) -> None:
        self.runtime = runtime
        self.service = runtime.service

    @classmethod
    async def open(cls, config: Config, *, store: AsyncObjectStore | None = None,
                   clock: Clock = SYSTEM) -> Ingestor:
        """Start the servers' runtime (store check, shards, producer, flusher, registry
        watch) without any server; ``store`` defaults to ``[store] url``."""
        return cls(await IngestorRuntime.start(config, store, clock=clock))

    def ingest(self, entries: Iterable[Entry], *, stream: str | None = None,
               idempotency_key: str | None = None) -> Durable:
        """Validate and buffer ``entries`` (all or none) and return their handle.

        ``stream`` may be left out when exactly one stream is configured. Refusals come at
        once, as the servers' 400/413/429 would: :class:`ingestor.errors.IngestError` with
        its ``code`` and per-event ``details``. ``idempotency_key`` derives the event ids
        as the ``Idempotency-Key`` header does, so a retried call is deduplicated.
        """
        compiled = self.service.stream(self._stream_name(stream))
        entries = list(entries)
        opaque = compiled.config.payload == "bytes"
        payloads = [] if opaque else [_encoded(entry) for entry in entries]
        try:
            canonical = compiled.from_entries(entries) if opaque else \
                compiled.from_events(payloads)
        except InvalidEvents as exc:
            if compiled.config.on_invalid == "dead_letter" and payloads and not opaque:
                future, count, dead = self.service.admit_valid(
                    compiled, payloads, idempotency_key=idempotency_key, caller=Caller())
                return Durable(future, count,
                               lambda n: self.service.accepted(compiled.name, n), dead)
            error: BadRequest = self.service.bad_request(exc)
            self.service.reject(compiled.name, error, len(entries))
            raise error from None
        future = self.service.admit(compiled, canonical, idempotency_key=idempotency_key,
                                    caller=Caller())
        return Durable(future, len(entries),
                       lambda count: self.service.accepted(compiled.name, count))

    def _stream_name(self, stream: str | None) -> str:
        if stream is not None:
            return stream
        names = list(self.service.streams)
        if len(names) != 1:
            raise ValueError(f"name the stream: {len(names)} are configured "
                             f"({', '.join(names) or 'none'})")
        return names[0]

    async def close(self, timeout_s: float | None = None) -> bool:
        """Flush what is buffered (resolving every handle) and release the store."""
        return await self.runtime.close(timeout_s)

    async def __aenter__(self) -> Ingestor:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
