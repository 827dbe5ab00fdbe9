"""Overlapped runs: the next run's job runs while this one commits; acks go in the background.

Why: a run used to be read → job (fetch, decompress, parse the batch files) → commit →
ack → dequeue → next run, each step waiting for the one before. At scale the job and the
acks (one CAS per manifest shard) are as long as the commit, so the collector drained half
of what 128 ingestors offered (``bench/scale_bench.py``). Here, while run N commits, run
N+1 is read from the manifest and its job runs (:class:`Ahead`; one run ahead, at most
``read_ahead_bytes`` of batch files, or 64 MiB per Spark partition when that is more:
:func:`collector.run_size.ahead_cap`), and run N's ack is written by :class:`AckPipe`
while run N+1 commits. Runs are sized by time and parallelism (:mod:`collector.run_size`).

What keeps exactly-once (the rules of :mod:`collector.service` are unchanged):

* **Commits stay one at a time, in order.** Only reads and jobs run ahead; a run's rows are
  committed after the run before it committed, under the same fences (each table's epoch),
  so catalog versions (:mod:`icefloe.catalog_version`) stay one per run.
* **A run read ahead is used only if the run before it committed.** It was read after
  that run's entries (the :attr:`Overlap.cursor`); any failure of a run, and every fence,
  discards it, and the next run reads again after what the manifest acknowledges (once the
  acks in flight have landed). Committing it after a failed run would record sequences
  past entries no table holds: they would be skipped for good.
* **Its job is used only under the routes it was built with** (:meth:`Collector.routing_key`);
  a job whose entries need a newer registry version or the schema registry is not run
  ahead (its entries are, and it runs when its turn comes).
* **An entry is acknowledged only after the commit holding its sequence returned**, never
  when read ahead; a takeover still resumes from the sequences in Iceberg: unacknowledged
  entries are read again and dropped by each table's ``icefloe.sequences``.

The read ahead starts only in a backlog (the run left entries queued, or took at least
``commit_interval_s``): at light load a run read ahead would hold entries queued while the
collector waits for its next run, and freshness would lose an interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from collector.ack_pipe import AckPipe
from collector.commit import RunResult
from collector.run_size import RunSizer, ahead_cap, run_cap
from collector.service import Collector, Fenced, positioned, through_of
from icefloe.errors import FencedError, TableFencedError
from icefloe.manifest.model import Entry
from icefloe.manifest.sharded_consumer import ShardEntry
from pipeline.load import ClusterRunOutput, RunOutput

log = logging.getLogger("icefloe.collector")

Output = RunOutput | ClusterRunOutput


@dataclass
class Ahead:
    """A run's entries as read (and, when its job ran ahead, its output)."""

    read: list[ShardEntry]
    pending: list[Entry]
    """Every entry the read found, positioned (:func:`collector.service.positioned`)."""
    entries: list[Entry]
    """The run's entries (empty with no job run ahead: taken when the run comes)."""
    output: Output | None = None
    key: tuple[int, int, int, int | None] | None = None


def _release(output: Output | None) -> None:
    if isinstance(output, ClusterRunOutput):  # free the executors' cached run
        output.release()


