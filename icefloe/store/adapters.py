"""Run a synchronous store behind the async interface.

Why: the local file store is naturally synchronous (fsync, flock), and a thread hop costs
tens of microseconds, far below a batch flush. Wrapping it here keeps one async contract
for servers without writing the file logic twice.
"""

from __future__ import annotations

import asyncio

from icefloe.store.base import (
    AsyncObjectStore,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    ObjectStore,
    PutResult,
)


class ThreadedAsyncStore(AsyncObjectStore):
    """Adapts an :class:`ObjectStore` to :class:`AsyncObjectStore` via worker threads."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url

    async def get(self, key: str) -> GetResult:
        return await asyncio.to_thread(self.inner.get, key)

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        return await asyncio.to_thread(
            self.inner.put, key, data, if_match=if_match, if_none_match=if_none_match
        )

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self.inner.delete, key)

    async def list(self, prefix: str = "") -> ListResult:
        return await asyncio.to_thread(self.inner.list, prefix)

    async def head(self, key: str) -> ObjectInfo:
        return await asyncio.to_thread(self.inner.head, key)

    async def close(self) -> None:
        await asyncio.to_thread(self.inner.close)
