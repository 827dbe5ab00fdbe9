"""An S3-like bucket on the wall clock, for cluster-scale benchmarks and their tests.

Why: the scale benchmark (``bench/scale_bench.py``) runs the real manifest producer,
publishing and consumer code for up to a hundred-odd simulated ingestors in one process;
what limits such a cluster is the store's latency, its conditional-write races and its
request rates, not CPU. This module supplies those three and counts every request, so the
cost model can be read off a run instead of a formula alone.

It reuses the simulator's bucket (:mod:`testing.sim.store`: S3's contract for ETags,
``If-Match``/``If-None-Match: *``, sorted listings, store-clock times; per-request latency,
applied-but-lost answers and lost races drawn from a seed) on the wall clock instead of
the simulator's virtual one, and adds what the simulator does not need:

* **per-prefix request rates** — S3 documents 3,500 PUT/COPY/POST/DELETE and 5,500
  GET/HEAD requests per second per partitioned prefix and answers ``503 SlowDown`` beyond;
  modeled as one token bucket per (prefix, class) holding one second's worth. The prefix
  is the key up to its last ``/`` (a LIST counts against the prefix it lists, in the
  GET/HEAD class: S3 documents no separate LIST rate);
* **request accounting** — per operation and per kind of key (batch file, manifest,
  other), LISTs counted in pages of 1,000 keys as S3's ``ListObjectsV2`` returns them.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections import Counter
from dataclasses import dataclass, field

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import TransientStoreError
from icefloe.store.base import (
    AsyncObjectStore,
    Encodable,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    PutResult,
)
from testing.sim.store import FaultPlan, SimStore, SimStoreView

S3_WRITES_PER_S = 3500.0
"""PUT/COPY/POST/DELETE per second per partitioned prefix (S3 performance guidelines)."""
S3_READS_PER_S = 5500.0
"""GET/HEAD per second per partitioned prefix."""
LIST_PAGE = 1000
"""Keys per ``ListObjectsV2`` page: a listing of n keys costs ceil(n / 1000) requests."""
CONTENT_ETAG_MAX = 64 * 1024
"""Bodies up to this size get a content ETag (the manifest's CAS needs it); larger ones
(batch files, written once under a unique key) a unique one, so the model does not hash
a gigabyte per second."""


class WallTime:
    """The simulator's clock interface (:class:`testing.sim.loop.SimTime`) on the wall
    clock: requests land when their real latency has passed."""

    inline_depth = 0

    def __init__(self, clock: Clock = SYSTEM) -> None:
        self.clock = clock

    @property
    def now(self) -> float:
        return self.clock.time()


class ModelBucket(SimStore):
    """The simulator's bucket on the wall clock; see the module docstring."""

    def __init__(self, seed: int = 0, clock: Clock = SYSTEM) -> None:
        super().__init__(WallTime(clock), random.Random(seed))  # type: ignore[arg-type]
        self._unique = itertools.count(1)

    def _etag(self, data: bytes) -> str:
        if len(data) <= CONTENT_ETAG_MAX:
            return '"' + hashlib.blake2b(data, digest_size=16).hexdigest() + '"'
        return f'"large-{next(self._unique)}"'


@dataclass
class PrefixThrottle:
    """Token buckets per (key prefix, request class), shared by every client of a bucket."""

    writes_per_s: float = S3_WRITES_PER_S
    reads_per_s: float = S3_READS_PER_S
    clock: Clock = SYSTEM
    throttled: Counter[str] = field(default_factory=Counter)
    _buckets: dict[tuple[str, bool], list[float]] = field(default_factory=dict)

    def admit(self, op: str, key: str, *, listing: bool = False) -> bool:
        """Take a token for ``op`` on ``key``; False means S3 would answer 503 SlowDown."""
        write = op in ("put", "delete")
        prefix = key if listing else key.rpartition("/")[0] + "/"
        rate = self.writes_per_s if write else self.reads_per_s
        now = self.clock.monotonic()
        bucket = self._buckets.setdefault((prefix, write), [rate, now])
        bucket[0] = min(rate, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        if bucket[0] < 1.0:
            self.throttled[prefix] += 1
            return False
        bucket[0] -= 1.0
        return True


def key_kind(key: str, manifest_prefix: str = "manifest/") -> str:
    """What a key is, for the request accounting: a batch file, a manifest, or other."""
    if key.startswith("batches/"):
        return "batch"
    if key.startswith(manifest_prefix):
        return "manifest"
    return "other"


@dataclass
class RequestLog:
    """Requests sent to the bucket, by (client role, operation, kind of key); shared by
    all clients. Throttled requests count as sent (they reached S3); LISTs count one per
    page.
    """

    requests: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    bytes_put: int = 0

    def count(self, role: str, op: str, key: str, pages: int = 1) -> None:
        self.requests[(role, op, key_kind(key))] += pages

    def total(self, role: str | None = None, op: str | None = None,
              kind: str | None = None) -> int:
        return sum(n for (r, o, k), n in self.requests.items()
                   if (role is None or r == role) and (op is None or o == op)
                   and (kind is None or k == kind))


class MeteredView(AsyncObjectStore):
    """One client's connection: counts each request, applies the per-prefix rate limit,
    then goes to the bucket (latency, lost answers and races happen there)."""

    def __init__(self, inner: SimStoreView, throttle: PrefixThrottle, log: RequestLog,
                 role: str) -> None:
        self.inner = inner
        self.role = role
        self.throttle = throttle
        self.log = log
        self.url = inner.url

    def _admit(self, op: str, key: str, *, listing: bool = False) -> None:
        if not self.throttle.admit(op, key, listing=listing):
            raise TransientStoreError(f"model: 503 SlowDown on {op} {key!r}", op=op, key=key,
                                      ambiguous=False, code="SlowDown")

    async def get(self, key: str) -> GetResult:
        self.log.count(self.role, "get", key)
        self._admit("get", key)
        return await self.inner.get(key)

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        self.log.count(self.role, "put", key)
        self.log.bytes_put += len(data)
        self._admit("put", key)
        return await self.inner.put(key, data, if_match=if_match,
                                    if_none_match=if_none_match)

    async def delete(self, key: str) -> None:
        self.log.count(self.role, "delete", key)
        self._admit("delete", key)
        await self.inner.delete(key)

    async def list(self, prefix: str = "") -> ListResult:
        self._admit("list", prefix, listing=True)
        result = await self.inner.list(prefix)
        pages = max(1, math.ceil(len(result.objects) / LIST_PAGE))
        self.log.count(self.role, "list", prefix, pages=pages)
        return result

    async def head(self, key: str) -> ObjectInfo:
        self.log.count(self.role, "head", key)
        self._admit("head", key)
        return await self.inner.head(key)

    def encodes_inline(self, body: Encodable) -> bool:
        return True


@dataclass
class S3Model:
    """A bucket, its rate limits and its request log: ``view(host)`` per client."""

    seed: int = 0
    latency_s: tuple[float, float] = (0.020, 0.050)
    lost_answer: float = 0.0
    """Probability that a PUT/DELETE is applied and its answer lost (ambiguous error)."""
    lost_race: float = 0.0
    """Probability that a conditional PUT is refused with 409/412 although it would win."""
    writes_per_s: float = S3_WRITES_PER_S
    reads_per_s: float = S3_READS_PER_S
    clock: Clock = SYSTEM
    bucket: ModelBucket = field(init=False)
    throttle: PrefixThrottle = field(init=False)
    log: RequestLog = field(init=False, default_factory=RequestLog)

    def __post_init__(self) -> None:
        self.bucket = ModelBucket(self.seed, self.clock)
        self.throttle = PrefixThrottle(self.writes_per_s, self.reads_per_s, self.clock)

    def view(self, host: str, role: str = "ingestor") -> MeteredView:
        """A client's connection; ``role`` groups its requests in :attr:`log`."""
        plan = FaultPlan(latency_s=self.latency_s, error_after=self.lost_answer,
                         lost_race=self.lost_race)
        return MeteredView(self.bucket.view(host, plan), self.throttle, self.log, role)

    @property
    def faults(self) -> int:
        """Lost answers and races injected so far."""
        return self.bucket.log.faults
