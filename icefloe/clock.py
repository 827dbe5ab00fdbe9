"""The one place protocol code reads time from: an injectable clock.

Why: the exactly-once argument depends on time in many places (append deadlines, GC grace,
leases, dedup windows, staging conditions, snapshot expiry). A deterministic simulator
(``testing/sim``) must be able to drive all of them from one seed, skew one host against
another and jump hours ahead, which is impossible while components call ``time.time()``
themselves. So the batcher, the manifest producer and consumer, the collector, GC, dedup,
staging, the registry and maintenance take a :class:`Clock` (default :data:`SYSTEM`) and
read time, and sleep, only through it.

Two readings, as in the standard library: :meth:`Clock.time` is wall-clock seconds since
the epoch (comparable across hosts only as far as their clocks agree; icefloe prefers the
store's clock where safety depends on it) and :meth:`Clock.monotonic` measures durations.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """What protocol code may ask of time."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes back (for durations)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for ``seconds``."""
        ...

    def sleep_sync(self, seconds: float) -> None:
        """Block the calling thread for ``seconds`` (code that runs in worker threads)."""
        ...


class SystemClock:
    """The real clock: :mod:`time` and :func:`asyncio.sleep`."""

    __slots__ = ()

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def sleep_sync(self, seconds: float) -> None:
        time.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM: Clock = SystemClock()
"""The default every component uses unless a test or the simulator injects another."""


class ManualClock:
    """A clock that moves only when told to: tests and the simulator.

    ``sleep`` and ``sleep_sync`` advance the clock by the time asked instead of waiting,
    so a backoff of ten minutes costs nothing; ``sleep`` still yields to the event loop
    once, so other tasks run in between as they would. ``offset_s`` makes a skewed view of
    the same clock (another host): ``clock.skewed(3600)`` reads an hour ahead.
    """

    __slots__ = ("_base", "_now", "offset_s")

    def __init__(self, start: float = 1_800_000_000.0, *, offset_s: float = 0.0,
                 _base: ManualClock | None = None) -> None:
        self._base = _base
        self._now = start
        self.offset_s = offset_s

    def _root(self) -> ManualClock:
        return self._base._root() if self._base is not None else self

    def time(self) -> float:
        return self._root()._now + self.offset_s

    def monotonic(self) -> float:
        return self._root()._now

    def advance(self, seconds: float) -> None:
        """Move time forward (never back: a monotonic reading must not decrease)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._root()._now += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)

    def sleep_sync(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def skewed(self, offset_s: float) -> ManualClock:
        """A view of this clock ``offset_s`` seconds off, as another host would read it."""
        return ManualClock(offset_s=offset_s, _base=self._root())

    def __repr__(self) -> str:
        return f"ManualClock(time={self.time():.3f}, offset_s={self.offset_s:g})"


class StoreClock:
    """The object store's clock as last read, carried forward by local monotonic time.

    Why: ages that decide deletion (snapshot expiry, the orphan sweep) and the dedup window
    must not depend on the clock of whichever host runs the collector; a host hours ahead
    would otherwise expire snapshots and delete files a commit in flight still needs. Every
    manifest read and write answers with the store's time (``Loaded.store_time``); the
    consumer feeds each one to :meth:`observe`, and :meth:`time` is the last one plus the
    local monotonic time elapsed since — seconds old at most, never skewed by the host's
    wall clock. Before the first observation it reads the local clock.
    """

    __slots__ = ("_at", "_store", "local")

    def __init__(self, local: Clock = SYSTEM) -> None:
        self.local = local
        self._store: float | None = None
        self._at = 0.0

    def observe(self, store_time: float) -> None:
        """Record the store's time as just read."""
        self._store, self._at = store_time, self.local.monotonic()

    def time(self) -> float:
        if self._store is None:
            return self.local.time()
        return self._store + self.local.monotonic() - self._at

    def monotonic(self) -> float:
        return self.local.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.local.sleep(seconds)

    def sleep_sync(self, seconds: float) -> None:
        self.local.sleep_sync(seconds)

    def __repr__(self) -> str:
        return f"StoreClock(time={self.time():.3f}, local={self.local!r})"
