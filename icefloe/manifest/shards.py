"""Manifest shards: N manifest objects of the same format, and the record of how many.

Why shards: one manifest object sustains a few tens of CAS writes per second on S3-like
latency, whatever the number of producers, so one queue caps the cluster's append rate.
N shard objects raise the cap N-fold; each keeps the manifest's whole contract (contiguous
sequences, group commit, idempotent producers, bounds), because each *is* a manifest.

Layout:

* **Shard 0 is the manifest key itself** (``manifest.key``). A deployment that never
  heard of shards, and an ingestor too old to know them, reads and writes shard 0: a
  rolling upgrade needs no migration.
* **Shard k > 0** lives at ``<key>-shard<k>`` next to it, created by its first write.
* **The shard set** ``<key>.shards`` records the count, so every process agrees on it
  whatever its own config says. A missing record means one shard. It is a small JSON
  document updated by compare-and-swap: growing 1 -> N online is one CAS; shrinking is
  refused (entries queued on a dropped shard would be stranded), with an error naming
  both counts; a process whose config says fewer uses the store's count (a warning).

Why a separate record and not a field of shard 0's header: old ingestors rewrite shard 0
on every append and would drop a header field they do not know.

What order is kept: sequences are per shard, so order holds within a shard, and therefore
within a producer (a producer appends to one shard for its whole life). Nothing orders
entries of different shards; the consumer tags every entry with ``(shard, sequence)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.config.manifest import MAX_SHARDS, ManifestConfig
from icefloe.errors import ConfigError, ManifestCorruptError
from icefloe.store.base import AsyncObjectStore
from icefloe.store.cas import Versioned, cas_document, load_document
from icefloe.store.retry import RetryPolicy

SHARD_SET_VERSION = 1
log = logging.getLogger("icefloe.manifest")


def shard_key(key: str, shard: int) -> str:
    """Object key of ``shard`` of the manifest at ``key`` (shard 0 is ``key`` itself)."""
    if shard < 0:
        raise ValueError(f"a shard number is >= 0, got {shard}")
    return key if shard == 0 else f"{key}-shard{shard}"


def shard_set_key(key: str) -> str:
    """Object key of the record holding the shard count of the manifest at ``key``."""
    return f"{key}.shards"


def shard_config(config: ManifestConfig, shard: int) -> ManifestConfig:
    """``config`` pointing at ``shard``'s object (every other setting applies per shard)."""
    if shard == 0:
        return config
    return dataclasses.replace(config, key=shard_key(config.key, shard))


class ShardSet(msgspec.Struct, frozen=True, kw_only=True):
    """The durable shard count. ``revision`` grows on every write (bytes always change)."""

    shards: int = 1
    revision: int = 0
    version: int = SHARD_SET_VERSION

    def encode(self) -> bytes:
        return _encoder.encode(self) + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> ShardSet:
        try:
            record = _decoder.decode(data)
        except msgspec.DecodeError as exc:
            raise ManifestCorruptError(f"manifest shard set cannot be decoded: {exc}") \
                from exc
        if record.version != SHARD_SET_VERSION:
            raise ManifestCorruptError(
                f"manifest shard set version {record.version} is not supported (this "
                f"icefloe reads version {SHARD_SET_VERSION})")
        if not 1 <= record.shards <= MAX_SHARDS:
            raise ManifestCorruptError(f"manifest shard set says {record.shards} shards")
        return record


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ShardSet)


async def read_shard_count(store: AsyncObjectStore, key: str, *,
                           clock: Clock = SYSTEM) -> int:
    """The store's shard count for the manifest at ``key`` (1 when never recorded)."""
    doc: Versioned[ShardSet] = await load_document(store, shard_set_key(key),
                                                   ShardSet.decode, ShardSet, clock=clock)
    return doc.value.shards


async def grow_shards(store: AsyncObjectStore, key: str, shards: int, *,
                      backoff: RetryPolicy, clock: Clock = SYSTEM) -> int:
    """Raise the shard count to ``shards`` (a CAS on the record); return the count now.

    Asking for the current count writes nothing. Asking for fewer raises
    :class:`ConfigError` naming both counts: a dropped shard's queued entries would never
    be consumed. Safe to run while producers and the consumer work: producers pick up the
    new count when they next re-read it, and the consumer reads every shard up to it.
    """
    if not 1 <= shards <= MAX_SHARDS:
        raise ConfigError(f"manifest.shards must be within 1..{MAX_SHARDS}, got {shards}")

    def grow(doc: Versioned[ShardSet]) -> ShardSet | None:
        current = doc.value.shards
        if shards < current:
            raise ConfigError(
                f"manifest.shards = {shards} is below the store's shard count {current} "
                f"({shard_set_key(key)!r}): shrinking is refused, because entries queued "
                f"on the dropped shards would never be consumed; set manifest.shards = "
                f"{current} or more")
        if shards == current:
            return None
        return ShardSet(shards=shards, revision=doc.value.revision + 1)

    loaded, written = await cas_document(store, shard_set_key(key), ShardSet.decode,
                                         ShardSet, grow, backoff=backoff,
                                         what="manifest shard set", clock=clock)
    return (written or loaded.value).shards


async def ensure_shards(store: AsyncObjectStore, config: ManifestConfig, *,
                        clock: Clock = SYSTEM) -> int:
    """Bring the store to ``config.shards`` at start: grow if the config asks for more;
    return the count the process must use.

    A config asking for fewer than the store holds is a config written before the shards
    were grown online (a replacement collector or ingestor from the old manifest): the
    store's count wins, with a warning naming both, and nothing is written — the count
    never shrinks (entries on a dropped shard would never be consumed), and refusing to
    start would leave those shards without a consumer. A config of 1 on a store that never
    recorded shards reads only (no write), so a single-manifest deployment stays as it was.
    """
    current = await read_shard_count(store, config.key, clock=clock)
    if config.shards == current:
        return current
    if config.shards < current:
        log.warning("manifest.shards = %d is below the store's shard count %d (%r): using "
                    "%d (the count only grows); set manifest.shards = %d to silence this",
                    config.shards, current, shard_set_key(config.key), current, current,
                    extra={"config_shards": config.shards, "store_shards": current})
        return current
    return await grow_shards(store, config.key, config.shards,
                             backoff=config.conflict_backoff, clock=clock)


def pick_shard(instance: str, shards: int) -> int:
    """The shard a process named ``instance`` appends to when there are ``shards``.

    Rendezvous hashing: every shard gets a pseudo-random weight per instance and the
    heaviest wins. Instances spread uniformly, and when the count grows from N to M only
    the instances whose heaviest shard is a new one move (about (M-N)/M of them): the
    rest keep their producer, and the new shards fill without emptying the old ones.
    """
    if shards <= 1:
        return 0

    def weight(shard: int) -> bytes:
        return hashlib.blake2b(f"{instance}/{shard}".encode(), digest_size=8).digest()

    return max(range(shards), key=weight)
