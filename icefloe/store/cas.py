"""Compare-and-swap of one whole JSON-like document in the object store.

Why one loop for every such document (the manifest queue, the stream registry): each
change has the same shape — read the object and its ETag, compute the new value, PUT it
with ``If-Match`` (``If-None-Match: *`` to create), and on a lost race start over from a
fresh read. The mutation is a pure function of what was read, so re-running it after a
conflict or an ambiguous write is always safe, and a check it makes (a full queue, a table
already owned) always sees the latest document.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from icefloe.errors import NotFound, PreconditionFailed, TransientStoreError
from icefloe.store.base import AsyncObjectStore
from icefloe.store.retry import RetryPolicy


class Document(Protocol):
    def encode(self) -> bytes: ...


D = TypeVar("D", bound=Document)


@dataclass(frozen=True, slots=True)
class Versioned(Generic[D]):
    """A document as read, with the ETag the next CAS needs and the store's clock."""

    value: D
    etag: str | None
    store_time: float
    size: int


@dataclass
class CasStats:
    """Counters a process exports as metrics."""

    writes: int = 0
    conflicts: int = 0


async def load_document(store: AsyncObjectStore, key: str, decode: Callable[[bytes], D],
                        empty: Callable[[], D]) -> Versioned[D]:
    """Read and decode ``key``; a missing object reads as ``empty()`` with etag None."""
    try:
        result = await store.get(key)
    except NotFound:
        return Versioned(empty(), None, time.time(), 0)
    return Versioned(decode(result.data), result.etag, result.store_time, len(result.data))


async def cas_document(store: AsyncObjectStore, key: str, decode: Callable[[bytes], D],
                       empty: Callable[[], D], mutate: Callable[[Versioned[D]], D | None], *,
                       backoff: RetryPolicy, stats: CasStats | None = None,
                       what: str = "document") -> tuple[Versioned[D], D | None]:
    """Apply ``mutate`` atomically; return what was read and what was written (or None).

    ``mutate`` returns None when nothing needs writing; it may raise to abort. Lost races
    retry with jittered backoff until ``backoff`` gives up, which surfaces as a transient
    error (sustained contention looks like an overloaded store).
    """
    started = time.monotonic()
    attempt = 0
    while True:
        loaded = await load_document(store, key, decode, empty)
        new = mutate(loaded)
        if new is None:
            return loaded, None
        data = new.encode()
        try:
            if loaded.etag is None:
                await store.put(key, data, if_none_match="*")
            else:
                await store.put(key, data, if_match=loaded.etag)
        except PreconditionFailed:
            attempt += 1
            if stats is not None:
                stats.conflicts += 1
            delay = backoff.delay(attempt)
            if attempt >= backoff.max_attempts or \
                    time.monotonic() - started + delay > backoff.budget_s:
                raise TransientStoreError(
                    f"{what} {key!r}: lost {attempt} compare-and-swap races in a row over "
                    f"{time.monotonic() - started:.1f}s; the store is overloaded",
                    op="put", key=key, ambiguous=False, code="CasContention") from None
            await asyncio.sleep(delay)
            continue
        if stats is not None:
            stats.writes += 1
        return loaded, new
