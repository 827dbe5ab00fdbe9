"""Run the admin API from a config: the registry (seeded from ``[[streams]]``), the task
runner with its catalog, the undelivered-data check against the manifest, and uvicorn.

Why seeding happens here and at every start: the first process to reach an empty registry
puts the config's streams into it (one CAS; a second process racing it re-reads and finds
it seeded). Later, differences between the file and the registry are logged as warnings —
the registry wins and nothing is applied silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config, StreamConfig
from icefloe.errors import ConfigError
from icefloe.manifest.cas import load as load_manifest
from icefloe.manifest.model import Entry
from icefloe.manifest.shards import read_shard_count, shard_key
from icefloe.registry import ops
from icefloe.registry.model import Registry
from icefloe.registry.store import RegistryStore, drift, refuse_conflicts
from icefloe.server_tls import section_tls
from icefloe.staging import PREFIX, StagingState, table_of_state
from icefloe.store import open_async_store, options_for
from icefloe.store.base import AsyncObjectStore
from icefloe_app.api.app import AdminApi, PendingCounter, build_app
from icefloe_app.api.auth import AdminAuth
from icefloe_app.api.tasks import TableDropper, TableMaker, Tasks

log = logging.getLogger("icefloe.admin")


@dataclass
class AdminReady:
    host: str
    port: int
    registry_version: int
    tls: bool = False

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"


def catalog_table_maker(config: Config) -> tuple[TableMaker, TableDropper]:
    """Creates or evolves a sink's table in the configured catalog (opened on first use),
    and drops an empty one again (a task that created it and then failed)."""
    opened: list[object] = []

    def catalog() -> Any:
        from pipeline.iceberg.catalog import open_catalog  # lazy: pyiceberg

        if not opened:
            opened.append(open_catalog(config.catalog))
        return opened[0]

    def make(stream: StreamConfig) -> bool:
        from pipeline.iceberg.tables import ensure_stream_table  # lazy: pyiceberg

        created: list[str] = []
        ensure_stream_table(catalog(), stream, created=created)
        return bool(created)

    def drop(table: str) -> bool:
        from pipeline.iceberg.tables import drop_if_empty  # lazy: pyiceberg

        return drop_if_empty(catalog(), table)
    return make, drop


PRUNE_EVERY_S = 60.0


async def prune_tombstones(store: AsyncObjectStore, registry: RegistryStore,
                           manifest_key: str, grace_s: float) -> Registry:
    """One pass of :func:`icefloe.registry.ops.prune` with what the store says now: the
    oldest pending registry version per source, and the tables with staged rows."""
    oldest: dict[str, int] = {}
    for entry in await _unacknowledged(store, manifest_key):
        for stream in entry.streams:
            oldest[stream] = min(oldest.get(stream, entry.registry_version),
                                 entry.registry_version)
    staged: set[str] = set()
    for info in (await store.list(f"{PREFIX}/")).objects:
        if table_of_state(info.key) is not None:
            state = StagingState.decode((await store.get(info.key)).data)
            if state.files:
                staged.add(state.table)
    return await registry.update(lambda r: ops.prune(
        r, now=registry.clock.time(), grace_s=grace_s, oldest_pending=oldest,
        staged_tables=staged, clock=registry.clock))


async def _prune_forever(store: AsyncObjectStore, registry: RegistryStore, config: Config,
                         stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PRUNE_EVERY_S)
        if stop.is_set():
            return
        try:
            before = (await registry.read()).version
            after = await prune_tombstones(store, registry, config.manifest.key,
                                           config.admin.tombstone_grace_s)
            if after.version != before:
                log.info("registry version %d: deleted sources and sinks nothing needs "
                         "any more were removed", after.version)
        except Exception as exc:  # try again next time
            log.warning("pruning the registry failed (will retry): %s", exc)


def pending_counter(store: AsyncObjectStore, manifest_key: str) -> PendingCounter:
    async def pending(source_id: str) -> int:
        return sum(1 for e in await _unacknowledged(store, manifest_key)
                   if source_id in e.streams)
    return pending


async def _unacknowledged(store: AsyncObjectStore, manifest_key: str) -> list[Entry]:
    """Manifest entries the collector has not acknowledged yet, of every shard (the
    store's shard count, whatever this process's config says: an ingestor may have grown
    it, and entries of any shard are undelivered until the collector acks them)."""
    count = await read_shard_count(store, manifest_key)
    loaded = await asyncio.gather(*(load_manifest(store, shard_key(manifest_key, n))
                                    for n in range(count)))
    return [entry for one in loaded
            for entry in one.manifest.entries_from(one.manifest.consumer.acked_through + 1)]


async def serve_admin(config: Config, *, stop: asyncio.Event,
                      store: AsyncObjectStore | None = None,
                      make_table: TableMaker | None = None,
                      on_ready: Callable[[AdminReady], None] | None = None,
                      clock: Clock = SYSTEM) -> int:
    """Serve until ``stop`` is set; returns the exit code. ``clock`` stamps registry
    changes and tasks and refills the token-failure budgets."""
    admin = config.admin
    if not admin.tokens:
        raise ConfigError(f"{config.source or 'config'}: admin.tokens is empty; the admin "
                          "API needs at least one token hash; make one with `icefloe token "
                          "new` and put its hash line into [admin] tokens (or "
                          "ICEFLOE_ADMIN_TOKENS)")
    tls = section_tls(config, "admin", what="admin API", secrets="admin tokens")
    own_store = store is None
    store = store or open_async_store(config.store.url, options_for(
        config.store.endpoint_url, config.store.region), control_url=config.store.control_url)
    try:
        registry = RegistryStore(store, admin.registry_key, clock=clock)
        seeded = await registry.seed(config.streams, config.source)
        refuse_conflicts(seeded, config.streams, config.source or "config")
        for note in drift(seeded, config.streams):
            log.warning("config and registry differ: %s", note)
        maker, dropper = catalog_table_maker(config)
        tasks = Tasks(make_table or maker, drop_table=None if make_table else dropper,
                      clock=clock)
        api = AdminApi(registry, tasks,
                       AdminAuth(admin.tokens, clock=clock),
                       pending=pending_counter(store, config.manifest.key),
                       cluster_output=config.collector.output == "cluster")
        server = uvicorn.Server(uvicorn.Config(
            build_app(api), host=admin.host, port=admin.port, log_config=None,
            access_log=False, lifespan="off",
            ssl_context_factory=None if tls is None else (lambda _config, _default:
                                                          tls.http_context)))
        # Stopping is the caller's `stop` (its own signal handlers): uvicorn must not take
        # SIGTERM over and re-raise it after shutting down, which would kill the process.
        server.capture_signals = contextlib.nullcontext  # type: ignore[assignment]
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if serving.done():  # failed to bind (uvicorn exits the task with SystemExit)
            with contextlib.suppress(BaseException):
                serving.result()
            raise ConfigError(f"admin.port: cannot listen on {admin.host}:{admin.port} (in "
                              "use already?); choose another with --port or [admin] port")
        port = server.servers[0].sockets[0].getsockname()[1]
        if tls is not None:
            tls.start()
        log.info("admin API on %s://%s:%d (registry version %d)",
                 "http" if tls is None else "https", admin.host, port, seeded.version)
        if on_ready is not None:
            on_ready(AdminReady(admin.host, port, seeded.version, tls is not None))
        pruning = asyncio.create_task(_prune_forever(store, registry, config, stop),
                                      name="registry-prune")
        await stop.wait()
        await pruning
        server.should_exit = True
        await serving
        await api.tasks.wait_all()
        if tls is not None:
            await tls.stop()
        return 0
    finally:
        if own_store:
            with contextlib.suppress(Exception):
                await store.close()
