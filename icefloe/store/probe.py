"""Start-up probe: refuse to run on a store that silently ignores conditional writes.

Also what a durable PUT costs on a store (:func:`measure_puts`, ``icefloe probe --puts``):
every flush writes a batch file and then the manifest, one after the other, so the PUT's
latency is the floor under every acknowledgement. A local store's file system can make it
costly (on ext4 without a journal, a create skips every inode freed nearby in the last
minutes, so a directory beside heavy deletions pays for them: see
:mod:`icefloe.store.fs_kind`); this shows it before an ingestor is pointed there.

Why: every exactly-once guarantee in icefloe rests on compare-and-swap of the manifest.
Some S3-compatible stores accept ``If-Match``/``If-None-Match`` and ignore them, which would
turn a lost race into silent data loss. Each process checks, once, that a conflicting
conditional PUT really fails with 412 before it touches the manifest.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from ulid import ULID

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import ConditionalWritesUnsupported, PreconditionFailed, StoreError
from icefloe.store.base import AsyncObjectStore

PROBE_PREFIX = "_icefloe/probe/"


def _unsupported(store: AsyncObjectStore, what: str) -> ConditionalWritesUnsupported:
    return ConditionalWritesUnsupported(
        f"the object store at {store.url} accepted a PUT with {what} that must have failed "
        "with 412: it does not enforce conditional writes, so icefloe cannot run on it safely "
        "(AWS S3 and current MinIO releases do; upgrade the store or use another)",
        op="probe",
    )


async def probe_conditional_writes(store: AsyncObjectStore) -> None:
    """Raise :class:`ConditionalWritesUnsupported` unless the store enforces CAS writes."""
    key = f"{PROBE_PREFIX}{ULID()}"
    try:
        first = await store.put(key, b"probe-1", if_none_match="*")
        try:
            await store.put(key, b"probe-2", if_none_match="*")
        except PreconditionFailed:
            pass
        else:
            raise _unsupported(store, "If-None-Match: * over an existing object")
        try:
            await store.put(key, b"probe-3", if_match='"icefloe-probe-stale-etag"')
        except PreconditionFailed:
            pass
        else:
            raise _unsupported(store, "If-Match on a stale ETag")
        second = await store.put(key, b"probe-4", if_match=first.etag)
        if second.etag == first.etag:
            raise _unsupported(store, "new bytes that kept the same ETag")
    finally:
        with contextlib.suppress(StoreError):
            await store.delete(key)


PROBE_PUT_BYTES = 4096
"""The size of each timed PUT: a small batch file's, so the figure is the fixed cost."""


@dataclass(frozen=True)
class PutLatency:
    """Seconds a durable create-only PUT of :data:`PROBE_PUT_BYTES` took on a store."""

    count: int
    p50_s: float
    p99_s: float


async def measure_puts(store: AsyncObjectStore, count: int, *,
                       clock: Clock = SYSTEM) -> PutLatency:
    """Time ``count`` PUTs made the way batch files are (a new key, ``If-None-Match: *``),
    one after the other, then delete them; raise the store's error if one fails."""
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    prefix, body = f"{PROBE_PREFIX}{ULID()}-", bytes(PROBE_PUT_BYTES)
    samples: list[float] = []
    try:
        for index in range(count):
            start = clock.monotonic()
            await store.put(f"{prefix}{index}", body, if_none_match="*")
            samples.append(clock.monotonic() - start)
    finally:
        for index in range(len(samples)):
            with contextlib.suppress(StoreError):
                await store.delete(f"{prefix}{index}")
    samples.sort()
    return PutLatency(count, samples[(count - 1) // 2],
                      samples[min(count - 1, int(count * 0.99))])
