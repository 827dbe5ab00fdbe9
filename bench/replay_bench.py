"""Retention and replay benchmark (#42 item 3): what keeping batch files costs, and how fast
``icefloe replay`` runs them again.

Measures, in one run on the local store and a SQLite Iceberg catalog, with
``[collector] keep_batches_s`` on:

* **storage kept per GB ingested**: bytes of the kept batch files (zstd, as ingestors
  write them) plus the retention index, per GB of event payload (canonical JSON) ingested;
  and the index's own share (bytes per GB of batch files kept) after GC compacted it;
* **replay throughput** into a new table (the sink's table dropped, as after a loss):
  batch file MB/s (zstd bytes read) and events/s, from the planning to the last commit,
  against the baseline of the same run: the collector committing the same files the
  first time (same engine, same chunk size: ``max_run_entries``); ratio = replay /
  collector;
* **requests per GB replayed**: store GETs and HEADs (one HEAD per file to refuse a range
  whose files are gone, one GET per file) per GB of batch files.

Spark (``local[2]``) by default; ``--engine local`` uses the in-process engine (no Spark)
for both the collector and the replay. A small warm-up run first starts Spark's Python
workers, so neither side pays it. ``--quick``: 60 files of 2,000 events (under a minute
with Spark's start); full: 400 files of 5,000 events.

Usage: python bench/replay_bench.py [--quick] [--engine spark|local] [--json PATH]
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import (
    BatchFile,
    Result,
    bench_parser,
    local_config,
    open_collector,
    print_table,
    publish_files,
    write_json,
)

from collector.gc import collect_garbage
from collector.replay import Replay
from collector.replay_plan import plan
from collector.replay_range import parse_bound
from icefloe.config import Column, Config, StreamConfig
from icefloe.manifest.publish import build_batch
from icefloe.retention import INDEX_PREFIX
from icefloe.store import open_async_store
from pipeline.iceberg.catalog import open_catalog

STREAM = StreamConfig(name="events", table="bench.events", columns=(
    Column("user_id", "string"), Column("url", "string"), Column("duration_ms", "long"),
    Column("ts", "timestamp"), Column("country", "string"), Column("device", "string")))
CHUNK = 20
"""Batch files per collector run and per replay chunk (``max_run_entries``)."""


def payload(i: int) -> bytes:
    """An event with some entropy (a session id, a search term): zstd then compresses
    about as much as it does real click streams (4-8x), not 30x as on repeated values."""
    rng = random.Random(i)
    return msgspec.json.encode({
        "user_id": f"user-{rng.randrange(50_000):06d}",
        "url": f"https://shop.example.com/p/{rng.randrange(99_991)}?q={rng.getrandbits(40):x}"
               f"&session={rng.getrandbits(64):016x}",
        "duration_ms": rng.randrange(60_000), "ts": "2026-11-23T10:00:00.123Z",
        "country": rng.choice(("DE", "FR", "US", "BR", "IN", "JP")),
        "device": rng.choice(("mobile", "desktop", "tablet"))})


def batch_files(count: int, per_batch: int, ingested: list[int]) -> Iterator[BatchFile]:
    """The files, counting the payload bytes ingested into ``ingested[0]``."""
    now_ms = int(time.time() * 1000)
    for b in range(count):
        events = [("events", f"e{b * per_batch + i}", now_ms, payload(b * per_batch + i))
                  for i in range(per_batch)]
        ingested[0] += sum(len(e[3]) for e in events)
        yield build_batch(iter(events))


async def commit_all(config: Config, engine: Any) -> float:
    """Drain the queue through a collector (dequeue included); seconds of its runs."""
    collector, store = await open_collector(config, engine)
    try:
        started = time.perf_counter()
        while (await collector.run_once()).entries:
            pass
        seconds = time.perf_counter() - started
        await collector.dequeue()
        await collector.consumer.release_lease()
        return seconds
    finally:
        await store.close()


async def kept_bytes(config: Config) -> tuple[int, int]:
    """(batch file bytes, index bytes) in the store after a GC pass that compacts."""
    store = open_async_store(config.store.url)
    try:
        await collect_garbage(store, config.manifest.key, grace_s=0.0,
                              keep_s=config.collector.keep_batches_s)
        batches = sum(o.size for o in (await store.list("batches/")).objects)
        index = sum(o.size for o in (await store.list(INDEX_PREFIX)).objects)
        return batches, index
    finally:
        await store.close()


async def planned(config: Config, files: int) -> Any:
    store = open_async_store(config.store.url)
    try:
        return await plan(config, store, "events", parse_bound("0", "--from"),
                          parse_bound(str(files - 1), "--to"))
    finally:
        await store.close()


def replay_seconds(config: Config, engine: Any, files: int) -> tuple[float, int]:
    """Replay every kept file into the dropped table: seconds (planning included) and rows."""
    open_catalog(config.catalog).drop_table(STREAM.table)
    started = time.perf_counter()
    p = asyncio.run(planned(config, files))
    replay = Replay(config, open_catalog(config.catalog), engine, p.target, p.entries)
    replay.start(truncate=False)
    rows = replay.run().rows
    return time.perf_counter() - started, rows


def engine_of(name: str) -> Any:
    if name == "local":
        from pipeline.load.run import LocalEngine  # why: the no-Spark engine is opt-in
        return LocalEngine()
    from pipeline.load.run import SparkEngine  # why: Spark only when asked for
    from pipeline.spark import get_spark  # why: starts the JVM
    return SparkEngine(get_spark("local[2]", "icefloe-bench", {"spark.driver.memory": "2g"}), 4)


def measure(root: Path, engine: Any, files: int, per_batch: int) -> list[Result]:
    config = local_config(root, (STREAM,), keep_batches_s=86400.0, max_run_entries=CHUNK,
                          max_run_bytes=1 << 34, dedup_window_s=0)
    ingested = [0]
    asyncio.run(publish_files(config.store.url, batch_files(files, per_batch, ingested)))
    events = files * per_batch
    collect_s = asyncio.run(commit_all(config, engine))
    batches, index = asyncio.run(kept_bytes(config))
    replay_s, rows = replay_seconds(config, engine, files)
    assert rows == events, f"replayed {rows} of {events} rows"
    gb, mb = batches / 1e9, batches / 1e6
    return [
        Result("replay throughput", mb / replay_s, "MB/s", mb / collect_s),
        Result("replay events/s", events / replay_s, "events/s", events / collect_s),
        Result("storage kept per GB ingested", (batches + index) / 1e6 / (ingested[0] / 1e9),
               "MB/GB"),
        Result("retention index per GB kept", index / 1e6 / gb, "MB/GB"),
        Result("store requests per GB replayed", 2 * files / gb, "requests/GB"),
    ]


def main() -> None:
    parser = bench_parser(__doc__, "60 files of 2,000 events instead of 400 of 5,000")
    parser.add_argument("--engine", choices=("spark", "local"), default="spark",
                        help="Spark local[2] (default) or the in-process engine")
    args = parser.parse_args()
    files, per_batch = (60, 2_000) if args.quick else (400, 5_000)
    engine = engine_of(args.engine)
    with tempfile.TemporaryDirectory(prefix="icefloe-replay-bench-") as tmp:
        measure(Path(tmp) / "warm-up", engine, 4, 500)  # Spark's Python workers start here
        results = measure(Path(tmp) / "run", engine, files, per_batch)
    print_table(f"retention and replay ({files} files x {per_batch:,} events, "
                f"{args.engine}; baseline: the collector's first commit)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
