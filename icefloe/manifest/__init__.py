"""The fenced manifest queue: producers append batch files, one consumer reads in order."""

from icefloe.manifest.cas import CasStats, Loaded, cas_update, load
from icefloe.manifest.config import SAFETY_MARGIN_S, ManifestConfig
from icefloe.manifest.consumer import ManifestConsumer
from icefloe.manifest.model import ConsumerState, Entry, Manifest, ProducerState
from icefloe.manifest.producer import BatchRef, ManifestProducer, ProducerStats
from icefloe.manifest.sharded_consumer import ShardedConsumer, ShardEntry
from icefloe.manifest.sharded_producer import ShardedProducer
from icefloe.manifest.shards import (
    ShardSet,
    ensure_shards,
    grow_shards,
    read_shard_count,
    shard_key,
    shard_set_key,
)

__all__ = [
    "SAFETY_MARGIN_S",
    "BatchRef",
    "CasStats",
    "ConsumerState",
    "Entry",
    "Loaded",
    "Manifest",
    "ManifestConfig",
    "ManifestConsumer",
    "ManifestProducer",
    "ProducerState",
    "ProducerStats",
    "ShardEntry",
    "ShardSet",
    "ShardedConsumer",
    "ShardedProducer",
    "cas_update",
    "ensure_shards",
    "grow_shards",
    "load",
    "read_shard_count",
    "shard_key",
    "shard_set_key",
]
