"""Fault injection at the object-store boundary, for tests, benchmarks and chaos runs.

Why here and not as mocks elsewhere: the store is the only place icefloe meets the outside
world, so injecting faults at this boundary exercises every real code path above it (the
retry layer, the manifest CAS loop, the idempotent producer table). Rules are seeded so a
failing run replays exactly.

Kinds of fault:

``fail``           raise a transient error *before* the request is applied (500)
``slowdown``       raise a throttling error before the request is applied (503 SlowDown)
``lose_response``  apply the request, then raise an ambiguous transient error
``precondition``   raise ``PreconditionFailed`` without applying (a 412 storm)
``delay``          sleep a random time in ``delay_s`` and then carry on (S3-like latency)
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from icefloe.errors import PreconditionFailed, TransientStoreError
from icefloe.store.base import (
    AsyncObjectStore,
    Encodable,
    EncodedPut,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    PutResult,
)

T = TypeVar("T")
FaultKind = Literal["fail", "slowdown", "lose_response", "precondition", "delay"]
ALL_OPS = frozenset({"get", "put", "delete", "list", "head"})


@dataclass
class FaultRule:
    """When and how to inject one kind of fault.

    A rule matches calls whose op is in ``ops`` and whose key starts with ``key_prefix``;
    it lets ``skip`` matching calls pass, then fires with ``probability`` until it has
    fired ``times`` times (``None`` = forever). ``on_fire`` runs when it fires — after the
    write for ``lose_response`` — so a test can interleave another actor exactly there.
    """

    kind: FaultKind
    ops: frozenset[str] = ALL_OPS
    key_prefix: str = ""
    times: int | None = 1
    probability: float = 1.0
    skip: int = 0
    delay_s: tuple[float, float] = (0.02, 0.05)
    on_fire: Callable[[], Awaitable[None]] | None = None
    fired: int = field(default=0, init=False)
    seen: int = field(default=0, init=False)

    def matches(self, op: str, key: str) -> bool:
        return op in self.ops and key.startswith(self.key_prefix)

    def should_fire(self, rng: random.Random) -> bool:
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        if self.probability < 1.0 and rng.random() >= self.probability:
            return False
        self.fired += 1
        return True


class FaultyAsyncStore(AsyncObjectStore):
    """Wraps a store and injects the faults its rules describe; counts what it injected."""

    def __init__(self, inner: AsyncObjectStore, rules: list[FaultRule] | None = None,
                 seed: int = 0) -> None:
        self.inner = inner
        self.url = inner.url
        self.rules: list[FaultRule] = list(rules or [])
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()

    def add(self, rule: FaultRule) -> FaultRule:
        self.rules.append(rule)
        return rule

    async def _call(self, op: str, key: str, call: Callable[[], Awaitable[T]]) -> T:
        failure: FaultRule | None = None
        for rule in self.rules:
            if not rule.matches(op, key) or not rule.should_fire(self.rng):
                continue
            self.injected[rule.kind] += 1
            if rule.kind == "delay":
                await asyncio.sleep(self.rng.uniform(*rule.delay_s))
                if rule.on_fire:
                    await rule.on_fire()
            elif failure is None:
                failure = rule
        if failure is None:
            return await call()
        message = f"injected {failure.kind} on {op} {key!r}"
        if failure.kind == "lose_response":
            await call()
            if failure.on_fire:
                await failure.on_fire()
            raise TransientStoreError(message + " (applied, response lost)", op=op, key=key,
                                      ambiguous=True, code="InjectedResponseLost")
        if failure.on_fire:
            await failure.on_fire()
        if failure.kind == "precondition":
            raise PreconditionFailed(message, op=op, key=key)
        code = "SlowDown" if failure.kind == "slowdown" else "InternalError"
        raise TransientStoreError(message, op=op, key=key, ambiguous=False, code=code)

    async def get(self, key: str) -> GetResult:
        return await self._call("get", key, lambda: self.inner.get(key))

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        return await self._call("put", key, lambda: self.inner.put(
            key, data, if_match=if_match, if_none_match=if_none_match))

    async def put_encoded(self, key: str, body: Encodable) -> EncodedPut:
        return await self._call("put", key, lambda: self.inner.put_encoded(key, body))

    async def delete(self, key: str) -> None:
        await self._call("delete", key, lambda: self.inner.delete(key))

    async def list(self, prefix: str = "") -> ListResult:
        return await self._call("list", prefix, lambda: self.inner.list(prefix))

    async def head(self, key: str) -> ObjectInfo:
        return await self._call("head", key, lambda: self.inner.head(key))

    async def close(self) -> None:
        await self.inner.close()
