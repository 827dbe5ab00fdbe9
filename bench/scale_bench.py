"""Cluster-scale benchmark (issue #25): does more ingestors mean more throughput?

**Modeled cluster.** N simulated ingestors in this one process (asyncio), each running the
real publishing code (:func:`icefloe.manifest.publish.publish_batch`: a batch PUT under a
new ULID key, then :class:`~icefloe.manifest.ManifestProducer`'s group-committed,
idempotent append) and sealing one batch every ``ingestor.flush_age_ms`` with at most
``FlushSettings.max_inflight`` flushes in flight, as the real batcher does. They share an
in-memory S3 model (:mod:`testing.s3model`): 20-50 ms per request (seeded), applied PUTs
whose answer is lost, lost 409/412 races, and S3's per-prefix request rates (503 SlowDown
beyond), behind the real retry layer. A modeled collector reads with the real
:class:`~icefloe.manifest.ManifestConsumer`, GETs every batch file of a run, stands for
the Spark job and the Iceberg commits with a **fixed latency** (no Spark here), acks, and
dequeues every ``collector.dequeue_every`` runs; at the end the real GC deletes the files.
The limit of such a cluster is the store's latency and the single manifest object, not
CPU; the ``cpu`` column shows how busy this process was (1.0 = one core), so a row the
machine itself limited is visible.

Reported per size: entries/s and bytes/s against what the ingestors offered (ratio),
ack p50/p99 (seal → manifest append durable), CAS writes/s, conflicts/s, the collector's
drain rate, and the exactly-once check (every acked batch drained once).

**Shards.** The N-shard rows run beside the single-manifest baseline: by default one
shard per ingestor (the sizing the ack p99 target needs at 10 flushes/s per ingestor, see
bench/README.md), or a fixed ``--shards N``. Producers and consumers are made in one
place, :func:`build_cluster`. ``--trace INGESTORS`` runs one row and splits its acks and
the collector's runs by stage (:mod:`_scale_trace`).

**Cost model.** S3 requests per GB ingested at 5 MB/s per ingestor with the default
flush settings, counted from the modeled runs and computed by formula, priced at S3
Standard us-east-1 list prices, next to Amazon Data Firehose's per-GB price for Iceberg
destinations (source in bench/README.md).

**Real processes** (``--processes``, see :mod:`_scale_processes`): 8 real ``icefloe
ingestor`` processes and the real collector (Spark) against a moto S3 server with 20-50 ms
in front of every request, 1 shard and ``--process-shards`` N. Moto serves requests one at
a time, so this is a shape check of the model on the real code path. It takes the machine's
Spark lock (/tmp/icefloe-spark.lock) itself: do not wrap the bench in ``flock``.

Usage: python bench/scale_bench.py [--quick] [--json PATH] [--shards N] [--seed S]
                                   [--trace INGESTORS]
                                   [--processes [--process-shards N] [--no-model]]
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import Result, bench_parser, print_table, write_json
from _grpc_load import EVENT as LOAD_EVENT
from _scale_collector import (
    LoopClock,
    SparkCost,
    StandIn,
    measured_cost,
    sample_depth,
    trend,
)
from _scale_collector import Sink as CollectorSink
from _scale_collector import collector_task as modeled_collector
from _scale_processes import ProcessRun, ProcessSpec, run_processes, spark_lock
from _scale_trace import FlushTrace, TimedProducer, Trace, TracingStore, summarize

from collector.gc import collect_garbage
from icefloe.checksum import crc32c
from icefloe.clock import SYSTEM, Clock
from icefloe.config import CollectorSection, IngestorSection
from icefloe.manifest import ManifestConfig, ManifestProducer
from icefloe.manifest.publish import publish_batch
from icefloe.manifest.sharded_consumer import ShardedConsumer, ShardEntry
from icefloe.manifest.shards import shard_config
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy
from ingestor.buffer import FlushSettings
from testing.s3model import LIST_PAGE, S3Model
from testing.sim.loop import SimTime, VirtualTimeLoop

INGESTOR = IngestorSection()
COLLECTOR = CollectorSection()
MANIFEST = ManifestConfig()
FLUSH_S = INGESTOR.flush_age_ms / 1000.0
MAX_INFLIGHT = FlushSettings.max_inflight
LOAD_BYTES_PER_S = 5_000_000
"""The stated load per ingestor (5 MB/s of events)."""
DEFAULT_BATCH = int(LOAD_BYTES_PER_S * FLUSH_S)
"""What one flush carries at that load: ~500 KB at the default 100 ms flush age."""
LARGE_BATCH = 2 * 1024 * 1024
COMMIT_S = 0.15
"""Modeled Spark job + Iceberg commits per collector run (DESIGN: a commit costs
~0.1-0.2 s); fixed, whatever the run's size."""
BATCH_GET_CONCURRENCY = 64
"""The modeled collector's batch-file GETs in flight (Spark's readers, stood in for)."""

