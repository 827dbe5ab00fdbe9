"""Run one blocking step for each of many items on a few threads, as a loop would.

Why: a collector that takes over fences and prepares every table before its first run
(a catalog commit, the table's offsets, its dedup window from the journal), and with one
table after the other its successor's first commit waited for the sum: the tables' I/O
(catalog, metadata and journal reads) overlaps well on threads. A simulator runs its
steps on one thread (``threads=1``): then this is exactly the plain loop, stopping at the
first error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def for_each(threads: int, step: Callable[[T], object], items: Sequence[T]) -> None:
    """``step(item)`` for every item, on up to ``threads`` threads. Every step runs to its
    end (what one step does never depends on another), then the first error in item order
    is raised; with one thread (or one item), the steps run in order on this thread and
    the first error stops them."""
    if threads <= 1 or len(items) <= 1:
        for item in items:
            step(item)
        return
    with ThreadPoolExecutor(min(threads, len(items)),
                            thread_name_prefix="icefloe-prepare") as pool:
        futures = [pool.submit(step, item) for item in items]
    for future in futures:
        future.result()
