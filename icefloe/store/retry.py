"""Retries of transient store errors, with jittered exponential backoff and a budget.

Why a wrapper and not botocore's retries: one policy for every backend (local, boto3,
aiobotocore), a time *budget* so a request never hangs past what its caller can wait, and
fault injection that sits *below* the retry layer, so tests exercise the real retry path.

Time (the budget, the backoff sleeps) is read through an injected :class:`~icefloe.clock.Clock`,
so a test or the simulator can run a whole retry storm in no real time.

Retrying a conditional PUT whose first attempt was applied but whose response was lost
yields ``PreconditionFailed`` on the retry. That is correct and expected: the manifest
layer re-reads and finds its own write (idempotent producer table), so nothing duplicates.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from icefloe.backoff import RetryPolicy
from icefloe.clock import SYSTEM, Clock
from icefloe.errors import StoreError, TransientStoreError
from icefloe.store.base import (
    AsyncObjectStore,
    Encodable,
    EncodedPut,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    ObjectStore,
    PutResult,
)

__all__ = ["NO_RETRY", "RetryPolicy", "RetryingAsyncStore", "RetryingStore",
           "call_with_retry", "call_with_retry_async"]

T = TypeVar("T")


NO_RETRY = RetryPolicy(max_attempts=1)


def _exhausted(exc: TransientStoreError, attempts: int, elapsed: float, ambiguous: bool
               ) -> TransientStoreError:
    return TransientStoreError(
        f"{exc} (gave up after {attempts} attempt(s) in {elapsed:.1f}s)",
        op=exc.op, key=exc.key, ambiguous=ambiguous, code=exc.code,
    )


def _next_delay(policy: RetryPolicy, exc: TransientStoreError, attempt: int,
                elapsed: float, ambiguous: bool) -> float:
    """The sleep before attempt ``attempt + 1``; raises the final error when the attempts
    or the budget (``elapsed`` so far plus that sleep) are spent.

    ``ambiguous`` is whether *any* attempt so far may have been applied: the error given
    up with says so even when the last attempt was a clean refusal (a write whose answer
    was lost, then a 503 on its retry, may have landed)."""
    delay = policy.delay(attempt)
    if attempt >= policy.max_attempts or elapsed + delay > policy.budget_s:
        raise _exhausted(exc, attempt, elapsed, ambiguous) from exc
    return delay


def call_with_retry(policy: RetryPolicy, fn: Callable[[], T], clock: Clock = SYSTEM) -> T:
    """Call ``fn`` until it succeeds, raises a non-transient error, or the policy gives up;
    the budget and the sleeps are on ``clock``."""
    started = clock.monotonic()
    attempt, ambiguous = 1, False
    while True:
        try:
            return fn()
        except TransientStoreError as exc:
            ambiguous = ambiguous or exc.ambiguous
            delay = _next_delay(policy, exc, attempt, clock.monotonic() - started, ambiguous)
        except StoreError as exc:  # final; it may owe its cause to an ambiguous attempt
            exc.ambiguous = exc.ambiguous or ambiguous
            raise
        attempt += 1
        clock.sleep_sync(delay)


async def call_with_retry_async(policy: RetryPolicy, fn: Callable[[], Awaitable[T]],
                                clock: Clock = SYSTEM) -> T:
    """Async twin of :func:`call_with_retry`."""
    started = clock.monotonic()
    attempt, ambiguous = 1, False
    while True:
        try:
            return await fn()
        except TransientStoreError as exc:
            ambiguous = ambiguous or exc.ambiguous
            delay = _next_delay(policy, exc, attempt, clock.monotonic() - started, ambiguous)
        except StoreError as exc:  # final; it may owe its cause to an ambiguous attempt
            exc.ambiguous = exc.ambiguous or ambiguous
            raise
        attempt += 1
        await clock.sleep(delay)


class RetryingStore(ObjectStore):
    """Retries transient errors of a synchronous store (backoff and budget on ``clock``)."""

    def __init__(self, inner: ObjectStore, policy: RetryPolicy | None = None, *,
                 clock: Clock = SYSTEM) -> None:
        self.inner = inner
        self.policy = policy or RetryPolicy()
        self.clock = clock
        self.url = inner.url

    def _call(self, fn: Callable[[], T]) -> T:
        return call_with_retry(self.policy, fn, self.clock)

    def get(self, key: str) -> GetResult:
        return self._call(lambda: self.inner.get(key))

    def put(self, key: str, data: bytes, *, if_match: str | None = None,
            if_none_match: IfNoneMatch = None) -> PutResult:
        return self._call(lambda: self.inner.put(
            key, data, if_match=if_match, if_none_match=if_none_match))

    def delete(self, key: str) -> None:
        self._call(lambda: self.inner.delete(key))

    def list(self, prefix: str = "") -> ListResult:
        return self._call(lambda: self.inner.list(prefix))

    def head(self, key: str) -> ObjectInfo:
        return self._call(lambda: self.inner.head(key))

    def close(self) -> None:
        self.inner.close()


class RetryingAsyncStore(AsyncObjectStore):
    """Retries transient errors of an async store (backoff and budget on ``clock``)."""

    def __init__(self, inner: AsyncObjectStore, policy: RetryPolicy | None = None, *,
                 clock: Clock = SYSTEM) -> None:
        self.inner = inner
        self.policy = policy or RetryPolicy()
        self.clock = clock
        self.url = inner.url

    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await call_with_retry_async(self.policy, fn, self.clock)

    async def get(self, key: str) -> GetResult:
        return await self._call(lambda: self.inner.get(key))

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        return await self._call(lambda: self.inner.put(
            key, data, if_match=if_match, if_none_match=if_none_match))

    async def put_encoded(self, key: str, body: Encodable) -> EncodedPut:
        return await self._call(lambda: self.inner.put_encoded(key, body))

    async def delete(self, key: str) -> None:
        await self._call(lambda: self.inner.delete(key))

    async def list(self, prefix: str = "") -> ListResult:
        return await self._call(lambda: self.inner.list(prefix))

    async def head(self, key: str) -> ObjectInfo:
        return await self._call(lambda: self.inner.head(key))

    async def close(self) -> None:
        await self.inner.close()