# S3 Standard, us-east-1 list prices (per request); DELETE is free
PRICE_PUT_CLASS = 0.005 / 1000   # PUT, COPY, POST, LIST
PRICE_GET_CLASS = 0.0004 / 1000  # GET, HEAD (and SELECT)
FIREHOSE_ICEBERG_PER_GB = 0.075
"""Amazon Data Firehose, Apache Iceberg Tables destination, first 250 TB/month, per GB
ingested (see bench/README.md for where the figure comes from)."""


EVENT_JSON_BYTES = len(LOAD_EVENT % (1, 1, 1))
"""About one ``_grpc_load.py`` event as JSON (the real-processes rows' bytes/s)."""

POSITION_BITS = 40
"""An entry's position across shards: ``shard << 40 | sequence`` (as the collector's runs)."""


# --- the cluster ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ClusterSpec:
    """One modeled run. Durations in seconds, sizes in bytes."""

    ingestors: int
    batch_bytes: int = DEFAULT_BATCH
    shards: int = 1
    duration_s: float = 6.0
    warmup_s: float = 1.0
    flush_s: float = FLUSH_S
    max_inflight: int = MAX_INFLIGHT
    commit_s: float = COMMIT_S
    lost_answer: float = 0.005
    lost_race: float = 0.005
    seed: int = 1
    collector: str = "fixed"
    """``fixed``: the first model (a fixed ``commit_s`` per run); ``in-line`` or
    ``overlap``: the #43 collectors on a Spark stand-in priced per byte
    (:mod:`_scale_collector`)."""


@dataclass
class ClusterRun:
    """What one run measured. ``window_s`` is the measured part (after the warm-up)."""

    spec: ClusterSpec
    window_s: float
    offered: int = 0
    acked_in_window: int = 0
    drained_in_window: int = 0
    latencies: list[float] = field(default_factory=list)
    censored: int = 0
    cas_writes: int = 0
    conflicts: int = 0
    cpu: float = 0.0
    acked_total: int = 0
    acked_bytes_total: int = 0
    failed: int = 0
    not_started: int = 0
    drained_total: int = 0
    lost: int = 0
    duplicates: int = 0
    requests: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    throttled: int = 0
    faults: int = 0
    gc_deleted: int = 0
    largest_group: int = 0
    collector_conflicts: int = 0
    shards_drained: int = 0  # how many shards the collector drained entries from
    depth_slope: float = 0.0
    """Queue depth's slope (entries/s) over the last four fifths of the window."""
    depth_margin: float = 0.0
    """Half-width of the slope's 95 % interval (:func:`_scale_collector.trend`)."""
    depth_end: float = 0.0
    spark_cores: int = 0

    def rate(self, count: int) -> float:
        return count / self.window_s

    @property
    def offered_per_s(self) -> float:
        return self.rate(self.offered)

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return 0.0
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def build_cluster(model: S3Model, spec: ClusterSpec, trace: Trace | None = None,
                  clock: Clock = SYSTEM
                  ) -> tuple[list[tuple[ManifestProducer, int]], ShardedConsumer]:
    """One manifest producer per ingestor (with its shard) and the collector's consumer.

    The one place that knows how producers and the collector meet the manifest. Ingestor
    ``i`` appends to shard ``i % shards`` (an even spread; real processes pick theirs by
    rendezvous hashing, even only on average). The collector reads every shard through the
    real :class:`ShardedConsumer`, as ``icefloe collector`` does. Each client gets its own
    connection to the bucket behind the real retry layer, as a process would. With
    ``trace``, every connection records its requests below the retry layer.
    """
    def connection(host: str, role: str, index: int | None) -> RetryingAsyncStore:
        view = model.view(host, role)
        if trace is None:
            return RetryingAsyncStore(view, RetryPolicy(), clock=clock)
        traced = TracingStore(view)
        if index is None:
            trace.collector = traced
        else:
            trace.stores[index] = traced
        return RetryingAsyncStore(traced, RetryPolicy())

    producers = [(ManifestProducer(connection(f"ingestor-{i}", "ingestor", i),
                                   shard_config(MANIFEST, i % spec.shards), clock=clock),
                  i % spec.shards)
                 for i in range(spec.ingestors)]
    # started with `[manifest] shards = N`, it grows the store's shard count first
    consumer = ShardedConsumer(connection("collector", "collector", None),
                               dataclasses.replace(MANIFEST, shards=spec.shards), clock=clock)
    return producers, consumer


@dataclass
class _Tally:
    """Shared bookkeeping of one run (all on one event loop: no locks)."""

    window: tuple[float, float]
    payload: bytes
    checksum: int
    offered: int = 0
    acked_in_window: int = 0
    drained_in_window: int = 0
    failed: int = 0
    not_started: int = 0
    acked: list[int | None] = field(default_factory=list)
    acked_bytes: int = 0
    sealed_at: list[float] = field(default_factory=list)
    done_at: list[float | None] = field(default_factory=list)
    drained: list[tuple[int, str, int]] = field(default_factory=list)

    def in_window(self, t: float) -> bool:
        return self.window[0] <= t < self.window[1]


