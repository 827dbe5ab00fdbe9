"""Helpers for pipeline and collector tests: configs, published batches, table reads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa

from icefloe.config import Column, Config, StreamConfig, load_config
from icefloe.config.manifest import ManifestConfig
from icefloe.manifest import ManifestProducer
from icefloe.manifest.publish import build_batch, publish_batch
from icefloe.registry import Registry, RegistryStore
from icefloe.store import open_async_store, options_for
from icefloe.store.base import AsyncObjectStore

CLICKS = StreamConfig(name="clicks", table="web.clicks", columns=(
    Column("user_id", "string", required=True), Column("url", "string"),
    Column("n", "long"), Column("ts", "timestamp")))
BUYS = StreamConfig(name="buys", table="shop.buys", columns=(
    Column("order_id", "string", required=True), Column("amount", "double"),
    Column("qty", "int"), Column("paid", "boolean"), Column("day", "date"),
    Column("meta", "json"), Column("ratio", "float")))

BASE_MS = int(time.time() * 1000)  # recent: the dedup window keys on receive time


def collector_config(root: Path, streams: Sequence[StreamConfig] = (CLICKS, BUYS),
                     store: dict[str, Any] | None = None, **collector: Any) -> Config:
    """A config on a local store (or ``store``) + SQLite catalog under ``root``."""
    raw = {
        "store": store or {"url": (root / "store").as_uri()},
        "catalog": {"uri": f"sqlite:///{root / 'catalog.db'}",
                    "warehouse": (root / "warehouse").as_uri()},
        "collector": {"metrics_port": 0, "host": "127.0.0.1", "gc_interval_s": 3600,
                      "maintenance_interval_s": 3600, **collector},
        "manifest": {"lease_s": 2.0},
        "streams": [msgspec.to_builtins(s) for s in streams],
    }
    path = root / "icefloe.toml"
    path.write_text("")
    return msgspec.structs.replace(
        load_config(path, overrides={k: v for k, v in raw.items() if k != "streams"}),
        streams=tuple(streams))


def click(i: int, prefix: str = "c") -> tuple[str, str, int, bytes]:
    payload = msgspec.json.encode({"user_id": f"u{i % 7}", "url": f"/p/{i}", "n": i,
                                   "ts": "2026-11-23T10:00:00.123456Z"})
    return ("clicks", f"{prefix}{i}", BASE_MS + i, payload)


def buy(i: int, prefix: str = "b") -> tuple[str, str, int, bytes]:
    payload = msgspec.json.encode({"order_id": f"o{i}", "amount": i * 1.5, "qty": i,
                                   "paid": i % 2 == 0, "day": "2026-11-23",
                                   "meta": '{"k":[1,2]}', "ratio": 0.5})
    return ("buys", f"{prefix}{i}", BASE_MS + i, payload)


async def publish(store: AsyncObjectStore, batches: Iterable[list[tuple[str, str, int, bytes]]],
                  producer: ManifestProducer | None = None, registry_version: int = 0
                  ) -> list[int]:
    """Write each list of events as one batch file and append it; return the sequences."""
    own = producer is None
    producer = producer or ManifestProducer(store, ManifestConfig())
    sequences = []
    try:
        for events in batches:
            data, count, streams = build_batch(events)
            sequences.append(await publish_batch(store, producer, data, record_count=count,
                                                 streams=streams,
                                                 registry_version=registry_version))
    finally:
        if own:
            await producer.close()
    return sequences


def open_store_of(config: Config) -> AsyncObjectStore:
    return open_async_store(config.store.url,
                            options_for(config.store.endpoint_url, config.store.region))


def publish_sync(config: Config, batches: Iterable[list[tuple[str, str, int, bytes]]],
                 registry_version: int = 0) -> list[int]:
    async def go() -> list[int]:
        store = open_store_of(config)
        try:
            return await publish(store, batches, registry_version=registry_version)
        finally:
            await store.close()
    # A fresh thread, so async tests (with a running loop) can call it too.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


def read_table(config: Config, name: str) -> pa.Table:
    from pipeline.iceberg.catalog import open_catalog

    return open_catalog(config.catalog).load_table(name).scan().to_arrow()


class Crash(Exception):
    """Stands in for the process dying at a collector hook point."""


def crash_at(stage: str) -> Any:
    def hook(seen: str) -> None:
        if seen == stage:
            raise Crash(stage)
    return hook


async def start(config: Config, engine: Any, *, hook: Any = None, takeover: bool = True
                ) -> Any:
    """A collector that is active and has its tables ready (as ``run_collector`` makes)."""
    from collector.service import Collector
    from pipeline.iceberg.catalog import open_catalog

    collector = Collector(config, open_store_of(config), open_catalog(config.catalog), engine,
                          hook=hook)
    await collector.acquire(takeover=takeover)
    await asyncio.to_thread(collector.prepare_tables)
    return collector


async def drain(collector: Any) -> int:
    """Run until the queue is empty; return how many runs had entries."""
    runs = 0
    while (await collector.run_once()).entries:
        runs += 1
    return runs


async def collect_all(config: Config, engine: Any) -> Any:
    """Start a collector on ``engine``, drain the queue and close its store; the collector,
    for its metrics (most end-to-end tests only need the tables filled)."""
    collector = await start(config, engine)
    try:
        await drain(collector)
    finally:
        await collector.store.close()
    return collector


def output_engine(spark: Any, output: str, partitions: int = 2) -> Any:
    """The Spark engine of ``[collector] output``: ``embedded`` (rows come back to the
    driver) or ``cluster`` (executors write the files)."""
    from pipeline.load.run import SparkClusterEngine, SparkEngine

    if output == "embedded":
        return SparkEngine(spark, partitions)
    return SparkClusterEngine(spark, partitions)


async def commit_routed(config: Config, engine: Any) -> None:
    """Commit everything queued with a collector routing by the registry in the store
    (its tables prepared first), dequeue it, and stop cleanly (the lease free)."""
    from collector.routing import Routes  # lazy: the collector's modules

    collector = await start(config, engine)
    try:
        registry = await RegistryStore(collector.store, config.admin.registry_key).read()
        collector.routes = Routes(registry)
        await asyncio.to_thread(collector.prepare_tables)
        await drain(collector)
        await collector.dequeue()
        await collector.consumer.release_lease()
    finally:
        await collector.store.close()


async def change_registry(config: Config, fn: Callable[[Registry], Registry]) -> Registry:
    """Apply ``fn`` to the registry in ``config``'s store (as the admin API does); the new
    registry."""
    store = open_store_of(config)
    try:
        return await RegistryStore(store, config.admin.registry_key).update(fn)
    finally:
        await store.close()


def ids(prefix: str, count: int) -> set[str]:
    """The event ids :func:`click` (and :func:`buy`) give events ``0..count-1`` with
    ``prefix``."""
    return {f"{prefix}{i}" for i in range(count)}


def assert_exact(config: Config, table: str, expected: set[str]) -> None:
    """``count(*) == count(distinct _event_id) == len(expected)``, and the same ids."""
    import pyarrow.compute as pc

    rows = read_table(config, table)
    ids = rows.column("_event_id")
    assert rows.num_rows == pc.count_distinct(ids).as_py() == len(expected)
    assert set(ids.to_pylist()) == expected


class Gate:
    """An engine whose job waits until the test lets it go: a takeover lands mid-run."""

    name = "gate"
    partitions = 1

    def __init__(self) -> None:
        from pipeline.load.run import LocalEngine

        self.inner = LocalEngine()
        self.entered = threading.Event()
        self.go = threading.Event()

    def run(self, spec: Any) -> Any:
        self.entered.set()
        assert self.go.wait(30), "the test never released the job"
        return self.inner.run(spec)
