"""The retention index: which committed batch file holds which manifest sequence, kept
after the entry left the manifest, so ``icefloe replay`` can run it again.

Why an index of its own: a dequeue removes an entry from the manifest, and with it the
only record of which file holds which sequence and when it was ingested. With
``[collector] keep_batches_s`` > 0 the collector writes, before it acknowledges a run, one
small **segment** naming the run's entries (per manifest shard):
``retention/index/s<shard>/<first:012d>-<last:012d>.json``. So every acknowledged (and
hence every dequeued) entry is in the index before the manifest forgets it.

Rules that keep it safe:

* **Append-only, create-only.** A segment is written with ``If-None-Match: *`` and never
  changed: two collectors (an old one before it learns it was fenced, and the new one)
  may write overlapping ranges; both say the same about a sequence (manifest entries
  are immutable), so readers take the union by sequence.
* **Compacted by replacement.** Small segments are merged (and expired entries dropped) by
  writing the new segments *first* and deleting the replaced ones after, so at any
  moment the union of the listed segments holds every live entry. A reader that finds a
  listed segment gone lists again (:func:`read_index`): its entries are in a segment
  written before it was deleted.
* **Expiry on the store's clock.** Each entry records ``committed_at`` (store clock,
  seconds) and is kept while ``now - committed_at <= keep_batches_s``; batch-file GC
  (:mod:`collector.gc`) keeps every file a live entry names, and drops expired entries
  from the index before it deletes their files, so the index never promises a file
  it no longer keeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import msgspec

from icefloe.errors import NotFound, PreconditionFailed
from icefloe.manifest.model import Entry
from icefloe.store.base import AsyncObjectStore

INDEX_PREFIX = "retention/index/"
SEGMENT_MAX_ENTRIES = 5000
"""Entries per compacted segment: ~1 MB of JSON, read whole by GC and replay."""
COMPACT_MIN_SEGMENTS = 16
"""Small segments of a shard tolerated before GC merges them."""
_RELIST_ATTEMPTS = 5
_CREATE_ATTEMPTS = 5


class IndexedEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One kept batch file: its manifest entry, shard, and commit time (store clock)."""

    shard: int
    committed_at: float
    entry: Entry

    @property
    def sequence(self) -> int:
        return self.entry.sequence


class Segment(msgspec.Struct, frozen=True, kw_only=True):
    """One index object: entries of one shard, sorted by sequence."""

    format: int
    shard: int
    entries: tuple[IndexedEntry, ...]


class Index(msgspec.Struct, frozen=True, kw_only=True):
    """What the listed segments say: ``entries[shard][sequence]`` and which segment
    keys said it (``segments[shard]``: key -> its sequences)."""

    entries: dict[int, dict[int, IndexedEntry]]
    segments: dict[int, dict[str, tuple[int, ...]]]

    def live(self, now: float, keep_s: float) -> dict[int, dict[int, IndexedEntry]]:
        """The entries still within retention at store time ``now``."""
        return {shard: {seq: e for seq, e in by_seq.items() if not expired(e, now, keep_s)}
                for shard, by_seq in self.entries.items()}


def expired(entry: IndexedEntry, now: float, keep_s: float) -> bool:
    """Whether ``entry`` is past retention at store time ``now`` (``keep_s`` 0: always)."""
    return now - entry.committed_at > keep_s


def segment_key(shard: int, first: int, last: int) -> str:
    return f"{INDEX_PREFIX}s{shard}/{first:012d}-{last:012d}.json"


def _shard_of(key: str) -> int | None:
    rest = key[len(INDEX_PREFIX):]
    head, _, tail = rest.partition("/")
    if not head.startswith("s") or not head[1:].isdigit() or not tail.endswith(".json"):
        return None
    return int(head[1:])


