"""Schema evolution benchmark (issue #27 item 1): an evolving schema against a fixed one.

Both streams get the same events: a few base fields plus ``f0``, ``f1``, ... where a new
field appears every 10,000 events (event ``i`` carries ``f0`` .. ``f{i // 10_000}``). The
*fixed* stream declares every field up front; the *evolving* one declares only the base
fields and has ``unknown_fields = "evolve"``, so its ingestor keeps the others and its
collector adds one column per 10,000 events (a schema commit before that run's data). The
payloads are made by the ingestor's own validator, so they are what the collector would
read in production. Both are drained by the collector in runs of 10,000 events, on copies
of nothing shared, side by side in one process; the figure is committed events/s, best of
``TRIALS``, and the evolving/fixed ratio.

Engine: the collector's in-process engine (no Spark) by default, which isolates what
evolution costs on the driver; ``--spark`` uses Spark ``local[2]``.

Usage: python bench/evolve_bench.py [--quick] [--spark] [--json PATH]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import (
    BatchFile,
    Result,
    bench_parser,
    drain,
    local_config,
    print_table,
    publish_files,
    write_json,
)

from collector.service import Engine
from icefloe.config import Column, StreamConfig
from icefloe.manifest.publish import build_batch
from ingestor.validate import CompiledStream
from pipeline.load.run import LocalEngine

TRIALS = 2
EVERY = 10_000
"""A new field per this many events."""
PER_BATCH = 2_000
BASE = (Column("user_id", "string"), Column("url", "string"), Column("n", "long"))


def streams(events: int) -> tuple[StreamConfig, StreamConfig]:
    extra = tuple(Column(f"f{k}", "long") for k in range((events - 1) // EVERY + 1))
    fixed = StreamConfig(name="events", table="bench.events", columns=(*BASE, *extra))
    evolving = StreamConfig(name="events", table="bench.events", columns=BASE,
                            unknown_fields="evolve")
    return fixed, evolving


def event(i: int) -> bytes:
    body = {"user_id": f"user-{i % 50_000:06d}", "url": f"/p/{i % 9973}", "n": i}
    body.update({f"f{k}": i + k for k in range(i // EVERY + 1)})
    return msgspec.json.encode(body)


def make_config(root: Path, stream: StreamConfig):
    return local_config(root, (stream,), max_run_entries=EVERY // PER_BATCH, dedup_window_s=0)


def batch_files(stream: StreamConfig, events: int) -> Iterator[BatchFile]:
    """The events as the ingestor would have flushed them, :data:`PER_BATCH` a file."""
    compiled = CompiledStream(stream)
    now_ms = int(time.time() * 1000)
    for start in range(0, events, PER_BATCH):
        ids = range(start, min(events, start + PER_BATCH))
        payloads = compiled.from_events([event(i) for i in ids]).payloads
        yield build_batch(
            ("events", f"e{i}", now_ms, p) for i, p in zip(ids, payloads, strict=True))


def measure(root: Path, stream: StreamConfig, engine: Engine, events: int) -> float:
    best = 0.0
    for trial in range(TRIALS):
        config = make_config(root / f"{stream.unknown_fields}-{trial}", stream)
        asyncio.run(publish_files(config.store.url, batch_files(stream, events)))
        # committed events/s over the whole queue, in runs of EVERY events
        rate, _ = asyncio.run(drain(config, engine, events, until_empty=True))
        best = max(best, rate)
    return best


def main() -> None:
    parser = bench_parser(__doc__, "30,000 events (3 new fields)")
    parser.add_argument("--spark", action="store_true", help="Spark local[2] engine")
    args = parser.parse_args()
    events = 30_000 if args.quick else 100_000
    engine: Engine = LocalEngine()
    if args.spark:
        from pipeline.load.run import SparkEngine
        from pipeline.spark import get_spark

        engine = SparkEngine(get_spark(), 2)
    fixed, evolving = streams(events)
    with tempfile.TemporaryDirectory(prefix="icefloe-evolve-bench-") as tmp:
        fixed_rate = measure(Path(tmp), fixed, engine, events)
        evolving_rate = measure(Path(tmp), evolving, engine, events)
    results = [
        Result(f"fixed schema ({len(fixed.columns)} declared columns), events/s", fixed_rate,
               "events/s"),
        Result(f"evolving schema (a new column per {EVERY:,} events), events/s",
               evolving_rate, "events/s", baseline=fixed_rate),
    ]
    print_table(f"schema evolution, {events:,} events, engine {engine.name}", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
