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

Thread hops (``offload``/``block_on``) and time (``clock``) are injected (see
:mod:`collector.hops`), so a simulator can run a collector on one thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from ulid import ULID

from collector.dedup import DedupWindow, sources_props, without_source
from collector.hops import BlockOn, Offload, sleep_or_stop
from collector.metrics import CollectorMetrics
from collector.routing import Routes, Target, cut_by_routing, embedded_reason
from collector.staging import COMMIT_CHUNK_BYTES, StagedFile, StagingArea, StagingState, due
from collector.staging import MAX_FILES as MAX_STAGED_FILES
from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config, StreamConfig
from icefloe.errors import (
    FencedError,
    LeaseHeldError,
    ManifestMismatchError,
    RegistryBehindError,
    RoutingUnsupportedError,
    TableFencedError,
)
from icefloe.manifest.consumer import ManifestConsumer
from icefloe.manifest.model import Entry
from icefloe.registry.model import Conditions, Registry
from icefloe.registry.store import RegistryStore
from icefloe.registry.streams import config_registry
from icefloe.store.base import AsyncObjectStore
from pipeline.columns import DEAD_LETTER_TABLE
from pipeline.iceberg.commit import CommitResult, commit_rows, committed_state
from pipeline.iceberg.data_files import AddFiles, FileSet
from pipeline.iceberg.fence import fence_all
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.tables import ensure_dead_letter_table, ensure_stream_table
from pipeline.load.executors import ClusterRunOutput, WritePlan, plan_write
from pipeline.load.run import RunOutput
from pipeline.load.spec import RunSpec, run_spec, with_sql_cases

log = logging.getLogger("icefloe.collector")

T = TypeVar("T")
Hook = Callable[[str], None]
"""Crash-injection point: called with a stage name; tests raise from it."""


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


@dataclass(slots=True)
class RunResult:
    """What one run did; ``entries`` 0 means the queue was empty."""

    entries: int = 0
    first_sequence: int = -1
    last_sequence: int = -1
    rows: dict[str, int] = field(default_factory=dict)
    staged: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    replayed: int = 0
    dead_letters: int = 0
    seconds: float = 0.0


