"""Acknowledge and dequeue committed runs in the background, in order, one write at a time.

Why: with a manifest shard per ingestor, a run's ack is one CAS per shard it read (plus
shard 0 first, the fencing check), tens of milliseconds each against S3 and slower under
contention; waiting for them between runs left the collector idle that long every run. An
ack changes nothing a later run needs *before it starts*: the next run reads after what
the collector committed (:class:`collector.overlap.Overlap` keeps that cursor), not after
the manifest's ack. So acks leave the critical path, with the exactly-once rules kept:

* an ack is submitted only after the Iceberg commits of its run returned (the tables hold
  its sequences), never for entries merely read or read ahead;
* acks go out in order, one write at a time, each carrying everything submitted so far
  (``{shard: through}`` merged), so an ack never goes back and a failed one is carried by
  the next; every ``dequeue_every`` runs the ack drops the acknowledged entries in the same
  write (one CAS instead of two), and the shards it did not touch are dequeued after it
  (a quiet shard's acknowledged entries would otherwise stay until a clean stop, and keep
  their batch files from GC);
* a crash between a commit and its ack loses nothing: the entries stay queued, the next
  collector reads them from the ack and its commits drop them as replayed (each table's
  ``icefloe.sequences``), as after a crash before a synchronous ack;
* a fenced ack (``FencedError``: replaced) is raised at the collector's next run, which
  ends it; a transient failure is logged and retried with the next submission, or at the
  next run that finds nothing to do (it waits for the acks: :meth:`AckPipe.wait` writes
  them again), which fails if the ack fails again: an idle collector never sits on an
  unwritten ack without saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from collector.bulkhead import INJECTED
from icefloe.errors import FencedError
from icefloe.manifest.sharded_consumer import ShardedConsumer

log = logging.getLogger("icefloe.collector")


class AckPipe:
    """The background acks of one collector (see the module docstring)."""

    def __init__(self, consumer: ShardedConsumer, hook: Callable[[str], None]) -> None:
        self.consumer = consumer
        self.hook = hook
        self.pending: dict[int, int] = {}
        """Acks submitted and not yet written: the last committed sequence per shard."""
        self._dequeue = False
        self._task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self.writes = 0

    def submit(self, through: dict[int, int], *, dequeue: bool = False) -> None:
        """Acknowledge ``through`` (per shard) once the writes before it are done; call
        only after the commits holding those sequences returned."""
        for shard, sequence in through.items():
            self.pending[shard] = max(self.pending.get(shard, -1), sequence)
        self._dequeue = self._dequeue or dequeue
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="collector-acks")

    async def _drain(self) -> None:
        while self.pending:
            through, self.pending = self.pending, {}
            dequeue, self._dequeue = self._dequeue, False
            try:
                if dequeue:
                    self.hook("before_dequeue")
                await self.consumer.ack(through, dequeue=dequeue)
                if dequeue:  # the shards this ack did not touch, as a synchronous run does
                    await self.consumer.dequeue(skip=through)
            except BaseException as exc:
                for shard, sequence in through.items():  # carried by the next ack
                    self.pending[shard] = max(self.pending.get(shard, -1), sequence)
                self._dequeue = self._dequeue or dequeue
                if isinstance(exc, asyncio.CancelledError):
                    raise
                self._failed = exc
                if not isinstance(exc, FencedError):
                    log.warning("background ack failed (the next ack carries it): %s", exc)
                return
            self.writes += 1
            try:
                self.hook("after_ack")
            except Exception as exc:  # an injected crash: check() raises it
                self._failed = exc
                return

    def check(self) -> None:
        """Raise what ended the background acks if this collector must stop for it: a
        fenced ack (replaced) or an injected crash (tests, the simulator). A transient
        failure is only cleared: its positions are still pending, carried by the next
        ack."""
        failed, self._failed = self._failed, None
        if isinstance(failed, FencedError) or getattr(failed, INJECTED, False):
            raise failed  # type: ignore[misc]

    async def wait(self) -> None:
        """Until every submitted ack is written; raises if the last write failed."""
        if self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        if self.pending and self._failed is None:
            self._task = asyncio.create_task(self._drain(), name="collector-acks")
            await asyncio.shield(self._task)
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    async def close(self) -> None:
        """Stop writing (the collector stops or was fenced); unwritten acks are left to
        the next collector, which replays their entries as committed."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
