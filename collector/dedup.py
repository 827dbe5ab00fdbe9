"""Drop rows whose ``(stream, _event_id)`` was already committed within a time window.

Why: the commit protocol makes every *manifest entry* land once, but a client that retries
a request (same event ids, or the same ``Idempotency-Key``) after a lost response creates a
second entry with the same events. Remembering recently committed ids per stream turns that
into "exactly once" end to end. The window is bounded in time (ids older than the window
are forgotten, by their ``_received_at``) and in size (``max_ids``, oldest first), so memory
stays bounded; after a restart the window is rebuilt from the table's recent rows.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc


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
        seen = self.seen
        batch: set[str] = set()
        keep: list[bool] = []
        append = keep.append
        for event_id in rows.column("_event_id").to_pylist():
            if event_id in seen or event_id in batch:
                append(False)
            else:
                batch.add(event_id)
                append(True)
        dropped = len(keep) - len(batch)
        if not dropped:
            return rows, 0
        return rows.filter(pa.array(keep, pa.bool_())), dropped

    def remember(self, rows: pa.Table, now_s: float | None = None, *,
                 from_table: bool = False) -> None:
        """Add committed rows' ids, then forget what fell out of the window."""
        if self.window_s <= 0 or rows.num_rows == 0:
            return
        ids = rows.column("_event_id").to_pylist()
        now = now_s if now_s is not None else time.time()
        # Kept for the window from now (commit time); a rebuild after a restart uses the
        # rows' receive time, which precedes their commit by about one commit interval.
        newest = now * 1000
        if rows.num_rows:
            received = pc.max(rows.column("_received_at")).cast(pa.int64()).as_py() // 1000
            newest = received if from_table else newest
        self.seen.update(ids)
        self.chunks.append(_Chunk(int(newest), ids))
        self.expire(now)

    def expire(self, now_s: float | None = None) -> None:
        cutoff_ms = int(((now_s if now_s is not None else time.time()) - self.window_s) * 1000)
        chunks, seen = self.chunks, self.seen
        while chunks and (chunks[0].newest_ms < cutoff_ms or len(seen) > self.max_ids):
            seen.difference_update(chunks.popleft().ids)
        if not chunks:
            seen.clear()
