"""Which kept batch files a replay runs: ``--from``/``--to`` resolved against the retention
index, refused with the first sequence or time that is no longer kept.

Why refuse a partly expired range instead of replaying what is left: a replay that
silently skips expired batches fills a table that looks complete and is not — the worst
kind of wrong. So every sequence of the range must be in the index within retention, and
its file must still be in the store (a bucket lifecycle rule may have removed it first).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass

from icefloe.errors import IcefloeError
from icefloe.retention import IndexedEntry


class ReplayRefused(IcefloeError):
    """A replay that must not start; the message is the one line the CLI prints."""


class ReplayConflict(IcefloeError):
    """Something else committed to the sink's table during the replay: it stopped."""


@dataclass(frozen=True, slots=True)
class Bound:
    """A ``--from``/``--to`` value: a manifest sequence, or a time (store clock, s)."""

    text: str
    sequence: int | None = None
    time: float | None = None


def parse_bound(text: str, flag: str) -> Bound:
    """``123`` is a sequence; ``2026-12-01T10:00:00Z`` (ISO 8601, UTC when no zone) a time."""
    value = text.strip()
    if value.isdigit():
        return Bound(value, sequence=int(value))
    try:
        when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ReplayRefused(f"{flag} {text!r} is neither a manifest sequence (an integer >= 0) "
                            "nor an ISO 8601 time such as 2026-12-01T10:00:00Z") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return Bound(value, time=when.timestamp())


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds")


def resolve(live: Mapping[int, Mapping[int, IndexedEntry]], start: Bound, end: Bound
            ) -> list[IndexedEntry]:
    """The kept entries of the range, in (shard, sequence) order; refused when any part
    of it is not kept. Sequences name shard 0's; with several shards use times."""
    shards = sorted(shard for shard, by_seq in live.items() if by_seq)
    if not shards:
        raise ReplayRefused("the retention index keeps no batch file: nothing to replay "
                            "(is [collector] keep_batches_s set, and has the collector "
                            "committed since?)")
    if (start.sequence is not None or end.sequence is not None) and shards != [0]:
        raise ReplayRefused(f"the index keeps manifest shards {shards}: sequences are per "
                            "shard, so give --from and --to as times")
    picked: list[IndexedEntry] = []
    for shard in shards:
        picked += _resolve_shard(live[shard], start, end)
    if not picked:
        raise ReplayRefused(f"no kept batch file between --from {start.text} and --to "
                            f"{end.text}")
    return picked


def _resolve_shard(by_seq: Mapping[int, IndexedEntry], start: Bound, end: Bound
                   ) -> list[IndexedEntry]:
    """One shard's part of the range: contiguous, every sequence kept."""
    kept = sorted(by_seq)
    first, last = _first(by_seq, kept, start), _last(by_seq, kept, end)
    if first is None or last is None or first > last:
        return []
    for sequence in range(first, last + 1):
        if sequence not in by_seq:
            raise ReplayRefused(f"sequence {sequence} is no longer kept (expired or deleted "
                                f"from the retention index; kept: {_spans(kept)}): replay a "
                                "range that starts after it")
    return [by_seq[s] for s in range(first, last + 1)]


def _first(by_seq: Mapping[int, IndexedEntry], kept: list[int], start: Bound) -> int | None:
    if start.sequence is not None:
        if start.sequence < kept[0]:
            raise ReplayRefused(f"sequence {start.sequence} is no longer kept (the oldest "
                                f"kept is {kept[0]}): replay from {kept[0]} or later")
        return start.sequence
    assert start.time is not None
    after = [s for s in kept if by_seq[s].entry.ingested_at >= start.time]
    if not after:
        return None
    # a sequence before the first match that is not kept may have held data of the range
    if after[0] > 0 and after[0] - 1 not in by_seq:
        raise ReplayRefused(f"time {start.text} is before the oldest kept batch file "
                            f"(sequence {after[0]}, ingested "
                            f"{_iso(by_seq[after[0]].entry.ingested_at)}); sequence "
                            f"{after[0] - 1} and older are no longer kept")
    return after[0]


def _last(by_seq: Mapping[int, IndexedEntry], kept: list[int], end: Bound) -> int | None:
    if end.sequence is not None:
        if end.sequence > kept[-1]:
            raise ReplayRefused(f"sequence {end.sequence} is not in the retention index (the "
                                f"newest indexed is {kept[-1]}: not committed yet, or "
                                "never kept)")
        return end.sequence
    assert end.time is not None
    before = [s for s in kept if by_seq[s].entry.ingested_at <= end.time]
    return before[-1] if before else None


def _spans(kept: list[int]) -> str:
    """``0-9, 20-29``: the kept sequences as runs (for the refusal message)."""
    runs: list[str] = []
    begin = prev = kept[0]
    for seq in [*kept[1:], -2]:
        if seq != prev + 1:
            runs.append(f"{begin}-{prev}" if begin != prev else str(begin))
            begin = seq
        prev = seq
    return ", ".join(runs[:5]) + (" ..." if len(runs) > 5 else "")
