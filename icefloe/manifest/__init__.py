"""The fenced manifest queue: producers append batch files, one consumer reads in order."""

from icefloe.manifest.cas import CasStats, Loaded, cas_update, load
from icefloe.manifest.config import SAFETY_MARGIN_S, ManifestConfig
from icefloe.manifest.consumer import ManifestConsumer
from icefloe.manifest.model import ConsumerState, Entry, Manifest, ProducerState
from icefloe.manifest.producer import BatchRef, ManifestProducer, ProducerStats

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
    "cas_update",
    "load",
]
