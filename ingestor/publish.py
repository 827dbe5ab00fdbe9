"""Where the ingestor's sealed batches go: a :class:`Publisher` writes each as a batch file
and appends it to the manifest (:func:`icefloe.manifest.publish.publish_block` does both).

Two of them, and the config chooses (:func:`open_publishing`), never the type of a store:

- :class:`StorePublisher` writes and appends from this process, through any store;
- :class:`HelperPublisher`, with the local store's helper process
  (:mod:`ingestor.store_helper`, ``[ingestor] store_helper``, the default on ``file://``),
  sends the batch there and the helper writes the file *and* appends it with a manifest
  producer of its own: one round trip per flush instead of two, and the manifest's
  encoding and CAS off the event loop (gRPC unary +9 % measured on 2 cores).

The helper publishes only for a plain ``file://`` store: not with a separate control store
(the manifest lives elsewhere), and not while store faults are injected
(``ICEFLOE_STORE_FAULTS``: the faults must see every write, and the helper's own producer
writes past them).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Protocol

from icefloe.clock import Clock
from icefloe.config import Config
from icefloe.config.manifest import ManifestConfig
from icefloe.formats.batch import BatchBlock
from icefloe.manifest.producer import ManifestProducer, ProducerStats
from icefloe.manifest.publish import new_batch_key, publish_block
from icefloe.manifest.sharded_producer import ShardedProducer
from icefloe.store import StoreOptions, local_path, open_async_store, options_for, wrap_async
from icefloe.store.adapters import InlineAsyncStore
from icefloe.store.base import AsyncObjectStore, ObjectStore
from icefloe.store.failpoints import FAULTS_ENV
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy
from ingestor.store_helper import ProcessAsyncStore

log = logging.getLogger("icefloe.ingestor.publish")


def store_options(config: Config) -> StoreOptions:
    """Store options from ``[store]`` (S3 settings only matter for ``s3://`` URLs), plus
    ``[ingestor] store_helper``: a ``file://`` store's I/O then runs in a helper process."""
    options = options_for(config.store.endpoint_url, config.store.region)
    if not config.ingestor.store_helper:
        return options
    return dataclasses.replace(options, local_store=ProcessAsyncStore)


def publishes_in_helper(config: Config, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the store helper also appends to the manifest (see the module docstring):
    ``[ingestor] store_helper`` on a ``file://`` store, the manifest in that same store,
    and no store faults injected."""
    url, control = config.store.url, config.store.control_url
    return (config.ingestor.store_helper and url.startswith("file:")
            and (not control or control.rstrip("/") == url.rstrip("/"))
            and not environ.get(FAULTS_ENV))


@dataclasses.dataclass(frozen=True)
class Publishing:
    """The store an ingestor opened and, when the helper publishes, its helper process."""

    store: AsyncObjectStore
    helper: ProcessAsyncStore | None
    retry: RetryPolicy


def open_publishing(config: Config, options: StoreOptions) -> Publishing:
    """Open the ingestor's store as its config asks (:func:`publishes_in_helper`)."""
    if publishes_in_helper(config):
        helper = ProcessAsyncStore(local_path(config.store.url))
        return Publishing(wrap_async(helper, options), helper, options.retry)
    store = open_async_store(config.store.url, options, control_url=config.store.control_url)
    return Publishing(store, None, options.retry)


def publisher_for(publishing: Publishing, manifest: ManifestConfig, index: int | None, *,
                  clock: Clock) -> Publisher:
    """The helper's publisher when the helper publishes, else one with a producer here."""
    if publishing.helper is not None:
        return HelperPublisher(publishing.helper, manifest, publishing.retry, index)
    store = publishing.store
    return StorePublisher(store, ShardedProducer(store, manifest, index=index, clock=clock))


class Publisher(Protocol):
    """Where the ingestor's sealed batches go: a file in the store, then a manifest entry."""

    stats: ProducerStats
    """The manifest producer's counters (exported as metrics)."""

    @property
    def producer_id(self) -> str | None:
        """The manifest producer id in use (None before the first append, helper only)."""
        ...

    @property
    def shard(self) -> int | None:
        """The manifest shard appends go to now (None before the first append)."""
        ...

    def dispatch(self, block: BatchBlock, *, streams: Iterable[str],
                 registry_version: int = 0) -> Awaitable[tuple[int | None, int]]:
        """Write ``block`` as a batch file and append it; awaited, (manifest sequence, file
        size). Not a coroutine function: a publisher may start the work in this call (the
        helper's does), so a flush sealed in the middle of a loop turn is being written
        while the rest of the turn runs."""
        ...

    async def close(self) -> None:
        """Wait for appends in flight."""
        ...


class StorePublisher:
    """Writes and appends from this process, through any store."""

    def __init__(self, store: AsyncObjectStore,
                 producer: ManifestProducer | ShardedProducer) -> None:
        self.store = store
        self.producer = producer
        self.stats = producer.stats

    @property
    def producer_id(self) -> str | None:
        return self.producer.producer_id

    @property
    def shard(self) -> int | None:
        """The manifest shard appends go to (None before the first with a sharded
        producer; 0 for a plain producer, which writes the manifest key)."""
        return self.producer.shard if isinstance(self.producer, ShardedProducer) else 0

    def dispatch(self, block: BatchBlock, *, streams: Iterable[str],
                 registry_version: int = 0) -> Awaitable[tuple[int | None, int]]:
        # starts when awaited: it runs on this loop anyway
        return publish_block(self.store, self.producer, block, streams=streams,
                             registry_version=registry_version)

    async def close(self) -> None:
        await self.producer.close()


@dataclasses.dataclass(frozen=True)
class PublishOutcome:
    """What the helper answers for one batch: its sequence (None: found already appended
    and dequeued) and size, or the error that refused it; and its producer's id and
    counters at that moment (refusals count too: queue full, deadline); ``instance`` names
    the helper's sharded producer (stable while the helper lives, unlike the producer id,
    which changes when the shard count grows) and ``shard`` where it appends."""

    sequence: int | None
    size: int
    producer_id: str
    stats: ProducerStats
    error: Exception | None = None
    instance: str = ""
    shard: int | None = None


@dataclasses.dataclass(frozen=True)
class PublishJob:
    """One batch to write and append inside the local store's helper process.

    Runs on the helper's event loop with a producer that lives there (made by the first
    job, kept in ``state``) over the helper's own store, retried with the ingestor's
    policy. Pickled to the helper: everything here must pickle.
    """

    key: str
    block: BatchBlock
    streams: tuple[str, ...]
    registry_version: int
    manifest: ManifestConfig
    retry: RetryPolicy
    index: int | None = None
    """The ingestor's ``shard_index`` (None: the shard is hashed)."""

    async def run(self, store: ObjectStore, state: dict[str, Any]) -> PublishOutcome:
        producer: ShardedProducer | None = state.get("producer")
        if producer is None:  # the job loop runs nothing else: no thread hop per call
            retrying = RetryingAsyncStore(InlineAsyncStore(store), self.retry)
            producer = state["producer"] = ShardedProducer(retrying, self.manifest,
                                                           index=self.index)
        try:
            sequence, size = await publish_block(
                producer.store, producer, self.block, streams=self.streams,
                registry_version=self.registry_version, key=self.key)
        except Exception as exc:  # answered with the counters it changed
            return PublishOutcome(None, 0, producer.producer_id or "",
                                  dataclasses.replace(producer.stats), exc,
                                  producer.instance, producer.shard)
        return PublishOutcome(sequence, size, producer.producer_id or "",
                              dataclasses.replace(producer.stats), None,
                              producer.instance, producer.shard)


class HelperPublisher:
    """Publishes through the local store's helper process (see the module docstring).

    Why the producer id can change: a helper that died took its producer with it, and the
    next one starts a new producer (a new id, numbering from 1), exactly like a restarted
    ingestor; the batches in flight when it died were answered 503, never acknowledged.
    ``stats`` add up over every helper this process had.
    """

    def __init__(self, helper: ProcessAsyncStore, manifest: ManifestConfig,
                 retry: RetryPolicy, index: int | None = None) -> None:
        self.helper = helper
        self.manifest = manifest
        self.retry = retry
        self.index = index
        self.stats = ProducerStats()
        self._earlier = ProducerStats()  # the counters of helpers that are gone
        self._current = ProducerStats()
        self._producer_id: str | None = None
        self._instance: str | None = None
        self._shard: int | None = None

    @property
    def producer_id(self) -> str | None:
        return self._producer_id

    @property
    def shard(self) -> int | None:
        """The manifest shard the helper's producer appends to (None before it answered)."""
        return self._shard

    def dispatch(self, block: BatchBlock, *, streams: Iterable[str],
                 registry_version: int = 0) -> Awaitable[tuple[int | None, int]]:
        job = PublishJob(new_batch_key(), block, tuple(sorted(set(streams))),
                         registry_version, self.manifest, self.retry, self.index)
        sent = self.helper.submit_job(job)  # on its way now, if a helper is running
        return self._answer(sent if sent is not None else self.helper.run_job(job))

    async def _answer(self, sent: Awaitable[Any]) -> tuple[int | None, int]:
        outcome: PublishOutcome = await sent
        self._account(outcome)
        if outcome.error is not None:
            raise outcome.error
        return outcome.sequence, outcome.size

    def _account(self, outcome: PublishOutcome) -> None:
        if outcome.instance != self._instance:
            if self._instance is not None:
                self._earlier = _added(self._earlier, self._current)
                log.warning("manifest producer %s replaced by %s (the store helper "
                            "restarted)", self._producer_id, outcome.producer_id)
            self._instance, self._current = outcome.instance, ProducerStats()
        # a new id under the same instance: the shard count grew and it moved
        self._producer_id = outcome.producer_id or self._producer_id
        self._shard = outcome.shard
        # answers of one group may arrive in any order: counters only grow
        self._current = _added(self._current, outcome.stats, maximum=True)
        total = _added(self._earlier, self._current)
        for name in _STATS_FIELDS:  # in place: the metrics hold this very object
            setattr(self.stats, name, getattr(total, name))

    async def close(self) -> None:
        """Nothing to wait for: every publish awaits its own append."""


_STATS_FIELDS = tuple(field.name for field in dataclasses.fields(ProducerStats))


def _added(a: ProducerStats, b: ProducerStats, *, maximum: bool = False) -> ProducerStats:
    """Field by field ``a + b`` (or the larger, with ``maximum``); the largest group is a
    maximum either way.

    Why the names are listed once: this runs on the event loop for every flush, and
    ``dataclasses.fields``/``asdict`` (a deep copy) cost ~3x the arithmetic."""
    values = {}
    for name in _STATS_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        values[name] = max(x, y) if maximum or name == "largest_group" else x + y
    return ProducerStats(**values)
