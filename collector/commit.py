"""How a run's rows reach Iceberg: the output paths, and what they share.

The run loop (:mod:`collector.service`) reads entries, runs the pipeline and acks; it
hands the run's output to one :class:`OutputPath`, an object the collector owns:

* **embedded** (:class:`collector.embedded_path.EmbeddedPath`; the run's rows are here):
  per table, drop the ids the dedup window has seen and commit the rest with the run's
  sequence;
* **cluster** (:class:`collector.cluster_path.ClusterPath`; the rows stay on the
  executors): dedup on the event keys alone, one job has the executors write every
  table's files, then each table gets one ``add_files`` commit;
* **staged** (:class:`collector.staged_path.StagedPath`; sinks with import conditions, and
  parked tables): both paths hand it a table's rows (or the files the executors staged),
  and it commits them in chunks, oldest first, when a condition holds.

Dead letters always go the embedded way, after the tables.

What the paths share is here: :class:`TableCommits` commits one table's rows through
:func:`pipeline.iceberg.commit_table` (one call per table: the write, the exactly-once
``commit_rows`` carrying ``icefloe.sequence``/``icefloe.epoch``, the cleanup), writes the
dedup journal first, claims the run's catalog version and keeps the metrics; and it owns
the per-table guards (bulkheads) and dead letters. Every path calls ``hook`` at the same
crash points (``after_write``, ``after_commit:<table>``, ``after_stage:<table>``,
``after_staged_commit:<table>``; and ``after_prepare:<table>`` once a template's table is
made or first prepared, before anything is committed to it), so tests and the simulator
can crash a collector between any two steps.

The paths read the collector's state through :class:`CollectorState` rather than holding
copies, because that state changes under them: ``epoch`` is set by ``acquire``, ``routes``
is replaced when the registry changes, and tests swap ``hook``. Blocking: every method
runs in a worker thread (or inline under the simulator), never on the loop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog

from collector.bulkhead import Bulkheads, ParkFullError
from collector.dedup import ANY_SOURCE, SOURCE_COLUMN, DedupWindow, source_runs, without_source
from collector.hops import BlockOn, together
from collector.journal import DedupJournal, id_rows
from collector.metrics import CollectorMetrics
from collector.routing import Routes, Target
from collector.staging import StagingArea
from collector.where import unrouted_dead_letters, where_error_dead_letters
from icefloe.catalog_version import claim_version
from icefloe.clock import Clock
from icefloe.manifest.model import Entry
from icefloe.manifest.sharded_consumer import ShardedConsumer
from icefloe.staging import StagingState
from icefloe.store.base import AsyncObjectStore
from icefloe.streams.cdc import POSITION_COLUMN
from icefloe.streams.evolution import EvolveLimits
from icefloe.streams.model import StreamConfig
from pipeline.iceberg import (
    DEAD_LETTER_TABLE,
    AddFiles,
    CommitResult,
    commit_table,
    missing_key_dead_letters,
    split_missing_keys,
)

__all__ = ["CollectorState", "Hook", "OutputPath", "RunResult", "TableCommits",
           "upsert_columns", "versions_of"]

log = logging.getLogger("icefloe.collector")

JOURNAL_SWEEP_EVERY = 256
"""Records a table's journal gets between two sweeps of its old ones."""

Hook = Callable[[str], None]
"""Crash-injection point: called with a stage name; tests raise from it."""

O_contra = TypeVar("O_contra", contravariant=True)


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
    cut: bool = False
    """The run left queued entries behind (cut by its size or time limit): a backlog, so
    the next run starts at once."""

    @property
    def sequences(self) -> dict[int, int]:
        """:attr:`through`, or shard 0's ``last_sequence`` for a run built without it."""
        return self.through or {0: self.last_sequence}


class OutputPath(Protocol[O_contra]):
    """How one shape of a run's output reaches Iceberg: the embedded path takes a
    ``RunOutput`` (rows here), the cluster path a ``ClusterRunOutput`` (rows on the
    executors), the staged path a :class:`~collector.staged_path.ToStage` (one table's
    rows or staged files, handed over by the other two)."""

    def commit(self, output: O_contra, result: RunResult, entries: list[Entry]) -> None:
        """Commit (or stage) ``output``'s rows of the run ``entries``; ``result`` counts
        what was done. A table's own failure is counted against it (bulkheads) and raised
        after every other table had its turn."""


class CollectorState(Protocol):
    """What the output paths read from :class:`collector.service.Collector` (which
    satisfies this): read at each use, never copied, since it changes under them."""

    catalog: Catalog
    store: AsyncObjectStore
    consumer: ShardedConsumer
    metrics: CollectorMetrics
    clock: Clock
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

    @property
    def hook(self) -> Hook: ...

    def prepare_parked(self, name: str) -> bool: ...

    def prepare_dynamic(self, name: str, stream: StreamConfig) -> None: ...


