"""Assemble one ingestor from configuration: store, probe, producer, buffer, service.

Why a runtime object: the HTTP and gRPC servers of one process share a single buffer and
manifest producer (one producer id per process, group commit across both transports), and
shutdown must drain that buffer exactly once, after both servers stopped accepting.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.formats.batch import Compression
from icefloe.manifest import ensure_shards
from icefloe.redact import mask_uri
from icefloe.registry.subjects import is_subject_stream
from icefloe.registry.watch import RegistryWatch
from icefloe.store import local_path
from icefloe.store.base import AsyncObjectStore
from icefloe.store.fs_kind import journalless_note
from icefloe.store.probe import probe_conditional_writes
from ingestor.buffer import Batcher, FlushSettings
from ingestor.metrics import IngestMetrics
from ingestor.publish import (
    Publisher,
    Publishing,
    open_publishing,
    publisher_for,
    store_options,
)
from ingestor.service import IngestService

log = logging.getLogger("icefloe.ingestor")


def flush_settings(config: Config) -> FlushSettings:
    ing = config.ingestor
    return FlushSettings(
        age_s=ing.flush_age_ms / 1000, max_batch_bytes=ing.flush_bytes,
        max_batch_events=ing.flush_events, min_interval_s=ing.min_flush_interval_ms / 1000,
        early_requests=ing.early_flush_requests,
        max_bytes=ing.buffer_max_bytes, timeout_s=ing.flush_timeout_s,
        zstd_level=ing.zstd_level, retry_after_s=ing.retry_after_s,
        compression=Compression.NONE if ing.batch_compression == "none" else Compression.ZSTD)


@dataclass
class IngestorRuntime:
    """Everything one ingestor process holds; transports get ``service``."""

    config: Config
    store: AsyncObjectStore
    publisher: Publisher
    batcher: Batcher
    service: IngestService
    metrics: IngestMetrics
    watch: RegistryWatch | None = None
    _watching: asyncio.Task[None] | None = None
    _stop_watch: asyncio.Event | None = None

    @classmethod
    async def start(cls, config: Config, store: AsyncObjectStore | None = None,
                    probe: bool = True, *, clock: Clock = SYSTEM,
                    metrics: IngestMetrics | None = None) -> IngestorRuntime:
        """Open the store, refuse it unless it enforces CAS, start the flusher.

        ``clock`` goes to the flusher, the manifest producer, the registry watch, the store's
        retry layer and the ingest service (receive times, token budget, rate limits); the
        store helper's producer, in another process, reads the system clock. ``metrics``:
        the process's, when its HTTP front serves them before the runtime stands. A given
        ``store`` is published to from this process."""
        opened = store is None
        options = dataclasses.replace(store_options(config), clock=clock)
        publishing = open_publishing(config, options) if store is None else \
            Publishing(store, None, options.retry)
        store = publishing.store
        try:
            return await cls._assemble(config, publishing, probe, clock,
                                       metrics or IngestMetrics())
        except BaseException:
            # a failed start is retried (ingestor.starting): leak no client session
            if opened:
                with contextlib.suppress(Exception):
                    await store.close()
            raise

    @classmethod
    async def _assemble(cls, config: Config, publishing: Publishing, probe: bool,
                        clock: Clock, metrics: IngestMetrics) -> IngestorRuntime:
        store = publishing.store
        if probe:
            await probe_conditional_writes(store)
        manifest = config.manifest.build()
        # grows the store to [manifest] shards (a config asking for fewer uses the store's)
        await ensure_shards(store, manifest, clock=clock)
        index = config.ingestor.shard_index if config.ingestor.shard_index >= 0 else None
        publisher = publisher_for(publishing, manifest, index, clock=clock)
        metrics.watch_producer(publisher.stats)
        metrics.watch_shard(lambda: publisher.shard)
        batcher = Batcher(publisher, flush_settings(config), metrics, clock=clock)
        batcher.start()
        service = IngestService(config, batcher, metrics, store, clock=clock)
        watch = RegistryWatch(store, config.admin.registry_key, service.apply_registry,
                              poll_s=config.admin.registry_poll_s,
                              on_error=lambda exc: metrics.registry_errors.inc(),
                              config_streams=config.streams, clock=clock)
        try:
            await watch.check()  # a registry, if there is one, applies before the first request
            served = [c.config for c in service.streams.values()]
            if any(s.format == "avro" or is_subject_stream(s) for s in served):
                # Confluent-framed records' ids and subject streams' types: known before
                # the first request
                await service.writer_schemas.refresh()
                await service.own_writers()  # single-object records' writer ids
        except BaseException:
            with contextlib.suppress(Exception):
                await batcher.close(1.0)  # nothing was accepted: nothing to drain
            with contextlib.suppress(Exception):
                await publisher.close()
            raise
        log.info("ingestor ready: store=%s producer=%s streams=%s registry=%d",
                 mask_uri(store.url), publisher.producer_id or "(in the store helper)",
                 ",".join(service.streams) or "-",
                 service.registry_version)
        if config.store.url.startswith("file:") and (
                note := journalless_note(local_path(config.store.url))):
            log.warning("local store: %s", note)
        runtime = cls(config, store, publisher, batcher, service, metrics, watch)
        runtime._stop_watch = asyncio.Event()
        runtime._watching = asyncio.create_task(watch.run(runtime._stop_watch),
                                                name="registry-watch")
        return runtime

    async def close(self, timeout_s: float | None = None) -> bool:
        """Flush what is buffered and answer every waiting request; True if drained."""
        if self._stop_watch is not None and self._watching is not None:
            self._stop_watch.set()
            await self._watching
        drained = await self.batcher.close(timeout_s or self.config.ingestor.shutdown_timeout_s)
        await self.publisher.close()
        await self.store.close()
        return drained
