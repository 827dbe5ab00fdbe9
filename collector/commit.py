"""How a run's rows become Iceberg commits, on each output path.

The run loop (:mod:`collector.service`) reads entries, runs the pipeline and acks; this
module takes the run's output from there to the tables:

* **embedded** (:class:`~pipeline.load.run.RunOutput`: the rows are here): per table,
  drop the ids the dedup window has seen, write the files and commit them with the run's
  sequence (``WriteThenAdd``);
* **cluster** (:class:`~pipeline.load.executors.ClusterRunOutput`: the rows stay on the
  executors): dedup on the event keys alone, per target table (a source with several sinks
  has several); one job has the executors write every table's fresh rows and every staged
  sink's files (if that job fails, a job per table: one table's failure is its own),
  then each table gets one ``add_files`` commit or its staged files are recorded; a run
  this path does not write itself (two sources writing one table, a sink that evolves
  its table from the data) was handed to the embedded path before it ran
  (:meth:`collector.service.Collector._route_run`);
* **staged** (sinks with import conditions): rows go to the staging area (written by the
  driver on the embedded path, by the executors on the cluster path) and are committed,
  in chunks, oldest first, when a condition holds (:meth:`RunCommits.commit_due_staged`);
* **upserts** (sinks with a ``primary_key``, both paths): rows missing a key value
  become dead letters, the rest commit by copy-on-write (:mod:`pipeline.iceberg.upsert`),
  staged or not. On the cluster path the driver gets only the key (and tombstone)
  columns with the keys, picks each key's latest row by the embedded rule and finds the
  files holding the keys; the executors write the surviving rows and rewrite those files
  in the run's write job, and one overwrite replaces them
  (:func:`~pipeline.load.executors.plan_upsert`,
  :class:`~pipeline.iceberg.data_files.ReplaceFiles`). A staged upsert sink is imported
  as on the embedded path (the import reads its staged rows);
* **dead letters**: always the embedded way, after the tables.

Every path commits through :func:`pipeline.iceberg.commit.commit_rows`, which carries
``icefloe.sequence``/``icefloe.epoch`` and skips what a table already holds, and calls
``hook`` at the same crash points (``after_write``, ``after_commit:<table>``,
``after_stage:<table>``, ``after_staged_commit:<table>``), so tests and the simulator can
crash a collector between any two steps.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog

from collector.bulkhead import (
    Bulkheads,
    ImportRefusedError,
    ParkFullError,
    TableFailures,
    is_shared_failure,
)
from collector.dedup import (
    ANY_SOURCE,
    SOURCE_COLUMN,
    DedupWindow,
    sources_props,
    without_source,
)
from collector.evolve import evolve_rows
from collector.hops import BlockOn
from collector.journal import DedupJournal, id_rows
from collector.metrics import CollectorMetrics
from collector.routing import Routes, Target
from collector.staging import COMMIT_CHUNK_BYTES, Staged, StagingArea, due
from collector.staging import MAX_FILES as MAX_STAGED_FILES
from collector.where import WHERE_ERROR, unrouted_dead_letters, where_error_dead_letters
from icefloe.catalog_version import claim_version
from icefloe.clock import Clock
from icefloe.errors import RoutingUnsupportedError
from icefloe.manifest.model import Entry
from icefloe.manifest.sharded_consumer import ShardedConsumer
from icefloe.registry.model import Conditions
from icefloe.staging import StagedFile, StagingState, merge_through
from icefloe.store.base import AsyncObjectStore
from icefloe.streams.evolution import CLIENT_FIELD, EXTRA_FIELD, OVERFLOW, EvolveLimits
from pipeline.columns import DEAD_LETTER_TABLE
from pipeline.iceberg.commit import CommitResult, commit_rows, not_committed
from pipeline.iceberg.data_files import AddFiles, FileSet, ReplaceFiles
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.upsert import (
    CopyOnWrite,
    missing_key_dead_letters,
    split_missing_keys,
    upsert_hook,
)
from pipeline.load.executors import (
    KEY_COLUMNS,
    ROW,
    ClusterRunOutput,
    UpsertPlan,
    WritePlan,
    Written,
    plan_upsert,
    plan_write,
)
from pipeline.load.run import RunOutput

__all__ = ["MAX_STAGED_FILES", "RunCommits", "RunResult", "chunk_of", "upsert_columns",
           "versions_of"]

log = logging.getLogger("icefloe.collector")

JOURNAL_SWEEP_EVERY = 256
"""Records a table's journal gets between two sweeps of its old ones."""

Hook = Callable[[str], None]
"""Crash-injection point: called with a stage name; tests raise from it."""

ClusterTarget = tuple[Target, pa.Table, tuple[int, ...] | None, str | None]
"""One table of a cluster-path run: target, keys it takes, entries, ``where`` column."""


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
    through: dict[int, int] = field(default_factory=dict)
    """The run's last sequence per manifest shard: what its commits record and its ack
    acknowledges. ``first_sequence``/``last_sequence`` are run positions (logs only)."""

    @property
    def sequences(self) -> dict[int, int]:
        """:attr:`through`, or shard 0's ``last_sequence`` for a run built without it."""
        return self.through or {0: self.last_sequence}


