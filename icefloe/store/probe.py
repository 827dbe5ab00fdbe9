"""Start-up probe: refuse to run on a store that silently ignores conditional writes.

Why: every exactly-once guarantee in icefloe rests on compare-and-swap of the manifest.
Some S3-compatible stores accept ``If-Match``/``If-None-Match`` and ignore them, which would
turn a lost race into silent data loss. Each process checks, once, that a conflicting
conditional PUT really fails with 412 before it touches the manifest.
"""

from __future__ import annotations

import contextlib

from ulid import ULID

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