async def _ingestor(producer: ManifestProducer, shard: int, spec: ClusterSpec,
                    tally: _Tally, rng: random.Random, trace: Trace | None = None,
                    number: int = 0) -> None:
    """Seal a batch every ``flush_s``; at most ``max_inflight`` flushes at once (the rest
    wait, as sealed batches do in the batcher). At the end of the window, batches still
    waiting for a slot are dropped (never written: not acked); flushes started finish."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(spec.max_inflight)
    waiting: set[asyncio.Task[None]] = set()
    started: set[asyncio.Task[None]] = set()

    async def flush(index: int) -> None:
        timed = None if trace is None else FlushTrace(number, tally.sealed_at[index])
        async with slots:
            task = asyncio.current_task()
            assert task is not None
            waiting.discard(task)
            started.add(task)
            if timed is not None:
                assert trace is not None
                timed.slot = loop.time()
                trace.flushes.append(timed)
            try:
                sequence = await publish_batch(
                    producer.store,
                    producer if timed is None else TimedProducer(producer, timed),  # type: ignore[arg-type]
                    tally.payload,
                    record_count=max(1, spec.batch_bytes // 200), streams=("events",),
                    checksum=tally.checksum)
            except Exception:  # not acknowledged (may be appended once: counted apart)
                tally.failed += 1
                return
        now = loop.time()
        tally.done_at[index] = now
        if timed is not None:
            timed.done = now
        tally.acked.append(None if sequence is None else shard << POSITION_BITS | sequence)
        tally.acked_bytes += spec.batch_bytes
        if tally.in_window(now):
            tally.acked_in_window += 1

    tick = tally.window[0] - spec.warmup_s + rng.uniform(0, spec.flush_s)
    while tick < tally.window[1]:
        await asyncio.sleep(max(0.0, tick - loop.time()))
        index = len(tally.sealed_at)
        tally.sealed_at.append(tick)
        tally.done_at.append(None)
        if tally.in_window(tick):
            tally.offered += 1
        task = asyncio.create_task(flush(index))
        waiting.add(task)
        tick += spec.flush_s
    for task in list(waiting):
        task.cancel()
        tally.not_started += 1
    await asyncio.gather(*waiting, *started, return_exceptions=True)


async def _collector(consumer: ShardedConsumer, spec: ClusterSpec, tally: _Tally,
                     publishing_done: asyncio.Event, trace: Trace | None = None) -> None:
    """Read every shard, GET the batch files, stand in for Spark + commits, ack each shard
    through what the run took; until all is drained."""
    loop = asyncio.get_running_loop()
    await consumer.initialize()
    gets = asyncio.Semaphore(BATCH_GET_CONCURRENCY)
    runs = 0

    async def fetch(location: str) -> None:
        async with gets:
            await consumer.store.get(location)

    while True:
        began = loop.time()
        entries = await consumer.read(max_entries=COLLECTOR.max_run_entries)
        run: list[ShardEntry] = []
        size = 0
        for tagged in entries:  # a cut leaves each shard a contiguous prefix
            if run and size + tagged.entry.size > COLLECTOR.max_run_bytes:
                break
            run.append(tagged)
            size += tagged.entry.size
        if run:
            read_at = loop.time()
            await asyncio.gather(*(fetch(t.entry.location) for t in run))
            fetched_at = loop.time()
            await asyncio.sleep(spec.commit_s)
            committed_at = loop.time()
            through: dict[int, int] = {}
            for tagged in run:
                through[tagged.shard] = max(through.get(tagged.shard, -1),
                                            tagged.entry.sequence)
            await consumer.ack(through)
            now = loop.time()
            if trace is not None:
                trace.runs.append((began, read_at, fetched_at, committed_at, now, len(run)))
            for tagged in run:
                tally.drained.append((tagged.shard << POSITION_BITS | tagged.entry.sequence,
                                      tagged.entry.producer_id, tagged.entry.producer_batch))
            if tally.in_window(now):
                tally.drained_in_window += len(run)
            runs += 1
            if runs % COLLECTOR.dequeue_every == 0:
                await consumer.dequeue()
        elif publishing_done.is_set():
            await consumer.dequeue()
            return
        if len(run) >= COLLECTOR.max_run_entries:
            continue  # a backlog: straight on, as the collector does
        wait = COLLECTOR.poll_interval_s if not run else \
            COLLECTOR.commit_interval_s - (loop.time() - began)
        await asyncio.sleep(max(0.0, wait))


COST: SparkCost | None = None
"""The Spark stand-in's prices (read once from bench/results/collector.json)."""


