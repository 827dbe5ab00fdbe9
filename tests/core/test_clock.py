"""The injectable clock: the system clock reads real time, the manual one only moves when told."""

from __future__ import annotations

import asyncio
import time

import pytest

from icefloe.clock import SYSTEM, ManualClock, StoreClock


def test_system_clock_reads_real_time() -> None:
    before = time.time()
    assert before <= SYSTEM.time() <= time.time()
    assert SYSTEM.monotonic() <= time.monotonic()


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(1000.0)
    assert clock.time() == 1000.0
    clock.advance(2.5)
    assert clock.time() == 1002.5
    assert clock.monotonic() == 1002.5
    clock.sleep_sync(600)
    assert clock.time() == 1602.5
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance(-1)


def test_skewed_view_follows_its_base() -> None:
    clock = ManualClock(1000.0)
    ahead = clock.skewed(3600)
    assert ahead.time() == 4600.0
    clock.advance(10)
    assert ahead.time() == 4610.0
    assert ahead.monotonic() == clock.monotonic()
    ahead.advance(5)  # advancing a view advances the one clock
    assert clock.time() == 1015.0


async def test_async_sleep_advances_and_yields() -> None:
    clock = ManualClock(0.0)
    order: list[str] = []

    async def other() -> None:
        order.append("other")

    task = asyncio.create_task(other())
    await clock.sleep(3600)
    order.append("after sleep")
    await task
    assert clock.time() == 3600.0
    assert order == ["other", "after sleep"]


def test_the_store_clock_follows_the_store_not_the_host():
    """Seeded by each manifest read, carried forward by monotonic time: a host hours ahead
    (or behind) does not move it; before the first read it is the host's clock."""
    host = ManualClock(1000.0).skewed(3 * 3600)
    store = StoreClock(host)
    assert store.time() == host.time()
    store.observe(1000.0)
    host.advance(30)
    assert store.time() == 1030.0
    assert store.monotonic() == host.monotonic()
    store.sleep_sync(5)
    assert store.time() == 1035.0
