"""icefloe.parallel.for_each: the loop a collector's takeover fences and prepares tables with."""

from __future__ import annotations

import threading

import pytest

from icefloe.parallel import for_each


def test_should_run_every_step_on_threads_and_raise_the_first_error_in_item_order() -> None:
    done: list[int] = []
    started = threading.Barrier(3, timeout=10)  # three steps at once, or this times out

    def step(n: int) -> None:
        if n < 3:
            started.wait()
        if n in (2, 4):
            raise ValueError(f"step {n}")
        done.append(n)

    with pytest.raises(ValueError, match="step 2"):
        for_each(4, step, [0, 1, 2, 3, 4, 5])
    assert sorted(done) == [0, 1, 3, 5]  # the steps after a failed one ran too


def test_should_be_the_plain_loop_with_one_thread() -> None:
    done: list[tuple[int, str]] = []

    def step(n: int) -> None:
        if n == 2:
            raise ValueError("step 2")
        done.append((n, threading.current_thread().name))

    with pytest.raises(ValueError, match="step 2"):
        for_each(1, step, [0, 1, 2, 3])
    assert done == [(0, threading.current_thread().name), (1, threading.current_thread().name)]