async def _modeled(spec: ClusterSpec, consumer: ShardedConsumer, cost: SparkCost, cores: int,
                   tally: _Tally, done: asyncio.Event) -> None:
    """One of the #43 collectors (:mod:`_scale_collector`) on a stand-in of ``cores``."""
    await consumer.initialize()

    def drained(run: list[Any], at: float) -> None:
        for tagged in run:
            tally.drained.append((tagged.shard << POSITION_BITS | tagged.entry.sequence,
                                  tagged.entry.producer_id, tagged.entry.producer_batch))
        if tally.in_window(at):
            tally.drained_in_window += len(run)

    await modeled_collector(spec.collector, consumer, StandIn(consumer, cost, cores),
                            CollectorSink(drained, []), done)


def _cas_totals(producers: list[tuple[ManifestProducer, int]]) -> tuple[int, int]:
    return (sum(p.stats.writes for p, _ in producers),
            sum(p.stats.conflicts for p, _ in producers))


async def run_cluster(spec: ClusterSpec, trace: Trace | None = None,
                      clock: Clock = SYSTEM) -> ClusterRun:
    """Run one modeled cluster and check that every acked batch was drained exactly once;
    with ``trace``, record every flush's stages and every request (``_scale_trace``).
    ``clock``: every client's and the bucket's (virtual time: :func:`run_virtual`)."""
    model = S3Model(seed=spec.seed, lost_answer=spec.lost_answer, lost_race=spec.lost_race,
                    clock=clock)
    producers, consumer = build_cluster(model, spec, trace, clock)
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.3  # the collector creates the manifest first
    payload = random.Random(spec.seed).randbytes(spec.batch_bytes)
    tally = _Tally((start + spec.warmup_s, start + spec.warmup_s + spec.duration_s),
                   payload, crc32c(payload))
    rng = random.Random(spec.seed + 1)
    publishing_done = asyncio.Event()
    samples: list[tuple[float, float]] = []
    cores = 0
    if spec.collector == "fixed":
        collector = asyncio.create_task(_collector(consumer, spec, tally, publishing_done,
                                                   trace))
    else:
        cost = COST if COST is not None else measured_cost()
        cores = cost.cores_for(spec.ingestors * spec.batch_bytes / spec.flush_s)
        collector = asyncio.create_task(_modeled(spec, consumer, cost, cores, tally,
                                                 publishing_done))
        depth = asyncio.create_task(sample_depth(
            lambda: len(tally.acked) - len(tally.drained), samples, tally.window[1],
            every_s=0.1))
    ingestors = [asyncio.create_task(_ingestor(p, shard, spec, tally, rng, trace, i))
                 for i, (p, shard) in enumerate(producers)]

    await asyncio.sleep(max(0.0, tally.window[0] - loop.time()))
    cas0, conflicts0 = _cas_totals(producers)
    cpu0 = time.process_time()
    await asyncio.sleep(max(0.0, tally.window[1] - loop.time()))
    cas1, conflicts1 = _cas_totals(producers)
    cpu = (time.process_time() - cpu0) / spec.duration_s

    await asyncio.gather(*ingestors)
    if spec.collector != "fixed":
        await depth
    publishing_done.set()
    await collector
    gc = await collect_garbage(consumer.store, MANIFEST.key, grace_s=0.0, clock=clock)

    run = ClusterRun(spec, spec.duration_s, offered=tally.offered,
                     acked_in_window=tally.acked_in_window,
                     drained_in_window=tally.drained_in_window,
                     cas_writes=cas1 - cas0, conflicts=conflicts1 - conflicts0, cpu=cpu,
                     acked_total=len(tally.acked), acked_bytes_total=tally.acked_bytes,
                     failed=tally.failed, not_started=tally.not_started,
                     drained_total=len(tally.drained), requests=Counter(model.log.requests),
                     throttled=sum(model.throttle.throttled.values()), faults=model.faults,
                     gc_deleted=gc.deleted,
                     largest_group=max(p.stats.largest_group for p, _ in producers),
                     collector_conflicts=sum(s.conflicts for s in consumer.stats.values()),
                     shards_drained=len({pos >> POSITION_BITS for pos, _, _ in tally.drained}),
                     depth_end=samples[-1][1] if samples else 0.0, spark_cores=cores)
    # 10 s blocks over a 5-minute window; a short (--quick) window still gets 4 blocks
    run.depth_slope, run.depth_margin = trend(samples, tally.window[0] + spec.duration_s / 5,
                                              block_s=min(10.0, spec.duration_s / 5))
    for sealed, done in zip(tally.sealed_at, tally.done_at, strict=True):
        if tally.in_window(sealed):
            if done is None:  # never acked: its wait so far is a lower bound
                run.censored += 1
                run.latencies.append(tally.window[1] - sealed)
            else:
                run.latencies.append(done - sealed)
    _check_exactly_once(run, tally)
    if trace is not None:
        trace.window = tally.window
    return run


