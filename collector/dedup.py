"""Drop rows whose ``(stream, _event_id)`` was already committed within a time window.

Why: the commit protocol makes every *manifest entry* land once, but a client that retries
a request (same event ids, or the same ``Idempotency-Key``) after a lost response creates a
second entry with the same events. Remembering recently committed ids per stream turns that
into "exactly once" end to end. The window is bounded in time (ids older than the window
are forgotten, by their ``_received_at``) and in size (``max_ids``, oldest first), so memory
stays bounded; after a restart the window is rebuilt from the table's recent commits.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import GreaterThan
from pyiceberg.table import Table

from pipeline.commit import NO_SEQUENCE, SEQUENCE_PROP


@dataclass(slots=True)
class _Chunk:
    newest_ms: int
    ids: list[str]


@dataclass(slots=True)
class DedupWindow:
    """Recently committed event ids of one stream."""

    window_s: float
    max_ids: int
    seen: set[str] = field(default_factory=set)
    chunks: deque[_Chunk] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.seen)

    def filter(self, rows: pa.Table) -> tuple[pa.Table, int]:
        """Rows not seen before (and the first of repeats within ``rows``); dropped count."""
        if self.window_s <= 0 or rows.num_rows == 0:
            return rows, 0
        keep = self._keep(rows.column("_event_id").to_pylist())
        if keep is None:
            return rows, 0
        return rows.filter(pa.array(keep, pa.bool_())), keep.count(False)

    def filter_in_sequence_order(self, rows: pa.Table) -> tuple[pa.Table, int]:
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
        keep = self._keep(rows.column("_event_id").take(order).to_pylist())
        if keep is None:
            return rows, 0
        mask = np.empty(rows.num_rows, dtype=np.bool_)
        mask[order.to_numpy()] = keep
        return rows.filter(pa.array(mask)), keep.count(False)

    def _keep(self, ids: list[str]) -> list[bool] | None:
        """Which ids (in order) are new; None when all of them are."""
        seen = self.seen
        batch: set[str] = set()
        keep: list[bool] = []
        append = keep.append
        for event_id in ids:
            if event_id in seen or event_id in batch:
                append(False)
            else:
                batch.add(event_id)
                append(True)
        return None if len(batch) == len(keep) else keep

    def remember(self, rows: pa.Table, now_s: float | None = None) -> None:
        """Add the ids of rows committed now, then forget what fell out of the window."""
        if self.window_s <= 0 or rows.num_rows == 0:
            return
        now = now_s if now_s is not None else time.time()
        self.add(rows.column("_event_id").to_pylist(), int(now * 1000), now)

    def add(self, ids: list[str], committed_ms: int, now_s: float | None = None) -> None:
        """Add ids committed at ``committed_ms`` (chunks must come oldest first)."""
        if self.window_s <= 0 or not ids:
            return
        self.seen.update(ids)
        self.chunks.append(_Chunk(committed_ms, ids))
        self.expire(now_s)

    def rebuild(self, table: Table, now_s: float | None = None) -> None:
        """Refill the window from a table after a restart, by *commit* time.

        Why the snapshot log and not ``_received_at``: the window promises "committed within
        the last window_s"; after a backlog, rows received long ago may have been committed
        seconds ago. Each snapshot says when it was committed and up to which manifest
        sequence, so rows are grouped into one chunk per snapshot (by ``_sequence``),
        starting after the sequence of the newest snapshot older than the window.
        """
        if self.window_s <= 0:
            return
        now = now_s if now_s is not None else time.time()
        cutoff_ms = int((now - self.window_s) * 1000)
        marks: list[tuple[int, int]] = []  # (sequence, committed_ms), newest first
        after = NO_SEQUENCE
        snapshot = table.current_snapshot()
        while snapshot is not None:
            props = snapshot.summary.additional_properties if snapshot.summary else {}
            if SEQUENCE_PROP in props:
                if snapshot.timestamp_ms < cutoff_ms:
                    after = int(props[SEQUENCE_PROP])
                    break
                marks.append((int(props[SEQUENCE_PROP]), snapshot.timestamp_ms))
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        if not marks:
            return
        rows = table.scan(row_filter=GreaterThan("_sequence", after),
                          selected_fields=("_event_id", "_sequence")).to_arrow()
        rows = rows.sort_by("_sequence")
        sequences = rows.column("_sequence").to_numpy()
        ids = rows.column("_event_id").to_pylist()
        begin = 0
        for sequence, committed_ms in reversed(marks):  # oldest commit first
            end = int(np.searchsorted(sequences, sequence, side="right"))
            if end > begin:
                self.add(ids[begin:end], committed_ms, now)
                begin = end
        if begin < len(ids):  # rows beyond the last mark (should not happen): keep them
            self.add(ids[begin:], int(now * 1000), now)

    def expire(self, now_s: float | None = None) -> None:
        cutoff_ms = int(((now_s if now_s is not None else time.time()) - self.window_s) * 1000)
        chunks, seen = self.chunks, self.seen
        while chunks and (chunks[0].newest_ms < cutoff_ms or len(seen) > self.max_ids):
            seen.difference_update(chunks.popleft().ids)
        if not chunks:
            seen.clear()
