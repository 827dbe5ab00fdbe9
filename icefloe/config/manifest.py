"""Settings of the manifest queue, and the rules that keep them safe together.

Why validation lives here: three timeouts interlock. A producer may append a batch file
until ``append_deadline_s`` after the store wrote it; garbage collection deletes an
unreferenced batch file only once it is older than ``gc_grace_s``; the idempotent-producer
table forgets a producer idle for ``producer_ttl_s``. If GC's grace or the table's memory
were shorter than the deadline (plus a margin for a slow in-flight request), a late append
could point at a deleted file, or an ambiguous retry could append a batch twice. A config
that breaks these relations is refused at start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from icefloe.backoff import RetryPolicy
from icefloe.errors import ConfigError

SAFETY_MARGIN_S = 300.0
"""Minimum slack between the append deadline and GC grace / producer TTL (seconds)."""

MAX_SHARDS = 256
"""Upper bound of ``manifest.shards``: the consumer reads every shard on each run."""


def _conflict_backoff() -> RetryPolicy:
    return RetryPolicy(max_attempts=1_000_000, base_delay_s=0.002, max_delay_s=0.2,
                       budget_s=30.0)


@dataclass(frozen=True)
class ManifestConfig:
    """Manifest queue settings. Durations in seconds, sizes in bytes.

    key:               object key of the manifest, relative to the store URL
    max_entries:       bound on unconsumed entries; beyond it appends get ``QueueFullError``
    max_bytes:         bound on the encoded manifest; beyond it appends get ``QueueFullError``
    append_deadline_s: a batch file older than this (store clock) is never appended
    gc_grace_s:        unreferenced batch files are deleted only when older than this
    producer_ttl_s:    idle producers leave the idempotent-producer table after this
    lease_s:           how long a consumer's lease lasts without renewal
    max_group:         most batches one producer appends in a single CAS (group commit)
    conflict_backoff:  backoff between CAS attempts that lost a race (budget = give-up time)
    shards:            manifest shards this process expects (``icefloe.manifest.shards``);
                       shard 0 is ``key`` itself, so 1 is the single-manifest layout
    """

    key: str = "manifest/queue"
    max_entries: int = 20_000
    max_bytes: int = 32 * 1024 * 1024
    append_deadline_s: float = 120.0
    gc_grace_s: float = 3600.0
    producer_ttl_s: float = 7 * 86400.0
    lease_s: float = 15.0
    max_group: int = 1000
    conflict_backoff: RetryPolicy = field(default_factory=_conflict_backoff)
    shards: int = 1

    def __post_init__(self) -> None:
        positive = ("max_entries", "max_bytes", "append_deadline_s", "gc_grace_s",
                    "producer_ttl_s", "lease_s", "max_group", "shards")
        for name in positive:  # `not > 0`: NaN compares false with every bound
            given: float = getattr(self, name)
            if not 0 < given < math.inf:
                wanted = "> 0" if math.isfinite(given) else "a finite number > 0"
                raise ConfigError(f"manifest.{name} must be {wanted}, got {given}")
        if self.shards > MAX_SHARDS:
            raise ConfigError(f"manifest.shards must be at most {MAX_SHARDS}, got "
                              f"{self.shards}")
        need = self.append_deadline_s + SAFETY_MARGIN_S
        if self.gc_grace_s < need:
            raise ConfigError(
                f"manifest.gc_grace_s ({self.gc_grace_s:g}) must be at least "
                f"manifest.append_deadline_s ({self.append_deadline_s:g}) + "
                f"{SAFETY_MARGIN_S:g} s: otherwise GC could delete a batch file that a "
                "producer is still allowed to append"
            )
        if self.producer_ttl_s < need:
            raise ConfigError(
                f"manifest.producer_ttl_s ({self.producer_ttl_s:g}) must be at least "
                f"manifest.append_deadline_s ({self.append_deadline_s:g}) + "
                f"{SAFETY_MARGIN_S:g} s: otherwise a retried ambiguous append could be "
                "appended twice"
            )