class TableCommits:
    """One table's commit, and the steps around it that every output path shares."""

    def __init__(self, state: CollectorState) -> None:
        self.state = state
        self.run_version: int | None = None
        """The catalog version of the run (or staged import) committing now, once
        claimed."""
        self._claiming = threading.Lock()

    def begin(self) -> None:
        """A run (or a round of staged imports) starts: it claims its own version."""
        self.run_version = None

    def claim_run_version(self) -> int:
        """The run's catalog version (:mod:`icefloe.catalog_version`), claimed at its first
        commit: every snapshot the run commits, to any table or from any shard, records
        the same one, and a run that commits nothing claims none.

        Thread-safe: with ``collector.commit_workers`` > 1 the tables' threads commit at
        once; the first to get here claims and the others wait for the same version (or
        for :meth:`record_ids`, which claims beside its journal PUT)."""
        s = self.state
        with self._claiming:
            if self.run_version is None:
                self.run_version = s.block_on(self._claim())
            return self.run_version

    def _claim(self) -> Coroutine[Any, Any, int]:
        s = self.state
        assert s.epoch is not None
        return claim_version(s.store, epoch=s.epoch, clock=s.consumer.store_clock)

    def commit(self, table: str, rows: pa.Table, sequence: int, *,
               sequences: dict[int, int] | None = None, stream: StreamConfig | None = None,
               writer: str | None = None, files: AddFiles | None = None,
               source: str | None = ANY_SOURCE) -> CommitResult:
        """Commit ``rows`` (with their ``_source`` tags, which are recorded, not committed)
        through :func:`pipeline.iceberg.commit_table`; ``sequences`` (per shard)
        supersedes ``sequence`` (shard 0). ``source``: of rows without a tag (None: record
        no sources, as for the dead letters)."""
        s = self.state
        assert s.epoch is not None
        runs = source_runs(rows, source) if source is not None else []
        committed = without_source(rows)
        outcome = commit_table(s.catalog, table, committed, sequence=sequence,
                               epoch=s.epoch, clock=s.consumer.store_clock,
                               version=self.claim_run_version, sequences=sequences,
                               sources=runs, stream=stream, writer=writer, files=files)
        self._observe(table, outcome,
                      committed.nbytes if files is None else files.files.size)
        return outcome

    def _observe(self, table: str, outcome: CommitResult, size: int) -> None:
        s, metrics = self.state, self.state.metrics
        if outcome.attempts > 1:
            metrics.commit_failed.labels(table).inc(outcome.attempts - 1)
        metrics.commit_seconds.labels(table).observe(outcome.seconds)
        metrics.rows.labels(table).inc(outcome.rows)
        metrics.bytes.labels(table).inc(size if outcome.rows else 0)
        metrics.replayed.labels(table).inc(outcome.replayed)
        for reason, count in outcome.noops:  # a change stream's no-op changes
            metrics.cdc_noops.labels(table, reason).inc(count)
        metrics.committed_sequence.labels(table).set(outcome.sequence)
        known = s.table_sequences.setdefault(table, {})
        for shard, seq in outcome.sequences or ((0, outcome.sequence),):
            if seq >= 0:
                known[shard] = max(known.get(shard, -1), seq)
        metrics.last_commit.set(s.clock.time())
        log.info("commit %s rows=%d replayed=%d sequence=%d epoch=%d %.3fs attempts=%d",
                 table, outcome.rows, outcome.replayed, outcome.sequence, s.epoch,
                 outcome.seconds, outcome.attempts,
                 extra={"table": table, "rows": outcome.rows, "sequence": outcome.sequence,
                        "epoch": s.epoch, "seconds": round(outcome.seconds, 4)})

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
        s = self.state
        window = s.windows.get(table)
        uuid = s.journal_uuids.get(table)
        if window is None or window.window_s <= 0 or uuid is None or fresh.num_rows == 0:
            return
        now = s.consumer.store_clock.time()
        self._journal_and_claim(s.journal.record(table, uuid, int(now * 1000), dict(through),
                                                 id_rows(fresh, SOURCE_COLUMN, source)))
        s.hook(f"after_journal:{table}")
        count = s.journal_writes[table] = s.journal_writes.get(table, 0) + 1
        if count % JOURNAL_SWEEP_EVERY == 0:
            before = window.cutoff_ms(now) - int(window.window_s * 1000)
            with contextlib.suppress(Exception):  # the next sweep (or start) does it
                s.block_on(s.journal.sweep(table, uuid, before))

    def _journal_and_claim(self, record: Coroutine[Any, Any, Any]) -> None:
        """Write a journal record; the run's first also claims the run's catalog version
        in the same store round trip (the commit that follows needs it; claimed after the
        record, a slow store paid two round trips in series on every run).

        Why this keeps the rules: the claim still comes before any snapshot and is fenced
        by the epoch; a claim whose commit then never lands (a crash, a replay that finds
        the run committed) leaves a version no snapshot records, as a crash after a claim
        always could. Other tables' records do not wait for this one."""
        if not self._claiming.acquire(blocking=False):  # another table claims now
            self.state.block_on(record)
            return
        try:
            if self.run_version is not None:
                self.state.block_on(record)
            else:
                _, self.run_version = self.state.block_on(together(record, self._claim()))
        finally:
            self._claiming.release()

    # -- bulkheads ---------------------------------------------------------------------

    @contextlib.contextmanager
    def guard(self, table: str) -> Iterator[None]:
        """One table's own step: a failure counts against it (and may park it)."""
        with self.state.bulkheads.guard(table):
            yield
        self.state.bulkheads.succeeded(table)

    def check_park_room(self, table: str) -> None:
        """Refuse to stage more for a parked table whose area holds ``park_max_bytes``."""
        bulkheads = self.state.bulkheads
        state = self.state.staging.states.get(table)
        if (bulkheads.is_parked(table) and state is not None
                and state.bytes >= bulkheads.max_bytes):
            raise ParkFullError(
                f"table {table} is parked ({bulkheads.parked[table].reason}) and its "
                f"staged rows reached collector.park_max_bytes ({bulkheads.max_bytes}):"
                " its entries wait in the queue now")

    # -- dead letters --------------------------------------------------------------------

    @staticmethod
    def keyed_rows(target: Target, rows: pa.Table, locations: dict[int, str],
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

    def unrouted(self, unrouted: dict[str, pa.Table], versions: dict[str, dict[int, int]],
                 entries: list[Entry], dead: pa.Table, *, counted: bool = False
                 ) -> pa.Table:
        """Count each source's unrouted events (unless ``counted`` already) and add those
        its ``unrouted`` (at their entry's version) sends to the dead letters to
        ``dead``."""
        s = self.state
        locations = {e.sequence: e.location for e in entries}
        parts = [dead]
        for source, rows in unrouted.items():
            if not counted:
                s.metrics.unrouted.labels(source).inc(rows.num_rows)
            seen = versions.get(source, {})
            keep = [q for q, v in seen.items()
                    if s.routes.unrouted_mode(source, v) == "dead_letter"]
            if keep:
                chosen = rows.filter(pc.is_in(rows.column("_sequence"),
                                              pa.array(keep, pa.int64())))
                parts.append(unrouted_dead_letters(source, chosen, locations))
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def where_errors(self, failed: dict[str, pa.Table], locations: dict[int, str]
                     ) -> list[pa.Table]:
        """Count and dead-letter each source's events a ``where`` raised an error on
        (reason ``where_error``): a mapping error of the event, whatever the source's
        ``unrouted`` says, never a routing decision."""
        out = []
        for source, rows in failed.items():
            self.state.metrics.where_errors.labels(source).inc(rows.num_rows)
            out.append(where_error_dead_letters(source, rows, locations))
        return out

    def commit_dead(self, dead: list[pa.Table], sequence: int, result: RunResult) -> None:
        """Commit the run's dead letters (the decode's, unrouted, refused rows) last."""
        rows = pa.concat_tables(dead) if len(dead) > 1 else dead[0]
        if rows.num_rows:
            outcome = self.commit(DEAD_LETTER_TABLE, rows, sequence,
                                  sequences=result.sequences, source=None)
            result.dead_letters = outcome.rows
            for reason in rows.column("reason").to_pylist()[: outcome.rows]:
                self.state.metrics.dead_letters.labels(reason.split(":", 1)[0]).inc()
            self.state.hook(f"after_commit:{DEAD_LETTER_TABLE}")

    def observe_staged(self, table: str, state: StagingState) -> None:
        metrics = self.state.metrics
        metrics.staged_rows.labels(table).set(state.rows)
        metrics.staged_bytes.labels(table).set(state.bytes)
        oldest = state.oldest_ms
        metrics.staged_oldest.labels(table).set(0 if oldest is None else oldest / 1000)


def versions_of(entries: list[Entry]) -> dict[str, dict[int, int]]:
    """Per source: each entry holding its events → the registry version it came with."""
    out: dict[str, dict[int, int]] = {}
    for entry in entries:
        for stream in entry.streams:
            out.setdefault(stream, {})[entry.sequence] = entry.registry_version
    return out


def upsert_columns(routes: Routes) -> dict[str, tuple[str, ...]]:
    """Per source, the primary-key and tombstone columns of its upsert sinks (and a change
    stream's position column): what the
    cluster output path collects to the driver with each row's keys (the embedded path,
    which has the rows, ignores it)."""
    out: dict[str, tuple[str, ...]] = {}
    for source, targets in routes.targets.items():
        names: list[str] = []
        for target in targets:
            sink = target.sink
            if not sink.primary_key:
                continue
            extra: tuple[str, ...] = (sink.tombstone_field,) if sink.tombstone_field else ()
            if sink.cdc is not None:  # a change stream's position orders its changes
                extra += (POSITION_COLUMN,)
            names += [n for n in (*sink.primary_key, *extra) if n not in names]
        if names:
            out[source] = tuple(names)
    return out

