"""The collector's thread hops and waits, as seams a deterministic simulator can replace.

Why seams: the collector's blocking steps (the Spark job, Iceberg commits, table
preparation) run in worker threads (``offload``, default :func:`asyncio.to_thread`), and
those steps reach back to the event loop for object-store calls (``block_on``, default: the
coroutine is scheduled on the collector's loop and the worker waits for it). A simulator
that runs the whole protocol on one thread, with an in-memory store and a
:class:`~icefloe.clock.ManualClock`, passes :func:`inline` and :func:`drive` instead: every
step then runs in order on the calling thread, and a seed replays exactly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from icefloe.clock import Clock

T = TypeVar("T")
Offload = Callable[..., Awaitable[Any]]
"""``await offload(func, *args)``: run the blocking ``func`` off the event loop."""
BlockOn = Callable[[Coroutine[Any, Any, Any]], Any]
"""``block_on(coro)``: from a blocking step, run a store coroutine to its result."""


async def inline(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """An ``offload`` that runs ``func`` right here, on the event loop's thread."""
    return func(*args, **kwargs)


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """A ``block_on`` for :func:`inline`: step ``coro`` to completion on this thread.

    Works for coroutines that only ever yield to the loop without waiting on it (an
    in-memory store, ``ManualClock.sleep``); one that awaits a real future cannot finish
    here and is refused instead of hanging.
    """
    try:
        while True:
            if coro.send(None) is not None:
                coro.close()
                raise RuntimeError("drive(): the coroutine awaited a future of the event "
                                   "loop; run it with the default thread hops")
    except StopIteration as done:
        return done.value


async def together(*coros: Coroutine[Any, Any, Any]) -> list[Any]:
    """Await ``coros`` at once on a running loop (each runs to its end; the first failure
    is raised after); one after another when :func:`drive` steps the caller, which has no
    loop to run tasks on (the simulator: a seed's order is then the listed order)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return [await coro for coro in coros]
    results = await asyncio.gather(*coros, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


async def sleep_or_stop(clock: Clock, seconds: float, stop: asyncio.Event | None) -> None:
    """Sleep ``seconds`` on ``clock``, or less if ``stop`` is set meanwhile."""
    if stop is None:
        await clock.sleep(max(seconds, 0.0))
        return
    if stop.is_set():
        return
    sleeper = asyncio.ensure_future(clock.sleep(max(seconds, 0.0)))
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, waiter):
            task.cancel()
        await asyncio.gather(sleeper, waiter, return_exceptions=True)