class Overlap:
    """Runs of one collector with the next run read ahead and acks in the background."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        cfg = collector.config.collector
        partitions = max(1, collector.engine.partitions)
        self.sizer = RunSizer(cfg.target_run_s, run_cap(cfg.max_run_bytes, partitions),
                              partitions)
        self.ahead_bytes = ahead_cap(cfg.read_ahead_bytes, partitions)
        """Most batch-file bytes of the run read ahead (its memory until its turn)."""
        self.acks = AckPipe(collector.consumer, lambda stage: collector.hook(stage))
        self.cursor: dict[int, int] | None = None
        """The last sequence per shard of the runs committed (or committing) since the
        last failure: where the next read starts. None: after the manifest's acks."""
        self._ahead: asyncio.Task[Ahead] | None = None
        self._runs = 0
        self._long = False
        self.used = 0
        """Runs whose job ran ahead and was used (tests, logs)."""
        self.discarded = 0
        """Runs read ahead and dropped (a failure, a fence, a registry change)."""

    async def run(self) -> RunResult:
        """The next run (see the module docstring); raises :class:`Fenced` when replaced."""
        try:
            self.acks.check()
            return await self._run()
        except (FencedError, TableFencedError) as exc:
            await self.discard()
            self.collector.metrics.fenced.inc()
            raise Fenced(str(exc)) from exc
        except BaseException:
            await self.discard()
            raise

    async def _run(self) -> RunResult:
        c = self.collector
        cfg = c.config.collector
        started = c.clock.monotonic()
        ahead = await self._adopt()
        if ahead is None:
            if self.cursor is None:  # reading after the acks: they must have landed
                await self.acks.wait()
            ahead = await self._read(self.sizer.budget())
        c.begin_run(ahead.pending)
        c.metrics.health.run_begins(len(ahead.entries))
        if not ahead.entries:
            # nothing to do: the acks in flight land now (a failed one is written again,
            # and fails this run if it fails again, as a synchronous ack would), so an idle
            # collector never sits on an unwritten ack and ``icefloe run`` ends acked
            await self.acks.wait()
            return RunResult()
        entries, output = ahead.entries, ahead.output
        if output is None:
            job_started = c.clock.monotonic()
            entries, output = await c.run_job(entries)
            self.sizer.observe(sum(e.size for e in entries), c.clock.monotonic() - job_started)
        else:
            self.used += 1
        c.after_job(output)
        items = ahead.read[:len(entries)]
        result = RunResult(len(entries), entries[0].sequence, entries[-1].sequence,
                           through=through_of(items),
                           cut=len(entries) < len(ahead.pending)
                           or len(ahead.pending) >= cfg.max_run_entries)
        self.cursor = _merged(self.cursor or {}, result.through)
        if result.cut or self._long:  # a backlog: the next run's job runs meanwhile
            self._ahead = asyncio.create_task(self._read_ahead(), name="collector-read-ahead")
        await c.offload(c.commit_run, output, result, entries)
        c.hook("after_commits")
        await c.index_run(items)
        self._runs += 1
        self.acks.submit(result.through, dequeue=self._runs % cfg.dequeue_every == 0)
        result.seconds = c.clock.monotonic() - started
        self._long = result.seconds >= cfg.commit_interval_s
        c.observe_run(entries, result)
        return result

    async def _read(self, max_bytes: int) -> Ahead:
        """Read after the cursor (or the acks) and take a run of at most ``max_bytes``."""
        c = self.collector
        starts = None if self.cursor is None else {s: q + 1 for s, q in self.cursor.items()}
        read = await c.consumer.read(starts, max_entries=c.config.collector.max_run_entries)
        pending = [positioned(item) for item in read]
        return Ahead(read, pending, c._take(pending, max_bytes, self.sizer.partitions))

    async def _read_ahead(self) -> Ahead:
        """The next run, read and (unless it needs the registry first) its job run, at
        most :attr:`ahead_bytes` of batch files: the memory it holds until its turn."""
        c = self.collector
        limit = self.ahead_bytes
        ahead = await self._read(min(self.sizer.budget(), limit))
        if not ahead.entries or sum(e.size for e in ahead.entries) > limit \
                or c.job_needs_io(ahead.entries):
            ahead.entries = []  # taken when its turn comes
            return ahead
        key = c.routing_key()
        entries, run = c._route_run(ahead.entries)
        spec = c.spec_for(entries, {})
        started = c.clock.monotonic()
        output = await c.offload(run, spec)
        self.sizer.observe(sum(e.size for e in entries), c.clock.monotonic() - started)
        ahead.entries, ahead.output, ahead.key = entries, output, key
        return ahead

    async def _adopt(self) -> Ahead | None:
        """The run read ahead, if any and still good; its job's output only if built
        under the current routes (else its entries are taken again, the job run anew)."""
        task, self._ahead = self._ahead, None
        if task is None:
            return None
        try:
            ahead = await task
        except (FencedError, TableFencedError):
            raise
        except Exception as exc:  # read again now: a lasting problem fails that read
            log.info("the run read ahead failed (%s); reading it again", exc)
            self.discarded += 1
            return None
        c = self.collector
        if ahead.output is not None and ahead.key != c.routing_key():
            _release(ahead.output)
            self.discarded += 1
            ahead.output, ahead.entries = None, []
        if ahead.output is None:
            ahead.entries = c._take(ahead.pending, self.sizer.budget(), self.sizer.partitions)
        return ahead

    async def discard(self) -> None:
        """Drop the run read ahead and the cursor: the next run reads after what the
        manifest acknowledges, once the acks in flight have landed."""
        self.cursor = None
        task, self._ahead = self._ahead, None
        if task is None:
            return
        self.discarded += 1
        with contextlib.suppress(Exception):
            _release((await task).output)

    async def settle(self) -> None:
        """Before a step that reads the manifest's acks itself (``POST /v1/run``'s drain,
        a clean stop): the run read ahead dropped, every ack written."""
        await self.discard()
        await self.acks.wait()

    async def close(self) -> None:
        """The collector stops: drop the run read ahead; acks in flight finish if they
        can (a clean stop leaves a tidy manifest), else the next collector replays."""
        await self.discard()
        with contextlib.suppress(Exception):
            await self.acks.wait()
        await self.acks.close()


def _merged(into: dict[int, int], through: dict[int, int]) -> dict[int, int]:
    out = dict(into)
    for shard, sequence in through.items():
        out[shard] = max(out.get(shard, -1), sequence)
    return out