class RunCommits:
    """The commit half of :class:`collector.service.Collector`, which inherits it.

    It reads the collector's state rather than holding its own, because that state changes
    under it: ``epoch`` is set by ``acquire``, ``routes`` is replaced when the registry
    changes, and tests swap ``hook``. What it relies on is declared below. Blocking: every
    method runs in a worker thread (or inline under the simulator), never on the loop.
    """

    catalog: Catalog
    store: AsyncObjectStore
    consumer: ShardedConsumer
    metrics: CollectorMetrics
    clock: Clock
    hook: Hook
    block_on: BlockOn
    routes: Routes
    staging: StagingArea
    windows: dict[str, DedupWindow]
    journal: DedupJournal
    journal_uuids: dict[str, str]
    journal_writes: dict[str, int]
    table_sequences: dict[str, dict[int, int]]
    epoch: int | None
    evolve_limits: EvolveLimits
    bulkheads: Bulkheads
    prepare_parked: Callable[[str], bool]
    run_version: int | None
    """The catalog version of the run (or staged import) committing now, once claimed."""

    def claim_run_version(self) -> int:
        """The run's catalog version (:mod:`icefloe.catalog_version`), claimed at its first
        commit: every snapshot the run commits, to any table or from any shard, records
        the same one, and a run that commits nothing claims none."""
        if self.run_version is None:
            assert self.epoch is not None
            self.run_version = self.block_on(claim_version(
                self.store, epoch=self.epoch, clock=self.consumer.store_clock))
        return self.run_version

    def commit_run(self, output: RunOutput | ClusterRunOutput, result: RunResult,
                   entries: list[Entry]) -> None:
        """Commit each affected table once (dedup first), then the dead letters; all of
        them as one catalog version."""
        self.run_version = None
        versions = versions_of(entries)
        if isinstance(output, RunOutput):
            for (stream, column), count in output.sql_errors.items():
                self.metrics.sql_errors.labels(stream, column).inc(count)
        if isinstance(output, ClusterRunOutput):
            self._commit_cluster(output, result, versions, entries)
            return
        sequence = result.last_sequence
        assert self.epoch is not None
        routed, unrouted, failed = self.routes.route_run(output.tables, versions)
        dead = [self._unrouted(unrouted, versions, entries, output.dead)]
        locations = {entry.sequence: entry.location for entry in entries}
        dead += self._where_errors(failed, locations)
        failures = TableFailures()
        for table, (target, rows) in routed.items():
            with failures.of(table), self._guard(table):
                self._commit_routed(target, rows, result, locations, dead)
        self._commit_dead(pa.concat_tables(dead) if len(dead) > 1 else dead[0],
                          sequence, result)
        failures.raise_first()

    def _commit_routed(self, target: Target, rows: pa.Table, result: RunResult,
                       locations: dict[int, str], dead: list[pa.Table]) -> None:
        """One table's rows of an embedded-path run: evolve its schema, split off rows
        without a key, then stage them or deduplicate and commit them."""
        table, sequence, sequences = target.table, result.last_sequence, result.sequences
        if self.bulkheads.is_parked(table):
            self._check_park_room(table)
            # staged as they came: an evolving sink's undeclared fields too; the import
            # evolves the table first (the table may not even load now)
            self._stage(target, self._keyed_rows(target, rows, locations, dead), result)
            return
        if EXTRA_FIELD in rows.column_names:  # an evolving sink's rows: columns first
            # (by the rows, not the owner: a table's rows may come from an evolving
            # sink's version while its newest sink does not evolve)
            rows, refused = evolve_rows(self.catalog, table, target.stream, rows,
                                        locations, self.evolve_limits, hook=self.hook,
                                        clock=self.clock)
            if refused is not None:
                dead.append(refused)
        rows = self._keyed_rows(target, rows, locations, dead)
        if self.is_staged(target):
            self._stage(target, rows, result)
            return
        window = self.windows[table]
        fresh, dropped = window.filter_in_sequence_order(rows)
        result.duplicates += dropped
        if dropped:
            self.metrics.duplicates.labels(target.source.id).inc(dropped)
        append = upsert_hook(target.stream) or WriteThenAdd(target.source.id)
        self.record_ids(table, fresh, sequences)
        try:
            outcome = self._commit(table, without_source(fresh), sequence, append=append,
                                   props=sources_props(fresh), sequences=sequences)
        finally:
            append.cleanup(self.catalog, table, sequence=sequence, epoch=self.epoch)
        window.remember(fresh)
        result.rows[table] = outcome.rows
        result.replayed += outcome.replayed
        self.hook(f"after_commit:{table}")

    @contextlib.contextmanager
    def _guard(self, table: str) -> Iterator[None]:
        """One table's own step: a failure counts against it (and may park it)."""
        with self.bulkheads.guard(table):
            yield
        self.bulkheads.succeeded(table)

    def _check_park_room(self, table: str) -> None:
        """Refuse to stage more for a parked table whose area holds ``park_max_bytes``."""
        state = self.staging.states.get(table)
        if (self.bulkheads.is_parked(table) and state is not None
                and state.bytes >= self.bulkheads.max_bytes):
            raise ParkFullError(
                f"table {table} is parked ({self.bulkheads.parked[table].reason}) and its "
                f"staged rows reached collector.park_max_bytes ({self.bulkheads.max_bytes}):"
                " its entries wait in the queue now")

    @staticmethod
    def _keyed_rows(target: Target, rows: pa.Table, locations: dict[int, str],
                    dead: list[pa.Table]) -> pa.Table:
        """``rows`` without those missing a primary-key value, which join ``dead``
        (before dedup and staging: the window and the staged files hold only rows the
        table can take)."""
        key = target.sink.primary_key
        if not key:
            return rows
        rows, bad = split_missing_keys(rows, key)
        if bad.num_rows:
            dead.append(missing_key_dead_letters(bad, key, target.source.id, locations))
        return rows

    def _unrouted(self, unrouted: dict[str, pa.Table], versions: dict[str, dict[int, int]],
                  entries: list[Entry], dead: pa.Table, *, counted: bool = False
                  ) -> pa.Table:
        """Count each source's unrouted events (unless ``counted`` already) and add those
        its ``unrouted`` (at their entry's version) sends to the dead letters to
        ``dead``."""
        locations = {e.sequence: e.location for e in entries}
        parts = [dead]
        for source, rows in unrouted.items():
            if not counted:
                self.metrics.unrouted.labels(source).inc(rows.num_rows)
            seen = versions.get(source, {})
            keep = [s for s, v in seen.items()
                    if self.routes.unrouted_mode(source, v) == "dead_letter"]
            if keep:
                chosen = rows.filter(pc.is_in(rows.column("_sequence"),
                                              pa.array(keep, pa.int64())))
                parts.append(unrouted_dead_letters(source, chosen, locations))
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def _where_errors(self, failed: dict[str, pa.Table], locations: dict[int, str]
                      ) -> list[pa.Table]:
        """Count and dead-letter each source's events a ``where`` raised an error on
        (reason ``where_error``): a mapping error of the event, whatever the source's
        ``unrouted`` says, never a routing decision."""
        out = []
        for source, rows in failed.items():
            self.metrics.where_errors.labels(source).inc(rows.num_rows)
            out.append(where_error_dead_letters(source, rows, locations))
        return out

    def _commit_dead(self, dead: pa.Table, sequence: int, result: RunResult) -> None:
        if dead.num_rows:
            outcome = self._commit(DEAD_LETTER_TABLE, dead, sequence,
                                   sequences=result.sequences)
            result.dead_letters = outcome.rows
            for reason in dead.column("reason").to_pylist()[: outcome.rows]:
                self.metrics.dead_letters.labels(reason.split(":", 1)[0]).inc()
            self.hook(f"after_commit:{DEAD_LETTER_TABLE}")

    def _commit_cluster(self, output: ClusterRunOutput, result: RunResult,
                        versions: dict[str, dict[int, int]], entries: list[Entry]) -> None:
        """The cluster output path: dedup on the keys, executors write, add_files per table.

        Per target table (a source with several sinks has several; a sink that missed part
        of the run gets only the entries it takes) the keys are deduplicated by that
        table's window and replay-filtered by its committed sequence; a staged sink's rows
        above its staging floor are planned instead. One Spark job writes every table's
        files and every staged file; then, in routing order, each table is committed with
        ``add_files`` (``after_commit:<table>``) or its staged files are recorded in its
        staging state (``after_stage:<table>``, then the import if a condition holds) —
        the embedded path's order and crash points, plus ``after_write`` (files written,
        nothing committed). If the shared write job fails, each plan is written by a job
        of its own (:meth:`_write_cluster`): a table whose write fails is one failed
        attempt of that table (it parks after ``park_after_failures``), and the others are
        committed. Files of a table whose commit is refused or never attempted are deleted
        here; a crash leaves them to the maintenance orphan sweep (staged ones to
        :meth:`~collector.staging.StagingArea.sweep`). Dead
        letters are few and go the embedded way; so do unrouted events (no sink's
        ``where`` took them: the executors marked each sink's rows), counted as there and,
        where their source says ``dead_letter``, fetched from the executors to become the
        same dead letters.

        A sink that evolves its table from the data never comes here: its runs take the
        embedded path (:func:`collector.routing.embedded_reason`), where the quotas, the
        ``_overflow`` column and a parked table's raw staging live.

        A table's planning counts a failure against it but does not clear its earlier ones
        (only its commit or staging does), so a table whose write keeps failing parks.
        """
        sequence, sequences = result.last_sequence, result.sequences
        assert self.epoch is not None
        routed, unrouted = self._cluster_targets(output, versions)
        pending: dict[str, FileSet] = {}
        staged_files: dict[str, tuple[StagedFile, ...]] = {}
        locations = {entry.sequence: entry.location for entry in entries}
        dead: list[pa.Table] = []
        try:
            dead.append(self._cluster_unrouted(output, unrouted, versions, entries))
            dead += self._cluster_where_errors(output, locations)
            fresh_keys: dict[str, pa.Table] = {}
            skipped: dict[str, int] = {}
            upserts: dict[str, UpsertPlan | None] = {}
            plans: list[WritePlan] = []
            failures = TableFailures()
            for table, (target, keys, allowed, where) in routed.items():
                with failures.of(table), self.bulkheads.guard(table):
                    self._check_park_room(table)
                    source = target.source.id
                    columns = tuple((c.name, c.type) for c in target.sink.columns)
                    good = keys  # without the rows missing a primary-key value
                    if target.sink.primary_key:  # those are dead letters
                        good, _ = self._cluster_keyed(output, target, keys, columns,
                                                      locations, dead)
                    if self.is_staged(target):
                        plan = self._plan_stage(target, good, columns, allowed, where,
                                                drop=_left_out(keys, good))
                        skipped[table] = good.num_rows - plan.expected
                        plans.append(plan)
                        continue
                    fresh, dropped = self.windows[table].filter(good, source)
                    result.duplicates += dropped
                    if dropped:
                        self.metrics.duplicates.labels(source).inc(dropped)
                    fresh_keys[table] = fresh
                    if target.sink.primary_key:
                        upsert = plan_upsert(
                            self.catalog, table, source, keys, fresh,
                            key=target.sink.primary_key, tombstone=target.sink.tombstone_field,
                            sequences=sequences, epoch=self.epoch, target=table,
                            columns=columns, entries=allowed, where=where)
                        upserts[table] = upsert
                        planned = upsert.write if upsert is not None else None
                    else:
                        planned = plan_write(self.catalog, table, source, keys, fresh,
                                             sequences=sequences, epoch=self.epoch, key=table,
                                             columns=columns, entries=allowed, where=where)
                    if planned is not None:
                        plans.append(planned)
            self._write_cluster(output, plans, failures, pending, staged_files)
            self.hook("after_write")
            for table, (target, *_) in routed.items():
                if table in failures.tables:
                    continue
                if table in skipped:
                    files = staged_files.pop(table, ())
                    self._record_staged(target, files, result, skipped[table])
                    continue
                source, fresh = target.source.id, fresh_keys[table]
                files, upsert = pending.pop(table, FileSet()), upserts.get(table)
                add = AddFiles(files) if upsert is None else ReplaceFiles(
                    files, upsert.replaced, upsert.snapshot_id, upsert.rows)
                with failures.of(table), self._guard(table):
                    self.record_ids(table, fresh, sequences, source)
                    try:
                        outcome = self._commit(table, fresh, sequence, append=add,
                                               nbytes=add.files.size,
                                               props=sources_props(fresh, source),
                                               sequences=sequences)
                    finally:
                        add.cleanup(self.catalog, table, sequence=sequence,
                                    epoch=self.epoch)
                    self.windows[table].remember(fresh, source)
                    result.rows[table] = outcome.rows
                    result.replayed += outcome.replayed
                    self.hook(f"after_commit:{table}")
        finally:
            for table, files in pending.items():  # never offered to add_files: not in a table
                AddFiles(files).cleanup(self.catalog, table, sequence=sequence,
                                        epoch=self.epoch)
            for files in staged_files.values():  # never recorded: in no staging state
                for staged in files:
                    with contextlib.suppress(Exception):
                        self.block_on(self.staging.store.delete(staged.key))
            output.release()
        self._commit_dead(pa.concat_tables(dead) if len(dead) > 1 else dead[0], sequence,
                          result)
        failures.raise_first()

    def _write_cluster(self, output: ClusterRunOutput, plans: list[WritePlan],
                       failures: TableFailures, files: dict[str, FileSet],
                       staged: dict[str, tuple[StagedFile, ...]]) -> None:
        """Have the executors write ``plans`` (into ``files`` and ``staged``, by table).

        One job for every table; if it fails (for a reason all tables do not share: the
        store, a fence), one job per table, so a table whose write fails — its data
        location, its files, its rows — fails alone: counted against it through
        ``failures`` (it parks after ``park_after_failures`` attempts), and every other
        table's files are written and committed in this run. Why the one job first: a run
        pays one Spark job, not one per table, while nothing fails.

        If every table's write fails, the session may be what is broken (its Python
        workers, its memory), not the tables: a one-row job tells, and if it fails too
        the first error is raised uncounted, as a failure of what every table shares.
        Files already written are in ``files``/``staged`` as each job returns, so the
        caller deletes whatever is not committed, whatever happens here."""
        try:
            written = output.write_all(plans)
        except Exception as exc:
            if is_shared_failure(exc):
                raise
            first = exc
        else:
            files.update(written.files)
            staged.update(written.staged)
            return
        todo = [p for p in plans if p.expected > 0 or p.rewrites]
        errors: dict[str, Exception] = {}
        if len(todo) == 1:  # the job that failed was this table's alone
            errors[todo[0].target] = first
        for plan in todo if len(todo) > 1 else ():
            try:
                part: Written = output.write_all([plan])
            except Exception as exc:
                if is_shared_failure(exc):
                    raise
                errors[plan.target] = exc
                continue
            files.update(part.files)
            staged.update(part.staged)
        if len(errors) == len(todo) and not output.session_works():
            raise first
        for table, exc in errors.items():
            log.warning("cluster write of %s failed on its own (the other tables of the "
                        "run go on): %s", table, exc, extra={"table": table})
            with failures.of(table), self.bulkheads.guard(table):
                raise exc

    @staticmethod
    def _cluster_keyed(output: ClusterRunOutput, target: Target, keys: pa.Table,
                       columns: tuple[tuple[str, str], ...], locations: dict[int, str],
                       dead: list[pa.Table]) -> tuple[pa.Table, pa.Array]:
        """:meth:`_keyed_rows` for the cluster path: ``keys`` (with the sink's key columns,
        absent where the source does not decode one) without the rows missing a key value,
        and those rows' ``_row`` ids (never written). Their dead letters, which need the
        rows themselves, are read from the executors (few rows) and join ``dead``."""
        key = target.sink.primary_key
        for name in key:
            if name not in keys.column_names:  # not decoded: no row has a value
                keys = keys.append_column(name, pa.nulls(keys.num_rows))
        good, bad = split_missing_keys(keys, key)
        if bad.num_rows == 0:
            return good, pa.array([], pa.int64())
        ids = bad.column(ROW).combine_chunks()
        rows = output.collect_rows(target.source.id, ids, columns)
        dead.append(missing_key_dead_letters(rows, key, target.source.id, locations))
        return good, ids

    def _cluster_targets(self, output: ClusterRunOutput, versions: dict[str, dict[int, int]]
                         ) -> tuple[dict[str, ClusterTarget], dict[str, pa.Table]]:
        """Per table of the run, in routing order: its target, the keys of the rows it
        takes, the entries they come from (None: all of the source's entries) and the
        run's column of its ``where`` (None: no predicate); and per source, the keys of
        its unrouted rows — rows of entries some target receives that no target's
        ``where`` took (as :meth:`collector.routing.Routes.route` finds them).

        Raises:
            RoutingUnsupportedError: two sources write one table in this run, or a sink
                evolves its table (the collector hands such runs to the embedded path
                before they run).
        """
        out: dict[str, ClusterTarget] = {}
        unrouted: dict[str, pa.Table] = {}
        for name, keys in output.keys.items():
            seen = versions.get(name, {})
            receivable = taken = pa.array(np.zeros(keys.num_rows, dtype=bool))
            filtered = False
            for target in self.routes.takers(name, seen):
                allowed = tuple(sorted(s for s, v in seen.items() if target.receives_at(v)))
                chosen = allowed if len(allowed) < len(seen) else None  # misses part of it
                mask = pc.is_in(keys.column("_sequence"), pa.array(allowed, pa.int64()))
                receivable = pc.or_(receivable, mask)
                where = output.wheres.get((name, target.table))
                if where is not None:
                    filtered = True
                    mask = pc.and_(mask, keys.column(where))
                taken = pc.or_(taken, mask)
                part = keys if chosen is None and where is None else keys.filter(mask)
                if target.table in out:
                    output.release()
                    raise RoutingUnsupportedError(
                        f"table {target.table!r} is written by two sinks in this run: the "
                        "cluster output path commits each table from one sink per run")
                if target.sink.unknown_fields == "evolve":
                    output.release()
                    raise RoutingUnsupportedError(
                        f"sink {target.sink.name!r} evolves table {target.table!r} from the "
                        "data: its runs take the embedded path (the cluster output path "
                        "does not evolve tables)")
                flags = [c for c in (*output.wheres.values(), *output.where_errors.values())
                         if c in part.column_names]
                out[target.table] = (target, part.drop_columns(flags), chosen, where)
            if filtered:
                left = pc.and_(receivable, pc.invert(taken))
                for column in output.where_errors.values():  # errors are not unrouted
                    if column in keys.column_names:
                        left = pc.and_(left, pc.is_null(keys.column(column)))
                left = keys.filter(left)
                if left.num_rows:
                    unrouted[name] = left.select(list(KEY_COLUMNS))
        return out, unrouted

    def _cluster_unrouted(self, output: ClusterRunOutput, unrouted: dict[str, pa.Table],
                          versions: dict[str, dict[int, int]], entries: list[Entry]
                          ) -> pa.Table:
        """The run's dead letters: the decode's, then each source's unrouted events its
        ``unrouted`` (at their entry's version) dead-letters — their rows fetched from the
        executors, so they are the embedded path's rows (:meth:`_unrouted`)."""
        rows: dict[str, pa.Table] = {}
        for source, keys in unrouted.items():
            seen = versions.get(source, {})
            keep = [s for s, v in seen.items()
                    if self.routes.unrouted_mode(source, v) == "dead_letter"]
            chosen = keys.filter(pc.is_in(keys.column("_sequence"),
                                          pa.array(keep, pa.int64()))) if keep else None
            if chosen is not None and chosen.num_rows:
                fetched = output.rows_of(source, chosen.column(ROW))
                rows[source] = fetched.sort_by([("_sequence", "ascending")])
            self.metrics.unrouted.labels(source).inc(keys.num_rows)
        return self._unrouted(rows, versions, entries, output.dead, counted=True)

    def _cluster_where_errors(self, output: ClusterRunOutput, locations: dict[int, str]
                              ) -> list[pa.Table]:
        """:meth:`_where_errors` for the cluster path: the executors marked each row a
        sink's ``where`` erred on (its message in the keys); those rows are fetched (few)
        and become the embedded path's dead letters, the first error of a row winning in
        sink order as there."""
        failed: dict[str, pa.Table] = {}
        for name, keys in output.keys.items():
            columns = [c for (stream, _), c in output.where_errors.items()
                       if stream == name and c in keys.column_names]
            if not columns:
                continue
            errors = pc.coalesce(*[keys.column(c) for c in columns]) if len(columns) > 1 \
                else keys.column(columns[0])
            erred = pc.is_valid(errors)
            if not pc.any(erred).as_py():
                continue
            ids = keys.filter(erred).column(ROW).combine_chunks()
            rows = output.rows_of(name, ids)  # in run order (_sequence, _row): the keys'
            failed[name] = rows.append_column(WHERE_ERROR, errors.filter(erred))
        return self._where_errors(failed, locations)

    def _plan_stage(self, target: Target, keys: pa.Table, columns: tuple[tuple[str, str], ...],
                    allowed: tuple[int, ...] | None, where: str | None = None, *,
                    drop: pa.Array | None = None) -> WritePlan:
        """What the executors stage for ``target``: its rows above the staging floor
        (staged or committed already: a replay stages nothing twice). Not deduplicated:
        staged rows are, when they are imported (as on the embedded path). ``drop``: rows
        (``_row``) not in ``keys`` that must not be staged (missing a primary-key value:
        dead letters)."""
        table = target.table
        committed = self.table_sequences.get(table, {})
        _, floor = self.block_on(self.staging.floor(table, committed))
        fresh = not_committed(keys, "_sequence", floor) if floor else keys
        return WritePlan(target.source.id, None, floor,
                         pa.array([], pa.int64()) if drop is None else drop,
                         fresh.num_rows, key=table, columns=columns, sequences=allowed,
                         stage=table, where=where)

    def _record_staged(self, target: Target, files: tuple[StagedFile, ...],
                       result: RunResult, skipped: int) -> None:
        """Record the files the executors staged for ``target`` in its staging state."""
        assert self.epoch is not None
        if files:
            staged = self.block_on(self.staging.record(
                target.table, files, epoch=self.epoch, through=result.sequences,
                skipped=skipped))
        else:
            state, _ = self.block_on(self.staging.floor(target.table, {}))
            staged = Staged(0, skipped, state)
        self._after_stage(target, staged, result)

    def record_ids(self, table: str, fresh: pa.Table, through: dict[int, int],
                   source: str = ANY_SOURCE) -> None:
        """Write the ids of ``fresh`` (the rows about to be committed: new events,
        tombstones included) to ``table``'s dedup journal, before the commit.

        Why before: a crash after the commit must not lose them (a restart would not find
        them in the table: a tombstone writes no row, a replaced row is gone). A record
        counts only once the table's committed sequence covers ``through``
        (:mod:`collector.journal`), so one written for a commit that never lands is
        harmless. Every :data:`JOURNAL_SWEEP_EVERY` records, those older than twice the
        window are deleted."""
        window = self.windows.get(table)
        uuid = self.journal_uuids.get(table)
        if window is None or window.window_s <= 0 or uuid is None or fresh.num_rows == 0:
            return
        now = self.consumer.store_clock.time()
        self.block_on(self.journal.record(table, uuid, int(now * 1000), dict(through),
                                          id_rows(fresh, SOURCE_COLUMN, source)))
        self.hook(f"after_journal:{table}")
        count = self.journal_writes[table] = self.journal_writes.get(table, 0) + 1
        if count % JOURNAL_SWEEP_EVERY == 0:
            before = window.cutoff_ms(now) - int(window.window_s * 1000)
            with contextlib.suppress(Exception):  # the next sweep (or start) does it
                self.block_on(self.journal.sweep(table, uuid, before))

    def _commit(self, table: str, rows: pa.Table, sequence: int, *,
                append: AddFiles | WriteThenAdd | CopyOnWrite | None = None,
                nbytes: int | None = None,
                props: dict[str, str] | None = None,
                sequences: dict[int, int] | None = None) -> CommitResult:
        """Commit ``rows``; ``sequences`` (per shard) supersedes ``sequence`` (shard 0)."""
        assert self.epoch is not None
        outcome = commit_rows(self.catalog, table, rows, sequence=sequence, epoch=self.epoch,
                              append=append, props=props, clock=self.consumer.store_clock,
                              sequences=sequences, version=self.claim_run_version)
        if outcome.attempts > 1:
            self.metrics.commit_failed.labels(table).inc(outcome.attempts - 1)
        self.metrics.commit_seconds.labels(table).observe(outcome.seconds)
        self.metrics.rows.labels(table).inc(outcome.rows)
        size = rows.nbytes if nbytes is None else nbytes
        self.metrics.bytes.labels(table).inc(size if outcome.rows else 0)
        self.metrics.replayed.labels(table).inc(outcome.replayed)
        self.metrics.committed_sequence.labels(table).set(outcome.sequence)
        known = self.table_sequences.setdefault(table, {})
        for shard, seq in outcome.sequences or ((0, outcome.sequence),):
            if seq >= 0:
                known[shard] = max(known.get(shard, -1), seq)
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
        return sum(removed.values())

    # -- sinks with import conditions: staged, committed when a condition holds ----------

    def is_staged(self, target: Target) -> bool:
        """Sinks with their own import conditions go through staging (and so does one with
        rows still staged, so that nothing overtakes them, and a parked table:
        :mod:`collector.bulkhead`); default sinks commit per run."""
        state = self.staging.states.get(target.table)
        return (target.sink.conditions != Conditions() or bool(state and state.files)
                or self.bulkheads.is_parked(target.table))

    def _stage(self, target: Target, rows: pa.Table, result: RunResult) -> None:
        assert self.epoch is not None
        table = target.table
        staged = self.block_on(self.staging.stage(
            table, rows, committed=self.table_sequences.get(table, {}), epoch=self.epoch,
            through=result.sequences))
        self._after_stage(target, staged, result)

    def _after_stage(self, target: Target, staged: Staged, result: RunResult) -> None:
        """Both paths, once a run's rows of ``target`` are staged: count them, then commit
        the staged rows if a condition holds (else compact a long file list)."""
        assert self.epoch is not None
        table = target.table
        result.staged[table] = staged.rows
        result.replayed += staged.skipped
        self.observe_staged(table, staged.state)
        self.hook(f"after_stage:{table}")
        if self.bulkheads.is_parked(table):
            return  # retried on its own schedule (commit_due_staged)
        committed = self._import_guarded(table, target.sink.conditions if
                                         target.sink.live and target.source.live else None)
        if committed is not None:
            result.rows[table] = committed  # models reading this table see the commit
        elif len(staged.state.files) > MAX_STAGED_FILES:
            self.observe_staged(table, self.block_on(self.staging.compact(table, self.epoch)))

    def commit_due_staged(self) -> dict[str, int]:
        """Commit every staged table whose conditions hold (blocking: call in a thread);
        returns rows committed per table. The imports of one call are one catalog
        version, like a run's commits."""
        self.run_version = None
        conditions: dict[str, Conditions | None] = {}
        for targets in self.routes.targets.values():
            for target in targets:
                live = target.sink.live and target.source.live
                if live or target.table not in conditions:
                    conditions[target.table] = target.sink.conditions if live else None
        done: dict[str, int] = {}
        for table, state in list(self.staging.states.items()):
            if not state.files:  # (a table parked a moment ago has none yet: stays parked)
                continue
            if self.bulkheads.is_parked(table):
                rows = self._retry_parked(table)
            else:
                rows = self._import_guarded(table, conditions.get(table))
            if rows is not None:
                done[table] = rows
        return done

    def _import_guarded(self, table: str, conditions: Conditions | None) -> int | None:
        """Import ``table``'s staged rows if due; a failure of its own counts against it
        (and may park it: then its imports wait for their retries, and runs go on)."""
        with self._guard(table):
            return self._commit_staged_if_due(table, conditions)

    def _retry_parked(self, table: str) -> int | None:
        """A parked table's staged rows, once its retry is due: committed, it is
        unparked; failed again, retried later (a shared failure is raised)."""
        if not self.bulkheads.due(table):
            return None
        try:
            if not self.prepare_parked(table):
                return None  # no sink routes there any more: it keeps its staged rows
            rows = self._commit_staged_if_due(table, None)
        except Exception as exc:
            if is_shared_failure(exc):
                raise
            self.bulkheads.retry_failed(table, exc)
            self.metrics.table_failures.labels(table, type(exc).__name__).inc()
            return None
        self.bulkheads.unpark(table)
        return rows

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
        state = self.block_on(self.staging.load(table))  # as stored, not as cached
        committed = 0
        while state.files:  # in chunks of staged bytes, oldest first: each a prefix
            chunk = chunk_of(state.files, COMMIT_CHUNK_BYTES)
            rows = self.block_on(self.staging.read(state, chunk))
            assert rows is not None
            through = merge_through(f.through for f in chunk)  # a prefix: per shard
            rows = self._evolve_staged(table, rows)
            window = self.windows[table]
            fresh, dropped = window.filter_in_sequence_order(rows)
            if dropped:
                self.metrics.duplicates.labels(table).inc(dropped)
            stream = self.routes.tables().get(table)
            upsert = upsert_hook(stream) if stream is not None else None
            self.record_ids(table, fresh, through)
            try:
                outcome = self._commit(table, without_source(fresh), through.get(0, -1),
                                       append=upsert, props=sources_props(fresh),
                                       sequences=through)
            finally:
                if upsert is not None:
                    upsert.cleanup(self.catalog, table, sequence=through.get(0, -1),
                                   epoch=self.epoch)
            window.remember(fresh)
            committed += outcome.rows
            self.hook(f"after_staged_commit:{table}")
            state = self.block_on(self.staging.drop(table, through, self.epoch))
            self.observe_staged(table, state)
            log.info("staged commit %s (%s): rows=%d sequences=%s", table, reason,
                     outcome.rows, through, extra={"table": table, "reason": reason,
                                                   "rows": outcome.rows})
        self.metrics.staged_commits.labels(table, reason).inc()
        return committed

    def _evolve_staged(self, table: str, rows: pa.Table) -> pa.Table:
        """Staged rows of a table parked while its sink evolves keep their undeclared
        fields: evolve the table for them now. Rows the evolution would refuse cannot
        become dead letters this late (the dead letters' offsets are past them), so the
        import stops, naming them, and the table stays parked with its rows staged."""
        if EXTRA_FIELD not in rows.column_names:
            return rows
        raw = pc.is_valid(rows.column(EXTRA_FIELD))
        if not pc.any(raw).as_py():  # staged evolved before: nothing left to evolve
            return rows.drop_columns([n for n in (EXTRA_FIELD, CLIENT_FIELD)
                                      if n in rows.column_names])
        stream = self.routes.tables().get(table)
        if stream is None:
            raise ImportRefusedError(f"staged rows of {table} carry undeclared fields, but "
                                     "no sink routes to it any more to evolve it")
        # rows staged before the table was parked were evolved then (one run's rows are
        # one file, so each sequence's rows stay together and in order)
        done = rows.filter(pc.invert(raw)).drop_columns(
            [n for n in (EXTRA_FIELD, CLIENT_FIELD) if n in rows.column_names])
        declared = {c.name for c in stream.columns}
        sent = rows.filter(raw)
        sent = sent.select([n for n in sent.column_names if n != OVERFLOW and (
            n in declared or n.startswith("_"))])
        sent, refused = evolve_rows(self.catalog, table, stream, sent, {},
                                    self.evolve_limits, hook=self.hook, clock=self.clock)
        rows = sent if done.num_rows == 0 else pa.concat_tables(
            [done, sent], promote_options="permissive")
        if refused is not None and refused.num_rows:
            reasons = sorted(set(refused.column("reason").to_pylist()))[:3]
            raise ImportRefusedError(
                f"{refused.num_rows} staged rows of {table} cannot be evolved into it "
                f"({', '.join(reasons)}; e.g. event {refused.column('event_id')[0]}): they "
                "stay staged and the table parked; change the sink's columns (admin API) "
                "so they fit, and they import at the next retry")
        return rows

    def observe_staged(self, table: str, state: StagingState) -> None:
        self.metrics.staged_rows.labels(table).set(state.rows)
        self.metrics.staged_bytes.labels(table).set(state.bytes)
        oldest = state.oldest_ms
        self.metrics.staged_oldest.labels(table).set(0 if oldest is None else oldest / 1000)


