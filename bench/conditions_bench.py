"""Import conditions benchmark: how closely sinks with age, size and count conditions are
committed to their limits while events flow.

One source, four sinks over the same events (local store, SQLite catalog, in-process
decode), fed at a steady rate by a producer in the same process; the collector loop runs as
in production (a run, then the staged sinks whose condition holds, then a poll pause):

* ``direct``: default conditions, committed every run — the baseline;
* ``age``: ``max_age_s`` = T (huge size and count limits): the delay between the oldest
  row's receive time and its commit, against T;
* ``events``: ``max_events`` = C: rows per commit, against C;
* ``bytes``: ``max_bytes`` = S: staged Parquet bytes per commit, against S.

A condition is checked after each run and each poll, so a commit lands at most about one
poll interval plus one run after the limit is reached: the ratios show that tolerance.

Second part: how long a registry change takes to reach a running ingestor (a new source
served) at the default ``registry_poll_s`` of 2 s, against that interval.

Usage: python bench/conditions_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import functools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, local_config, print_table, write_json

from icefloe.config import Column, Config, StreamConfig
from icefloe.registry import Conditions, RegistryStore, ops

COLUMNS = (Column("user_id", "string", required=True), Column("url", "string"),
           Column("n", "long"))
POLL_S = 0.2


def config_in(root: Path) -> Config:
    return local_config(root, (StreamConfig("clicks", "web.direct", COLUMNS),), env={},
                        metrics_port=0, gc_interval_s=3600, maintenance_interval_s=3600)


def sinks(age_s: float, events: int, size: int) -> tuple[ops.SinkSpec, ...]:
    big = Conditions(max_age_s=86_400, max_bytes=500_000_000, max_events=10_000_000)
    return (
        ops.SinkSpec(name="direct", table="web.direct", columns=COLUMNS),
        ops.SinkSpec(name="age", table="web.age", columns=COLUMNS,
                     conditions=msgspec.structs.replace(big, max_age_s=age_s)),
        ops.SinkSpec(name="events", table="web.events", columns=COLUMNS,
                     conditions=msgspec.structs.replace(big, max_events=events)),
        ops.SinkSpec(name="bytes", table="web.bytes", columns=COLUMNS,
                     conditions=msgspec.structs.replace(big, max_bytes=size)))


async def produce(config: Config, rate: int, seconds: float, stop: asyncio.Event) -> int:
    """``rate`` events/s in batches of 100 for ``seconds``; returns how many were sent."""
    from icefloe.config.manifest import ManifestConfig
    from icefloe.manifest import ManifestProducer
    from icefloe.manifest.publish import build_batch, publish_batch
    from icefloe.store import open_async_store

    store = open_async_store(config.store.url)
    producer = ManifestProducer(store, ManifestConfig())
    sent, started = 0, time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            now_ms = int(time.time() * 1000)
            events = [("clicks", f"e{sent + i}", now_ms, msgspec.json.encode(
                {"user_id": f"u{i % 50}", "url": f"/p/{(sent + i) % 997}", "n": sent + i}))
                for i in range(100)]
            data, count, streams = build_batch(events)
            await publish_batch(store, producer, data, record_count=count, streams=streams,
                                registry_version=1)
            sent += count
            ahead = sent / rate - (time.monotonic() - started)
            if ahead > 0:
                await asyncio.sleep(ahead)
    finally:
        stop.set()
        await producer.close()
        await store.close()
    return sent


async def collect(config: Config, stop: asyncio.Event) -> dict[str, list[dict[str, Any]]]:
    """The collector loop; records every commit per table: rows, bytes, oldest row age."""
    from collector.routing import Routes
    from collector.service import Collector
    from icefloe.store import open_async_store
    from pipeline.iceberg.catalog import open_catalog
    from pipeline.load.run import LocalEngine

    commits: dict[str, list[dict[str, Any]]] = {}
    collector: Collector | None = None

    def hook(stage: str) -> None:
        assert collector is not None
        if stage.startswith("after_staged_commit:"):
            table = stage.split(":", 1)[1]
            state = collector.staging.states[table]
            commits.setdefault(table, []).append({
                "rows": state.rows, "bytes": state.bytes,
                "delay_s": time.time() - (state.oldest_ms or 0) / 1000})

    store = open_async_store(config.store.url)
    collector = Collector(config, store, open_catalog(config.catalog), LocalEngine(),
                          hook=hook)
    await collector.acquire(takeover=True)
    registry = await RegistryStore(store, config.admin.registry_key).read()
    collector.routes = Routes(registry)
    await asyncio.to_thread(collector.prepare_tables)
    try:
        while True:
            result = await collector.run_once()
            if result.rows.get("web.direct"):
                commits.setdefault("web.direct", []).append(
                    {"rows": result.rows["web.direct"], "bytes": 0, "delay_s": 0.0})
            await asyncio.to_thread(collector.commit_due_staged)
            if stop.is_set() and not result.entries:
                break
            if not result.entries:
                await asyncio.sleep(POLL_S)
    finally:
        await store.close()
    return commits


async def run(root: Path, rate: int, seconds: float, age_s: float, events: int,
              size: int) -> tuple[int, dict[str, list[dict[str, Any]]]]:
    config = config_in(root)
    from icefloe.store import open_async_store

    store = open_async_store(config.store.url)
    await RegistryStore(store, config.admin.registry_key).update(
        lambda r: ops.create_source(r, ops.SourceSpec(id="clicks",
                                                      sinks=sinks(age_s, events, size))))
    await store.close()
    stop = asyncio.Event()
    sent, commits = await asyncio.gather(produce(config, rate, seconds, stop),
                                         collect(config, stop))
    return sent, commits


async def propagation(root: Path, rounds: int) -> list[float]:
    """Seconds from a registry write to a running ingestor serving the new source."""
    from icefloe.store import open_async_store
    from ingestor.runtime import IngestorRuntime

    config = config_in(root)
    runtime = await IngestorRuntime.start(config)
    store = open_async_store(config.store.url)
    registry = RegistryStore(store, config.admin.registry_key)
    delays = []
    pick = random.Random(7)
    try:
        for i in range(rounds):
            spec = ops.SourceSpec(id=f"s{i}", sinks=(ops.SinkSpec(
                name="t", table=f"web.t{i}", columns=COLUMNS),))
            await registry.update(functools.partial(ops.create_source, spec=spec))
            written = time.monotonic()
            while f"s{i}" not in runtime.service.streams:
                await asyncio.sleep(0.005)
            delays.append(time.monotonic() - written)
            await asyncio.sleep(pick.uniform(0, 2))  # land anywhere in the poll interval
    finally:
        await store.close()
        await runtime.close(5)
    return delays


def main() -> int:
    parser = bench_parser(__doc__, "20 s at 2,000 events/s")
    args = parser.parse_args()
    seconds, rate = (20.0, 2000) if args.quick else (60.0, 5000)
    age_s, events, size = (5.0, 8000, 200_000) if args.quick else (15.0, 50_000, 1_000_000)
    with tempfile.TemporaryDirectory(prefix="icefloe-conditions-") as tmp:
        sent, commits = asyncio.run(run(Path(tmp), rate, seconds, age_s, events, size))
    with tempfile.TemporaryDirectory(prefix="icefloe-registry-") as tmp:
        delays = asyncio.run(propagation(Path(tmp), 5 if args.quick else 15))

    def full(table: str) -> list[dict[str, Any]]:
        # the last commit of a sink may be partial (the flow stopped): judge the others
        done = commits.get(table, [])
        return done[:-1] if len(done) > 1 else done

    age = [c["delay_s"] for c in full("web.age")]
    counts = [c["rows"] for c in full("web.events")]
    sizes = [c["bytes"] for c in full("web.bytes")]
    direct = commits.get("web.direct", [])
    results = [
        Result(f"age sink: oldest row's delay at commit, median (T = {age_s:g} s)",
               statistics.median(age) if age else 0.0, "s", age_s),
        Result("age sink: oldest row's delay at commit, max", max(age, default=0.0), "s",
               age_s),
        Result(f"events sink: rows per commit, median (C = {events:,})",
               statistics.median(counts) if counts else 0.0, "rows", events),
        Result(f"bytes sink: staged bytes per commit, median (S = {size:,})",
               statistics.median(sizes) if sizes else 0.0, "bytes", size),
        Result("direct sink (default conditions): commits", len(direct), "commits"),
        Result("age / events / bytes sinks: commits",
               len(commits.get("web.age", [])) + len(commits.get("web.events", []))
               + len(commits.get("web.bytes", [])), "commits"),
        Result("events sent", sent, "events"),
        Result("registry change → ingestor serves it, median", statistics.median(delays),
               "s", 2.0),
        Result("registry change → ingestor serves it, max", max(delays), "s", 2.0),
    ]
    print_table(f"Import conditions ({rate:,} events/s for {seconds:g} s, poll {POLL_S} s; "
                "baseline: the configured limit)", results)
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
