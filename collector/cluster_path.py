"""The cluster output path: the run's rows stay on the executors (a ``ClusterRunOutput``).

Per target table (a source with several sinks has several; a sink that missed part of the
run gets only the entries it takes) the keys are deduplicated by that table's window and
replay-filtered by its committed sequence; a staged sink's rows above its staging floor
are planned instead. One Spark job writes every table's files and every staged file; then,
in routing order, each table is committed with ``add_files`` (``after_commit:<table>``) or
its staged files are handed to the staged path (``after_stage:<table>``, then the import
if a condition holds) — the embedded path's order and crash points, plus ``after_write``
(files written, nothing committed). If the shared write job fails, each plan is written by
a job of its own (:meth:`ClusterPath._write`): a table whose write fails is one failed
attempt of that table (it parks after ``park_after_failures``), and the others are
committed. Files of a table whose commit is refused or never attempted are deleted here;
a crash leaves them to the maintenance orphan sweep (staged ones to
:meth:`~collector.staging.StagingArea.sweep`). Dead letters are few and go the embedded
way; so do unrouted events (no sink's ``where`` took them: the executors marked each
sink's rows), counted as there and, where their source says ``dead_letter``, fetched from
the executors to become the same dead letters.

**Upserts** (sinks with a ``primary_key``): the driver gets only the key (and tombstone)
columns with the keys, picks each key's latest row by the embedded rule and finds the
files holding the keys; the executors write the surviving rows and rewrite those files in
the run's write job, and one overwrite replaces them (``plan_upsert``, ``ReplaceFiles``).
A staged upsert sink is imported as on the embedded path.

**Table templates**: the executors name each row's table (:mod:`pipeline.load.named`);
the template's keys are split per table by the embedded path's rule
(:mod:`collector.cluster_dynamic`), each new table is made before it is planned, every
table's rows are written by the run's one write job, and the tables commit one after the
other or ``collector.commit_workers`` at a time. **Change streams** are upserts whose
key's latest change is chosen by source position and checked against the positions the
table holds (:func:`~pipeline.load.plan_upsert`, the embedded path's
:mod:`pipeline.iceberg.cdc_apply`).

A run this path does not write itself (two sources writing one table, a sink that evolves
its table from the data) was handed to the embedded path before it ran
(:meth:`collector.service.Collector._route_run`; :func:`collector.routing.embedded_reason`),
where the quotas, the ``_overflow`` column and a parked table's raw staging live.

A table's planning counts a failure against it but does not clear its earlier ones (only
its commit or staging does), so a table whose write keeps failing parks.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collector.bulkhead import TableFailures, is_shared_failure
from collector.cluster_dynamic import ClusterTarget, expand
from collector.commit import CollectorState, RunResult, TableCommits, versions_of
from collector.dynamic import DynamicTables
from collector.embedded_path import EmbeddedPath
from collector.routing import Target
from collector.staged_path import StagedPath, ToStage
from collector.where import WHERE_ERROR
from icefloe.errors import RoutingUnsupportedError
from icefloe.manifest.model import Entry
from icefloe.staging import StagedFile
from icefloe.streams.cdc import POSITION_COLUMN
from pipeline.iceberg import (
    AddFiles,
    FileSet,
    ReplaceFiles,
    missing_key_dead_letters,
    not_committed,
    split_missing_keys,
)
from pipeline.load import (
    KEY_COLUMNS,
    ROW,
    ClusterRunOutput,
    UpsertPlan,
    WritePlan,
    Written,
    plan_upsert,
    plan_write,
)

log = logging.getLogger("icefloe.collector")

Columns = tuple[tuple[str, str], ...]


@dataclass(slots=True)
class ClusterRun:
    """One cluster-path run between its planning, its write job and its commits."""

    output: ClusterRunOutput
    result: RunResult
    entries: list[Entry]
    locations: dict[int, str]
    failures: TableFailures = field(default_factory=TableFailures)
    dead: list[pa.Table] = field(default_factory=list)
    fresh_keys: dict[str, pa.Table] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    """Tables planned as staged: rows below their staging floor."""
    upserts: dict[str, UpsertPlan | None] = field(default_factory=dict)
    plans: list[WritePlan] = field(default_factory=list)
    pending: dict[str, FileSet] = field(default_factory=dict)
    """Files written and not yet offered to ``add_files`` (deleted if never offered)."""
    staged_files: dict[str, tuple[StagedFile, ...]] = field(default_factory=dict)
    """Files staged and not yet recorded in a staging state (deleted if never recorded)."""


class ClusterPath:
    """:class:`~collector.commit.OutputPath` of a ``ClusterRunOutput``."""

    def __init__(self, state: CollectorState, commits: TableCommits,
                 staged: StagedPath, *, dynamic: DynamicTables | None = None,
                 workers: int = 1) -> None:
        """``dynamic``: the table templates' tables (shared with the embedded path, so
        both count ``max_tables`` alike); ``workers``: tables committed at once
        (``collector.commit_workers``)."""
        self.state = state
        self.commits = commits
        self.staged = staged
        self.dynamic = dynamic or DynamicTables(lambda: state.catalog)
        self.workers = workers
        self._counts = threading.Lock()

    @classmethod
    def beside(cls, embedded: EmbeddedPath) -> ClusterPath:
        """The cluster path of a collector whose embedded path is ``embedded``: the same
        state, commits and staged path, table templates' tables and commit workers (a
        collector switches between the two per run)."""
        return cls(embedded.state, embedded.commits, embedded.staged,
                   dynamic=embedded.dynamic, workers=embedded.workers)

    def commit(self, output: ClusterRunOutput, result: RunResult, entries: list[Entry]
               ) -> None:
        """Dedup on the keys, executors write, ``add_files`` per table, dead letters."""
        assert self.state.epoch is not None
        versions = versions_of(entries)
        routed, unrouted = self._targets(output, versions)
        run = ClusterRun(output, result, entries,
                         {entry.sequence: entry.location for entry in entries})
        try:
            run.dead.append(self._unrouted(output, unrouted, versions, entries))
            run.dead += self._where_errors(output, run.locations)
            routed = expand(self.dynamic, output, routed, run.locations, run.dead)
            for table, planned in routed.items():
                with run.failures.of(table), self.state.bulkheads.guard(table):
                    if planned[4] is not None:  # a template's table: made on first use
                        self.state.prepare_dynamic(table, planned[0].stream)
                    self._plan(run, table, *planned)
            self._write(output, run.plans, run.failures, run.pending, run.staged_files)
            self.state.hook("after_write")
            self._each_table([(table, target) for table, (target, *_) in routed.items()
                              if table not in run.failures.tables],
                             lambda table, target: self._commit_table(run, table, target))
        finally:
            self._discard(run)
        if not run.failures.tables:  # only in a run that is acked (as the embedded path)
            self.commits.commit_dead(run.dead, result.last_sequence, result)
        run.failures.raise_first()

    def _each_table(self, tables: list[tuple[str, Target]],
                    one: Callable[[str, Target], None]) -> None:
        """Call ``one`` per table: in routing order, or ``workers`` at a time (as
        :meth:`collector.embedded_path.EmbeddedPath._each_table`, and safe for the same
        reasons: each table's commit is its own; the run's catalog version is claimed
        once, by the first table to commit, so every table records the same one)."""
        workers = min(self.workers, len(tables))
        if workers <= 1:
            for table, target in tables:
                one(table, target)
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="icefloe-commit") as pool:
            futures = [pool.submit(one, table, target) for table, target in tables]
            for future in futures:
                future.result()  # a shared failure or a crash: raised once all are done

    def _plan(self, run: ClusterRun, table: str, target: Target, keys: pa.Table,
              allowed: tuple[int, ...] | None, where: str | None,
              named: str | None = None) -> None:
        """Plan one table's write: its staged rows, or its fresh rows (or upsert);
        ``named``: a template's table, the keys' column of the names its rows gave."""
        s, result = self.state, run.result
        assert s.epoch is not None
        self.commits.check_park_room(table)
        source = target.source.id
        columns = tuple((c.name, c.type) for c in target.sink.columns)
        good = keys  # without the rows missing a primary-key value
        if target.sink.primary_key:  # those are dead letters
            good, _ = self._keyed(run.output, target, keys, columns, run.locations,
                                  run.dead)
        if self.staged.takes(target):
            plan = self._plan_stage(target, good, columns, allowed, where,
                                    drop=_left_out(keys, good), named=named)
            run.skipped[table] = good.num_rows - plan.expected
            run.plans.append(plan)
            return
        fresh, dropped = s.windows[table].filter(good, source)
        result.duplicates += dropped
        if dropped:
            s.metrics.duplicates.labels(source).inc(dropped)
        run.fresh_keys[table] = fresh
        planned: WritePlan | None
        if target.sink.primary_key:
            cdc = target.sink.cdc  # a change stream: ordered by its source positions
            upsert = plan_upsert(
                s.catalog, table, source, keys, fresh,
                key=target.sink.primary_key, tombstone=target.sink.tombstone_field,
                sequences=result.sequences, epoch=s.epoch, target=table,
                columns=columns, entries=allowed, where=where,
                position=POSITION_COLUMN if cdc is not None else None,
                keep_deletes=cdc is not None and cdc.deletes == "keep")
            run.upserts[table] = upsert
            planned = upsert.write if upsert is not None else None
        else:
            planned = plan_write(s.catalog, table, source, keys, fresh,
                                 sequences=result.sequences, epoch=s.epoch, key=table,
                                 columns=columns, entries=allowed, where=where, named=named)
        if planned is not None:
            run.plans.append(planned)

    def _commit_table(self, run: ClusterRun, table: str, target: Target) -> None:
        """Commit one table's written files (or hand its staged files over)."""
        s, result = self.state, run.result
        if table in run.skipped:
            staged = run.staged_files.pop(table, ())
            self.staged.commit(ToStage(target, files=staged, skipped=run.skipped[table]),
                               result, run.entries)
            return
        source, fresh = target.source.id, run.fresh_keys[table]
        files, upsert = run.pending.pop(table, FileSet()), run.upserts.get(table)
        add = AddFiles(files) if upsert is None else ReplaceFiles(
            files, upsert.replaced, upsert.snapshot_id, upsert.rows, dict(upsert.noops))
        with run.failures.of(table), self.commits.guard(table):
            self.commits.record_ids(table, fresh, result.sequences, source)
            outcome = self.commits.commit(table, fresh, result.last_sequence,
                                          sequences=result.sequences, files=add,
                                          source=source)
            s.windows[table].remember(fresh, source)
            with self._counts:  # tables may commit in parallel (commit_workers)
                result.rows[table] = outcome.rows
                result.replayed += outcome.replayed
            s.hook(f"after_commit:{table}")

    def _discard(self, run: ClusterRun) -> None:
        """Delete the files never committed or recorded, and free the executors' run."""
        s = self.state
        assert s.epoch is not None
        sequence = run.result.last_sequence
        for table, files in run.pending.items():  # never offered to add_files
            AddFiles(files).cleanup(s.catalog, table, sequence=sequence, epoch=s.epoch)
        for staged_files in run.staged_files.values():  # never recorded: in no staging state
            for staged in staged_files:
                with contextlib.suppress(Exception):
                    s.block_on(s.staging.store.delete(staged.key))
        run.output.release()

    @staticmethod
    def _keyed(output: ClusterRunOutput, target: Target, keys: pa.Table,
                       columns: Columns, locations: dict[int, str],
                       dead: list[pa.Table]) -> tuple[pa.Table, pa.Array]:
        """:meth:`TableCommits.keyed_rows` for the cluster path: ``keys`` (with the sink's
        key columns, absent where the source does not decode one) without the rows missing
        a key value, and those rows' ``_row`` ids (never written). Their dead letters, which
        need the rows themselves, are read from the executors (few rows) and join ``dead``."""
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

    def _targets(self, output: ClusterRunOutput, versions: dict[str, dict[int, int]]
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
            for target in self.state.routes.takers(name, seen):
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
                mine = output.tables.get((name, target.table), ())  # its template's names
                flags = [c for c in (*output.wheres.values(), *output.where_errors.values(),
                                     *(c for cs in output.tables.values() for c in cs))
                         if c in part.column_names and c not in mine]
                out[target.table] = (target, part.drop_columns(flags), chosen, where, None)
            if filtered:
                left = pc.and_(receivable, pc.invert(taken))
                for column in output.where_errors.values():  # errors are not unrouted
                    if column in keys.column_names:
                        left = pc.and_(left, pc.is_null(keys.column(column)))
                left = keys.filter(left)
                if left.num_rows:
                    unrouted[name] = left.select(list(KEY_COLUMNS))
        return out, unrouted

    def _unrouted(self, output: ClusterRunOutput, unrouted: dict[str, pa.Table],
                          versions: dict[str, dict[int, int]], entries: list[Entry]
                          ) -> pa.Table:
        """The run's dead letters: the decode's, then each source's unrouted events its
        ``unrouted`` (at their entry's version) dead-letters — their rows fetched from the
        executors, so they are the embedded path's rows (:meth:`TableCommits.unrouted`)."""
        rows: dict[str, pa.Table] = {}
        for source, keys in unrouted.items():
            seen = versions.get(source, {})
            keep = [s for s, v in seen.items()
                    if self.state.routes.unrouted_mode(source, v) == "dead_letter"]
            chosen = keys.filter(pc.is_in(keys.column("_sequence"),
                                          pa.array(keep, pa.int64()))) if keep else None
            if chosen is not None and chosen.num_rows:
                fetched = output.rows_of(source, chosen.column(ROW))
                rows[source] = fetched.sort_by([("_sequence", "ascending")])
            self.state.metrics.unrouted.labels(source).inc(keys.num_rows)
        return self.commits.unrouted(rows, versions, entries, output.dead, counted=True)

    def _where_errors(self, output: ClusterRunOutput, locations: dict[int, str]
                              ) -> list[pa.Table]:
        """:meth:`TableCommits.where_errors` for the cluster path: the executors marked each row a
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
        return self.commits.where_errors(failed, locations)

    def _plan_stage(self, target: Target, keys: pa.Table, columns: Columns,
                    allowed: tuple[int, ...] | None, where: str | None = None, *,
                    drop: pa.Array | None = None, named: str | None = None) -> WritePlan:
        """What the executors stage for ``target``: its rows above the staging floor
        (staged or committed already: a replay stages nothing twice). Not deduplicated:
        staged rows are, when they are imported (as on the embedded path). ``drop``: rows
        (``_row``) not in ``keys`` that must not be staged (missing a primary-key value:
        dead letters)."""
        table = target.table
        committed = self.state.table_sequences.get(table, {})
        _, floor = self.state.block_on(self.state.staging.floor(table, committed))
        fresh = not_committed(keys, "_sequence", floor) if floor else keys
        return WritePlan(target.source.id, None, floor,
                         pa.array([], pa.int64()) if drop is None else drop,
                         fresh.num_rows, key=table, columns=columns, sequences=allowed,
                         stage=table, where=where, named=named)

    def _write(self, output: ClusterRunOutput, plans: list[WritePlan],
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
        for table, error in errors.items():
            log.warning("cluster write of %s failed on its own (the other tables of the "
                        "run go on): %s", table, error, extra={"table": table})
            with failures.of(table), self.state.bulkheads.guard(table):
                raise error


def _left_out(keys: pa.Table, taken: pa.Table) -> pa.Array:
    """``_row`` of the rows of ``keys`` not in ``taken``."""
    if taken.num_rows == keys.num_rows:
        return pa.array([], pa.int64())
    kept = pc.is_in(keys.column("_row"), value_set=taken.column("_row").combine_chunks())
    return keys.filter(pc.invert(kept)).column("_row").combine_chunks()

