"""Slow-loris defence: HTTP clients whose headers or body arrive too slowly are cut off.

Why this is needed: uvicorn (httptools) has no timeout for request headers, and a body is
read as fast as the client sends it, so a client that opens connections and dribbles a
byte every few seconds holds each one — and its buffers — forever. The rules (Apache's
``mod_reqtimeout`` model):

* headers must be complete ``header_timeout_s`` after the connection opens (or, on a
  keep-alive connection, after the next request's first byte);
* a body must be complete ``body_timeout_s`` after the headers, plus one second for every
  ``body_min_bytes_per_s`` bytes received so far — a slow but steady upload goes on, a
  trickle is refused with 408 and its connection closed;
* however steady, a body must be complete ``body_max_s`` after its headers (408 and a close
  too): else one client could hold a connection and its buffers for hours at the minimum
  rate;
* a request answered before its body arrived (a refusal): the rest of that body and the
  next request's headers within ``header_timeout_s`` of the answer
  (:mod:`ingestor.http.server`);
* an idle keep-alive connection (answered, nothing new) is closed after ``keep_alive_s``
  (uvicorn's own keep-alive timer is not used: it is armed and cancelled per request).

Why a sweeper instead of a timer per request: arming and cancelling an event-loop timer
costs ~1.5-8 µs, a noticeable share of a ~20 µs request. Here a connection only notes when
it started waiting (``headers_since``, ``idle_since``: attribute writes, no dict or timer
per request), and one callback every ``sweep_s`` (0.5 s) looks at the watched connections
and bodies, while there are any. Deadlines are therefore enforced within ``sweep_s``.

Time is read through :attr:`SlowClientGuard.now`: the event loop's clock, or the
``clock`` given (a :class:`~icefloe.clock.ManualClock` in tests), so deadlines can be
checked without waiting for them. Connections set their clocks from the same ``now``.

Not thread-safe: one instance belongs to the event loop of one HTTP server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from icefloe.clock import Clock

SWEEP_S = 0.5


class HeaderWaiter(Protocol):
    """A watched connection (the guarded uvicorn protocol). It keeps its own clocks:
    ``headers_since`` (waiting for request headers since; None: not waiting) and
    ``idle_since`` (answered at, nothing since; None: busy)."""

    headers_since: float | None
    idle_since: float | None

    def header_timeout(self) -> None: ...

    def idle_timeout(self) -> None: ...


class BodyRead:
    """One body being read: when it started, how much arrived, whether time ran out.

    ``task`` (the ASGI path) is cancelled when time runs out; ``on_expire`` (the fast
    lane, which has no task per request) is called instead.
    """

    __slots__ = ("capped", "expired", "on_expire", "received", "started", "task")

    def __init__(self, task: asyncio.Task[object] | None, started: float,
                 on_expire: Callable[[], None] | None = None) -> None:
        self.task = task
        self.on_expire = on_expire
        self.started = started
        self.received = 0
        self.expired = False
        self.capped = False  # expired by body_max_s rather than by the rate rule


class SlowClientGuard:
    """Header and body deadlines of one HTTP server's connections (see module docstring)."""

    def __init__(self, header_timeout_s: float, body_timeout_s: float,
                 body_min_bytes_per_s: float, sweep_s: float = SWEEP_S,
                 keep_alive_s: float = 30.0, body_max_s: float = 300.0,
                 clock: Clock | None = None) -> None:
        self.header_timeout_s = header_timeout_s
        self.body_max_s = body_max_s
        self.keep_alive_s = keep_alive_s
        self.body_timeout_s = body_timeout_s
        self.body_min_bytes_per_s = body_min_bytes_per_s
        self.sweep_s = sweep_s
        self.connections: set[HeaderWaiter] = set()
        self.bodies: dict[BodyRead, None] = {}
        self.cut_headers = 0
        self.cut_bodies = 0
        self._sweeper: asyncio.TimerHandle | None = None
        # Cached on first use: asyncio.get_running_loop() makes a getpid() syscall on
        # every call in CPython 3.11, and syscalls are not cheap everywhere (~10 % of a
        # single-event request on this project's CI-class VM, measured with py-spy).
        self._loop: asyncio.AbstractEventLoop | None = None
        self.now: Callable[[], float] = clock.monotonic if clock is not None \
            else self._first_now
        self._clock = clock

    # -- registration ------------------------------------------------------------------

    def watch(self, connection: HeaderWaiter) -> None:
        """Watch ``connection`` until :meth:`forget`; its clocks are its own to set."""
        self.connections.add(connection)
        self._ensure_sweeping()

    def forget(self, connection: HeaderWaiter) -> None:
        """``connection`` is gone."""
        self.connections.discard(connection)

    def begin_body(self, on_expire: Callable[[], None] | None = None) -> BodyRead:
        """Register a body read (see :meth:`end_body`): the current task's, which is
        cancelled if time runs out, or — given ``on_expire`` — one that is told so."""
        loop = self._loop or self._bind_loop()
        read = BodyRead(None if on_expire else asyncio.current_task(loop), self.now(),
                        on_expire)
        self.bodies[read] = None
        self._ensure_sweeping()
        return read

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        if self._clock is None:
            self.now = self._loop.time
        return self._loop

    def _first_now(self) -> float:
        """``now`` before the guard knows its loop: bind it, then read the loop's clock."""
        return (self._loop or self._bind_loop()).time()

    def end_body(self, read: BodyRead) -> None:
        self.bodies.pop(read, None)

    def body_deadline(self, read: BodyRead) -> float:
        """The rate rule's deadline, capped at ``body_max_s`` after the body began."""
        extra = read.received / self.body_min_bytes_per_s if self.body_min_bytes_per_s else 0
        return read.started + min(self.body_timeout_s + extra, self.body_max_s)

    # -- the sweeper -----------------------------------------------------------------------

    def _ensure_sweeping(self) -> None:
        if self._sweeper is None:
            loop = self._loop or self._bind_loop()
            self._sweeper = loop.call_later(self.sweep_s, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweeper = None
        now = self.now()
        for connection in list(self.connections):
            since = connection.headers_since
            if since is not None and now - since > self.header_timeout_s:
                connection.headers_since = None
                self.cut_headers += 1
                connection.header_timeout()
            idle = connection.idle_since
            if idle is not None and now - idle > self.keep_alive_s:
                connection.idle_since = None
                connection.idle_timeout()
        for read in [r for r in self.bodies if now > self.body_deadline(r)]:
            self.bodies.pop(read, None)
            expire = read.on_expire or (read.task.cancel if read.task is not None
                                        and not read.task.done() else None)
            if expire is not None:
                read.expired = True
                read.capped = now - read.started >= self.body_max_s
                self.cut_bodies += 1
                expire()
        if self.connections or self.bodies:
            self._sweeper = loop.call_later(self.sweep_s, self._sweep, loop)

    def close(self) -> None:
        """Stop sweeping (server shutdown)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._loop = None
        if self._clock is None:
            self.now = self._first_now
        self.connections.clear()
        self.bodies.clear()