def _check_exactly_once(run: ClusterRun, tally: _Tally) -> None:
    """Every acked sequence drained, nothing drained twice (by sequence or by producer
    batch); failed publishes may have been appended once each (ambiguous), no more."""
    drained_sequences = Counter(s for s, _, _ in tally.drained)
    drained_batches = Counter((p, b) for _, p, b in tally.drained)
    run.duplicates = sum(n - 1 for n in drained_sequences.values() if n > 1) + \
        sum(n - 1 for n in drained_batches.values() if n > 1)
    known = [s for s in tally.acked if s is not None]
    missing = sum(1 for s in known if s not in drained_sequences)
    run.lost = max(missing, len(tally.acked) - run.drained_total)
    extra = run.drained_total - len(tally.acked)  # drained, never acked: failed publishes
    if extra > run.failed:  # that may each have been appended once, no more
        run.duplicates += extra - run.failed


# --- output --------------------------------------------------------------------------------

def _label(spec: ClusterSpec) -> str:
    size = f"{spec.batch_bytes / 2**20:.0f} MiB" if spec.batch_bytes >= 2**20 \
        else f"{spec.batch_bytes / 1000:.0f} KB"
    return f"{spec.ingestors} ingestors, {size} batches, {spec.shards} shard" + \
        ("s" if spec.shards > 1 else "")


def cluster_results(run: ClusterRun) -> list[Result]:
    spec, label = run.spec, _label(run.spec)
    offered = run.offered_per_s
    return [
        Result(f"{label}: entries/s (baseline: offered)", run.rate(run.acked_in_window),
               "entries/s", offered),
        Result(f"{label}: bytes/s (baseline: offered)",
               run.rate(run.acked_in_window) * spec.batch_bytes / 1e6, "MB/s",
               offered * spec.batch_bytes / 1e6),
        Result(f"{label}: ack p50 (seal -> appended)", run.percentile(0.50) * 1000, "ms"),
        Result(f"{label}: ack p99 (target 500 ms)", run.percentile(0.99) * 1000, "ms", 500),
        Result(f"{label}: manifest CAS writes/s", run.rate(run.cas_writes), "CAS/s"),
        Result(f"{label}: CAS conflicts/s", run.rate(run.conflicts), "conflicts/s"),
        Result(f"{label}: entries per manifest CAS",
               run.acked_in_window / max(1, run.cas_writes), "entries"),
        Result(f"{label}: collector drain (baseline: offered)",
               run.rate(run.drained_in_window), "entries/s", offered),
        Result(f"{label}: bench process CPU (1.0 = one core)", run.cpu, "cores"),
        Result(f"{label}: lost + duplicated (acked vs drained)", run.lost + run.duplicates,
               "entries"),
    ]


def collector_results(run: ClusterRun) -> list[Result]:
    """The #43 rows: drain against what was offered, and the queue depth's slope with its
    95 % margin; "slope less its margin" <= 0 says the queue does not grow beyond the
    saw-tooth's noise (see :func:`_scale_collector.trend`)."""
    label = f"collector model (#43), {_label(run.spec)}, {run.spec.collector}"
    if run.spec.collector == "overlap":
        label += f", seed {run.spec.seed}"
    return [
        Result(f"{label}: drain (baseline: offered)", run.rate(run.drained_in_window),
               "entries/s", run.offered_per_s),
        Result(f"{label}: queue depth slope over the last 4/5 of the window",
               run.depth_slope, "entries/s"),
        Result(f"{label}: queue depth slope's 95 % margin", run.depth_margin, "entries/s"),
        Result(f"{label}: queue depth slope less its margin (growth beyond noise)",
               run.depth_slope - run.depth_margin, "entries/s"),
        Result(f"{label}: queue depth at the window's end", run.depth_end, "entries"),
        Result(f"{label}: Spark stand-in executor cores", run.spark_cores, "cores"),
        Result(f"{label}: lost + duplicated (acked vs drained)", run.lost + run.duplicates,
               "entries"),
    ]


def run_virtual(spec: ClusterSpec) -> ClusterRun:
    """Run ``spec`` on virtual time (:class:`testing.sim.loop.VirtualTimeLoop`): the
    clock moves only when every task waits (on the S3 model's latency, a backoff, the Spark
    stand-in), so the figures are the model's own, not how busy this machine is, and a
    5-minute window takes only the CPU it needs. The Python work of the ingestors and the
    collector takes no modeled time (the stand-in's prices and S3's latency are the costs)."""
    sim = SimTime(time.time())
    loop = VirtualTimeLoop(sim)
    try:
        return loop.run_until_complete(run_cluster(spec, clock=LoopClock(sim)))
    finally:
        loop.close()


