"""Where an ack's time goes in the modeled cluster (issue #25): per-stage timestamps.

Why a trace and not another figure: ``scale_bench.py`` reports an ack p99, and a p99 alone
does not say which stage makes it — waiting for a flush slot, the batch PUT, waiting
behind this producer's CAS in flight (group commit), lost CAS races and their backoff, or
a retry after a lost answer. This module records every request each client sends (below
the real retry layer, so retries and lost answers show) and when each flush passed each
stage, then splits every ack into:

* ``slot``: sealed → a flush slot free (``FlushSettings.max_inflight``);
* ``put``: the batch-file PUT, retries included;
* ``behind``: append called → the producer's first manifest request after it (the
  group commit waiting for the CAS in flight, or its backoff sleep, to end);
* ``cas``: the rest of the append: the CAS attempts that carried the batch, with their
  reads, lost races (412/409) and backoff sleeps;

and counts, per ack, the manifest PUTs, the lost races and the lost answers the producer
met while the batch waited. Printed for the median acks and the slowest 1 %.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import PreconditionFailed, TransientStoreError
from icefloe.store.base import (
    AsyncObjectStore,
    Encodable,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    PutResult,
)


@dataclass(frozen=True, slots=True)
class Request:
    """One request a client sent: when, what, and how it ended."""

    start: float
    end: float
    op: str
    manifest: bool
    outcome: str  # ok | race | lost | error


class TracingStore(AsyncObjectStore):
    """Records every request to ``inner`` (one client's connection) in ``requests``."""

    def __init__(self, inner: AsyncObjectStore, clock: Clock = SYSTEM) -> None:
        self.inner = inner
        self.clock = clock
        self.url = inner.url
        self.requests: list[Request] = []

    async def _timed(self, op: str, key: str, call: Callable[[], Any]) -> Any:
        start, outcome = self.clock.monotonic(), "ok"
        try:
            return await call()
        except PreconditionFailed:
            outcome = "race"
            raise
        except TransientStoreError as exc:
            outcome = "lost" if exc.ambiguous else "error"
            raise
        finally:
            self.requests.append(Request(start, self.clock.monotonic(), op,
                                         key.startswith("manifest/"), outcome))

    async def get(self, key: str) -> GetResult:
        return await self._timed("get", key, lambda: self.inner.get(key))

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        return await self._timed("put", key, lambda: self.inner.put(
            key, data, if_match=if_match, if_none_match=if_none_match))

    async def delete(self, key: str) -> None:
        await self._timed("delete", key, lambda: self.inner.delete(key))

    async def list(self, prefix: str = "") -> ListResult:
        return await self._timed("list", prefix, lambda: self.inner.list(prefix))

    async def head(self, key: str) -> ObjectInfo:
        return await self._timed("head", key, lambda: self.inner.head(key))

    def encodes_inline(self, body: Encodable) -> bool:
        return True


@dataclass
class FlushTrace:
    """One flush's stage times (monotonic seconds; None: not reached)."""

    ingestor: int
    sealed: float
    slot: float | None = None
    appending: float | None = None
    done: float | None = None


@dataclass
class Trace:
    """Every flush of a run and every client's requests."""

    flushes: list[FlushTrace] = field(default_factory=list)
    stores: dict[int, TracingStore] = field(default_factory=dict)
    collector: TracingStore | None = None
    runs: list[tuple[float, float, float, float, float, int]] = field(default_factory=list)
    """The collector's runs: began, read, batch files fetched, committed, acked, entries."""
    window: tuple[float, float] = (0.0, 0.0)


class TimedProducer:
    """A producer whose ``append`` notes when the batch PUT was done (publish_batch
    calls ``append`` right after it)."""

    def __init__(self, producer: Any, flush: FlushTrace, clock: Clock = SYSTEM) -> None:
        self._producer = producer
        self._flush = flush
        self._clock = clock

    async def append(self, batch: Any) -> int | None:
        self._flush.appending = self._clock.monotonic()
        return await self._producer.append(batch)


@dataclass
class Split:
    """One ack split into stages (seconds) and counts."""

    total: float
    slot: float
    put: float
    behind: float
    cas: float
    cas_puts: int
    races: int
    lost: int
    gets: int


def split(flush: FlushTrace, requests: list[Request]) -> Split | None:
    """``flush``'s stages, from its producer's requests that overlap its append."""
    if flush.slot is None or flush.appending is None or flush.done is None:
        return None
    during = [r for r in requests if r.manifest and flush.appending <= r.start < flush.done]
    first = min((r.start for r in during), default=flush.done)
    lost = sum(1 for r in requests if r.outcome == "lost"
               and flush.slot <= r.start < flush.done)
    return Split(total=flush.done - flush.sealed, slot=flush.slot - flush.sealed,
                 put=flush.appending - flush.slot, behind=first - flush.appending,
                 cas=flush.done - first,
                 cas_puts=sum(1 for r in during if r.op == "put"),
                 races=sum(1 for r in during if r.outcome == "race"),
                 lost=lost, gets=sum(1 for r in during if r.op == "get"))


def summarize(trace: Trace, window: tuple[float, float]) -> list[str]:
    """Lines: the median and the slowest 1 % of acks sealed in ``window``, by stage."""
    splits = [s for f in trace.flushes if window[0] <= f.sealed < window[1]
              for s in [split(f, trace.stores[f.ingestor].requests)] if s is not None]
    if not splits:
        return ["trace: no acks in the window"]
    splits.sort(key=lambda s: s.total)
    n = len(splits)
    tail = splits[int(n * 0.99):] or splits[-1:]
    middle = splits[int(n * 0.45):int(n * 0.55) + 1]
    lines = [f"trace: {n} acks in the window"]
    for name, group in (("p45-p55", middle), ("slowest 1 %", tail)):
        def mean(attr: str, group: list[Split] = group) -> float:
            return statistics.fmean(getattr(s, attr) for s in group)
        lines.append(
            f"  {name} ({len(group)} acks): total {mean('total') * 1000:.0f} ms = slot wait "
            f"{mean('slot') * 1000:.0f} + batch PUT {mean('put') * 1000:.0f} + behind the CAS "
            f"in flight {mean('behind') * 1000:.0f} + own CAS {mean('cas') * 1000:.0f} ms; "
            f"per ack: {mean('cas_puts'):.1f} manifest PUTs, {mean('races'):.1f} lost races, "
            f"{mean('gets'):.1f} manifest GETs, {mean('lost'):.2f} lost answers")
    lines += _request_lines(trace, window)
    lines += _run_lines(trace, window)
    return lines


def _run_lines(trace: Trace, window: tuple[float, float]) -> list[str]:
    """The collector's runs that ended in the window, split by stage."""
    first = (f"first run began {trace.runs[0][0] - window[0]:+.2f} s from the window's start"
             if trace.runs else "no run at all")
    runs = [r for r in trace.runs if window[0] <= r[4] < window[1]]
    if not runs:
        return [f"  collector: no run ended in the window ({first})"]
    def mean(i: int, j: int) -> float:
        return statistics.fmean(r[j] - r[i] for r in runs) * 1000
    span = window[1] - window[0]
    return [f"  collector: {len(runs)} runs, {sum(r[5] for r in runs) / span:.0f} entries/s, "
            f"{statistics.fmean(r[5] for r in runs):.0f} entries per run; per run: read "
            f"{mean(0, 1):.0f} + batch GETs {mean(1, 2):.0f} + commit {mean(2, 3):.0f} + "
            f"acks {mean(3, 4):.0f} ms (max ack {max(r[4] - r[3] for r in runs) * 1000:.0f}); "
            f"{first}"]


def _request_lines(trace: Trace, window: tuple[float, float]) -> list[str]:
    """Manifest request outcomes in the window: producers' and the collector's."""
    lines = []
    for who, reqs in (("producers", [r for s in trace.stores.values() for r in s.requests]),
                      ("collector", trace.collector.requests if trace.collector else [])):
        inside = [r for r in reqs if r.manifest and window[0] <= r.start < window[1]]
        puts = [r for r in inside if r.op == "put"]
        won = sum(1 for r in puts if r.outcome == "ok")
        races = sum(1 for r in puts if r.outcome == "race")
        span = window[1] - window[0]
        lines.append(f"  {who}: manifest PUTs {len(puts) / span:.1f}/s ({won / span:.1f} won, "
                     f"{races / span:.1f} lost races), GETs "
                     f"{sum(1 for r in inside if r.op == 'get') / span:.1f}/s")
    return lines
