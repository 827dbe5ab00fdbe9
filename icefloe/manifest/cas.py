"""Read-modify-write of the manifest with compare-and-swap, shared by producer and consumer.

Why one loop: every manifest change has the same shape — read the object and its ETag,
compute the new value, PUT it with ``If-Match`` (``If-None-Match: *`` to create), and on a
lost race start over from a fresh read. The mutation is a pure function of what was read,
so re-running it after a conflict or an ambiguous write is always safe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from icefloe.errors import NotFound, PreconditionFailed, TransientStoreError
from icefloe.manifest.model import Manifest
from icefloe.store.base import AsyncObjectStore
from icefloe.store.retry import RetryPolicy


@dataclass(frozen=True, slots=True)
class Loaded:
    """A manifest as read, with what the next CAS needs and the store's clock."""

    manifest: Manifest
    etag: str | None
    store_time: float
    size: int


@dataclass
class CasStats:
    """Counters a process exports as metrics."""

    writes: int = 0
    conflicts: int = 0


async def load(store: AsyncObjectStore, key: str) -> Loaded:
    """Read and decode the manifest; a missing one reads as empty (etag None)."""
    try:
        result = await store.get(key)
    except NotFound:
        return Loaded(Manifest(), None, time.time(), 0)
    return Loaded(Manifest.decode(result.data), result.etag, result.store_time,
                  len(result.data))


async def cas_update(store: AsyncObjectStore, key: str,
                     mutate: Callable[[Loaded], Manifest | None], *,
                     backoff: RetryPolicy, stats: CasStats | None = None
                     ) -> tuple[Loaded, Manifest | None]:
    """Apply ``mutate`` atomically; return what was read and what was written (or None).

    ``mutate`` returns None when nothing needs writing; it may raise to abort (fencing,
    full queue). Lost races retry with jittered backoff until ``backoff`` gives up, which
    surfaces as a transient error (sustained contention looks like an overloaded store).
    """
    started = time.monotonic()
    attempt = 0
    while True:
        loaded = await load(store, key)
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
                    f"manifest {key!r}: lost {attempt} compare-and-swap races in a row over "
                    f"{time.monotonic() - started:.1f}s; the store is overloaded",
                    op="put", key=key, ambiguous=False, code="CasContention") from None
            await asyncio.sleep(delay)
            continue
        if stats is not None:
            stats.writes += 1
        return loaded, new