def collector_specs(quick: bool, seed: int) -> list[ClusterSpec]:
    """128 ingestors (a shard each) and 1.3 GB/s (64 ingestors of 2 MiB batches), each
    with the in-line collector (the baseline) and the overlapped one: a 5-minute window
    (``--quick``: 20 s, one seed, a shape check within the minute ``--quick`` has; full:
    the overlapped one with three seeds, three runs of record)."""
    duration, warmup = (20.0, 3.0) if quick else (300.0, 10.0)
    rows = (ClusterSpec(128, shards=128, duration_s=duration, warmup_s=warmup, seed=seed),
            ClusterSpec(64, batch_bytes=LARGE_BATCH, shards=64, duration_s=duration,
                        warmup_s=warmup, seed=seed))
    seeds = (seed,) if quick else (seed, seed + 1, seed + 2)
    return [spec for row in rows for spec in (
        dataclasses.replace(row, collector="in-line"),
        *(dataclasses.replace(row, collector="overlap", seed=s) for s in seeds))]


def print_run_notes(run: ClusterRun) -> None:
    print(f"  {_label(run.spec)}: acked {run.acked_total}, drained {run.drained_total}, "
          f"failed {run.failed}, never started at stop {run.not_started}, unacked at the "
          f"window's end {run.censored} (their wait counts as a lower bound), lost "
          f"{run.lost}, duplicated {run.duplicates}; faults injected {run.faults}, "
          f"503 SlowDown {run.throttled}, largest group {run.largest_group}, "
          f"collector's lost CAS races {run.collector_conflicts}, GC deleted "
          f"{run.gc_deleted}")


# --- cost model ----------------------------------------------------------------------------

COST_ROWS: tuple[tuple[str, str, str, str], ...] = (
    # label, role, op, kind
    ("batch PUTs (ingestors)", "ingestor", "put", "batch"),
    ("manifest CAS PUTs (ingestors)", "ingestor", "put", "manifest"),
    ("manifest GETs (ingestors, after a lost race)", "ingestor", "get", "manifest"),
    ("manifest GETs (collector reads)", "collector", "get", "manifest"),
    ("manifest CAS PUTs (collector acks, dequeues)", "collector", "put", "manifest"),
    ("batch GETs (collector)", "collector", "get", "batch"),
    ("LISTs (GC)", "collector", "list", "batch"),
    ("DELETEs (GC; free on S3)", "collector", "delete", "batch"),
)


def formula_per_gb(ingestors: int, bytes_per_s: float = LOAD_BYTES_PER_S,
                   flush_s: float = FLUSH_S) -> dict[str, float]:
    """Requests per GB by formula, from the config defaults, for ``ingestors`` at
    ``bytes_per_s`` each. Manifest rows are the floor (no lost races): one CAS per flush
    (the in-flight flushes of one ingestor rarely overlap at 10 per second)."""
    per_gb = 1e9
    batches = per_gb / (bytes_per_s * flush_s)
    seconds = per_gb / (ingestors * bytes_per_s)  # wall time the cluster takes for 1 GB
    runs = seconds / COLLECTOR.commit_interval_s
    gc_passes = seconds / COLLECTOR.gc_interval_s
    files_listed = ingestors / flush_s * (MANIFEST.gc_grace_s + COLLECTOR.gc_interval_s)
    return {
        "batch PUTs (ingestors)": batches,
        "manifest CAS PUTs (ingestors)": batches,
        "manifest GETs (ingestors, after a lost race)": 0.0,
        "manifest GETs (collector reads)": runs + gc_passes,
        "manifest CAS PUTs (collector acks, dequeues)": runs * (1 + 1 / COLLECTOR.dequeue_every),
        "batch GETs (collector)": batches,
        "LISTs (GC)": gc_passes * math.ceil(files_listed / 1000),
        "DELETEs (GC; free on S3)": batches,
    }


def measured_per_gb(run: ClusterRun) -> dict[str, float]:
    """Requests per GB counted in a modeled run (its whole life, over every byte acked).

    LISTs are the exception: the run's one GC pass at the end lists every file once,
    while in steady state GC lists each file (gc_grace_s + gc_interval_s) / gc_interval_s
    times (a file stays in the listing for the grace period), in pages of 1,000 — so that
    row is the files the run's GC deleted times that factor.
    """
    gb = run.acked_bytes_total / 1e9
    counts = {label: run.requests[(role, op, kind)] / gb
              for label, role, op, kind in COST_ROWS}
    listings = (MANIFEST.gc_grace_s + COLLECTOR.gc_interval_s) / COLLECTOR.gc_interval_s
    counts["LISTs (GC)"] = run.gc_deleted * listings / LIST_PAGE / gb
    return counts


def dollars_per_tb(per_gb: dict[str, float]) -> float:
    total = 0.0
    for label, count in per_gb.items():
        if "DELETE" in label:
            continue
        price = PRICE_GET_CLASS if "GET" in label else PRICE_PUT_CLASS
        total += count * price
    return total * 1000