async def write_segment(store: AsyncObjectStore, entries: Sequence[IndexedEntry]) -> str:
    """Create the segment of ``entries`` (one shard, any order); a segment of the same
    range written already (a replayed run, another collector) says the same: kept.

    A refused create is trusted only once the object is seen: S3 answers a conditional
    write racing another with 409 ``ConditionalRequestConflict``, after which neither may
    have been written (the simulator's ``retention`` family found the collector acking
    entries no segment held)."""
    ordered = sorted(entries, key=lambda e: e.sequence)
    shard = ordered[0].shard
    if any(e.shard != shard for e in ordered):
        raise ValueError("a retention segment holds the entries of one shard")
    key = segment_key(shard, ordered[0].sequence, ordered[-1].sequence)
    body = msgspec.json.encode(Segment(format=1, shard=shard, entries=tuple(ordered)))
    for _ in range(_CREATE_ATTEMPTS):
        try:
            await store.put(key, body, if_none_match="*")
            return key
        except PreconditionFailed:
            try:
                await store.head(key)
                return key
            except NotFound:
                continue  # a conflict that wrote nothing: create it again
    raise PreconditionFailed(f"cannot create retention segment {key}: every conditional "
                             f"create was refused and the object is still missing "
                             f"({_CREATE_ATTEMPTS} attempts)", op="put", key=key)


async def record_run(store: AsyncObjectStore, items: Iterable[tuple[int, Entry]],
                     committed_at: float) -> list[str]:
    """Index one committed run's entries (``(shard, entry)`` pairs): one segment per
    shard. Called before the run is acknowledged."""
    by_shard: dict[int, list[IndexedEntry]] = {}
    for shard, entry in items:
        by_shard.setdefault(shard, []).append(
            IndexedEntry(shard=shard, committed_at=committed_at, entry=entry))
    return [await write_segment(store, entries) for entries in by_shard.values()]


async def read_index(store: AsyncObjectStore, cache: dict[str, Segment] | None = None
                     ) -> Index:
    """Every listed segment, merged; lists again when a listed segment vanished (a
    compaction replaced it: its entries are in a segment written before).

    ``cache`` (kept by a long-lived reader such as the collector's GC) holds segments
    already read: a segment never changes once created, so only new keys are fetched, and
    keys no longer listed leave the cache."""
    cache = {} if cache is None else cache
    for _ in range(_RELIST_ATTEMPTS):
        listing = await store.list(INDEX_PREFIX)
        keys = {info.key: shard for info in listing.objects
                if (shard := _shard_of(info.key)) is not None}
        try:
            await _fetch(store, [key for key in keys if key not in cache], cache)
        except NotFound:
            continue
        for key in set(cache) - set(keys):
            del cache[key]
        return _merged({key: cache[key] for key in keys})
    raise NotFound(f"the retention index under {INDEX_PREFIX!r} kept changing while it was "
                   f"read ({_RELIST_ATTEMPTS} listings); try again")


async def _fetch(store: AsyncObjectStore, keys: list[str], cache: dict[str, Segment]) -> None:
    bodies = await asyncio.gather(*(store.get(key) for key in keys))
    for key, got in zip(keys, bodies, strict=True):
        cache[key] = msgspec.json.decode(got.data, type=Segment)


def _merged(segments: dict[str, Segment]) -> Index:
    entries: dict[int, dict[int, IndexedEntry]] = {}
    keys: dict[int, dict[str, tuple[int, ...]]] = {}
    for key, segment in segments.items():
        keys.setdefault(segment.shard, {})[key] = tuple(e.sequence for e in segment.entries)
        mine = entries.setdefault(segment.shard, {})
        for item in segment.entries:
            mine.setdefault(item.sequence, item)
    return Index(entries=entries, segments=keys)


async def compact(store: AsyncObjectStore, index: Index, now: float, keep_s: float) -> int:
    """Drop expired entries and merge small segments (new segments written first, the
    replaced ones deleted after). Returns how many segments were deleted."""
    deleted = 0
    for shard, keys in index.segments.items():
        by_seq = index.entries.get(shard, {})
        stale = {key for key, seqs in keys.items()
                 if any(expired(by_seq[s], now, keep_s) for s in seqs)}
        small = {key for key, seqs in keys.items() if len(seqs) < SEGMENT_MAX_ENTRIES}
        replace = stale | (small if len(small) > COMPACT_MIN_SEGMENTS else set())
        if not replace:
            continue
        keep = sorted({s for key in replace for s in keys[key]
                       if not expired(by_seq[s], now, keep_s)})
        written = set()
        for start in range(0, len(keep), SEGMENT_MAX_ENTRIES):
            chunk = [by_seq[s] for s in keep[start:start + SEGMENT_MAX_ENTRIES]]
            written.add(await write_segment(store, chunk))
        for key in sorted(replace - written):
            await store.delete(key)
            deleted += 1
    return deleted
