"""Batch-file and manifest-queue benchmark.

Measures, in one run and side by side with their baselines:

* batch encode (framing + zstd level 3) and decode (zstd + record split + envelope split by
  stream) for ~200-byte JSON events, zstd on and off; baseline: bare zstd on the same block;
* manifest appends with 1, 2, 4, 8 producer *processes*, each appending as fast as it can
  (many appends in flight, so group commit kicks in), while a consumer acks and dequeues,
  on the local store and on the local store with injected S3-like latency (20-50 ms per
  request); baseline: one producer, and one append per CAS (group commit off).

Usage: python bench/queue_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Result, bench_parser, print_table, write_json

from icefloe.errors import QueueFullError
from icefloe.formats.batch import BatchBuilder, Compression, decode_block, iter_records
from icefloe.formats.envelope import encode_envelope, split_by_stream
from icefloe.manifest import (
    BatchRef,
    ManifestConfig,
    ManifestConsumer,
    ManifestProducer,
)
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.base import AsyncObjectStore
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore

LATENCY = (0.020, 0.050)


# --- batch files ---------------------------------------------------------------------------

def make_records(count: int) -> list[bytes]:
    """~200-byte canonical JSON events in envelopes, over three streams."""
    records = []
    for i in range(count):
        payload = msgspec.json.encode({
            "user_id": f"user-{i % 5000:05d}", "url": f"https://example.com/p/{i % 977}",
            "duration_ms": (i * 37) % 60000, "ts": "2026-11-23T01:02:03.456Z",
            "ctx": {"country": "DE", "device": "mobile", "app": "4.2.1"}})
        records.append(encode_envelope(("pageviews", "clicks", "errors")[i % 3],
                                       f"01JD{i:022d}", 1_790_000_000_000 + i, payload))
    return records


def timed(fn: Callable[..., object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_batches(quick: bool) -> list[Result]:
    records = make_records(20_000)
    repeat = 3 if quick else 7
    block_bytes = sum(4 + len(r) for r in records)
    results: list[Result] = []
    for compression in (Compression.ZSTD, Compression.NONE):
        label = compression.name.lower()

        def encode(compression: Compression = compression) -> bytes:
            builder = BatchBuilder()
            for record in records:
                builder.add(record)
            return builder.finish(compression)

        data = encode()
        block, count = decode_block(data)
        t_encode = timed(encode, repeat)
        t_decode = timed(lambda data=data: sum(1 for _ in iter_records(*decode_block(data))),
                         repeat)
        t_split = timed(lambda data=data: split_by_stream(*decode_block(data)), repeat)
        base_encode: float | None = None  # no baseline without zstd
        base_decode: float | None = None
        if compression is Compression.ZSTD:
            cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
            frame = data[:-7]
            t_zstd = timed(lambda cctx=cctx, block=block: cctx.compress(block), repeat)
            t_unzstd = timed(lambda frame=frame: zstandard.ZstdDecompressor().decompress(frame),
                             repeat)
            base_encode = block_bytes / t_zstd / 1e6
            base_decode = count / t_unzstd
        results += [
            Result(f"batch encode, {label} (MB/s of block)", block_bytes / t_encode / 1e6,
                   "MB/s", base_encode),
            Result(f"batch encode, {label} (records/s)", count / t_encode, "records/s"),
            Result(f"batch decode+split records, {label}", count / t_decode, "records/s",
                   base_decode),
            Result(f"batch decode+split by stream, {label}", count / t_split, "records/s",
                   base_decode),
        ]
        if compression is Compression.ZSTD:
            results.append(Result("batch zstd ratio", block_bytes / len(data), "x"))
    return results


# --- manifest --------------------------------------------------------------------------

def open_bench_store(root: str, latency: bool) -> AsyncObjectStore:
    store: AsyncObjectStore = ThreadedAsyncStore(LocalStore(root))
    if latency:
        store = FaultyAsyncStore(store, [FaultRule("delay", times=None, delay_s=LATENCY)])
    return store


def producer_process(root: str, latency: bool, in_flight: int, duration: float,
                     start: threading.Event) -> tuple[int, int, int]:
    """Append as fast as possible for ``duration``; return (entries, CAS writes, conflicts)."""

    async def run() -> tuple[int, int, int]:
        producer = ManifestProducer(open_bench_store(root, latency), ManifestConfig())
        deadline = time.monotonic() + duration

        async def appender(worker: int) -> int:
            done = attempt = 0
            while time.monotonic() < deadline:
                attempt += 1
                ref = BatchRef(f"batches/{producer.producer_id}-{worker}-{attempt}",
                               4_000_000, 1, 20_000, ("pageviews",), time.time())
                try:
                    await producer.append(ref)
                except QueueFullError:  # backpressure: the consumer is behind
                    await asyncio.sleep(0.01)
                    continue
                done += 1
            return done

        counts = await asyncio.gather(*(appender(w) for w in range(in_flight)))
        return sum(counts), producer.stats.writes, producer.stats.conflicts

    start.wait()
    return asyncio.run(run())


async def consume(root: str, latency: bool, stop: asyncio.Event) -> None:
    """Ack and dequeue everything every 100 ms, as a collector would."""
    consumer = ManifestConsumer(open_bench_store(root, latency), ManifestConfig())
    await consumer.initialize()
    while not stop.is_set():
        entries = await consumer.read()
        if entries:
            await consumer.ack(entries[-1].sequence, dequeue=True)
        await asyncio.sleep(0.05)


def run_manifest(producers: int, latency: bool, in_flight: int, duration: float
                 ) -> tuple[float, float, float]:
    """Entries/s, CAS/s and conflicts/s across ``producers`` processes."""
    root = tempfile.mkdtemp(prefix="icefloe-bench-")
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(producers, mp_context=ctx) as pool:
        start = manager.Event()
        futures = [pool.submit(producer_process, root, latency, in_flight, duration, start)
                   for _ in range(producers)]

        async def drive() -> float:
            stop = asyncio.Event()
            consumer = asyncio.create_task(consume(root, latency, stop))
            await asyncio.sleep(0.3)  # let the consumer create the manifest
            began = time.monotonic()
            start.set()
            await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
            elapsed = time.monotonic() - began
            stop.set()
            await consumer
            return elapsed

        elapsed = asyncio.run(drive())
        totals = [f.result() for f in futures]
    entries, writes, conflicts = (sum(t[i] for t in totals) for i in range(3))
    return entries / elapsed, writes / elapsed, conflicts / elapsed


def bench_manifest(quick: bool) -> list[Result]:
    duration = 2.0 if quick else 8.0
    results: list[Result] = []
    for latency in (False, True):
        where = "S3-like latency 20-50ms" if latency else "local store"
        in_flight = 16
        single, _, _ = run_manifest(1, latency, 1, duration)
        results.append(Result(f"manifest, {where}, 1 producer, 1 append/CAS (no grouping)",
                              single, "entries/s"))
        baseline = None
        for producers in (1, 2, 4, 8):
            entries, cas, conflicts = run_manifest(producers, latency, in_flight, duration)
            baseline = baseline or entries
            label = f"manifest, {where}, {producers} producer(s) x {in_flight} in flight"
            results += [
                Result(f"{label}: entries", entries, "entries/s", baseline),
                Result(f"{label}: CAS writes", cas, "CAS/s"),
                Result(f"{label}: CAS conflicts", conflicts, "conflicts/s"),
            ]
    return results


def main() -> None:
    parser = bench_parser(__doc__, "short run (under a minute)")
    args = parser.parse_args()
    results = bench_batches(args.quick)
    print_table("batch files (~200-byte JSON events in envelopes, 20k records)", results)
    manifest = bench_manifest(args.quick)
    print_table("manifest queue (baseline = 1 producer with the same settings)", manifest)
    write_json(args.json, results + manifest)


if __name__ == "__main__":
    main()