def cost_results(runs: list[ClusterRun]) -> list[Result]:
    """Requests per GB (measured beside the formula) and $/TB next to Firehose's price."""
    results: list[Result] = []
    firehose_tb = FIREHOSE_ICEBERG_PER_GB * 1000
    for run in runs:
        n = run.spec.ingestors
        measured, formula = measured_per_gb(run), formula_per_gb(n)
        for label, _, _, _ in COST_ROWS:
            results.append(Result(f"cost, {n} ingestors: {label} per GB (baseline: formula)",
                                  measured[label], "requests/GB", formula[label] or None))
        results.append(Result(f"cost, {n} ingestors: S3 requests $/TB (baseline: Firehose "
                              "Iceberg $/TB; target ratio <= 0.10)", dollars_per_tb(measured),
                              "$/TB", firehose_tb))
        results.append(Result(f"cost, {n} ingestors: formula $/TB (baseline: Firehose)",
                              dollars_per_tb(formula), "$/TB", firehose_tb))
    target = FIREHOSE_ICEBERG_PER_GB * 1000 / 10
    for flush in (0.1, 0.25, 0.5, 1.0, 2.0):
        formula = formula_per_gb(32, flush_s=flush)
        batch = LOAD_BYTES_PER_S * flush / 1e6
        results.append(Result(f"cost by formula, flush age {flush:g} s (~{batch:g} MB "
                              "batches), 32 ingestors (baseline: a tenth of Firehose)",
                              dollars_per_tb(formula), "$/TB", target))
    return results


# --- real processes ------------------------------------------------------------------------

def process_results(run: ProcessRun) -> list[Result]:
    """The real-processes rows, named like the modeled ones; every name carries the moto
    caveat, so no figure travels without it."""
    spec, w = run.spec, run.window_s
    label = (f"real processes, {spec.ingestors} ingestors, {spec.shards} shard"
             f"{'s' if spec.shards > 1 else ''} (moto serves one request at a time)")
    requests = sum(run.store_requests.values())
    return [
        Result(f"{label}: entries/s", run.entries / w, "entries/s"),
        Result(f"{label}: events/s acked (clients)", run.client_events / w, "events/s"),
        Result(f"{label}: bytes/s (events as JSON)", run.events * EVENT_JSON_BYTES / w / 1e6,
               "MB/s"),
        Result(f"{label}: batch-file bytes/s (zstd; the load's events repeat)",
               run.batch_bytes / w / 1e3, "KB/s"),
        Result(f"{label}: ack p50 (client: sent -> durable; worst client)", run.ack_p50_ms,
               "ms"),
        Result(f"{label}: ack p99 (target 500 ms)", run.ack_p99_ms, "ms", 500),
        Result(f"{label}: manifest CAS writes/s", run.cas_writes / w, "CAS/s"),
        Result(f"{label}: CAS conflicts/s", run.conflicts / w, "conflicts/s"),
        Result(f"{label}: collector drain (baseline: events accepted)",
               run.collector_rows / w, "events/s", run.events / w),
        Result(f"{label}: collector queue at the window's end", run.queue_at_end, "entries"),
        Result(f"{label}: store requests/s served by moto", requests / w, "requests/s"),
        *(Result(f"{label}: {method}s per entry appended (all clients)",
                 run.store_requests[method] / max(1.0, run.entries), "requests/entry")
          for method in ("PUT", "GET", "HEAD", "DELETE") if run.store_requests[method]),
        Result(f"{label}: accepted - committed after the drain",
               run.accepted_total - run.committed_total, "events"),
    ]


def print_process_notes(run: ProcessRun) -> None:
    drain = "not drained in time" if run.drain_s is None else f"drained in {run.drain_s:.1f} s"
    print(f"  real processes, {run.spec.shards} shard(s): shards used by the ingestors "
          f"{run.shards_used}; store requests in the window {dict(run.store_requests)}; "
          f"accepted {run.accepted_total:.0f} events, committed {run.committed_total:.0f} "
          f"({drain}); 1-min load average {run.load_avg:.1f} on {os.cpu_count()} cores")


def process_specs(quick: bool, shards: int, seed: int) -> list[ProcessSpec]:
    duration, warmup = (10.0, 4.0) if quick else (30.0, 6.0)
    return [ProcessSpec(8, shards=n, duration_s=duration, warmup_s=warmup, seed=seed)
            for n in (1, shards)]


# --- main ----------------------------------------------------------------------------------

def specs(quick: bool, seed: int) -> list[ClusterSpec]:
    duration, warmup = (2.0, 0.5) if quick else (8.0, 1.5)
    # 2 and 4 (full run only): how many ingestors one manifest object carries, for sizing
    sizes = (8, 32) if quick else (2, 4, 8, 32, 64, 128)
    rows = [ClusterSpec(n, duration_s=duration, warmup_s=warmup, seed=seed) for n in sizes]
    if not quick:  # its 1-shard backlog takes the model longest to drain after the window
        rows.append(ClusterSpec(64, batch_bytes=LARGE_BATCH, duration_s=duration,
                                warmup_s=warmup, seed=seed))
    return rows