def _left_out(keys: pa.Table, taken: pa.Table) -> pa.Array:
    """``_row`` of the rows of ``keys`` not in ``taken``."""
    if taken.num_rows == keys.num_rows:
        return pa.array([], pa.int64())
    kept = pc.is_in(keys.column("_row"), value_set=taken.column("_row").combine_chunks())
    return keys.filter(pc.invert(kept)).column("_row").combine_chunks()


def versions_of(entries: list[Entry]) -> dict[str, dict[int, int]]:
    """Per source: each entry holding its events → the registry version it came with."""
    out: dict[str, dict[int, int]] = {}
    for entry in entries:
        for stream in entry.streams:
            out.setdefault(stream, {})[entry.sequence] = entry.registry_version
    return out


def chunk_of(files: tuple[StagedFile, ...], limit: int) -> tuple[StagedFile, ...]:
    """The longest prefix of ``files`` within ``limit`` bytes (at least one file), grown
    until it ends at a sequence boundary.

    Why the boundary: a chunk is committed with its highest sequence, and a replay drops
    rows at or below it; the staged files of one cluster-path run (one per task) overlap
    in sequences, so a chunk that ended between them would lose the rest's rows."""
    size, count, last = 0, 0, -1
    for staged in files:
        if count and size + staged.bytes > limit and staged.first_sequence > last:
            break
        size += staged.bytes
        count += 1
        last = max(last, staged.last_sequence)
    return files[:count]



def upsert_columns(routes: Routes) -> dict[str, tuple[str, ...]]:
    """Per source, the primary-key and tombstone columns of its upsert sinks: what the
    cluster output path collects to the driver with each row's keys (the embedded path,
    which has the rows, ignores it)."""
    out: dict[str, tuple[str, ...]] = {}
    for source, targets in routes.targets.items():
        names: list[str] = []
        for target in targets:
            sink = target.sink
            if not sink.primary_key:
                continue
            extra = (sink.tombstone_field,) if sink.tombstone_field else ()
            names += [n for n in (*sink.primary_key, *extra) if n not in names]
        if names:
            out[source] = tuple(names)
    return out
