"""The modeled collector of ``scale_bench.py`` with a Spark stand-in priced per byte (#43).

Why a second model: ``scale_bench``'s first collector stands for the Spark job and the
commits with a fixed 0.15 s, whatever a run holds, so it cannot say whether the collector
keeps up once a run's bytes cost what they cost. Here the job costs what the real cluster
output path measured per byte (:func:`measured_cost`, read from
``bench/results/collector.json``: the standalone cluster's committed events/s on its two
one-core workers, times the bytes of the bench's events), spread over a Spark cluster of
``cores`` executor cores, plus the measured commit latency per run. Batch files are GET
with one request in flight per core, as the executors' readers do.

Two collectors over the same cluster, side by side:

* **in line** (the collector before #43): read → job → commit → ack every shard → next
  run, each run capped by ``max_run_entries``/``max_run_bytes``, dequeue every
  ``dequeue_every`` runs;
* **overlapped** (:mod:`collector.overlap`): while run N commits, run N+1 is read after
  what N took and its job runs (one run ahead); N's ack goes out in the background (in
  order, one write at a time, merged; a dequeue in the same write every
  ``dequeue_every`` runs) while N+1 commits; runs are sized by time
  (:class:`collector.run_size.RunSizer`: ``target_run_s`` of the measured job rate, at
  least one batch file per partition), with ``spark_partitions`` set to the cluster's
  executor cores, as a collector set up for that cluster is (its byte caps then grow with
  the partitions: :func:`collector.run_size.run_cap`).

The queue depth (entries appended and not yet committed) is sampled every second; its
slope over the last four fifths of the window says whether the collector keeps up.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.run_size import RunSizer, ahead_cap, run_cap
from icefloe.config import CollectorSection
from icefloe.errors import TransientStoreError
from icefloe.manifest.sharded_consumer import ShardedConsumer, ShardEntry

COLLECTOR = CollectorSection()
RESULTS = Path(__file__).resolve().parent / "results"
RATE_ROW = "cluster output, standalone cluster, 2 workers x 1 core"
"""The measured cluster path: committed events/s on a standalone cluster of two one-core
workers (``collector_bench.py``'s ``cluster_rows``)."""
RATE_CORES = 2
COMMIT_ROW = "commit latency, collector (written files + add_files)"
SPARK_BUSY = 0.7
"""The stand-in cluster is sized so that its executors are busy this share of the time
at the offered load (a cluster sized for the load, with headroom)."""


class LoopClock:
    """A :class:`icefloe.clock.Clock` on a :class:`testing.sim.loop.SimTime` (the bench's
    virtual time): wall time from its start, monotonic time the loop's."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim

    def time(self) -> float:
        return float(self.sim.now)

    def monotonic(self) -> float:
        return float(self.sim.elapsed)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def sleep_sync(self, seconds: float) -> None:
        self.sim.advance(seconds)


async def persist(call: Callable[[], Awaitable[Any]]) -> Any:
    """``call`` until it succeeds: a failed ack is retried, as the collector retries a
    run (lost CAS races in a row against busy producers are transient)."""
    while True:
        try:
            return await call()
        except TransientStoreError:
            await asyncio.sleep(0.5)


@dataclass(frozen=True)
class SparkCost:
    """What the stand-in charges: seconds per batch-file byte on one executor core, and
    seconds per run's commit."""

    seconds_per_byte_core: float
    commit_s: float
    source: str

    def cores_for(self, bytes_per_s: float) -> int:
        """Executor cores that read ``bytes_per_s`` at :data:`SPARK_BUSY`."""
        return max(1, math.ceil(bytes_per_s * self.seconds_per_byte_core / SPARK_BUSY))


def event_bytes() -> float:
    """Mean JSON bytes of ``collector_bench.py``'s events (those the rate was measured on)."""
    from collector_bench import payload  # why: the bench's own events, not a typed figure
    return sum(len(payload(i)) for i in range(10_000)) / 10_000


def measured_cost(path: Path = RESULTS / "collector.json") -> SparkCost:
    """The stand-in's prices, from the committed collector benchmark run."""
    data = json.loads(path.read_text())
    rows = {r["name"]: r["value"] for r in data["results"]}
    if RATE_ROW not in rows or COMMIT_ROW not in rows:
        raise SystemExit(f"{path}: no {RATE_ROW!r} or {COMMIT_ROW!r} row; run "
                         "bench/collector_bench.py (with the cluster rows) first")
    size = event_bytes()
    per_byte_core = RATE_CORES / (rows[RATE_ROW] * size)
    return SparkCost(per_byte_core, rows[COMMIT_ROW],
                     f"{path.name} ({data.get('date', '?')}): {rows[RATE_ROW]:,.0f} events/s "
                     f"on {RATE_CORES} cores x {size:.0f} B/event = "
                     f"{1 / per_byte_core / 1e6:.2f} MB/s per core; commit "
                     f"{rows[COMMIT_ROW]:.3f} s")


@dataclass
class Sink:
    """Where the collector reports what it committed (the bench's tally)."""

    drained: Callable[[list[ShardEntry], float], None]
    runs: list[tuple[float, float, float, float, float, int]]


class StandIn:
    """The Spark job and the commit of one run, priced by :class:`SparkCost`."""

    def __init__(self, consumer: ShardedConsumer, cost: SparkCost, cores: int) -> None:
        self.consumer = consumer
        self.cost = cost
        self.cores = cores
        self.gets = asyncio.Semaphore(cores)

    async def _fetch(self, location: str) -> None:
        async with self.gets:
            await self.consumer.store.get(location)

    async def job(self, run: list[ShardEntry]) -> float:
        """GET every batch file (a request in flight per core), then decode; seconds."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.gather(*(self._fetch(t.entry.location) for t in run))
        size = sum(t.entry.size for t in run)
        await asyncio.sleep(size * self.cost.seconds_per_byte_core / self.cores)
        return loop.time() - began

    async def commit(self) -> None:
        await asyncio.sleep(self.cost.commit_s)


def _through(run: list[ShardEntry]) -> dict[int, int]:
    through: dict[int, int] = {}
    for tagged in run:
        through[tagged.shard] = max(through.get(tagged.shard, -1), tagged.entry.sequence)
    return through


def _take(entries: list[ShardEntry], max_bytes: int, min_entries: int = 1
          ) -> list[ShardEntry]:
    run: list[ShardEntry] = []
    size = 0
    for tagged in entries[:COLLECTOR.max_run_entries]:
        if len(run) >= min_entries and size + tagged.entry.size > max_bytes:
            break
        run.append(tagged)
        size += tagged.entry.size
    return run


async def in_line(consumer: ShardedConsumer, spark: StandIn, sink: Sink,
                  done: asyncio.Event) -> None:
    """The collector before #43: every step waits for the one before."""
    loop = asyncio.get_running_loop()
    runs = 0
    while True:
        began = loop.time()
        run = _take(await consumer.read(max_entries=COLLECTOR.max_run_entries),
                    COLLECTOR.max_run_bytes)
        if not run:
            if done.is_set():
                await persist(consumer.dequeue)
                return
            await asyncio.sleep(COLLECTOR.poll_interval_s)
            continue
        read_at = loop.time()
        await spark.job(run)
        fetched_at = loop.time()
        await spark.commit()
        committed_at = loop.time()
        through = _through(run)
        await persist(lambda: consumer.ack(through))  # noqa: B023 - awaited here
        now = loop.time()
        sink.runs.append((began, read_at, fetched_at, committed_at, now, len(run)))
        sink.drained(run, committed_at)
        runs += 1
        if runs % COLLECTOR.dequeue_every == 0:
            await persist(consumer.dequeue)
        if len(run) < COLLECTOR.max_run_entries:
            await asyncio.sleep(max(0.0, COLLECTOR.commit_interval_s - (loop.time() - began)))


class Overlapped:
    """The collector of :mod:`collector.overlap`, on the stand-in."""

    def __init__(self, consumer: ShardedConsumer, spark: StandIn, sink: Sink,
                 partitions: int) -> None:
        self.consumer = consumer
        self.spark = spark
        self.sink = sink
        self.sizer = RunSizer(COLLECTOR.target_run_s,
                              run_cap(COLLECTOR.max_run_bytes, partitions), partitions)
        self.ahead_bytes = ahead_cap(COLLECTOR.read_ahead_bytes, partitions)
        self.cursor: dict[int, int] = {}
        self.pending: dict[int, int] = {}
        self.acks: asyncio.Task[None] | None = None
        self.runs = 0
        self.dequeue = False

    async def _read(self, max_bytes: int) -> tuple[list[ShardEntry], bool]:
        starts = {s: q + 1 for s, q in self.cursor.items()}
        read = await self.consumer.read(starts, max_entries=COLLECTOR.max_run_entries)
        run = _take(read, max_bytes, self.sizer.partitions)
        return run, len(run) < len(read) or len(read) >= COLLECTOR.max_run_entries

    async def _job(self, run: list[ShardEntry]) -> None:
        seconds = await self.spark.job(run)
        self.sizer.observe(sum(t.entry.size for t in run), seconds)

    async def _ahead(self) -> tuple[list[ShardEntry], bool]:
        run, cut = await self._read(min(self.sizer.budget(), self.ahead_bytes))
        if run:
            await self._job(run)
        return run, cut

    async def _ack_all(self) -> None:
        while self.pending:
            through, self.pending = self.pending, {}
            dequeue, self.dequeue = self.dequeue, False
            await persist(lambda: self.consumer.ack(through, dequeue=dequeue))  # noqa: B023

    def _submit(self, through: dict[int, int]) -> None:
        for shard, sequence in through.items():
            self.pending[shard] = max(self.pending.get(shard, -1), sequence)
        self.runs += 1
        self.dequeue = self.dequeue or self.runs % COLLECTOR.dequeue_every == 0
        if self.acks is None or self.acks.done():
            self.acks = asyncio.create_task(self._ack_all())

    async def run(self, done: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        ahead: asyncio.Task[tuple[list[ShardEntry], bool]] | None = None
        long = False
        while True:
            began = loop.time()
            if ahead is not None:
                run, cut = await ahead
                ahead = None
                jobbed = bool(run)
            else:
                run, cut = await self._read(self.sizer.budget())
                jobbed = False
            if not run:
                if done.is_set():
                    if self.acks is not None:
                        await self.acks
                    await persist(self.consumer.dequeue)
                    return
                await asyncio.sleep(COLLECTOR.poll_interval_s)
                continue
            read_at = loop.time()
            if not jobbed:
                await self._job(run)
            fetched_at = loop.time()
            self.cursor.update({s: max(self.cursor.get(s, -1), q)
                                for s, q in _through(run).items()})
            if cut or long:  # a backlog: the next run's job runs while this one commits
                ahead = asyncio.create_task(self._ahead())
            await self.spark.commit()
            committed_at = loop.time()
            self._submit(_through(run))
            self.sink.runs.append((began, read_at, fetched_at, committed_at, committed_at,
                                   len(run)))
            self.sink.drained(run, committed_at)
            long = committed_at - began >= COLLECTOR.commit_interval_s
            if not (cut or long):
                await asyncio.sleep(max(0.0, COLLECTOR.commit_interval_s
                                        - (loop.time() - began)))


def slope(samples: list[tuple[float, float]], start: float) -> float:
    """Least-squares slope (per second) of the samples taken from ``start`` on."""
    return trend(samples, start)[0]


def trend(samples: list[tuple[float, float]], start: float, block_s: float = 10.0
          ) -> tuple[float, float]:
    """``(slope, margin)``: the least-squares slope (per second) of the samples from
    ``start`` on, and the half-width of its 95 % interval.

    Why a margin: a queue that keeps up is not flat but a saw-tooth (it fills between runs
    and empties at each commit), so the fitted slope of a bounded queue is a small number
    of either sign. The margin tells such noise from growth. The saw-tooth's residuals are
    correlated over a run or two, so they are averaged in ``block_s`` blocks (batch means)
    before their spread is taken; the slope's standard error is then that of a fit through
    the block means, times Student's t for their count."""
    points = [(t, v) for t, v in samples if t >= start]
    if len(points) < 2:
        return 0.0, 0.0
    mt = sum(t for t, _ in points) / len(points)
    mv = sum(v for _, v in points) / len(points)
    den = sum((t - mt) ** 2 for t, _ in points)
    if not den:
        return 0.0, 0.0
    fitted = sum((t - mt) * (v - mv) for t, v in points) / den
    blocks: dict[int, list[tuple[float, float]]] = {}
    for t, v in points:
        blocks.setdefault(int((t - points[0][0]) // block_s), []).append(
            (t, v - (mv + fitted * (t - mt))))
    means = [(sum(t for t, _ in b) / len(b), sum(r for _, r in b) / len(b))
             for b in blocks.values()]
    if len(means) < 3:
        return fitted, math.inf
    spread = sum(r * r for _, r in means) / (len(means) - 2)
    centre = sum(t for t, _ in means) / len(means)
    error = math.sqrt(spread / sum((t - centre) ** 2 for t, _ in means))
    return fitted, _t95(len(means) - 2) * error


def _t95(dof: int) -> float:
    """Student's t for a two-sided 95 % interval (Cornish-Fisher expansion around the
    normal's 1.96: within 0.5 % of the table from 3 degrees of freedom on)."""
    z = 1.959964
    if dof < 3:
        return {1: 12.706, 2: 4.303}.get(dof, math.inf)
    return (z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * dof**3))


async def sample_depth(depth: Callable[[], int], samples: list[tuple[float, float]],
                       until: float, every_s: float = 1.0) -> None:
    """Record the queue depth every ``every_s`` until ``until`` (loop time)."""
    loop = asyncio.get_running_loop()
    while loop.time() < until:
        samples.append((loop.time(), float(depth())))
        await asyncio.sleep(every_s)


def collector_task(mode: str, consumer: ShardedConsumer, spark: StandIn, sink: Sink,
                   done: asyncio.Event) -> Any:
    """The coroutine of the ``mode`` collector (``in-line`` or ``overlap``)."""
    if mode == "overlap":  # set up for its cluster: a Spark partition per executor core
        return Overlapped(consumer, spark, sink, spark.cores).run(done)
    return in_line(consumer, spark, sink, done)
