"""The staged output path: rows wait in the staging area until an import condition holds.

Sinks with import conditions, a table with rows still staged (nothing may overtake them)
and a parked table (:mod:`collector.bulkhead`) go through here. The other two paths hand
over a table's rows of a run (:class:`ToStage`): rows written by the driver on the
embedded path, files the executors staged on the cluster path. They are counted
(``after_stage:<table>``) and, if a condition holds, imported at once; else
:meth:`StagedPath.commit_due` imports them later, in chunks of staged bytes, oldest first
(``after_staged_commit:<table>``), deduplicated then as on the embedded path. A parked
table's import is its retry: committed, it is unparked.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from collector.bulkhead import ImportRefusedError, is_shared_failure
from collector.commit import CollectorState, RunResult, TableCommits
from collector.evolve import evolve_rows
from collector.routing import Target
from collector.staging import COMMIT_CHUNK_BYTES, Staged, due
from collector.staging import MAX_FILES as MAX_STAGED_FILES
from icefloe.manifest.model import Entry
from icefloe.registry.model import Conditions
from icefloe.staging import StagedFile, StagingState, merge_through
from icefloe.streams.evolution import CLIENT_FIELD, EXTRA_FIELD, OVERFLOW
from pipeline.iceberg import rows_under_current_names

__all__ = ["MAX_STAGED_FILES", "StagedPath", "ToStage", "chunk_of"]

log = logging.getLogger("icefloe.collector")


@dataclass(frozen=True, slots=True)
class ToStage:
    """One table's rows of a run for the staged path: ``rows`` (the embedded path's, to
    write) or ``files`` (already staged by the executors, ``skipped`` rows were below the
    staging floor)."""

    target: Target
    rows: pa.Table | None = None
    files: tuple[StagedFile, ...] = ()
    skipped: int = 0


class StagedPath:
    """:class:`~collector.commit.OutputPath` of a :class:`ToStage`, and the imports."""

    def __init__(self, state: CollectorState, commits: TableCommits) -> None:
        self.state = state
        self.commits = commits

    def takes(self, target: Target) -> bool:
        """Sinks with their own import conditions go through staging (and so does one with
        rows still staged, so that nothing overtakes them, and a parked table:
        :mod:`collector.bulkhead`); default sinks commit per run."""
        s = self.state
        state = s.staging.states.get(target.table)
        return (target.sink.conditions != Conditions() or bool(state and state.files)
                or s.bulkheads.is_parked(target.table))

    def commit(self, output: ToStage, result: RunResult, entries: list[Entry]) -> None:
        """Stage (or record) one table's rows of the run, then import them if due."""
        s = self.state
        assert s.epoch is not None
        table = output.target.table
        if output.rows is not None:
            staged = s.block_on(s.staging.stage(
                table, output.rows, committed=s.table_sequences.get(table, {}),
                epoch=s.epoch, through=result.sequences))
        elif output.files:
            staged = s.block_on(s.staging.record(
                table, output.files, epoch=s.epoch, through=result.sequences,
                skipped=output.skipped))
        else:
            state, _ = s.block_on(s.staging.floor(table, {}))
            staged = Staged(0, output.skipped, state)
        self._after_stage(output.target, staged, result)

    def _after_stage(self, target: Target, staged: Staged, result: RunResult) -> None:
        """Both paths, once a run's rows of ``target`` are staged: count them, then commit
        the staged rows if a condition holds (else compact a long file list)."""
        s = self.state
        assert s.epoch is not None
        table = target.table
        result.staged[table] = staged.rows
        result.replayed += staged.skipped
        self.commits.observe_staged(table, staged.state)
        s.hook(f"after_stage:{table}")
        if s.bulkheads.is_parked(table):
            return  # retried on its own schedule (commit_due)
        committed = self._import_guarded(table, target.sink.conditions if
                                         target.sink.live and target.source.live else None)
        if committed is not None:
            result.rows[table] = committed  # models reading this table see the commit
        elif len(staged.state.files) > MAX_STAGED_FILES:
            self.commits.observe_staged(table, s.block_on(s.staging.compact(
                table, s.epoch, each=self._renamer(table))))

    def commit_due(self) -> dict[str, int]:
        """Commit every staged table whose conditions hold (blocking: call in a thread);
        returns rows committed per table. The imports of one call are one catalog
        version, like a run's commits."""
        s = self.state
        self.commits.begin()
        conditions: dict[str, Conditions | None] = {}
        for targets in s.routes.targets.values():
            for target in targets:
                live = target.sink.live and target.source.live
                if live or target.table not in conditions:
                    conditions[target.table] = target.sink.conditions if live else None
        done: dict[str, int] = {}
        for table, state in list(s.staging.states.items()):
            if not state.files:  # (a table parked a moment ago has none yet: stays parked)
                continue
            if s.bulkheads.is_parked(table):
                rows = self._retry_parked(table)
            else:
                try:
                    rows = self._import_guarded(table, conditions.get(table))
                except Exception as exc:
                    if is_shared_failure(exc):
                        raise
                    # counted and logged against that table (it parks after
                    # park_after_failures): the staged tables after it still import now
                    rows = None
            if rows is not None:
                done[table] = rows
        return done

    def _import_guarded(self, table: str, conditions: Conditions | None) -> int | None:
        """Import ``table``'s staged rows if due; a failure of its own counts against it
        (and may park it: then its imports wait for their retries, and runs go on)."""
        with self.commits.guard(table):
            return self._commit_if_due(table, conditions)

    def _retry_parked(self, table: str) -> int | None:
        """A parked table's staged rows, once its retry is due: committed, it is
        unparked; failed again, retried later (a shared failure is raised)."""
        s = self.state
        if not s.bulkheads.due(table):
            return None
        try:
            if not s.prepare_parked(table):
                return None  # no sink routes there any more: it keeps its staged rows
            rows = self._commit_if_due(table, None)
        except Exception as exc:
            if is_shared_failure(exc):
                raise
            s.bulkheads.retry_failed(table, exc)
            s.metrics.table_failures.labels(table, type(exc).__name__).inc()
            return None
        s.bulkheads.unpark(table)
        return rows

    def _commit_if_due(self, table: str, conditions: Conditions | None) -> int | None:
        """``conditions`` None: the sink is gone or back to defaults — commit at once."""
        s = self.state
        state = s.staging.states.get(table)
        if state is None or not state.files:
            return None
        reason = "drain" if conditions is None or conditions == Conditions() else \
            due(state, conditions, int(s.clock.time() * 1000))
        if reason is None:
            return None
        assert s.epoch is not None
        state = s.block_on(s.staging.load(table))  # as stored, not as cached
        committed = 0
        while state.files:  # in chunks of staged bytes, oldest first: each a prefix
            rows, state = self._commit_chunk(table, state, reason)
            committed += rows
        s.metrics.staged_commits.labels(table, reason).inc()
        return committed

    def _commit_chunk(self, table: str, state: StagingState, reason: str
                      ) -> tuple[int, StagingState]:
        """Commit the oldest chunk of ``table``'s staged files, then drop it from the
        staging state; returns the rows committed and the state after."""
        s = self.state
        assert s.epoch is not None
        chunk = chunk_of(state.files, COMMIT_CHUNK_BYTES)
        rows = s.block_on(s.staging.read(state, chunk, each=self._renamer(table)))
        assert rows is not None
        through = merge_through(f.through for f in chunk)  # a prefix: per shard
        rows = self._evolve_staged(table, rows)
        window = s.windows[table]
        fresh, dropped = window.filter_in_sequence_order(rows)
        if dropped:
            s.metrics.duplicates.labels(table).inc(dropped)
        self.commits.record_ids(table, fresh, through)
        outcome = self.commits.commit(table, fresh, through.get(0, -1), sequences=through,
                                      stream=s.routes.tables().get(table))
        window.remember(fresh)
        s.hook(f"after_staged_commit:{table}")
        state = s.block_on(s.staging.drop(table, through, s.epoch))
        self.commits.observe_staged(table, state)
        log.info("staged commit %s (%s): rows=%d sequences=%s", table, reason,
                 outcome.rows, through, extra={"table": table, "reason": reason,
                                               "rows": outcome.rows})
        return outcome.rows, state

    def _renamer(self, table: str) -> Callable[[pa.Table], pa.Table] | None:
        """For a Protobuf table: each staged file's rows under its columns' current names
        (a field renamed in the ``.proto`` since they were staged keeps its column, same
        field id, but not its name: :func:`rows_under_current_names`). None otherwise."""
        stream = self.state.routes.tables().get(table)
        if stream is None or stream.format != "protobuf":
            return None
        return functools.partial(rows_under_current_names,
                                 self.state.catalog.load_table(table))

    def _evolve_staged(self, table: str, rows: pa.Table) -> pa.Table:
        """Staged rows of a table parked while its sink evolves keep their undeclared
        fields: evolve the table for them now. Rows the evolution would refuse cannot
        become dead letters this late (the dead letters' offsets are past them), so the
        import stops, naming them, and the table stays parked with its rows staged."""
        if EXTRA_FIELD not in rows.column_names:
            return rows
        extras = [n for n in (EXTRA_FIELD, CLIENT_FIELD) if n in rows.column_names]
        raw = pc.is_valid(rows.column(EXTRA_FIELD))
        if not pc.any(raw).as_py():  # staged evolved before: nothing left to evolve
            return rows.drop_columns(extras)
        s = self.state
        stream = s.routes.tables().get(table)
        if stream is None:
            raise ImportRefusedError(f"staged rows of {table} carry undeclared fields, but "
                                     "no sink routes to it any more to evolve it")
        # rows staged before the table was parked were evolved then (one run's rows are
        # one file, so each sequence's rows stay together and in order)
        done = rows.filter(pc.invert(raw)).drop_columns(extras)
        declared = {c.name for c in stream.columns}
        sent = rows.filter(raw)
        sent = sent.select([n for n in sent.column_names if n != OVERFLOW and (
            n in declared or n.startswith("_"))])
        sent, refused = evolve_rows(s.catalog, table, stream, sent, {},
                                    s.evolve_limits, hook=s.hook, clock=s.clock)
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
