"""The collector: the single fenced consumer that commits manifest entries into Iceberg.

One run = the next entries after the last ack (bounded by count and bytes) → one pipeline
job → per table: deduplicate, commit once with ``icefloe.sequence``/``icefloe.epoch`` → ack
→ dequeue in bulk. Why this order is safe at every crash point:

* crash before a table's commit: nothing of the run is in that table; the entries are not
  acked, so the next collector re-reads and commits them;
* crash after some commits but before the ack: those tables' summaries hold the run's
  sequence, so on replay :func:`pipeline.iceberg.commit.commit_rows` drops their rows;
  tables not yet committed get theirs — exactly once per table;
* crash after the ack: the entries are never read again; dequeue and GC are idempotent.

A replaced collector (epoch bumped by a standby or ``--takeover``) is stopped by the
manifest (``FencedError``) or by a table recording a newer epoch (``TableFencedError``).
Every table records the newer epoch from the takeover on: before consuming, a collector
fences every icefloe table (:mod:`pipeline.iceberg.fence`) and its staging states, then confirms the
manifest epoch; a table or staging state it creates later is confirmed the same way before
its first commit. So no commit by an older epoch lands anywhere after a takeover.

This module is the run loop (lease, tables, read, run, ack, dequeue); how a run's rows become
Iceberg commits is the job of the output path objects the :class:`Collector` owns
(:mod:`collector.commit`: ``embedded``, ``cluster`` and ``staged``).

Thread hops (``offload``/``block_on``) and time (``clock``) are injected (see
:mod:`collector.hops`), so a simulator can run a collector on one thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

import msgspec
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from ulid import ULID

from collector.bulkhead import Bulkheads, Parked, crash_marking, is_shared_failure
from collector.cluster_dynamic import table_specs
from collector.cluster_path import ClusterPath
from collector.commit import Hook, RunResult, TableCommits, upsert_columns, versions_of
from collector.dedup import DedupWindow
from collector.dynamic import carry_dynamic, has_templates, staged_tables
from collector.embedded_path import EmbeddedPath
from collector.hops import BlockOn, Offload, sleep_or_stop
from collector.http import STALL_INTERVALS
from collector.journal import DedupJournal, JournalView
from collector.metrics import CollectorMetrics
from collector.routing import Routes, cut_by_routing, embedded_reason
from collector.staged_path import StagedPath
from collector.staging import StagingArea
from icefloe.backoff import run_retry_delay
from icefloe.catalog_version import stamp_epoch
from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config, StreamConfig
from icefloe.errors import (
    FencedError,
    LeaseHeldError,
    ManifestMismatchError,
    OffsetLostError,
    RegistryBehindError,
    TableFencedError,
    TransientStoreError,
)
from icefloe.manifest.model import Entry, Manifest
from icefloe.manifest.sharded_consumer import ShardedConsumer, ShardEntry
from icefloe.registry.model import Conditions, Registry, Source
from icefloe.registry.store import RegistryStore
from icefloe.registry.streams import config_registry
from icefloe.registry.subjects import (
    SubjectError,
    has_subjects,
    resolve_registry,
    resolved_sources,
)
from icefloe.retention import record_run
from icefloe.schemas.model import SchemaDocument
from icefloe.schemas.store import SchemaStore, schema_key
from icefloe.store.base import AsyncObjectStore
from icefloe.streams.evolution import EvolveLimits
from pipeline.iceberg import (
    DEAD_LETTER_TABLE,
    committed_state,
    ensure_dead_letter_table,
    ensure_stream_table,
    fence_all,
    fence_table,
    position,
)
from pipeline.load import (
    ClusterRunOutput,
    RunOutput,
    RunSpec,
    run_spec,
    with_avro_writers,
    with_key_columns,
    with_sql_cases,
    with_tables,
    with_template_cases,
    with_wheres,
)

__all__ = ["Collector", "Engine", "Fenced", "Hook", "RunResult", "positioned", "through_of"]

log = logging.getLogger("icefloe.collector")

T = TypeVar("T")


class Engine(Protocol):
    """Runs the pipeline. A cluster-output engine (its ``run`` gives a
    :class:`ClusterRunOutput`) also has ``run_embedded(spec) -> RunOutput``: the embedded
    shape on the same session, for runs the cluster path cannot write (see
    :meth:`Collector._route_run`)."""

    name: str
    partitions: int

    def run(self, spec: RunSpec) -> RunOutput | ClusterRunOutput: ...


class Fenced(Exception):
    """This collector was replaced; it must exit (the CLI exits non-zero)."""


class Collector:
    """Owns the consumer, the catalog tables and the dedup windows of one collector, and
    the output paths a run's rows take to Iceberg (``embedded``, ``cluster``, ``staged``:
    :mod:`collector.commit`), which read its state through
    :class:`~collector.commit.CollectorState`."""

    def __init__(self, config: Config, store: AsyncObjectStore, catalog: Catalog,
                 engine: Engine, *, metrics: CollectorMetrics | None = None,
                 hook: Hook | None = None, holder: str | None = None,
                 clock: Clock = SYSTEM, offload: Offload = asyncio.to_thread,
                 block_on: BlockOn | None = None) -> None:
        """``offload`` runs each blocking step off the event loop and ``block_on`` runs a
        store coroutine from inside one (defaults: a worker thread, and the collector's
        loop); :func:`collector.hops.inline` and :func:`collector.hops.drive` run
        everything on one thread instead."""
        self.config = config
        self.store = store
        self.catalog = catalog
        self.engine = engine
        self.metrics = metrics or CollectorMetrics()
        self.hook = hook or (lambda stage: None)  # marked: see crash_marking
        self.consumer = ShardedConsumer(store, config.manifest.build(),
                                        holder=holder or f"collector-{ULID()}", clock=clock)
        self.metrics.queue_max_entries.set(self.consumer.config.max_entries)
        self.metrics.watch_shards(self.consumer)
        # the stream registry as stored (subject streams unresolved: :attr:`routes`
        # resolves them, :mod:`icefloe.registry.subjects`); the schema registry's reader (its
        # parse cache serves the resolves) and the document it read last (None: not yet)
        self.registry = config_registry(config.streams)
        self.routes = Routes(self.registry)
        self.schemas = SchemaStore(store, schema_key(config.admin.registry_key), clock=clock)
        self.schema_doc: SchemaDocument | None = None
        self.subject_problems: dict[str, SubjectError] = {}
        """Tables whose subject stream lost its type (deleted subject, another schema
        type, message gone): parked until a resolve succeeds again."""
        col = config.collector
        self.evolve_limits = EvolveLimits(col.evolve_max_columns, col.evolve_max_name_length,
                                          col.evolve_max_depth)
        self.unprepared: set[str] = set()
        """Tables parked before they could be prepared (not loadable at start)."""
        self.bulkheads = Bulkheads(col.park_after_failures, col.park_retry_s,
                                   col.park_max_bytes, clock.monotonic,
                                   on_change=self._parked_changed,
                                   on_failure=self._table_failed)
        health = self.metrics.health
        health.monotonic, health.stall_after_s = clock.monotonic, \
            STALL_INTERVALS * col.commit_interval_s
        self._hold_s: float | None = None
        self.windows: dict[str, DedupWindow] = {}
        """Dedup windows by table: ids committed to that table within the window, by
        source."""
        self.epoch: int | None = None
        self.table_sequences: dict[str, dict[int, int]] = {}
        """Committed sequence per table, per manifest shard (absent: none)."""
        self._runs_since_dequeue = 0
        self.clock = clock
        self.offload = offload
        self.block_on: BlockOn = block_on or self._run_on_loop
        self.staging = StagingArea(store, confirm=self.confirm_epoch, clock=clock)
        self.journal = DedupJournal(store)
        self.journal_uuids: dict[str, str] = {}
        """Table uuid (the journal's key) of each table with a dedup window."""
        self.journal_writes: dict[str, int] = {}
        self.model_tables: list[str] = []
        """Model targets the collector keeps fresh: fenced on takeover like its own."""
        self._fenced_epoch: int | None = None
        self._confirmed: set[str] = set()
        """``table_uuid`` of tables known to be fenced against any newer collector: fenced
        by us, or created/loaded by us and followed by a manifest-epoch confirmation."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.commits = TableCommits(self)
        self.staged = StagedPath(self, self.commits)
        self.embedded = EmbeddedPath(
            self, self.commits, self.staged, workers=col.commit_workers,
            limits={s.table: s.dynamic_tables for s in config.streams if s.dynamic_tables})
        self.cluster = ClusterPath.beside(self.embedded)

    # -- start: lease, epoch, tables, dedup state ----------------------------------------

    async def acquire(self, *, takeover: bool = False,
                      stop: asyncio.Event | None = None,
                      on_standby: Callable[[], None] | None = None,
                      wait: bool = True) -> int:
        """Become the active collector: wait as a hot standby while another holds a live
        lease (unless ``takeover``), then bump the epoch. Returns our epoch.

        ``on_standby`` is called once when the wait begins (the runner keeps Spark, the
        store and the catalog warm from then on).

        Raises:
            LeaseHeldError: another holds a live lease and ``wait`` is off (``icefloe run``
                refuses rather than waits).
        """
        self._loop = asyncio.get_running_loop()
        lease_s = self.consumer.config.lease_s
        waiting_logged = False
        outages = 0
        while True:
            try:
                if takeover:
                    self.epoch = await self.consumer.initialize()
                    break
                holder, expires, now = await self.consumer.lease()
                if not holder or holder == self.consumer.holder or expires <= now:
                    try:  # the lease is re-checked inside the epoch-bump CAS
                        self.epoch = await self.consumer.initialize(respect_lease=True)
                        break
                    except LeaseHeldError as exc:  # renewed (or taken) meanwhile
                        holder, expires, now = exc.holder, exc.remaining_s, 0.0
            except (TransientStoreError, ConnectionError, TimeoutError) as exc:
                if not wait:
                    raise
                # A standby outlives a store outage: exiting would leave no collector
                # until a new process boots Spark, and a takeover cut short (shard 0's
                # epoch bumped, another shard's fence failed) is finished by the same
                # holder on the next attempt instead of waiting out its own lease.
                outages += 1
                delay = run_retry_delay(outages, lease_s)
                log.warning("standby: the store failed while waiting for the lease "
                            "(attempt %d); retrying in %.1f s: %s", outages, delay,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                await sleep_or_stop(self.clock, delay, stop)
                if stop is not None and stop.is_set():
                    raise asyncio.CancelledError from None
                continue
            outages = 0
            if not wait:
                raise LeaseHeldError(holder, max(expires - now, 0.0))
            if not waiting_logged:
                log.info("standby: %s holds the lease for %.1f s more; waiting", holder,
                         expires - now)
                waiting_logged = True
                if on_standby is not None:
                    on_standby()
            self.metrics.active.set(0)
            self.metrics.health.set_role("standby")
            pause = min(max(expires - now, 0.05), lease_s / 3)
            await sleep_or_stop(self.clock, pause, stop)
            if stop is not None and stop.is_set():
                raise asyncio.CancelledError
        self.metrics.epoch.set(self.epoch)
        self.metrics.active.set(1)
        self.metrics.health.set_role("active")
        log.info("active: holder %s took the queue at epoch %d%s", self.consumer.holder,
                 self.epoch, " (takeover)" if takeover else "")
        return self.epoch

    @property
    def streams(self) -> dict[str, StreamConfig]:
        """The streams decoded (one per source, the union of its sinks' columns)."""
        return {s.name: s for s in self.routes.decode_streams}

    def route_by(self, registry: Registry) -> None:
        """Route by ``registry`` (before the tables are prepared: they are made ready for
        it by :meth:`prepare_tables`)."""
        self.registry = registry
        self.routes = self._new_routes(self._resolved(registry))
        self.metrics.registry_version.set(registry.version)

    def _new_routes(self, registry: Registry) -> Routes:
        """Routes of ``registry``, with the template tables met so far carried over."""
        routes = Routes(registry)
        routes.dynamic = carry_dynamic(self.routes, routes)
        return routes

    def _resolved(self, registry: Registry) -> Registry:
        """``registry`` with its subject streams' types from the document last read; a
        subject that cannot give one keeps its last type and its tables are noted in
        :attr:`subject_problems` (a subject never seen yet just waits: no table)."""
        if self.schema_doc is None or not has_subjects(registry):
            return registry
        previous = resolved_sources(self.routes.registry)
        problems: dict[str, SubjectError] = {}

        def failed(source: Source, exc: SubjectError) -> None:
            if exc.missing and (source.id, source.created_version) not in previous:
                log.info("%s: its table waits for the subject's first version", exc)
                return
            for sink in source.sinks:
                problems[sink.table] = exc

        resolved = resolve_registry(registry, self.schema_doc, self.schemas,
                                    previous=previous, on_error=failed)
        self.subject_problems = problems
        return resolved

    async def read_schemas(self) -> dict[int, str]:
        """Read the schema registry document (once per run, after the run's entries: it
        holds every id an ingestor accepted a record of), re-resolve the subject streams
        (a new version evolves their tables here, before the run's rows are decoded and
        committed), and return the Avro writer schemas by id."""
        subjects = has_subjects(self.registry)
        if not subjects and not any(s.format == "avro" for s in self.routes.decode_streams):
            return {}
        doc = await self.schemas.read()
        before, self.schema_doc = self.schema_doc, doc
        if subjects and (before is None or before.version != doc.version
                         or self.subject_problems):
            resolved = self._resolved(self.registry)
            if resolved != self.routes.registry or self.subject_problems:
                await self.offload(self._apply, self.registry, resolved)
        return {r.id: r.canonical for r in doc.schemas
                if r.schema_type == "AVRO" and not r.references}

    def prepare_tables(self) -> None:
        """Fence every icefloe table (once per epoch), then create or evolve every sink's
        table and the dead-letter table; rebuild dedup (blocking: call in a thread)."""
        if has_subjects(self.registry):  # subject streams' types before their tables
            self.schema_doc = self._await(self.schemas.read())
            self.routes = self._new_routes(self._resolved(self.registry))
        self.fence_tables()
        shards = self._await(self._snapshots())
        oldest = [waiting[0].ingested_at for m in shards.values()
                  if (waiting := m.entries_from(m.consumer.acked_through + 1))]
        self._hold_s = self._oldest_waiting_s(min(oldest, default=None))
        if has_templates(self.routes):  # a parked template table's rows staged before
            staged = self._await(self.staging.tables())
            self.routes.dynamic.update(staged_tables(self.routes, staged))
        for name, stream in self.routes.tables().items():
            if name not in self.unprepared:
                self._prepare_or_park(name, stream)
        dead = ensure_dead_letter_table(self.catalog)
        self.confirm_table(dead)
        self.table_sequences[DEAD_LETTER_TABLE] = committed_state(dead).sequences

    def _unloadable(self, name: str, exc: Exception) -> bool:
        """A table that fails to load or fence for a reason of its own (its metadata
        missing or unreadable) is parked instead of stopping the collector: every other
        table starts. Fences, lost offsets and shared outages still stop the start."""
        if (name == DEAD_LETTER_TABLE or is_shared_failure(exc)
                or isinstance(exc, (OffsetLostError, TableFencedError))):
            return False
        self.unprepared.add(name)
        self.bulkheads.park_now(name, exc)
        return True

    def _prepare_or_park(self, name: str, stream: StreamConfig) -> None:
        problem = self.subject_problems.get(name)
        if problem is not None:
            self.unprepared.add(name)
            self.bulkheads.park_now(name, problem)
            return
        if stream.schema is not None and stream.schema.subject and not stream.schema.text:
            return  # its subject has no version yet: made when one is registered
        try:
            self._prepare_table(name, stream)
        except Exception as exc:
            if not self._unloadable(name, exc):
                raise

    def prepare_parked(self, name: str) -> bool:
        """Before a table parked at start imports its staged rows: fence it, read its
        offsets and rebuild its dedup window (raises while it still cannot be loaded).
        Returns whether it is prepared (False: no sink routes to it any more)."""
        if name in self.subject_problems:  # its subject gave it no type: read it again
            self.schema_doc = self._await(self.schemas.read())
            self._apply(self.registry, self._resolved(self.registry))
            problem = self.subject_problems.get(name)
            if problem is not None:
                raise problem
        if name not in self.unprepared:
            return True
        stream = self.routes.tables().get(name)
        if stream is None:
            return False
        assert self.epoch is not None
        fenced = fence_table(self.catalog, name, self.epoch, offsets=True)
        self.confirm_epoch_sync()
        if fenced is not None:
            self._confirmed.add(fenced.uuid)
        self._prepare_table(name, stream)
        self.unprepared.discard(name)
        return True

    def prepare_dynamic(self, name: str, stream: StreamConfig) -> None:
        """A table a table template named (:mod:`collector.dynamic`): created on its first
        use with the sink's columns and layout, then prepared like a configured table
        (committed sequence, dedup window, staging), so exactly-once holds per table.
        A failure here is the table's own (the caller's guard counts it; once parked its
        rows are staged and :meth:`prepare_parked` prepares it before their import)."""
        self.routes.dynamic[name] = stream
        if name in self.windows or (name in self.unprepared
                                    and self.bulkheads.is_parked(name)):
            return
        try:
            self._prepare_table(name, stream)
        except Exception:
            self.unprepared.add(name)
            raise
        self.unprepared.discard(name)
        self.hook(f"after_prepare:{name}")  # made (or found) and ready: nothing committed

    def _oldest_waiting_s(self, oldest_entry_s: float | None) -> float | None:
        """Store time of the oldest event not yet in its tables: the first unacknowledged
        entry's, or an older staged row's. Dedup windows reach back ``dedup_window_s`` from
        it (:attr:`collector.dedup.DedupWindow.hold_s`), so an outage or a backlog never
        lets an original's id expire before its retries are committed."""
        staged = [s.oldest_ms / 1000 for s in self.staging.states.values()
                  if s.oldest_ms is not None]
        times = [t for t in (oldest_entry_s, *staged) if t is not None]
        return min(times) if times else None

    def fence_tables(self) -> None:
        """Make every icefloe table record our epoch before we consume (blocking).

        Routed tables and the dead letters carry their sequence forward (a lost one is
        refused here, loudly); model targets and any other table icefloe marked or
        committed to are fenced too, and every existing staging state is stamped. Then the
        manifest epoch is confirmed: had a newer collector taken over meanwhile, it may not
        have seen the tables we just marked.
        """
        assert self.epoch is not None
        if self._fenced_epoch == self.epoch:
            return
        consumed = [*self.routes.tables(), DEAD_LETTER_TABLE]
        fenced = fence_all(self.catalog, self.epoch, consumed=consumed,
                           known=self.model_tables, skip=self._unloadable)
        self.block_on(self.staging.claim_existing(self.epoch))
        # the catalog version counter too: an older collector can claim no more versions
        self.block_on(stamp_epoch(self.store, self.epoch, clock=self.consumer.store_clock))
        self.confirm_epoch_sync()
        self._confirmed.update(f.uuid for f in fenced)
        self._fenced_epoch = self.epoch
        log.info("fenced %d tables at epoch %d", len(fenced), self.epoch)

    async def confirm_epoch(self) -> None:
        """Raise :class:`FencedError` if another collector took over (one manifest read)."""
        await self.consumer.confirm()

    def confirm_epoch_sync(self) -> None:
        self.block_on(self.confirm_epoch())

    def confirm_table(self, table: Table) -> None:
        """Before the first commit to a table we did not fence (created or first loaded
        after our fence), confirm the manifest epoch: a newer collector that listed the
        catalog before the table was marked bumped the epoch first, so we see it."""
        uuid = str(table.metadata.table_uuid)
        if uuid not in self._confirmed:
            self.confirm_epoch_sync()
            self._confirmed.add(uuid)

    def _prepare_table(self, name: str, stream: StreamConfig) -> None:
        table = ensure_stream_table(self.catalog, stream)
        self.confirm_table(table)
        state = committed_state(table)
        self.table_sequences[name] = state.sequences
        self.metrics.committed_sequence.labels(name).set(state.sequence)
        log.info("table %s: committed through sequences %s (epoch %d)", name,
                 state.sequences, state.epoch)
        cfg = self.config.collector
        window = DedupWindow(cfg.dedup_window_s, cfg.dedup_max_ids, name=name,
                             clock=self.consumer.store_clock,
                             on_effective=self._window_observer(name))
        window.hold_s = self._hold_s
        window.rebuild(table, journal=self._journal_view(name, table, state.sequences,
                                                         window))
        if len(window):
            log.info("dedup window of %s rebuilt with %d ids", name, len(window))
        assert self.epoch is not None
        staged = self._await(self.staging.claim(name, self.epoch,
                                                create=self._has_conditions(name)))
        self.windows[name] = window  # last: a half-prepared table is prepared again
        self.commits.observe_staged(name, staged)
        if staged.files:
            log.info("table %s: %d rows staged through sequences %s", name, staged.rows,
                     staged.last_sequences)

    def _journal_view(self, name: str, table: Table, committed: dict[int, int],
                      window: DedupWindow) -> JournalView | None:
        """The dedup journal of ``table`` as far back as ``window`` reaches (begun now if
        it has none: :mod:`collector.journal`); records older than twice the window are
        swept first. None with dedup off."""
        if window.window_s <= 0:
            return None
        uuid = str(table.metadata.table_uuid)
        now = self.consumer.store_clock.time()
        marker = self._await(self.journal.begin(name, uuid, committed, int(now * 1000)))
        cutoff = window.cutoff_ms(now)
        self._await(self.journal.sweep(name, uuid, cutoff - int(window.window_s * 1000)))
        view = self._await(self.journal.load(name, uuid, marker, committed, cutoff,
                                             window.max_ids))
        self.journal_uuids[name] = uuid
        return view

    def _window_observer(self, table: str) -> Callable[[float, int], None]:
        effective = self.metrics.dedup_effective_window.labels(table)
        remembered = self.metrics.dedup_ids.labels(table)

        def observe(seconds: float, ids: int) -> None:
            effective.set(seconds)
            remembered.set(ids)
        return observe

    def _has_conditions(self, table: str) -> bool:
        """Whether a sink writing ``table`` has import conditions (its rows are staged)."""
        return any(t.table == table and t.sink.conditions != Conditions()
                   for targets in self.routes.targets.values() for t in targets)

    def _await(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a store coroutine from a blocking step, through the ``block_on`` seam."""
        return self.block_on(coro)

    def _run_on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a store coroutine on the collector's loop from a worker thread (the commit
        path runs in threads; the store's connections belong to the loop)."""
        assert self._loop is not None, "acquire() first"
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # waiting here would block the loop the coroutine needs
            coro.close()
            raise RuntimeError("blocking collector step called on the event loop: run it "
                               "with asyncio.to_thread")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def hook(self) -> Hook:
        return self._hook

    @hook.setter
    def hook(self, hook: Hook) -> None:
        self._hook = crash_marking(hook)

    def _parked_changed(self, table: str, parked: Parked | None) -> None:
        self.metrics.table_parked.labels(table).set(0 if parked is None else 1)
        self.metrics.health.parked = self.bulkheads.reasons()

    def _table_failed(self, table: str, kind: str) -> None:
        self.metrics.table_failures.labels(table, kind).inc()

    def apply_registry(self, registry: Registry) -> None:
        """Route by ``registry`` from now on; tables of new sinks are made ready first, and
        a sink whose columns changed has its table evolved (blocking: call in a thread)."""
        self._apply(registry, self._resolved(registry))

    def _apply(self, registry: Registry, resolved: Registry) -> None:
        """:meth:`apply_registry` of ``registry`` as ``resolved`` (its subject streams'
        types filled): a subject stream whose version changed has its table evolved here,
        and one that lost its type has its table parked."""
        routes = self._new_routes(resolved)
        old = self.routes.tables()
        for name, stream in routes.tables().items():
            if name in self.unprepared:
                continue  # parked: prepared when its staged rows are retried
            if name not in self.windows:
                self._prepare_or_park(name, stream)
            elif old.get(name) != stream:
                try:
                    self.confirm_table(ensure_stream_table(self.catalog, stream))
                except Exception as exc:
                    if not self._unloadable(name, exc):
                        raise
        for name, problem in self.subject_problems.items():
            if name in self.windows and not self.bulkheads.is_parked(name):
                self.unprepared.add(name)
                self.bulkheads.park_now(name, problem)
        self.registry, self.routes = registry, routes
        self._unpark_resolved()
        self.bulkheads.retry_all_now()  # a change may be the fix a parked table waits for
        self.metrics.registry_version.set(registry.version)
        log.info("registry version %d: %d tables", registry.version, len(self.windows),
                 extra={"registry_version": registry.version})

    def _refuse_untyped(self, entries: list[Entry]) -> None:
        """A run holding records of a subject stream that has no type here (its subject
        deleted after they were accepted, and this collector never saw a version) cannot
        be decoded: it fails naming the stream and the subject, and is retried (never
        skipped) until the subject has a version again."""
        waiting = {s.name: s.schema.subject for s in self.routes.decode_streams
                   if s.schema is not None and s.schema.subject and not s.schema.text}
        for entry in entries if waiting else ():
            for name in entry.streams:
                subject = waiting.get(name)
                if subject is not None:
                    raise SubjectError(name, subject, (
                        f"has no version in the schema registry, but manifest entry "
                        f"{entry.sequence} holds records of the stream: register the "
                        "schema again to decode them"), missing=True)

    def _unpark_resolved(self) -> None:
        """A table parked for its subject that has its type again and nothing staged is
        prepared and unparked now (with staged rows, their import's retry unparks it)."""
        for name in [n for n, p in self.bulkheads.parked.items()
                     if p.reason.startswith(f"{SubjectError.__name__}:")
                     and n not in self.subject_problems]:
            state = self.staging.states.get(name)
            if state is not None and state.files:
                continue
            try:
                self.prepare_parked(name)
            except Exception as exc:
                if is_shared_failure(exc):
                    raise
                continue  # stays parked: its retry tries again
            self.bulkheads.unpark(name)

    async def verify_offsets(self) -> None:
        """Refuse to run if a table has committed sequences the manifest never issued.

        That happens when the manifest was deleted or recreated, or the collector points
        at the wrong store: every new entry would look like a replay of what the table
        already holds and be acknowledged without being committed — silent loss.
        """
        shards = await self._snapshots()
        staged = {t: s.staged_through for t, s in self.staging.states.items()}
        for table, sequences in [*self.table_sequences.items(), *staged.items()]:
            for shard, sequence in sequences.items():
                issued = shards[shard].next_sequence if shard in shards else 0
                if sequence >= issued:
                    raise ManifestMismatchError(
                        f"table {table} has committed sequence {sequence} of manifest shard "
                        f"{shard}, but that shard of {self.consumer.config.key!r} in "
                        f"{self.config.store.url} has only issued sequences below {issued}: "
                        "the manifest was reset or this collector points at the wrong "
                        "store. Refusing to start, because new entries would be skipped as "
                        "already committed.")

    async def queue_heads(self) -> dict[int, tuple[int, int]]:
        """Per shard: its next sequence to issue and the last one acknowledged (what
        ``POST /v1/run`` drains through, :mod:`collector.run_now`)."""
        return {n: (m.next_sequence, m.consumer.acked_through)
                for n, m in (await self._snapshots()).items()}

    async def queue_sample(self, max_entries: int, max_bytes: int) -> list[Entry]:
        """A few entries at the head of the queue, read like :meth:`queue_heads` (plain
        manifest reads, no lease needed): what a warm standby runs its dry job on."""
        sample: list[Entry] = []
        size = 0
        for shard in (await self._snapshots()).values():
            for entry in shard.entries_from(shard.consumer.acked_through + 1):
                if len(sample) >= max_entries or (sample and size + entry.size > max_bytes):
                    return sample
                sample.append(entry)
                size += entry.size
        return sample

    async def _snapshots(self) -> dict[int, Manifest]:
        """Every shard as it is now, one after the other: unlike the consumer's concurrent
        :meth:`~ShardedConsumer.snapshot`, this also runs under a ``block_on`` that steps
        the coroutine on one thread (:func:`collector.hops.drive`)."""
        count = await self.consumer.refresh_count()
        return {n: await self.consumer.shard(n).snapshot() for n in range(count)}

    # -- one run ---------------------------------------------------------------------------

    def _take(self, entries: list[Entry], max_bytes: int | None = None,
              min_entries: int = 1) -> list[Entry]:
        """The run's entries: a prefix of ``entries`` within ``max_run_entries`` and
        ``max_bytes`` (default ``max_run_bytes``), never fewer than ``min_entries`` (the
        first ``min_entries`` are taken whatever their size: one per Spark partition)."""
        cfg = self.config.collector
        limit = cfg.max_run_bytes if max_bytes is None else max_bytes
        taken: list[Entry] = []
        size = 0
        for entry in entries[: cfg.max_run_entries]:
            if len(taken) >= min_entries and size + entry.size > limit:
                break
            taken.append(entry)
            size += entry.size
        return taken

    async def run_once(self) -> RunResult:
        """Consume the next run of entries, if any. Raises :class:`Fenced` when replaced."""
        try:
            return await self._run_once()
        except (FencedError, TableFencedError) as exc:
            self.metrics.fenced.inc()
            raise Fenced(str(exc)) from exc

    async def _run_once(self) -> RunResult:
        started = self.clock.monotonic()
        read = await self.consumer.read(max_entries=self.config.collector.max_run_entries)
        pending = [positioned(item) for item in read]
        self.begin_run(pending)
        entries = self._take(pending)
        self.metrics.health.run_begins(len(entries))
        if not entries:
            return RunResult()
        entries, output = await self.run_job(entries)
        self.after_job(output)
        result = RunResult(len(entries), entries[0].sequence, entries[-1].sequence,
                           through=through_of(read[:len(entries)]))
        await self.offload(self.commit_run, output, result, entries)
        self.hook("after_commits")
        await self.index_run(read[:len(entries)])
        await self.consumer.ack(result.through)
        self.hook("after_ack")
        self._runs_since_dequeue += 1
        if self._runs_since_dequeue >= self.config.collector.dequeue_every:
            await self.dequeue()
        result.seconds = self.clock.monotonic() - started
        self.observe_run(entries, result)
        return result

    def begin_run(self, pending: list[Entry]) -> None:
        """A run starts on ``pending`` (what its manifest read found after the last
        committed entry): queue metrics, and the dedup windows reach back from its oldest
        event (see :meth:`_oldest_waiting_s`)."""
        self._observe_queue(pending)
        self._hold_s = self._oldest_waiting_s(pending[0].ingested_at if pending else None)
        for window in self.windows.values():
            window.hold_s = self._hold_s

    async def run_job(self, entries: list[Entry]
                      ) -> tuple[list[Entry], RunOutput | ClusterRunOutput]:
        """The run's pipeline job: routes caught up with its entries' registry version,
        schemas read, the run cut where routing changes (cluster), the Spark job run.
        Returns the entries the job covers and its output."""
        assert self.epoch is not None
        await self._catch_up_registry(entries)
        writers = await self.read_schemas()
        self._refuse_untyped(entries)
        entries, run = self._route_run(entries)
        return entries, await self.offload(run, self.spec_for(entries, writers))

    def spec_for(self, entries: list[Entry], writers: dict[int, str]) -> RunSpec:
        """The job's spec of ``entries``, by the current routes."""
        spec = run_spec(self.routes.decode_config(self.config), entries,
                        partitions=self.engine.partitions)
        versions = versions_of(entries)
        spec = with_sql_cases(spec, self.routes.sql_cases(versions))
        spec = with_template_cases(spec, self.routes.template_cases(versions))
        spec = with_wheres(spec, self.routes.where_specs(versions))
        spec = with_tables(spec, table_specs(self.routes, versions, self.embedded.dynamic))
        spec = with_key_columns(spec, upsert_columns(self.routes))
        return with_avro_writers(spec, writers)

    def job_needs_io(self, entries: list[Entry]) -> bool:
        """Whether the job of ``entries`` must first read or change this collector's state
        (a newer registry version, the schema registry): such a job is not run ahead
        (:mod:`collector.overlap`), only when its run comes."""
        if max(e.registry_version for e in entries) > self.routes.version:
            return True
        if has_subjects(self.registry) or any(s.format == "avro"
                                              for s in self.routes.decode_streams):
            return True
        try:
            self._refuse_untyped(entries)
        except SubjectError:
            return True
        return False

    def routing_key(self) -> tuple[int, int, int, int | None]:
        """What a job's spec was built from: the routes (replaced on every registry change),
        the dynamic tables met so far, and the epoch. A job run ahead under another key is
        run again."""
        return id(self.routes), self.routes.version, len(self.routes.dynamic), self.epoch

    def after_job(self, output: RunOutput | ClusterRunOutput) -> None:
        """The ``after_job`` crash point (a crash frees the executors' cached run)."""
        try:
            self.hook("after_job")
        except BaseException:
            if isinstance(output, ClusterRunOutput):  # free the executors' cached run
                output.release()
            raise

    async def index_run(self, items: list[ShardEntry]) -> None:
        """With retention on, name the run's batch files in the retention index before the
        ack (:mod:`icefloe.retention`): a dequeued entry is then always indexed.

        Stamped on the store's clock, which GC judges retention on (its listing's time):
        on this host's wall clock, a collector hours behind stamped commits hours early
        and GC deleted their batch files that much before ``keep_batches_s`` was over (the
        simulator's ``retention`` family found it after a takeover between skewed hosts)."""
        if self.config.collector.keep_batches_s <= 0:
            return
        await record_run(self.store, [(item.shard, item.entry) for item in items],
                         self.consumer.store_clock.time())
        self.hook("after_index")

    def commit_run(self, output: RunOutput | ClusterRunOutput, result: RunResult,
                   entries: list[Entry]) -> None:
        """Commit a run's output through its output path (blocking: call in a thread):
        each affected table once (dedup first), then the dead letters; all of them as one
        catalog version."""
        self.commits.begin()
        if isinstance(output, ClusterRunOutput):
            self.cluster.commit(output, result, entries)
        else:
            self.embedded.commit(output, result, entries)

    def commit_due_staged(self) -> dict[str, int]:
        """Import every staged table whose conditions hold (blocking: call in a thread);
        rows committed per table (:meth:`collector.staged_path.StagedPath.commit_due`)."""
        return self.staged.commit_due()

    async def dequeue(self) -> int:
        """Remove acknowledged entries from the manifest (bulk, idempotent)."""
        self.hook("before_dequeue")
        removed = await self.consumer.dequeue()
        self._runs_since_dequeue = 0
        return sum(removed.values())

    def _route_run(self, entries: list[Entry]
                   ) -> tuple[list[Entry], Callable[[RunSpec], RunOutput | ClusterRunOutput]]:
        """The entries of this run and the engine call that runs them.

        On the cluster output path a run ends where its routing changes (a sink disabled,
        enabled, re-created, a table passing to another source), so each table has one
        sink per run; the cluster path writes fan-out, routing by content and staged sinks
        itself. A run it does not write itself (two sources writing one table, a sink that
        evolves its table from the data: :func:`collector.routing.embedded_reason`) takes
        the embedded path on the same session. Both shapes
        commit through the same ``commit_rows``, dedup windows and staging, so switching per
        run keeps exactly-once (see :func:`collector.routing.cut_by_routing`). No registry
        the admin API accepts can wedge the queue.
        """
        embedded = getattr(self.engine, "run_embedded", None)
        if embedded is None:  # an embedded engine routes any run
            return entries, self.engine.run
        taken = cut_by_routing(self.routes, entries)
        if len(taken) < len(entries):
            log.info("cluster run cut at sequence %d: routing changes at registry version "
                     "%d", entries[len(taken)].sequence,
                     entries[len(taken)].registry_version)
        reason = embedded_reason(self.routes, taken)
        if reason is None:
            return taken, self.engine.run
        self.metrics.embedded_runs.labels(reason).inc()
        log.info("run sequences %d..%d takes the embedded path (%s)", taken[0].sequence,
                 taken[-1].sequence, reason, extra={"reason": reason})
        return taken, embedded

    async def _catch_up_registry(self, entries: list[Entry]) -> None:
        """Entries accepted under a registry version this collector has not seen yet: read
        the registry first (a run is never routed by an older version than its entries)."""
        needed = max(e.registry_version for e in entries)
        if needed <= self.routes.version:
            return
        registry = await RegistryStore(self.store, self.config.admin.registry_key,
                                       clock=self.clock).read()
        if registry.version < needed:
            raise RegistryBehindError(
                f"manifest entry {entries[-1].sequence} was accepted under registry version "
                f"{needed}, but the registry {self.config.admin.registry_key!r} is at version "
                f"{registry.version}: the registry was replaced or this collector reads "
                "another store; not routing these events until it is back")
        await self.offload(self.apply_registry, registry)


    def observe_run(self, entries: list[Entry], result: RunResult) -> None:
        self.metrics.run_seconds.observe(result.seconds)
        self.metrics.batch_bytes.inc(sum(e.size for e in entries))
        log.info("run sequences %d..%d entries=%d rows=%s duplicates=%d replayed=%d "
                 "dead_letters=%d %.3fs", result.first_sequence, result.last_sequence,
                 result.entries, result.rows, result.duplicates, result.replayed,
                 result.dead_letters, result.seconds)

    def _observe_queue(self, pending: list[Entry]) -> None:
        """Queue length and lag from the manifest the run just read (no extra GET)."""
        shards = self.consumer.last_read
        if not shards:
            return
        self.metrics.queue_length.set(sum(m.next_sequence - m.consumer.acked_through - 1
                                          for m in shards.values()))
        oldest = pending[0].ingested_at if pending else None
        self.metrics.lag_seconds.set(0 if oldest is None else max(0.0, self.clock.time() - oldest))


def positioned(item: ShardEntry) -> Entry:
    """The entry with its run position as its sequence: the pipeline, routing and dedup of
    a run order and tag rows by it (:data:`pipeline.iceberg.commit.SHARD_BITS`)."""
    if item.shard == 0:
        return item.entry
    return msgspec.structs.replace(item.entry, sequence=position(item.shard, item.sequence))


def through_of(items: list[ShardEntry]) -> dict[int, int]:
    """The last sequence per shard of a run (each shard's entries are a contiguous
    prefix of what it had queued, so acking through it skips nothing)."""
    through: dict[int, int] = {}
    for item in items:
        through[item.shard] = max(through.get(item.shard, -1), item.sequence)
    return through