def trace_row(ingestors: int, shards: int, quick: bool, seed: int) -> None:
    """One modeled row with every flush's stages and every request recorded."""
    duration, warmup = (3.0, 0.7) if quick else (8.0, 1.5)
    spec = ClusterSpec(ingestors, shards=shards, duration_s=duration, warmup_s=warmup,
                       seed=seed)
    trace = Trace()
    run = asyncio.run(run_cluster(spec, trace))
    print_run_notes(run)
    print(f"  ack p50 {run.percentile(0.5) * 1000:.0f} ms, p99 "
          f"{run.percentile(0.99) * 1000:.0f} ms; entries/s {run.rate(run.acked_in_window):.1f}"
          f" of {run.offered_per_s:.1f} offered; collector drain "
          f"{run.rate(run.drained_in_window):.1f}/s")
    for line in summarize(trace, trace.window):
        print(line)


def main() -> None:
    parser = bench_parser(__doc__, "short run (under a minute)")
    parser.add_argument("--shards", type=int, default=0,
                        help="the N of the N-shard rows (default 0: one per ingestor)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--processes", action="store_true",
                        help="also run the real-processes rows (8 ingestors, moto, Spark)")
    parser.add_argument("--process-shards", type=int, default=4,
                        help="the N of the real-processes N-shard row (default 4)")
    parser.add_argument("--no-model", action="store_true",
                        help="skip the modeled cluster and the cost model")
    parser.add_argument("--collector", action="store_true",
                        help="only the #43 collector rows (in line vs overlapped, on a "
                             "Spark stand-in priced from bench/results/collector.json)")
    parser.add_argument("--trace", type=int, metavar="INGESTORS",
                        help="only trace one modeled row (INGESTORS on --shards shards, "
                             "--quick's window): where its acks' time goes, by stage")
    args = parser.parse_args()
    if args.trace:
        trace_row(args.trace, args.shards or args.trace, args.quick, args.seed)
        return
    processes: list[Result] = []
    if args.processes:
        with spark_lock():
            for process_spec in process_specs(args.quick, args.process_shards, args.seed):
                print(f"real processes: {process_spec.ingestors} ingestors, "
                      f"{process_spec.shards} shard(s), {process_spec.duration_s:g} s window "
                      f"after {process_spec.warmup_s:g} s", flush=True)
                process_run = run_processes(process_spec)
                print_process_notes(process_run)
                processes += process_results(process_run)
        print_table("real processes (moto behind 20-50 ms per request; moto serves requests "
                    "one at a time: a shape check of the model, not S3's capacity)", processes)
    if args.no_model:
        write_json(args.json, processes)
        return
    collector = collector_rows(args.quick, args.seed)
    if args.collector:
        write_json(args.json, collector)
        return
    print(f"defaults read from the config: flush age {FLUSH_S * 1000:g} ms, "
          f"{MAX_INFLIGHT} flushes in flight, collector commit interval "
          f"{COLLECTOR.commit_interval_s:g} s, dequeue every {COLLECTOR.dequeue_every} runs, "
          f"max run {COLLECTOR.max_run_entries} entries; modeled commit {COMMIT_S * 1000:g} "
          f"ms per run (no Spark)")
    results: list[Result] = []
    baseline_runs: list[ClusterRun] = []
    for spec in specs(args.quick, args.seed):
        for shards in (1, args.shards or spec.ingestors):
            one = ClusterSpec(**{**spec.__dict__, "shards": shards})
            run = asyncio.run(run_cluster(one))
            print_run_notes(run)
            results += cluster_results(run)
            if shards == 1:
                baseline_runs.append(run)
    print_table("modeled cluster (S3 model: 20-50 ms, lost answers, 409/412, per-prefix "
                "rates; baseline = what the ingestors offered)", results)
    cost_runs = [r for r in baseline_runs
                 if r.spec.batch_bytes == DEFAULT_BATCH and r.spec.ingestors >= 8]
    cost = cost_results(cost_runs)
    print_table(f"cost model at {LOAD_BYTES_PER_S / 1e6:g} MB/s per ingestor, flush "
                f"{FLUSH_S * 1000:g} ms (S3 Standard us-east-1: PUT/LIST $0.005, GET $0.0004 "
                "per 1,000)", cost)
    write_json(args.json, processes + results + cost + collector)


def collector_rows(quick: bool, seed: int) -> list[Result]:
    """Run and print the #43 collector rows."""
    global COST
    COST = measured_cost()
    print(f"Spark stand-in: {COST.source}", flush=True)
    rows: list[Result] = []
    for spec in collector_specs(quick, seed):
        run = run_virtual(spec)
        print_run_notes(run)
        print(f"    {spec.collector}: drain {run.rate(run.drained_in_window):.0f} of "
              f"{run.offered_per_s:.0f} entries/s offered, queue depth slope "
              f"{run.depth_slope:+.2f} ± {run.depth_margin:.2f} entries/s, "
              f"{run.spark_cores} executor cores",
              flush=True)
        rows += collector_results(run)
    print_table("collector model (#43): in line vs overlapped, Spark stand-in priced per "
                "byte from bench/results/collector.json (baseline = offered)", rows)
    return rows


if __name__ == "__main__":
    main()
