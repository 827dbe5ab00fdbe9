"""Virtual time for asyncio: the whole protocol runs on one thread, in simulated seconds.

Why a loop and not patched sleeps: the protocol waits in many ways (``asyncio.sleep``,
``wait_for`` timeouts, futures resolved by other tasks, worker-thread hops). An event loop
whose clock only moves when every task is waiting makes all of them simulated at once:
when nothing is ready, the loop jumps to the next timer instead of blocking. Tasks run in
the loop's FIFO order, so one seed gives one schedule.

Thread hops (``asyncio.to_thread`` / ``run_in_executor``) run inline on the loop thread,
so the collector's blocking steps (Iceberg commits, staging) are atomic in simulated time.
A blocking step that needs the store drives the store coroutine to completion right there
(:func:`drive`); the simulated store never suspends while the loop is inside such a step.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SimTime:
    """The one simulated clock: seconds, moved only by the loop (and blocking sleeps)."""

    def __init__(self, start: float) -> None:
        self.now = start
        self.inline_depth = 0
        """>0 while a thread hop runs inline: store operations must not suspend then."""

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.now += seconds


class HostClock:
    """One host's view of :class:`SimTime`: a :class:`icefloe.clock.Clock` with skew."""

    def __init__(self, sim: SimTime, offset_s: float = 0.0) -> None:
        self.sim = sim
        self.offset_s = offset_s

    def time(self) -> float:
        return self.sim.now + self.offset_s

    def monotonic(self) -> float:
        return self.sim.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def sleep_sync(self, seconds: float) -> None:
        # a blocking sleep inside an inline step: nothing else can run meanwhile anyway
        self.sim.advance(seconds)


class _VirtualSelector(selectors.DefaultSelector):
    """Never blocks: a wait for ``timeout`` seconds moves simulated time instead."""

    def __init__(self, sim: SimTime) -> None:
        super().__init__()
        self._sim = sim

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise SimDeadlock("every task waits and no timer is set: the simulation is "
                              "wedged (a task waits for something that never happens)")
        self._sim.advance(timeout)
        return []


class SimDeadlock(RuntimeError):
    """No task can ever run again."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on :class:`SimTime` whose executor hops run inline."""

    def __init__(self, sim: SimTime) -> None:
        super().__init__(selector=_VirtualSelector(sim))
        self.sim = sim

    def time(self) -> float:
        return self.sim.now

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any
                        ) -> asyncio.Future[T]:
        future: asyncio.Future[T] = self.create_future()
        self.sim.inline_depth += 1
        try:
            result = func(*args)
        except BaseException as exc:  # delivered to the awaiting task, as a thread would
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            future.set_exception(exc)
        else:
            future.set_result(result)
        finally:
            self.sim.inline_depth -= 1
        return future


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion without the loop (inside an inline step).

    Works because the simulated store completes at once while ``inline_depth`` > 0; a
    coroutine that still suspends would wait for a loop that cannot run: that is a bug in
    the simulation's seams, reported as such.
    """
    ctx = contextvars.copy_context()
    try:
        while True:
            yielded = ctx.run(coro.send, None)
            if yielded is not None and not (isinstance(yielded, asyncio.Future)
                                            and yielded.done()):
                coro.close()
                raise RuntimeError("simulation: a blocking step suspended on "
                                   f"{yielded!r}; blocking steps must not wait")
    except StopIteration as stop:
        return stop.value
