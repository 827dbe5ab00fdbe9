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
import concurrent.futures
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
LOOP_TURN_S = 1e-6


class SimTime:
    """The one simulated clock, moved only by the loop (and blocking sleeps).

    ``elapsed`` counts from 0 (the loop's and every host's monotonic time): at epoch-sized
    values a float's step is ~0.2 us, too coarse for timers that must come due exactly.
    Wall-clock readings are ``start + elapsed``.
    """

    def __init__(self, start: float) -> None:
        self.start = start
        self.elapsed = 0.0
        self.inline_depth = 0
        """>0 while a blocking step runs inline: store operations must not suspend then."""

    @property
    def now(self) -> float:
        return self.start + self.elapsed

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.elapsed += seconds


class HostClock:
    """One host's view of :class:`SimTime`: a :class:`icefloe.clock.Clock` with skew."""

    def __init__(self, sim: SimTime, offset_s: float = 0.0) -> None:
        self.sim = sim
        self.offset_s = offset_s

    def time(self) -> float:
        return self.sim.now + self.offset_s

    def monotonic(self) -> float:
        return self.sim.elapsed

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
        self.next_timer: Callable[[], float | None] = lambda: None

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready:
            self._sim.advance(LOOP_TURN_S)
            return ready
        if timeout is None:
            raise SimDeadlock("every task waits and no timer is set: the simulation is "
                              "wedged (a task waits for something that never happens)")
        if timeout <= 0:
            # every turn of the loop costs a microsecond, as a real one costs at least that:
            # code that waits for a deadline a rounding error away then still sees it pass
            self._sim.advance(LOOP_TURN_S)
            return []
        if timeout > 0:
            target = self._sim.elapsed + timeout
            when = self.next_timer()
            if when is not None and when <= target + 1e-9:
                target = max(target, when)  # land on the timer exactly: it comes due
            self._sim.elapsed = target
        return []


class SimDeadlock(RuntimeError):
    """No task can ever run again."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on :class:`SimTime` whose executor hops run inline."""

    def __init__(self, sim: SimTime) -> None:
        selector = _VirtualSelector(sim)
        super().__init__(selector=selector)
        self.sim = sim
        selector.next_timer = self._next_timer

    def time(self) -> float:
        return self.sim.elapsed

    def _next_timer(self) -> float | None:
        """When the earliest timer is due: asyncio's own timer heap (private, and rebound
        when asyncio sweeps cancelled timers, so read it anew each time)."""
        timers: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        return timers[0].when() if timers else None

    def run_in_executor(self, executor: concurrent.futures.Executor | None,
                        func: Callable[[*Ts], T], *args: *Ts
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


async def offload(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """The collector's ``offload`` seam: a blocking step runs right here, atomically."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    loop.sim.inline_depth += 1
    try:
        return func(*args, **kwargs)
    finally:
        loop.sim.inline_depth -= 1


_nested: dict[int, VirtualTimeLoop] = {}


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion inside a blocking step, where the loop cannot run.

    A nested loop on the same :class:`SimTime` runs it (the outer loop is set aside for
    that time), so the step may still gather tasks or back off; nothing of any other host
    runs meanwhile, exactly as nothing else runs while a real thread blocks on its result.
    """
    outer = asyncio.events._get_running_loop()
    if not isinstance(outer, VirtualTimeLoop):
        raise RuntimeError("drive() runs only inside a simulated blocking step")
    nested = _nested.get(id(outer))
    if nested is None or nested.is_closed():
        nested = _nested[id(outer)] = VirtualTimeLoop(outer.sim)
        factory = outer.get_task_factory()
        if factory is not None:
            nested.set_task_factory(factory)
    asyncio.events._set_running_loop(None)
    try:
        return nested.run_until_complete(coro)
    finally:
        asyncio.events._set_running_loop(outer)


def close_nested(loop: asyncio.AbstractEventLoop) -> None:
    nested = _nested.pop(id(loop), None)
    if nested is not None and not nested.is_closed():
        nested.close()
