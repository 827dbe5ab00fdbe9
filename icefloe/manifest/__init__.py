"""The fenced manifest queue: producers append batch files, one consumer reads in order.

The names below load on first use (PEP 562), not when the package loads: a one-second
``icefloe query`` cannot pay for the queue's producer, consumer and store code it never
runs (issue #28). ``from icefloe.manifest import X`` works as before. The queue's
settings (:class:`ManifestConfig`) live with the rest of the configuration, in
:mod:`icefloe.config.manifest`, and are re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from icefloe.config.manifest import SAFETY_MARGIN_S, ManifestConfig
    from icefloe.manifest.cas import CasStats, Loaded, cas_update, load
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


def __getattr__(name: str) -> Any:
    """Import the submodules behind the package's names on first use (all at once, as the
    eager package did), then answer from them."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from icefloe.config.manifest import SAFETY_MARGIN_S, ManifestConfig  # startup time: PEP 562
    from icefloe.manifest.cas import CasStats, Loaded, cas_update, load  # startup time: PEP 562
    from icefloe.manifest.consumer import ManifestConsumer  # startup time: PEP 562
    from icefloe.manifest.model import ConsumerState, Entry, Manifest, ProducerState  # startup time
    from icefloe.manifest.producer import BatchRef, ManifestProducer, ProducerStats  # startup time
    from icefloe.manifest.sharded_consumer import ShardedConsumer, ShardEntry  # startup time
    from icefloe.manifest.sharded_producer import ShardedProducer  # startup time: PEP 562
    from icefloe.manifest.shards import (
        ShardSet,
        ensure_shards,
        grow_shards,
        read_shard_count,
        shard_key,
        shard_set_key,
    )  # startup time: PEP 562

    names = {
        "SAFETY_MARGIN_S": SAFETY_MARGIN_S, "BatchRef": BatchRef, "CasStats": CasStats,
        "ConsumerState": ConsumerState, "Entry": Entry, "Loaded": Loaded,
        "Manifest": Manifest, "ManifestConfig": ManifestConfig,
        "ManifestConsumer": ManifestConsumer, "ManifestProducer": ManifestProducer,
        "ProducerState": ProducerState, "ProducerStats": ProducerStats,
        "ShardEntry": ShardEntry, "ShardSet": ShardSet, "ShardedConsumer": ShardedConsumer,
        "ShardedProducer": ShardedProducer, "cas_update": cas_update,
        "ensure_shards": ensure_shards, "grow_shards": grow_shards, "load": load,
        "read_shard_count": read_shard_count, "shard_key": shard_key,
        "shard_set_key": shard_set_key,
    }
    globals().update(names)
    return names[name]
