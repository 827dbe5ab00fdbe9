"""Drop rows whose ``(source, _event_id)`` was already committed to a table within a window.

Why: the commit protocol makes every *manifest entry* land once, but a client that retries
a request (same event ids, or the same ``Idempotency-Key``) after a lost response creates a
second entry with the same events. Remembering the ids recently committed to each table
turns that into "exactly once" end to end.

Why keyed by source within a table: event ids are only unique per source (business ids via
``event_id_field`` and idempotency keys collide across sources in real life). When a table
passes from one source to another (a sink moved between sources), the new source's events
must not be dropped because the old one used the same ids; and a fanned-out event still
lands once in each of its sinks, because each table has a window of its own. A table has
no per-row source column, so each commit records which source its sequences came from in
its snapshot summary (:data:`~pipeline.iceberg.commit.SOURCES_PROP`); rows decoded in one run carry
it in a ``_source`` column that is dropped before the commit (:func:`without_source`).

The window is bounded in time (ids committed more than ``window_s`` ago, by the store's
clock, are forgotten) and in size (``max_ids``, oldest first, part of a commit at a time),
so memory stays bounded; when the size bound cuts into the time window, it is logged and
reported (``on_effective``). After a restart the window is rebuilt from the table's recent
commits only, never by scanning the whole table (:meth:`DedupWindow.rebuild`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import GreaterThanOrEqual
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.snapshots import Operation, Snapshot

from collector.journal import JournalView
from icefloe.clock import SYSTEM, Clock
from pipeline.iceberg import (
    NO_SEQUENCE,
    SEQUENCE_PROP,
    SEQUENCES_PROP,
    SHARD_BITS,
    SOURCES_PROP,
    SourceRun,
    committed_at_ms,
    decode_sequences,
    decode_sources,
    encode_sources,
    history_cut,
    position,
)

log = logging.getLogger("icefloe.collector")

SOURCE_COLUMN = "_source"
"""The source a decoded row came from; never committed (see :func:`without_source`)."""
ANY_SOURCE = "*"
"""Ids of unknown source (commits and staged files of older icefloe versions): they count
as seen for every source, as the per-table window of those versions did."""

_EMPTY: frozenset[str] = frozenset()
_LOCAL = (1 << SHARD_BITS) - 1


@dataclass(slots=True)
class _Chunk:
    """Ids of one source committed at ``committed_ms``; ``ids[:start]`` already evicted."""

    committed_ms: int
    source: str
    ids: list[str]
    start: int = 0


@dataclass(frozen=True, slots=True)
class _Mark:
    """One commit the rebuild replays: its sequence, time and source runs (None: legacy)."""

    sequences: dict[int, int]
    """Committed sequence per shard after this commit."""
    committed_ms: int
    runs: list[SourceRun] | None
    """Source runs over run positions (shard << SHARD_BITS | sequence)."""
    snapshot: Snapshot | None = None
    """The upsert commit itself when it replaced rows (an overwrite that records its
    sources): the rows it removed are read back from the files it deleted."""


def with_source(rows: pa.Table, source: str) -> pa.Table:
    """``rows`` of one source, tagged with it (so tables built from several sources keep
    each row's origin until the commit)."""
    column = pa.repeat(pa.scalar(source, pa.string()), rows.num_rows)
    if SOURCE_COLUMN in rows.column_names:
        return rows.set_column(rows.column_names.index(SOURCE_COLUMN), SOURCE_COLUMN, column)
    return rows.append_column(SOURCE_COLUMN, column)


def without_source(rows: pa.Table) -> pa.Table:
    """``rows`` as they are committed: the ``_source`` tag removed."""
    if SOURCE_COLUMN in rows.column_names:
        return rows.drop_columns([SOURCE_COLUMN])
    return rows


def row_sources(rows: pa.Table, default: str = ANY_SOURCE) -> str | list[str]:
    """The source of each row: one string when all agree, else one per row; rows without
    a tag (staged by an older version) get ``default``."""
    if SOURCE_COLUMN not in rows.column_names or rows.num_rows == 0:
        return default
    column = rows.column(SOURCE_COLUMN)
    if column.null_count:
        column = pc.fill_null(column, default)
    unique = pc.unique(column)
    if len(unique) == 1:
        return str(unique[0].as_py())
    return column.to_pylist()


def source_runs(rows: pa.Table, default: str = ANY_SOURCE) -> list[SourceRun]:
    """``[(source, first, last)]`` over the distinct sequences of ``rows``, in sequence
    order, consecutive sequences of one source merged: what a commit records in
    :data:`~pipeline.iceberg.commit.SOURCES_PROP` (one run in the usual case)."""
    if rows.num_rows == 0:
        return []
    sources = row_sources(rows, default)
    if isinstance(sources, str):
        seq = rows.column("_sequence")
        return [(sources, int(pc.min(seq).as_py()), int(pc.max(seq).as_py()))]
    pairs = pa.table({"s": rows.column("_sequence"), "src": pa.array(sources, pa.string())})
    pairs = pairs.group_by(["s", "src"]).aggregate([]).sort_by("s")
    runs: list[SourceRun] = []
    for sequence, source in zip(pairs.column("s").to_pylist(),
                                pairs.column("src").to_pylist(), strict=True):
        if runs and runs[-1][0] == source:
            runs[-1] = (source, runs[-1][1], sequence)
        else:
            runs.append((source, sequence, sequence))
    return runs


def sources_props(rows: pa.Table, default: str = ANY_SOURCE) -> dict[str, str]:
    """The summary property that lets :meth:`DedupWindow.rebuild` key ``rows`` by source."""
    runs = source_runs(rows, default)
    return {SOURCES_PROP: encode_sources(runs)} if runs else {}


@dataclass(slots=True)
class DedupWindow:
    """Recently committed event ids of one table, by source.

    ``clock`` is the store's clock (:class:`~icefloe.clock.StoreClock`): commit times and
    the window's edge are both read from it, so a host whose clock is off neither forgets
    ids early nor keeps them forever. ``on_effective(seconds, ids)`` is told how far back
    the window reaches after every change (``window_s`` unless ``max_ids`` cut it short).
    """

    window_s: float
    max_ids: int
    name: str = ""
    clock: Clock = SYSTEM
    on_effective: Callable[[float, int], None] | None = None
    seen: dict[str, set[str]] = field(default_factory=dict)
    chunks: deque[_Chunk] = field(default_factory=deque)
    size: int = 0
    cut_ms: int | None = None
    """Commit time of the newest ids the size bound evicted (None: it never did)."""
    hold_s: float | None = None
    """Store time of the oldest event not yet committed (the first unacknowledged entry,
    or the oldest staged row); None when nothing waits. Ids are kept until ``window_s``
    before it, not before now: a retry sent seconds after its original but committed after
    a collector outage or a backlog must still find the original (see :meth:`edge_s`)."""
    _short: bool = False

    def __len__(self) -> int:
        return self.size

    def ids(self, source: str) -> set[str]:
        """The ids remembered for ``source`` (a copy; for tests and inspection)."""
        return set(self.seen.get(source, _EMPTY))

    # -- filtering --------------------------------------------------------------------

    def filter(self, rows: pa.Table, source: str = ANY_SOURCE) -> tuple[pa.Table, int]:
        """Rows not seen before (and the first of repeats within ``rows``); dropped count.
        ``source``: of rows without a ``_source`` column."""
        if self.window_s <= 0 or rows.num_rows == 0:
            return rows, 0
        keep = self._keep(rows.column("_event_id").to_pylist(), row_sources(rows, source))
        if keep is None:
            return rows, 0
        return rows.filter(pa.array(keep, pa.bool_())), keep.count(False)

    def filter_in_sequence_order(self, rows: pa.Table, source: str = ANY_SOURCE
                                 ) -> tuple[pa.Table, int]:
        """:meth:`filter` as if ``rows`` were stably sorted by ``_sequence``, but without
        reordering them.

        Why sequence order: Spark returns a run in partition order, and partitions are
        balanced by size, not sequence. Deduplication keeps the *first* copy of an id and
        the replay filter drops rows at or below a table's committed sequence; only in
        sequence order do the two agree (a retried copy in a later entry must lose to the
        original, which the table may already hold). Why not sort the rows: that copies
        every column (~0.1-0.5 s per 1M rows) while only the ids need the order; here rows
        are copied only when some are dropped.
        """
        if self.window_s <= 0 or rows.num_rows == 0:
            return rows, 0
        order = pc.sort_indices(rows.column("_sequence"))  # stable
        sources = row_sources(rows, source)
        if not isinstance(sources, str):
            sources = [sources[i] for i in order.to_numpy()]
        keep = self._keep(rows.column("_event_id").take(order).to_pylist(), sources)
        if keep is None:
            return rows, 0
        mask = np.empty(rows.num_rows, dtype=np.bool_)
        mask[order.to_numpy()] = keep
        return rows.filter(pa.array(mask)), keep.count(False)

    def _keep(self, ids: list[str], sources: str | list[str]) -> list[bool] | None:
        """Which ids (in order) are new; None when all of them are."""
        if isinstance(sources, str) and sources != ANY_SOURCE:
            return self._keep_one(ids, self.seen.get(sources, _EMPTY),
                                  self.seen.get(ANY_SOURCE, _EMPTY))
        per_row = [sources] * len(ids) if isinstance(sources, str) else sources
        batch: set[tuple[str, str]] = set()
        keep: list[bool] = []
        for source, event_id in zip(per_row, ids, strict=True):
            key = (source, event_id)
            if key in batch or self._seen(source, event_id):
                keep.append(False)
            else:
                batch.add(key)
                keep.append(True)
        return None if len(batch) == len(keep) else keep

    @staticmethod
    def _keep_one(ids: list[str], seen: set[str] | frozenset[str],
                  unknown: set[str] | frozenset[str]) -> list[bool] | None:
        """The fast path: every row of one source."""
        batch: set[str] = set()
        keep: list[bool] = []
        append = keep.append
        for event_id in ids:
            if event_id in seen or event_id in batch or event_id in unknown:
                append(False)
            else:
                batch.add(event_id)
                append(True)
        return None if len(batch) == len(keep) else keep

    def _seen(self, source: str, event_id: str) -> bool:
        if source == ANY_SOURCE:  # of unknown source: a repeat of any source's id
            return any(event_id in ids for ids in self.seen.values())
        return (event_id in self.seen.get(source, _EMPTY)
                or event_id in self.seen.get(ANY_SOURCE, _EMPTY))

    # -- remembering ------------------------------------------------------------------

    def remember(self, rows: pa.Table, source: str = ANY_SOURCE,
                 now_s: float | None = None) -> None:
        """Add the ids of rows committed now, then forget what fell out of the window."""
        if self.window_s <= 0 or rows.num_rows == 0:
            return
        now = self.clock.time() if now_s is None else now_s
        sources = row_sources(rows, source)
        ids = rows.column("_event_id").to_pylist()
        if isinstance(sources, str):
            self._append(sources, ids, int(now * 1000))
        else:
            grouped: dict[str, list[str]] = {}
            for src, event_id in zip(sources, ids, strict=True):
                grouped.setdefault(src, []).append(event_id)
            for src, group in grouped.items():
                self._append(src, group, int(now * 1000))
        self.expire(now)

    def add(self, ids: list[str], committed_ms: int, now_s: float | None = None, *,
            source: str = ANY_SOURCE) -> None:
        """Add ids committed at ``committed_ms`` (chunks must come oldest first)."""
        if self.window_s <= 0 or not ids:
            return
        self._append(source, ids, committed_ms)
        self.expire(now_s)

    def _append(self, source: str, ids: list[str], committed_ms: int) -> None:
        seen = self.seen.setdefault(source, set())
        before = len(seen)
        seen.update(ids)
        self.size += len(seen) - before
        self.chunks.append(_Chunk(committed_ms, source, ids))

    # -- forgetting -------------------------------------------------------------------

    def expire(self, now_s: float | None = None) -> None:
        """Forget ids committed before the window; then, while more than ``max_ids`` are
        remembered, the oldest ids one by one (never a whole recent commit at once)."""
        now = self.clock.time() if now_s is None else now_s
        cutoff_ms = int((self.edge_s(now) - self.window_s) * 1000)
        chunks = self.chunks
        while chunks and chunks[0].committed_ms < cutoff_ms:
            head = chunks.popleft()
            self._forget(head.source, head.ids[head.start:])
        while self.size > self.max_ids and chunks:
            head = chunks[0]
            take = min(self.size - self.max_ids, len(head.ids) - head.start)
            self._forget(head.source, head.ids[head.start:head.start + take])
            head.start += take
            self.cut_ms = max(self.cut_ms or head.committed_ms, head.committed_ms)
            if head.start >= len(head.ids):
                chunks.popleft()
            elif head.start * 2 > len(head.ids):  # drop references to evicted ids
                head.ids, head.start = head.ids[head.start:], 0
        if not chunks:
            self.seen.clear()
            self.size = 0
        self._report(now, cutoff_ms)

    def _forget(self, source: str, ids: list[str]) -> None:
        seen = self.seen.get(source)
        if seen is None:
            return
        before = len(seen)
        seen.difference_update(ids)
        self.size -= before - len(seen)
        if not seen:
            del self.seen[source]

    def effective_s(self, now_s: float | None = None) -> float:
        """How far back the window reaches: ``window_s``, or less while the ids evicted by
        ``max_ids`` were committed within it."""
        now = self.clock.time() if now_s is None else now_s
        if self.cut_ms is None or self.cut_ms < (now - self.window_s) * 1000:
            return self.window_s
        return max(0.0, now - self.cut_ms / 1000)

    def _report(self, now: float, cutoff_ms: int) -> None:
        effective = self.effective_s(now)
        short = effective < self.window_s
        if short and not self._short:
            log.warning("dedup window of %s: collector.dedup_max_ids (%d) cuts it to the "
                        "last %.0f s instead of collector.dedup_window_s (%.0f s): a retry "
                        "older than that is committed again; raise dedup_max_ids",
                        self.name or "?", self.max_ids, effective, self.window_s,
                        extra={"table": self.name, "effective_s": round(effective, 1)})
        elif self._short and not short:
            log.info("dedup window of %s covers collector.dedup_window_s (%.0f s) again",
                     self.name or "?", self.window_s)
        self._short = short
        if self.on_effective is not None:
            self.on_effective(effective, self.size)

    # -- after a restart --------------------------------------------------------------

    def edge_s(self, now: float) -> float:
        """The time the window reaches back from: now, or the oldest event still waiting
        to be committed when that is older (its retries may follow it by seconds, however
        late the collector commits them)."""
        return now if self.hold_s is None else min(now, self.hold_s)

    def cutoff_ms(self, now_s: float | None = None) -> int:
        """Store time (ms) the window reaches back to: ``window_s`` before :meth:`edge_s`."""
        now = self.clock.time() if now_s is None else now_s
        return int((self.edge_s(now) - self.window_s) * 1000)

    def rebuild(self, table: Table, now_s: float | None = None,
                journal: JournalView | None = None) -> None:
        """Refill the window after a restart, by *commit* time: from the dedup journal
        (:mod:`collector.journal`) where it reaches back far enough, else (commits made
        before the journal began) from the table's snapshot log.

        Why the journal first: it holds exactly the ids each commit accepted (tombstones
        too, never the rows a copy-on-write commit copied), whatever expiry, compaction
        or another engine did to the snapshots since. Where the window reaches back before
        the journal began, those older commits are read as :meth:`_rebuild_from_log`
        does; if the snapshot log no longer reaches the window's start either, the window
        cannot be known there and that is said (a warning, and the effective-window
        metric shows where it ends) rather than assumed.
        """
        if self.window_s <= 0:
            return
        now = self.clock.time() if now_s is None else now_s
        cutoff = self.cutoff_ms(now)
        if journal is None or not journal.covers(cutoff):
            before = None if journal is None else journal.marker.since_ms
            self._rebuild_from_log(table, now, before_ms=before)
        if journal is not None:
            for record in journal.records:  # oldest first, each committed
                if record.committed_ms < cutoff:
                    continue
                for source, ids in record.ids.items():
                    if ids:
                        self._append(source, ids, record.committed_ms)
            if journal.capped_ms is not None:  # max_ids reached: older records left out
                self.cut_ms = max(self.cut_ms or journal.capped_ms, journal.capped_ms)
        self.expire(now)

    def _rebuild_from_log(self, table: Table, now: float, before_ms: int | None = None
                          ) -> None:
        """Refill the window from a table's snapshot log, by *commit* time.

        Why the snapshot log and not ``_received_at``: the window promises "committed within
        the last window_s"; after a backlog, rows received long ago may have been committed
        seconds ago. Each icefloe commit records when it was committed (store clock), up to
        which manifest sequence, and which source each of its sequences came from; only the
        rows of commits within the window are read (``_sequence`` at or above the lowest
        sequence those commits added), newest commits first until ``max_ids`` are found,
        and grouped into chunks per commit and source. So neither snapshot expiry nor a
        large table makes the rebuild scan the whole table. Commits of older versions (no
        source runs) are read as before, their ids counted for every source.

        ``before_ms`` (the journal's start): only commits before it are added (the journal
        holds the rest); and a log that expiry cut short inside the window is reported.
        """
        cutoff = self.cutoff_ms(now)
        marks, floor, capped_ms = self._marks(table, cutoff)
        if before_ms is not None:
            self._report_cut_log(table, marks, floor, cutoff, before_ms)
        if not marks:
            return
        previous = dict(floor)  # per shard: the sequence below the replayed commits
        firsts: dict[int, int] = {}
        for _, first, _ in marks[0].runs or ():  # the oldest mark's lowest added sequence
            shard, local = first >> SHARD_BITS, first & _LOCAL
            firsts[shard] = min(firsts.get(shard, local), local)
        for shard, local in firsts.items():
            previous[shard] = max(previous.get(shard, NO_SEQUENCE), local - 1)
        shards = {shard for mark in marks for shard in mark.sequences}
        lowest = min(previous.get(shard, NO_SEQUENCE) for shard in shards) if shards \
            else NO_SEQUENCE
        positions, ids = _positions(table, lowest + 1,
                                    [m.snapshot for m in marks if m.snapshot is not None])

        def between(first: int, last: int) -> list[str]:
            begin = int(np.searchsorted(positions, first, side="left"))
            end = int(np.searchsorted(positions, last, side="right"))
            return ids[begin:end]

        for mark in marks:  # oldest commit first; per shard, what it added
            for shard, through in sorted(mark.sequences.items()):
                start = position(shard, previous.get(shard, NO_SEQUENCE) + 1)
                end = position(shard, through) if through >= 0 else start - 1
                runs = mark.runs or [(ANY_SOURCE, start, end)]
                for source, first, last in runs:
                    part = between(max(first, start), min(last, end))
                    if part and (before_ms is None or mark.committed_ms < before_ms):
                        self._append(source, part, mark.committed_ms)
                previous[shard] = max(previous.get(shard, NO_SEQUENCE), through)
        rest = [i for p, i in zip(positions.tolist(), ids, strict=True)
                if p >> SHARD_BITS in shards
                and (p & _LOCAL) > previous.get(p >> SHARD_BITS, NO_SEQUENCE)]
        if rest and before_ms is None:  # rows beyond the last mark (should not happen)
            self._append(ANY_SOURCE, rest, int(now * 1000))
        if capped_ms is not None:
            self.cut_ms = max(self.cut_ms or capped_ms, capped_ms)

    def _report_cut_log(self, table: Table, marks: list[_Mark], floor: dict[int, int],
                        cutoff_ms: int, journal_ms: int) -> None:
        """Say so when the snapshot log ends inside the window before the journal began:
        snapshots there were expired (by another tool), and the ids of their commits are
        not known. The effective window then ends at the oldest commit still known."""
        if floor:
            return  # the log reaches a commit older than the window
        oldest = _oldest(table)
        if oldest is None or not history_cut(oldest):
            return  # the table's first commit is in the window: nothing before it
        known_ms = min(marks[0].committed_ms, journal_ms) if marks else journal_ms
        if known_ms <= cutoff_ms:
            return
        self.cut_ms = max(self.cut_ms or known_ms, known_ms)
        log.warning("dedup window of %s: its snapshot log ends at a commit of %s and its "
                    "dedup journal began at %s, after the window's start (%s): older "
                    "snapshots were expired outside icefloe, so a retry of a request "
                    "committed before %s is committed again. Nothing to do but wait: the "
                    "journal covers the whole window from %s on", self.name or table.name(),
                    _utc(known_ms), _utc(journal_ms), _utc(cutoff_ms), _utc(known_ms),
                    _utc(journal_ms + int(self.window_s * 1000)),
                    extra={"table": self.name, "known_ms": known_ms})

    def _marks(self, table: Table, cutoff_ms: int
               ) -> tuple[list[_Mark], dict[int, int], int | None]:
        """The commits to replay (oldest first), the sequences below them per shard, and
        the commit time of the newest in-window commit left out because ``max_ids`` were
        reached."""
        marks: list[_Mark] = []
        floor: dict[int, int] = {}
        capped_ms: int | None = None
        found = 0
        snapshot = table.current_snapshot()
        while snapshot is not None:
            props = snapshot.summary.additional_properties if snapshot.summary else {}
            if SEQUENCE_PROP in props and _is_append(snapshot):
                committed = committed_at_ms(snapshot)
                sequence = decode_sequences(props.get(SEQUENCES_PROP)) or \
                    {0: int(props[SEQUENCE_PROP])}
                if committed < cutoff_ms:
                    floor = sequence
                    break
                if found >= self.max_ids:  # enough ids: older commits are left out
                    floor, capped_ms = sequence, committed
                    break
                upsert = snapshot.summary is not None \
                    and snapshot.summary.operation == Operation.OVERWRITE
                marks.append(_Mark(sequence, committed, decode_sources(
                    props.get(SOURCES_PROP)), snapshot if upsert else None))
                found += int(props.get("added-records", 0) or 0)
            snapshot = _parent(table, snapshot)
        marks.reverse()
        return marks, floor, capped_ms


def _utc(ms: int) -> str:
    """A store time (ms) as an operator reads it."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def _oldest(table: Table) -> Snapshot | None:
    """The oldest snapshot of the log (the end of the walk from the current one)."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        parent = _parent(table, snapshot)
        if parent is None:
            return snapshot
        snapshot = parent
    return None


def _is_append(snapshot: Snapshot) -> bool:
    """A commit that added rows (icefloe's compactions carry the sequence forward in an
    overwrite; they add no ids and say nothing about the window). An upsert's overwrite
    records its sources (:data:`SOURCES_PROP`) like an append: it added the run's rows."""
    if snapshot.summary is None or snapshot.summary.operation == Operation.APPEND:
        return True
    return SOURCES_PROP in snapshot.summary.additional_properties


def _positions(table: Table, low: int, upserts: list[Snapshot] | None = None
               ) -> tuple[np.ndarray, list[str]]:
    """Run positions (sorted) and event ids of the rows with ``_sequence >= low``; rows of
    tables written before shards (no ``_shard``, or null) are shard 0's.

    ``upserts``: copy-on-write commits of the window. The rows they replaced or deleted
    are no longer in the table, but their event ids were committed within the window: a
    retry of one must still be dropped after a restart, as it is in memory, or a stale
    update would win again. They are read from the files those commits removed (still
    reachable from the window's snapshots)."""
    has_shard = "_shard" in {f.name for f in table.schema().fields}
    fields = ("_event_id", "_sequence", "_shard") if has_shard else ("_event_id", "_sequence")
    row_filter = GreaterThanOrEqual("_sequence", max(low, 0))
    rows = table.scan(row_filter=row_filter, selected_fields=fields).to_arrow()
    replaced = _replaced_rows(table, upserts or [], fields, row_filter)
    if replaced is not None and replaced.num_rows:
        rows = pa.concat_tables([rows.select(fields), replaced.select(fields)])
        rows = rows.group_by(list(fields)).aggregate([])  # kept rows are in both
    pos = rows.column("_sequence").combine_chunks().to_numpy(zero_copy_only=False)
    pos = pos.astype(np.int64)
    if has_shard:
        shard = pc.fill_null(rows.column("_shard"), 0).combine_chunks()
        pos = pos | (shard.to_numpy(zero_copy_only=False).astype(np.int64) << SHARD_BITS)
    order = np.argsort(pos, kind="stable")
    ids = rows.column("_event_id").to_pylist()
    return pos[order], [ids[i] for i in order]


def _replaced_rows(table: Table, upserts: list[Snapshot], fields: tuple[str, ...],
                   row_filter: GreaterThanOrEqual) -> pa.Table | None:
    """The rows (``fields``) of the data files ``upserts`` deleted; None when there are
    none, or when they cannot be read (logged: the window then holds the table's rows
    only, as before upserts)."""
    if not upserts:
        return None
    try:
        tasks = [FileScanTask(entry.data_file) for snapshot in upserts
                 for manifest in snapshot.manifests(table.io)
                 if manifest.added_snapshot_id == snapshot.snapshot_id
                 for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
                 if entry.status == ManifestEntryStatus.DELETED
                 and entry.snapshot_id == snapshot.snapshot_id]
        if not tasks:
            return None
        return ArrowScan(table.metadata, table.io, table.schema().select(*fields),
                         row_filter).to_table(tasks)
    except Exception as exc:  # an unreadable file must not stop the collector's start
        log.warning("dedup window of %s: cannot read the rows its upserts replaced (%s); "
                    "a retry of one of them is committed again", table.name(), exc)
        return None


def _parent(table: Table, snapshot: Snapshot) -> Snapshot | None:
    parent = snapshot.parent_snapshot_id
    return table.snapshot_by_id(parent) if parent is not None else None
