"""How big the next run is: by time (``collector.target_run_s``) and by parallelism.

Why not by ``max_run_bytes`` alone: a run's Spark job takes time in proportion to its bytes,
and everything queued behind it waits that long; a cap in bytes is a cap in time only for
one cluster size and one event shape. So the collector measures what its jobs read per
second (batch-file bytes over job seconds, smoothed over runs) and gives the next run
about ``target_run_s`` of it — never fewer entries than the job has partitions (every Spark
task gets a batch file: the cluster's parallelism is used even when the rate measured so far
is low), never more than ``max_run_entries`` and the byte cap. The byte cap is
``max_run_bytes``, or :data:`PARTITION_BYTES` per Spark partition when that is more: a
collector set up for a large cluster (``spark_partitions`` = its executor cores) takes
runs as large as its executors hold, not one machine's. Before the first job there is no
rate: the byte cap alone applies.
"""

from __future__ import annotations

from dataclasses import dataclass

PARTITION_BYTES = 128 * 1024 * 1024
"""Batch-file bytes one Spark partition reads in a run, at most, beyond
``max_run_bytes``: a run of a cluster set up with many partitions may hold that much per
partition (its memory is spread over the executors), so ``max_run_bytes`` does not cap a
large cluster at one small machine's run."""
AHEAD_PARTITION_BYTES = 64 * 1024 * 1024
"""The same for the one run read ahead, beyond ``read_ahead_bytes``."""
SMOOTHING = 0.3
"""Weight of the newest job in the rate (an exponential moving average)."""
MIN_BYTES = 1 << 20
"""Jobs smaller than this say little about the rate (their fixed costs dominate)."""


def run_cap(max_run_bytes: int, partitions: int) -> int:
    """Most batch-file bytes of one run: ``max_run_bytes``, or more with many partitions
    (:data:`PARTITION_BYTES` each)."""
    return max(max_run_bytes, partitions * PARTITION_BYTES)


def ahead_cap(read_ahead_bytes: int, partitions: int) -> int:
    """Most batch-file bytes of the run read ahead (:data:`AHEAD_PARTITION_BYTES`)."""
    return max(read_ahead_bytes, partitions * AHEAD_PARTITION_BYTES)


@dataclass
class RunSizer:
    """The byte budget of the next run, from the jobs measured so far."""

    target_s: float
    max_bytes: int
    """The byte cap of a run (:func:`run_cap`)."""
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
