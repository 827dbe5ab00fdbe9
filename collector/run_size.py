"""How big the next run is: by time (``collector.target_run_s``) and by parallelism.

Why not by ``max_run_bytes`` alone: a run's Spark job takes time in proportion to its bytes,
and everything queued behind it waits that long; a cap in bytes is a cap in time only for
one cluster size and one event shape. So the collector measures what its jobs read per
second (batch-file bytes over job seconds, smoothed over runs) and gives the next run
about ``target_run_s`` of it — never fewer entries than the job has partitions (every Spark
task gets a batch file: the cluster's parallelism is used even when the rate measured so far
is low), never more than ``max_run_entries``/``max_run_bytes``. Before the first job there
is no rate: the byte limit alone applies.
"""

from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = 0.3
"""Weight of the newest job in the rate (an exponential moving average)."""
MIN_BYTES = 1 << 20
"""Jobs smaller than this say little about the rate (their fixed costs dominate)."""


@dataclass
class RunSizer:
    """The byte budget of the next run, from the jobs measured so far."""

    target_s: float
    max_bytes: int
    partitions: int
    rate: float | None = None
    """Batch-file bytes per second of job time (None: no job measured yet)."""

    def observe(self, size: int, seconds: float) -> None:
        """A job read ``size`` batch-file bytes in ``seconds``."""
        if size < MIN_BYTES or seconds <= 0:
            return
        rate = size / seconds
        self.rate = rate if self.rate is None else \
            SMOOTHING * rate + (1 - SMOOTHING) * self.rate

    def budget(self) -> int:
        """Most batch-file bytes the next run takes (beyond its first ``partitions``
        entries, which it takes whatever their size)."""
        if self.target_s <= 0 or self.rate is None:
            return self.max_bytes
        return max(1, min(self.max_bytes, int(self.rate * self.target_s)))
