"""The retry policy: jittered exponential backoff bounded by attempts and by time.

Why a module of its own (stdlib only): the manifest settings hold a policy, so every
process that loads the config builds one, while the store package that retries with it
(:mod:`icefloe.store.retry`, which re-exports :class:`RetryPolicy`) imports asyncio and
every backend; a one-second ``icefloe query`` loads the config but never touches the store.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Full-jitter exponential backoff bounded by attempts *and* elapsed time.

    ``max_attempts`` counts the first try; ``budget_s`` caps the time spent sleeping plus
    trying, so callers with deadlines (acks, leases) stay predictable.
    """

    max_attempts: int = 8
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    budget_s: float = 20.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("RetryPolicy.max_attempts must be >= 1")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError("RetryPolicy needs 0 <= base_delay_s <= max_delay_s")
        if self.budget_s <= 0:
            raise ValueError("RetryPolicy.budget_s must be > 0")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Sleep before retry number ``attempt`` (1-based): uniform in [0, base·2^(n-1)]."""
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return (rng or random).uniform(0, cap)


def run_retry_delay(failures: int, cap_s: float) -> float:
    """The wait before retrying a collector's run (or its start, or a standby's lease read)
    after ``failures`` failures in a row: 0.5 s doubling, at most ``cap_s``. No jitter: one
    collector retries, there is no herd to spread."""
    return min(cap_s, 0.5 * 2.0 ** min(failures - 1, 10))