class Collector:
    """Owns the consumer, the catalog tables and the dedup windows of one collector."""

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
        self.hook = hook or (lambda stage: None)
        self.consumer = ManifestConsumer(store, config.manifest.build(),
                                         holder=holder or f"collector-{ULID()}", clock=clock)
        self.metrics.queue_max_entries.set(self.consumer.config.max_entries)
        self.routes = Routes(config_registry(config.streams))
        self._hold_s: float | None = None
        self.windows: dict[str, DedupWindow] = {}
        """Dedup windows by table: ids committed to that table within the window, by
        source."""
        self.epoch: int | None = None
        self.table_sequences: dict[str, int] = {}
        self._runs_since_dequeue = 0
        self.clock = clock
        self.offload = offload
        self.block_on: BlockOn = block_on or self._run_on_loop
        self.staging = StagingArea(store, confirm=self.confirm_epoch)
        self.model_tables: list[str] = []
        """Model targets the collector keeps fresh: fenced on takeover like its own."""
        self._fenced_epoch: int | None = None
        self._confirmed: set[str] = set()
        """``table_uuid`` of tables known to be fenced against any newer collector: fenced
        by us, or created/loaded by us and followed by a manifest-epoch confirmation."""
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- start: lease, epoch, tables, dedup state ----------------------------------------

    async def acquire(self, *, takeover: bool = False,
                      stop: asyncio.Event | None = None) -> int:
        """Become the active collector: wait as a hot standby while another holds a live
        lease (unless ``takeover``), then bump the epoch. Returns our epoch."""
        self._loop = asyncio.get_running_loop()
        lease_s = self.consumer.config.lease_s
        waiting_logged = False
        while True:
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
            if not waiting_logged:
                log.info("standby: %s holds the lease for %.1f s more; waiting", holder,
                         expires - now)
                waiting_logged = True
            self.metrics.active.set(0)
            self.metrics.health.set_role("standby")
            wait = min(max(expires - now, 0.05), lease_s / 3)
            await sleep_or_stop(self.clock, wait, stop)
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

    def prepare_tables(self) -> None:
        """Fence every icefloe table (once per epoch), then create or evolve every sink's
        table and the dead-letter table; rebuild dedup (blocking: call in a thread)."""
        self.fence_tables()
        manifest = self._await(self.consumer.snapshot())
        waiting = manifest.entries_from(manifest.consumer.acked_through + 1)
        self._hold_s = self._oldest_waiting_s(waiting[0].ingested_at if waiting else None)
        for name, stream in self.routes.tables().items():
            self._prepare_table(name, stream)
        dead = ensure_dead_letter_table(self.catalog)
        self.confirm_table(dead)
        self.table_sequences[DEAD_LETTER_TABLE] = committed_state(dead).sequence

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
                           known=self.model_tables)
        self.block_on(self.staging.claim_existing(self.epoch))
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
        self.table_sequences[name] = state.sequence
        self.metrics.committed_sequence.labels(name).set(state.sequence)
        log.info("table %s: committed through sequence %d (epoch %d)", name, state.sequence,
                 state.epoch)
        cfg = self.config.collector
        window = DedupWindow(cfg.dedup_window_s, cfg.dedup_max_ids, name=name,
                             clock=self.consumer.store_clock,
                             on_effective=self._window_observer(name))
        window.hold_s = self._hold_s
        window.rebuild(table)
        if len(window):
            log.info("dedup window of %s rebuilt with %d ids", name, len(window))
        assert self.epoch is not None
        staged = self._await(self.staging.claim(name, self.epoch,
                                                create=self._has_conditions(name)))
        self.windows[name] = window  # last: a half-prepared table is prepared again
        self._observe_staged(name, staged)
        if staged.files:
            log.info("table %s: %d rows staged through sequence %d", name, staged.rows,
                     staged.last_sequence)

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
        return self.block_on(coro)  # type: ignore[no-any-return]

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

    def apply_registry(self, registry: Registry) -> None:
        """Route by ``registry`` from now on; tables of new sinks are made ready first, and
        a sink whose columns changed has its table evolved (blocking: call in a thread)."""
        routes = Routes(registry)
        old = self.routes.tables()
        for name, stream in routes.tables().items():
            if name not in self.windows:
                self._prepare_table(name, stream)
            elif old.get(name) != stream:
                self.confirm_table(ensure_stream_table(self.catalog, stream))
        self.routes = routes
        self.metrics.registry_version.set(registry.version)
        log.info("registry version %d: %d tables", registry.version, len(self.windows),
                 extra={"registry_version": registry.version})

    async def verify_offsets(self) -> None:
        """Refuse to run if a table has committed sequences the manifest never issued.

        That happens when the manifest was deleted or recreated, or the collector points
        at the wrong store: every new entry would look like a replay of what the table
        already holds and be acknowledged without being committed — silent loss.
        """
        manifest = await self.consumer.snapshot()
        staged = {t: s.through_sequence for t, s in self.staging.states.items()}
        for table, sequence in [*self.table_sequences.items(), *staged.items()]:
            if sequence >= manifest.next_sequence:
                raise ManifestMismatchError(
                    f"table {table} has committed manifest sequence {sequence}, but the "
                    f"manifest {self.consumer.config.key!r} in {self.config.store.url} has "
                    f"only issued sequences below {manifest.next_sequence}: the manifest "
                    "was reset or this collector points at the wrong store. Refusing to "
                    "start, because new entries would be skipped as already committed.")

    # -- one run ---------------------------------------------------------------------------

    def _take(self, entries: list[Entry]) -> list[Entry]:
        cfg = self.config.collector
        taken: list[Entry] = []
        size = 0
        for entry in entries[: cfg.max_run_entries]:
            if taken and size + entry.size > cfg.max_run_bytes:
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
        pending = await self.consumer.read(max_entries=self.config.collector.max_run_entries)
        self._observe_queue(pending)
        self._hold_s = self._oldest_waiting_s(pending[0].ingested_at if pending else None)
        for window in self.windows.values():
            window.hold_s = self._hold_s
        entries = self._take(pending)
        if not entries:
            return RunResult()
        assert self.epoch is not None
        await self._catch_up_registry(entries)
        entries, run = self._route_run(entries)
        spec = run_spec(self.routes.decode_config(self.config), entries,
                        partitions=self.engine.partitions)
        spec = with_sql_cases(spec, self.routes.sql_cases(self._versions(entries)))
        output = await self.offload(run, spec)
        try:
            self.hook("after_job")
        except BaseException:
            if isinstance(output, ClusterRunOutput):  # free the executors' cached run
                output.release()
            raise
        result = RunResult(len(entries), entries[0].sequence, entries[-1].sequence)
        await self.offload(self._commit_all, output, result, entries)
        self.hook("after_commits")
        last = entries[-1].sequence
        await self.consumer.ack(last)
        self.hook("after_ack")
        self._runs_since_dequeue += 1
        if self._runs_since_dequeue >= self.config.collector.dequeue_every:
            await self.dequeue()
        result.seconds = self.clock.monotonic() - started
        self._observe(entries, result)
        return result

    def _route_run(self, entries: list[Entry]
                   ) -> tuple[list[Entry], Callable[[RunSpec], RunOutput | ClusterRunOutput]]:
        """The entries of this run and the engine call that runs them.

        On the cluster output path a run ends where its routing changes (a sink disabled,
        enabled, re-created, a table passing to another source), so each source has one
        target; a run that still cannot be written in one shot there (fan-out, staging)
        takes the embedded path on the same session. Both shapes commit through the same
        ``commit_rows``, dedup windows and staging, so switching per run keeps exactly-once
        (see :func:`collector.routing.cut_by_routing`). No registry the admin API accepts
        can wedge the queue.
        """
        embedded = getattr(self.engine, "run_embedded", None)
        if embedded is None:  # an embedded engine routes any run
            return entries, self.engine.run
        taken = cut_by_routing(self.routes, entries)
        if len(taken) < len(entries):
            log.info("cluster run cut at sequence %d: routing changes at registry version "
                     "%d", entries[len(taken)].sequence,
                     entries[len(taken)].registry_version)
        reason = embedded_reason(self.routes, taken, self._is_staged)
        if reason is None:
            return taken, self.engine.run
        self.metrics.embedded_runs.labels(reason).inc()
        log.info("run sequences %d..%d takes the embedded path (%s): the cluster output "
                 "path writes one table per source without staging", taken[0].sequence,
                 taken[-1].sequence, reason, extra={"reason": reason})
        return taken, embedded

    # -- sinks with import conditions: staged, committed when a condition holds ----------

    def _is_staged(self, target: Target) -> bool:
        """Sinks with their own import conditions go through staging (and so does one with
        rows still staged, so that nothing overtakes them); default sinks commit per run."""
        state = self.staging.states.get(target.table)
        return target.sink.conditions != Conditions() or bool(state and state.files)

    def _stage(self, target: Target, rows: pa.Table, result: RunResult) -> None:
        assert self.epoch is not None
        table = target.table
        staged = self._await(self.staging.stage(
            table, rows, committed=self.table_sequences.get(table, -1), epoch=self.epoch,
            run_last=result.last_sequence))
        result.staged[table] = staged.rows
        result.replayed += staged.skipped
        self._observe_staged(table, staged.state)
        self.hook(f"after_stage:{table}")
        committed = self._commit_staged_if_due(table, target.sink.conditions if
                                               target.sink.live and target.source.live
                                               else None)
        if committed is not None:
            result.rows[table] = committed  # models reading this table see the commit
        elif len(staged.state.files) > MAX_STAGED_FILES:
            self._observe_staged(table, self._await(self.staging.compact(table, self.epoch)))

    def commit_due_staged(self) -> dict[str, int]:
        """Commit every staged table whose conditions hold (blocking: call in a thread);
        returns rows committed per table."""
        conditions: dict[str, Conditions | None] = {}
        for targets in self.routes.targets.values():
            for target in targets:
                live = target.sink.live and target.source.live
                if live or target.table not in conditions:
                    conditions[target.table] = target.sink.conditions if live else None
        done: dict[str, int] = {}
        for table, state in list(self.staging.states.items()):
            if state.files:
                rows = self._commit_staged_if_due(table, conditions.get(table))
                if rows is not None:
                    done[table] = rows
        return done

    def _commit_staged_if_due(self, table: str, conditions: Conditions | None) -> int | None:
        """``conditions`` None: the sink is gone or back to defaults — commit at once."""
        state = self.staging.states.get(table)
        if state is None or not state.files:
            return None
        reason = "drain" if conditions is None or conditions == Conditions() else \
            due(state, conditions, int(self.clock.time() * 1000))
        if reason is None:
            return None
        assert self.epoch is not None
        state = self._await(self.staging.load(table))  # as stored, not as cached
        committed = 0
        while state.files:  # in chunks of staged bytes, oldest first: each a prefix
            chunk = chunk_of(state.files, COMMIT_CHUNK_BYTES)
            rows = self._await(self.staging.read(state, chunk))
            assert rows is not None
            through = chunk[-1].last_sequence
            window = self.windows[table]
            fresh, dropped = window.filter_in_sequence_order(rows)
            if dropped:
                self.metrics.duplicates.labels(table).inc(dropped)
            outcome = self._commit(table, without_source(fresh), through,
                                   props=sources_props(fresh))
            window.remember(fresh)
            committed += outcome.rows
            self.hook(f"after_staged_commit:{table}")
            state = self._await(self.staging.drop(table, through, self.epoch))
            self._observe_staged(table, state)
            log.info("staged commit %s (%s): rows=%d sequence=%d", table, reason,
                     outcome.rows, through, extra={"table": table, "reason": reason,
                                                   "rows": outcome.rows})
        self.metrics.staged_commits.labels(table, reason).inc()
        return committed

    def _observe_staged(self, table: str, state: StagingState) -> None:
        self.metrics.staged_rows.labels(table).set(state.rows)
        self.metrics.staged_bytes.labels(table).set(state.bytes)
        oldest = state.oldest_ms
        self.metrics.staged_oldest.labels(table).set(0 if oldest is None else oldest / 1000)

    async def _catch_up_registry(self, entries: list[Entry]) -> None:
        """Entries accepted under a registry version this collector has not seen yet: read
        the registry first (a run is never routed by an older version than its entries)."""
        needed = max(e.registry_version for e in entries)
        if needed <= self.routes.version:
            return
        registry = await RegistryStore(self.store, self.config.admin.registry_key).read()
        if registry.version < needed:
            raise RegistryBehindError(
                f"manifest entry {entries[-1].sequence} was accepted under registry version "
                f"{needed}, but the registry {self.config.admin.registry_key!r} is at version "
                f"{registry.version}: the registry was replaced or this collector reads "
                "another store; not routing these events until it is back")
        await self.offload(self.apply_registry, registry)

    @staticmethod
    def _versions(entries: list[Entry]) -> dict[str, dict[int, int]]:
        """Per source: each entry holding its events → the registry version it came with."""
        out: dict[str, dict[int, int]] = {}
        for entry in entries:
            for stream in entry.streams:
                out.setdefault(stream, {})[entry.sequence] = entry.registry_version
        return out

    def _commit_all(self, output: RunOutput | ClusterRunOutput, result: RunResult,
                    entries: list[Entry]) -> None:
        """Commit each affected table once (dedup first), then the dead letters."""
        versions = self._versions(entries)
        if isinstance(output, RunOutput):
            for (stream, column), count in output.sql_errors.items():
                self.metrics.sql_errors.labels(stream, column).inc(count)
        if isinstance(output, ClusterRunOutput):
            self._commit_cluster(output, result, versions)
            return
        sequence = result.last_sequence
        assert self.epoch is not None
        for table, (target, rows) in self.routes.per_table(output.tables, versions).items():
            if self._is_staged(target):
                self._stage(target, rows, result)
                continue
            window = self.windows[table]
            fresh, dropped = window.filter_in_sequence_order(rows)
            result.duplicates += dropped
            if dropped:
                self.metrics.duplicates.labels(target.source.id).inc(dropped)
            append = WriteThenAdd(target.source.id)
            try:
                outcome = self._commit(table, without_source(fresh), sequence, append=append,
                                       props=sources_props(fresh))
            finally:
                append.cleanup(self.catalog, table, sequence=sequence, epoch=self.epoch)
            window.remember(fresh)
            result.rows[table] = outcome.rows
            result.replayed += outcome.replayed
            self.hook(f"after_commit:{table}")
        self._commit_dead(output.dead, sequence, result)

    def _commit_dead(self, dead: pa.Table, sequence: int, result: RunResult) -> None:
        if dead.num_rows:
            outcome = self._commit(DEAD_LETTER_TABLE, dead, sequence)
            result.dead_letters = outcome.rows
            for reason in dead.column("reason").to_pylist()[: outcome.rows]:
                self.metrics.dead_letters.labels(reason.split(":", 1)[0]).inc()
            self.hook(f"after_commit:{DEAD_LETTER_TABLE}")

    def _commit_cluster(self, output: ClusterRunOutput, result: RunResult,
                        versions: dict[str, dict[int, int]]) -> None:
        """The cluster output path: dedup on the keys, executors write, add_files per table.

        Same order and crash points as the embedded path, plus ``after_write`` (files
        written, nothing committed). Files of a table whose commit is refused or never
        attempted (an earlier table failed) are deleted here; a crash leaves them to the
        maintenance orphan sweep. Dead letters are few and go the embedded way.
        """
        sequence = result.last_sequence
        assert self.epoch is not None
        targets: dict[str, str] = {}
        for name in output.keys:
            if not self.routes.takers(name, versions.get(name, {})):
                continue  # every sink was off for these events: they go nowhere
            target = self.routes.single_target(name, versions.get(name, {}))
            if target is not None and self._is_staged(target):
                output.release()
                raise RoutingUnsupportedError(
                    f"sink {target.sink.name!r} of source {name!r} has import conditions: "
                    "the cluster output path does not stage rows; set [collector] output = "
                    "\"embedded\" for sinks with import conditions")
            if target is None:
                output.release()
                raise RoutingUnsupportedError(
                    f"source {name!r} has several sinks, or a sink that misses part of this "
                    "run (disabled or created meanwhile): the cluster output path writes "
                    "each source to one table; set [collector] output = \"embedded\" to "
                    "route by the registry")
            targets[name] = target.table
        if len(set(targets.values())) < len(targets):
            output.release()
            raise RoutingUnsupportedError(
                "two sources write the same table in this run (a sink moved between "
                "sources): the cluster output path commits each source alone; set "
                "[collector] output = \"embedded\" to route by the registry")
        pending: dict[str, FileSet] = {}
        try:
            fresh_keys: dict[str, pa.Table] = {}
            plans: list[WritePlan] = []
            for name, keys in output.keys.items():
                if name not in targets:
                    continue
                fresh, dropped = self.windows[targets[name]].filter(keys, name)
                result.duplicates += dropped
                if dropped:
                    self.metrics.duplicates.labels(name).inc(dropped)
                fresh_keys[name] = fresh
                plan = plan_write(self.catalog, targets[name], name, keys, fresh,
                                  sequence=sequence, epoch=self.epoch)
                if plan is not None:
                    plans.append(plan)
            pending = output.write(plans)
            self.hook("after_write")
            for name, fresh in fresh_keys.items():
                table = targets[name]
                add = AddFiles(pending.pop(name, FileSet()))
                try:
                    outcome = self._commit(table, fresh, sequence, append=add,
                                           nbytes=add.files.size,
                                           props=sources_props(fresh, name))
                finally:
                    add.cleanup(self.catalog, table, sequence=sequence, epoch=self.epoch)
                self.windows[table].remember(fresh, name)
                result.rows[table] = outcome.rows
                result.replayed += outcome.replayed
                self.hook(f"after_commit:{table}")
        finally:
            for name, files in pending.items():  # never offered to add_files: not in a table
                AddFiles(files).cleanup(self.catalog, targets[name],
                                        sequence=sequence, epoch=self.epoch)
            output.release()
        self._commit_dead(output.dead, sequence, result)

    def _commit(self, table: str, rows: pa.Table, sequence: int, *,
                append: AddFiles | WriteThenAdd | None = None, nbytes: int | None = None,
                props: dict[str, str] | None = None) -> CommitResult:
        assert self.epoch is not None
        outcome = commit_rows(self.catalog, table, rows, sequence=sequence, epoch=self.epoch,
                              append=append, props=props, clock=self.consumer.store_clock)
        if outcome.attempts > 1:
            self.metrics.commit_failed.labels(table).inc(outcome.attempts - 1)
        self.metrics.commit_seconds.labels(table).observe(outcome.seconds)
        self.metrics.rows.labels(table).inc(outcome.rows)
        size = rows.nbytes if nbytes is None else nbytes
        self.metrics.bytes.labels(table).inc(size if outcome.rows else 0)
        self.metrics.replayed.labels(table).inc(outcome.replayed)
        self.metrics.committed_sequence.labels(table).set(outcome.sequence)
        self.table_sequences[table] = max(self.table_sequences.get(table, -1),
                                          outcome.sequence)
        self.metrics.last_commit.set(self.clock.time())
        log.info("commit %s rows=%d replayed=%d sequence=%d epoch=%d %.3fs attempts=%d",
                 table, outcome.rows, outcome.replayed, outcome.sequence, self.epoch,
                 outcome.seconds, outcome.attempts,
                 extra={"table": table, "rows": outcome.rows, "sequence": outcome.sequence,
                        "epoch": self.epoch, "seconds": round(outcome.seconds, 4)})
        return outcome

    async def dequeue(self) -> int:
        """Remove acknowledged entries from the manifest (bulk, idempotent)."""
        self.hook("before_dequeue")
        removed = await self.consumer.dequeue()
        self._runs_since_dequeue = 0
        return removed

    def _observe(self, entries: list[Entry], result: RunResult) -> None:
        self.metrics.run_seconds.observe(result.seconds)
        self.metrics.batch_bytes.inc(sum(e.size for e in entries))
        log.info("run sequences %d..%d entries=%d rows=%s duplicates=%d replayed=%d "
                 "dead_letters=%d %.3fs", result.first_sequence, result.last_sequence,
                 result.entries, result.rows, result.duplicates, result.replayed,
                 result.dead_letters, result.seconds)

    def _observe_queue(self, pending: list[Entry]) -> None:
        """Queue length and lag from the manifest the run just read (no extra GET)."""
        manifest = self.consumer.last_read
        if manifest is None:
            return
        self.metrics.queue_length.set(
            manifest.next_sequence - manifest.consumer.acked_through - 1)
        oldest = pending[0].ingested_at if pending else None
        self.metrics.lag_seconds.set(0 if oldest is None else max(0.0, self.clock.time() - oldest))


def chunk_of(files: tuple[StagedFile, ...], limit: int) -> tuple[StagedFile, ...]:
    """The longest prefix of ``files`` within ``limit`` bytes (at least one file)."""
    size, count = 0, 0
    for staged in files:
        if count and size + staged.bytes > limit:
            break
        size += staged.bytes
        count += 1
    return files[:count]

