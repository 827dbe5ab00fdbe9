"""Run a synchronous store behind the async interface.

Why: the local file store is naturally synchronous (fsync, flock), and a thread hop costs
tens of microseconds, far below a batch flush. Wrapping it here keeps one async contract
for servers without writing the file logic twice.

Why threads of their own (:data:`STORE_THREADS`), not the loop's default executor: that
executor also runs a process's long blocking work (the collector's runs, table preparation
and maintenance, each ``asyncio.to_thread``), and its few workers (cores + 4) can all be
busy with it for seconds. A lease renewal queued behind them lets the lease lapse, and a
standby takes over a collector that was alive. Store calls are short; their own pool keeps
them so.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from icefloe.store.base import (
    AsyncObjectStore,
    Encodable,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    ObjectStore,
    PutResult,
)

T = TypeVar("T")

STORE_THREADS = 16
"""Workers of the process's store-call pool (shared by every :class:`ThreadedAsyncStore`)."""
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def store_pool() -> ThreadPoolExecutor:
    """The process's pool for synchronous store calls (made on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="icefloe-store")
        return _pool


class ThreadedAsyncStore(AsyncObjectStore):
    """Adapts an :class:`ObjectStore` to :class:`AsyncObjectStore` via worker threads."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        context = contextvars.copy_context()  # as asyncio.to_thread does
        bound = functools.partial(context.run, call, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(store_pool(), bound)

    async def get(self, key: str) -> GetResult:
        return await self._run(self.inner.get, key)

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        return await self._run(
            self.inner.put, key, data, if_match=if_match, if_none_match=if_none_match
        )

    async def delete(self, key: str) -> None:
        await self._run(self.inner.delete, key)

    async def list(self, prefix: str = "") -> ListResult:
        return await self._run(self.inner.list, prefix)

    async def head(self, key: str) -> ObjectInfo:
        return await self._run(self.inner.head, key)

    async def close(self) -> None:
        await self._run(self.inner.close)


class InlineAsyncStore(ThreadedAsyncStore):
    """Calls the synchronous store right on the event loop, blocking it for each call.

    Only for a loop that has nothing else to do meanwhile: the local store helper's job
    loop. There a thread hop per call (two per flush) cost more than it saved — HTTP
    flushes of ~250 events took 2.7-2.8 ms through threads, against ~2.0-2.2 ms when the
    helper ran each put directly.
    """

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return call(*args, **kwargs)

    def encodes_inline(self, body: Encodable) -> bool:
        return True  # a thread hop buys nothing on a loop with nothing else to do
