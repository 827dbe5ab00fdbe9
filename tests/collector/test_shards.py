"""The collector and manifest shards: per-shard metrics (queue length, CAS writes,
conflicts) watched by the collector, and the cluster output path on more than one
shard."""

from __future__ import annotations

import time

from prometheus_client import generate_latest

from collector.metrics import CollectorMetrics
from collector.service import Collector
from icefloe.config import CollectorSection, Config, ManifestSection, StoreSection
from icefloe.manifest import (
    BatchRef,
    ManifestConfig,
    ShardedConsumer,
    ShardedProducer,
    grow_shards,
)
from icefloe.store import open_async_store


async def test_should_export_queue_length_and_cas_writes_per_shard(tmp_path):
    store = open_async_store((tmp_path / "store").as_uri())
    config = ManifestConfig(shards=3)
    await grow_shards(store, config.key, 3, backoff=config.conflict_backoff)
    for shard, count in ((0, 1), (2, 3)):
        producer = ShardedProducer(store, config, shard=shard)
        for n in range(count):
            await producer.append(BatchRef(f"batches/{shard}-{n}.ifb", 1, 1, 1, ("s",),
                                           time.time()))
    consumer = ShardedConsumer(store, config)
    await consumer.initialize()
    await consumer.read()
    await consumer.ack({2: 0})
    await consumer.read()
    metrics = CollectorMetrics()
    metrics.watch_shards(consumer)

    text = generate_latest(metrics.registry).decode()

    assert 'icefloe_collector_shard_queue_entries{shard="0"} 1.0' in text
    assert 'icefloe_collector_shard_queue_entries{shard="1"} 0.0' in text
    assert 'icefloe_collector_shard_queue_entries{shard="2"} 2.0' in text
    # shard 2: three appends, the fence, the ack (every writer's CAS counts)
    assert 'icefloe_collector_shard_cas_writes_total{shard="2"} 5.0' in text
    assert 'icefloe_collector_shard_cas_conflicts_total{shard="0"} 0.0' in text
    assert "icefloe_collector_shards 3.0" in text
    await store.close()


async def test_should_accept_the_cluster_output_path_on_more_than_one_shard(tmp_path):
    """The cluster output path writes ``_shard`` and shard-local sequences, so a
    cluster-output collector over two shards starts (before: a ConfigError)."""
    store = open_async_store((tmp_path / "store").as_uri())
    config = Config(store=StoreSection(url=(tmp_path / "store").as_uri()),
                    manifest=ManifestSection(shards=2),
                    collector=CollectorSection(output="cluster"))
    collector = Collector(config, store, catalog=None, engine=None)  # type: ignore[arg-type]
    await collector.acquire(takeover=True)
    assert collector.consumer.shard_count == 2
    await store.close()


async def test_should_watch_every_shard_from_the_collector(tmp_path):
    store = open_async_store((tmp_path / "store").as_uri())
    config = Config(store=StoreSection(url=(tmp_path / "store").as_uri()),
                    manifest=ManifestSection(shards=2))
    collector = Collector(config, store, catalog=None, engine=None)  # type: ignore[arg-type]
    await collector.acquire(takeover=True)
    await collector.consumer.read()
    text = generate_latest(collector.metrics.registry).decode()
    assert 'icefloe_collector_shard_queue_entries{shard="1"} 0.0' in text
    assert "icefloe_collector_shards 2.0" in text
    await store.close()
