"""An in-memory object store with seeded faults, one view per simulated host.

Why in memory: the simulator must decide, from its seed alone, when each request lands,
whether it fails before or after it is applied, and how long it stalls. The store keeps
S3's contract as icefloe relies on it (content ETags, ``If-Match``/``If-None-Match: *``,
sorted listings, store-clock times) and applies each request atomically at the moment its
simulated latency ends, so requests of different hosts interleave as they would over a
network.

Faults (per host view, drawn from the seed): an error before the request is applied, an
error *after* it was applied (the answer is lost: the worst case for appends), a lost
conditional race (412/409), a stall, and a crash of the calling host. Inside a blocking
step (``SimTime.inline_depth`` > 0) requests complete at once and only crashes are
injected: such steps cannot wait (see :mod:`testing.sim.loop`).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from icefloe.errors import NotFound, PreconditionFailed, TransientStoreError
from icefloe.store.base import (
    AsyncObjectStore,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    PutResult,
    check_key,
)
from testing.sim.loop import SimTime


class SimCrash(BaseException):
    """The calling host crashed here. A BaseException, so no ``except Exception`` in the
    protocol code can swallow it: the host's tasks end where they stand."""


@dataclass(slots=True)
class _Object:
    data: bytes
    etag: str
    last_modified: float


@dataclass
class FaultPlan:
    """Per-request probabilities for one host; all zero means a perfect store."""

    error_before: float = 0.0
    error_after: float = 0.0
    lost_race: float = 0.0
    stall: float = 0.0
    stall_s: tuple[float, float] = (1.0, 30.0)
    crash: float = 0.0
    latency_s: tuple[float, float] = (0.001, 0.03)

    @staticmethod
    def none() -> FaultPlan:
        return FaultPlan(latency_s=(0.001, 0.01))


@dataclass
class StoreLog:
    """Faults injected (the run's summary reports them)."""

    faults: int = 0


class SimStore:
    """The shared bucket; hosts talk to it through :meth:`view`."""

    def __init__(self, sim: SimTime, rng: random.Random) -> None:
        self.sim = sim
        self.rng = rng
        self.objects: dict[str, _Object] = {}
        self.log = StoreLog()
        self.faults_on = True
        self.on_delete: Callable[[str], None] = lambda key: None
        """Called before a delete is applied (the checker's referenced-file invariant)."""

    def view(self, host: str, plan: FaultPlan) -> SimStoreView:
        return SimStoreView(self, host, plan)

    # -- atomic operations, applied at one simulated instant -----------------------------

    def _etag(self, data: bytes) -> str:
        # content-derived, as S3's: an identical body gives an identical ETag
        return '"' + hashlib.blake2b(data, digest_size=16).hexdigest() + '"'

    def apply_get(self, key: str) -> GetResult:
        obj = self.objects.get(key)
        if obj is None:
            raise NotFound(f"{key} not found", op="get", key=key)
        return GetResult(obj.data, obj.etag, obj.last_modified, self.sim.now)

    def apply_put(self, key: str, data: bytes, if_match: str | None,
                  if_none_match: IfNoneMatch) -> PutResult:
        current = self.objects.get(key)
        if if_none_match == "*" and current is not None:
            raise PreconditionFailed(f"{key} exists", op="put", key=key)
        if if_match is not None and (current is None or current.etag != if_match):
            raise PreconditionFailed(f"{key} changed", op="put", key=key)
        obj = _Object(bytes(data), self._etag(data), self.sim.now)
        self.objects[key] = obj
        return PutResult(obj.etag, self.sim.now)

    def apply_delete(self, key: str) -> None:
        self.on_delete(key)
        self.objects.pop(key, None)

    def apply_list(self, prefix: str) -> ListResult:
        objects = [ObjectInfo(k, len(o.data), o.last_modified, o.etag)
                   for k, o in sorted(self.objects.items()) if k.startswith(prefix)]
        return ListResult(objects, self.sim.now)

    def apply_head(self, key: str) -> ObjectInfo:
        obj = self.objects.get(key)
        if obj is None:
            raise NotFound(f"{key} not found", op="head", key=key)
        return ObjectInfo(key, len(obj.data), obj.last_modified, obj.etag)


class SimStoreView(AsyncObjectStore):
    """One host's connection to the :class:`SimStore`, with that host's faults."""

    def __init__(self, store: SimStore, host: str, plan: FaultPlan) -> None:
        self.store = store
        self.host = host
        self.plan = plan
        self.url = "sim://bucket"
        self.crashed = False

    def _draw(self, p: float) -> bool:
        return self.store.faults_on and p > 0 and self.store.rng.random() < p

    async def _call(self, op: str, key: str, apply: object, *,
                    conditional: bool = False) -> object:
        store, plan, rng = self.store, self.plan, self.store.rng
        if self.crashed:
            raise SimCrash(f"{self.host} is down")
        if self._draw(plan.crash):
            self.crashed = True
            raise SimCrash(f"{self.host} crashed before {op} {key}")
        inline = store.sim.inline_depth > 0
        if not inline:
            delay = rng.uniform(*plan.latency_s)
            if self._draw(plan.stall):
                delay += rng.uniform(*plan.stall_s)
            await asyncio.sleep(delay)
            if self.crashed:  # crashed while the request was in flight
                raise SimCrash(f"{self.host} is down")
            if self._draw(plan.error_before):
                store.log.faults += 1
                raise TransientStoreError(f"sim: {op} {key} failed before it was applied",
                                          op=op, key=key, ambiguous=False, code="SimError")
            if conditional and self._draw(plan.lost_race):
                store.log.faults += 1
                raise PreconditionFailed(f"sim: {op} {key} lost a race (409)", op=op,
                                         key=key)
        result = apply()  # type: ignore[operator]
        if not inline and op in ("put", "delete") and self._draw(plan.error_after):
            store.log.faults += 1
            raise TransientStoreError(f"sim: {op} {key} was applied but its answer was lost",
                                      op=op, key=key, ambiguous=True, code="SimLostAnswer")
        return result

    async def get(self, key: str) -> GetResult:
        check_key(key)
        return await self._call("get", key, lambda: self.store.apply_get(key))  # type: ignore[return-value]

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        check_key(key)
        return await self._call(  # type: ignore[return-value]
            "put", key, lambda: self.store.apply_put(key, data, if_match, if_none_match),
            conditional=if_match is not None or if_none_match is not None)

    async def delete(self, key: str) -> None:
        check_key(key)
        await self._call("delete", key, lambda: self.store.apply_delete(key))

    async def list(self, prefix: str = "") -> ListResult:
        return await self._call("list", prefix, lambda: self.store.apply_list(prefix))  # type: ignore[return-value]

    async def head(self, key: str) -> ObjectInfo:
        check_key(key)
        return await self._call("head", key, lambda: self.store.apply_head(key))  # type: ignore[return-value]

    def encodes_inline(self, body: object) -> bool:
        return True  # never a thread hop for encoding
