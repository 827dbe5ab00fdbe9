"""The embedded output path: the run's rows are here (a ``RunOutput``), per table.

Per table of the run, in routing order: a parked table's rows are staged as they came; an
evolving sink's rows evolve the table first (quotas, ``_overflow``); rows missing a
primary-key value become dead letters; a staged sink's rows go to the staged path; the
rest are deduplicated by the table's window and committed with the run's sequence in one
call into :mod:`pipeline.iceberg` (write-then-``add_files``, or copy-on-write for a keyed
sink). Then the dead letters. One table's failure is its own (bulkheads); it is raised
after every other table had its turn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from collector.bulkhead import TableFailures
from collector.commit import CollectorState, RunResult, TableCommits, versions_of
from collector.dynamic import DynamicTables
from collector.evolve import evolve_rows
from collector.routing import Target
from collector.staged_path import StagedPath, ToStage
from icefloe.manifest.model import Entry
from icefloe.streams.evolution import EXTRA_FIELD
from icefloe.streams.model import DynamicTables as Limits
from pipeline.load import RunOutput


class EmbeddedPath:
    """:class:`~collector.commit.OutputPath` of a ``RunOutput``."""

    def __init__(self, state: CollectorState, commits: TableCommits,
                 staged: StagedPath, *, workers: int = 1,
                 limits: Mapping[str, Limits] | None = None) -> None:
        """``workers``: tables committed at once (``collector.commit_workers``);
        ``limits``: each table template's (:class:`collector.dynamic.DynamicTables`)."""
        self.state = state
        self.commits = commits
        self.staged = staged
        self.workers = workers
        self.dynamic = DynamicTables(lambda: state.catalog, limits)
        self._counts = threading.Lock()

    def commit(self, output: RunOutput, result: RunResult, entries: list[Entry]) -> None:
        """Commit each affected table once (dedup first), then the dead letters."""
        s = self.state
        for (stream, column), count in output.sql_errors.items():
            s.metrics.sql_errors.labels(stream, column).inc(count)
        assert s.epoch is not None
        versions = versions_of(entries)
        routed, unrouted, failed = s.routes.route_run(output.tables, versions)
        dead = [self.commits.unrouted(unrouted, versions, entries, output.dead)]
        locations = {entry.sequence: entry.location for entry in entries}
        dead += self.commits.where_errors(failed, locations)
        named = self.dynamic.expand(routed, locations, dead)  # templates: per table
        failures = TableFailures()

        def one(table: str, target: Target, rows: pa.Table) -> None:
            with failures.of(table), self.commits.guard(table):
                if table not in routed:  # a template's table: made on first use
                    s.prepare_dynamic(table, target.stream)
                self.commit_routed(target, rows, result, locations, dead)
        self._each_table(named, one)
        if not failures.tables:
            # only in a run that is acked: a table that failed before splitting off its
            # rows without a key (its park area full, its evolution refused) adds those
            # dead letters on the retry, which would find the dead-letter table already
            # covering the run's sequences and drop them as replays
            self.commits.commit_dead(dead, result.last_sequence, result)
        failures.raise_first()

    def _each_table(self, named: dict[str, tuple[Target, pa.Table]],
                    one: Callable[[str, Target, pa.Table], None]) -> None:
        """Call ``one`` per table: in routing order, or ``workers`` at a time.

        Why this is safe for exactly-once: each table's commit is its own (its sequence,
        window, journal, bulkhead); a crash while several are in flight leaves some
        committed and some not, like a crash between two of them in turn. The run's
        catalog version is claimed once, by the first table to commit, so every table
        records the same one (:meth:`~collector.commit.TableCommits.claim_run_version`)."""
        workers = min(self.workers, len(named))
        if workers <= 1:
            for table, (target, rows) in named.items():
                one(table, target, rows)
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="icefloe-commit") as pool:
            futures = [pool.submit(one, table, target, rows)
                       for table, (target, rows) in named.items()]
            for future in futures:
                future.result()  # a shared failure or a crash: raised once all are done

    def commit_routed(self, target: Target, rows: pa.Table, result: RunResult,
                      locations: dict[int, str], dead: list[pa.Table]) -> None:
        """One table's rows of the run: evolve its schema, split off rows without a key,
        then stage them or deduplicate and commit them."""
        s, commits, table = self.state, self.commits, target.table
        if s.bulkheads.is_parked(table):
            commits.check_park_room(table)
            # staged as they came: an evolving sink's undeclared fields too; the import
            # evolves the table first (the table may not even load now)
            rows = commits.keyed_rows(target, rows, locations, dead)
            self.staged.commit(ToStage(target, rows=rows), result, [])
            return
        if EXTRA_FIELD in rows.column_names:  # an evolving sink's rows: columns first
            # (by the rows, not the owner: a table's rows may come from an evolving
            # sink's version while its newest sink does not evolve)
            rows, refused = evolve_rows(s.catalog, table, target.stream, rows, locations,
                                        s.evolve_limits, hook=s.hook, clock=s.clock)
            if refused is not None:
                dead.append(refused)
        rows = commits.keyed_rows(target, rows, locations, dead)
        if self.staged.takes(target):
            self.staged.commit(ToStage(target, rows=rows), result, [])
            return
        self._commit_fresh(target, rows, result)

    def _commit_fresh(self, target: Target, rows: pa.Table, result: RunResult) -> None:
        """Deduplicate ``rows`` by the table's window and commit the rest."""
        s, table = self.state, target.table
        window = s.windows[table]
        fresh, dropped = window.filter_in_sequence_order(rows)
        with self._counts:  # tables may commit in parallel (commit_workers)
            result.duplicates += dropped
        if dropped:
            s.metrics.duplicates.labels(target.source.id).inc(dropped)
        self.commits.record_ids(table, fresh, result.sequences)
        outcome = self.commits.commit(table, fresh, result.last_sequence,
                                      sequences=result.sequences, stream=target.stream,
                                      writer=target.source.id)
        window.remember(fresh)
        with self._counts:
            result.rows[table] = outcome.rows
            result.replayed += outcome.replayed
        s.hook(f"after_commit:{table}")
