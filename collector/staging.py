"""Per-sink staging: a sink with slow import conditions keeps its pending rows as Parquet
files in the object store, so the shared manifest moves on without it.

Why: a sink that commits once an hour (or at 500 MB) must neither pin the manifest (its
entries could not be acknowledged and dequeued for an hour, and every other sink and
ingestor would feel the queue grow) nor keep an hour of rows in the collector's memory.
So each run writes that sink's rows to ``staging/<table>/<first>-<last>-<ulid>.parquet``
(on the cluster output path the executors write them, one file per task) and records the
run's files in ``staging/<table>/state.json`` (the layout: :mod:`icefloe.staging`)
— by compare-and-swap, with the collector epoch — *before* the run's entries are
acknowledged. When the sink's conditions hold (oldest pending row older than
``max_age_s``, or ``max_bytes`` / ``max_events`` reached), all its staged files are
committed in one Iceberg append that records the highest staged sequence, and then dropped
from the state and deleted.

Exactly once, at every crash point:

* before the state write: the run is not acknowledged; the replay stages the rows again
  (an unreferenced file from the first try is an orphan, deleted by :func:`sweep`);
* after the state write, before the ack: the replay skips rows at or below the state's
  staged-through sequence of their shard for this sink — they are staged already;
* after the table commit, before the state update: the table's per-shard sequences
  (``icefloe.sequence``/``icefloe.sequences``) cover the staged files, so the next look
  drops them from the state without committing again (and
  :func:`pipeline.iceberg.commit.commit_rows` filters rows at or below them anyway).

With several manifest shards every sequence above is per shard: the state records how far
each shard is staged, each file the last sequence of each shard it holds, and a chunk's
commit records its files' per-shard maxima (files are staged run by run, so a prefix of
them is a prefix of every shard).

A newer collector fences an older one here too: the state records the epoch of its last
writer, and a write by an older epoch is refused. On takeover the new collector stamps
every existing state and creates (stamped) the state of every table it stages, so the
refusal holds from the takeover on; a collector that creates a state later
confirms the manifest epoch before relying on it (a newer collector that found no state
had bumped the epoch first, so the older one sees it and stops).
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from ulid import ULID

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import NotFound, TableFencedError
from icefloe.registry.model import Conditions
from icefloe.staging import (
    PREFIX,
    StagedFile,
    StagingState,
    data_key,
    merge_through,
    state_key,
    table_of_state,
)
from icefloe.store.base import AsyncObjectStore
from icefloe.store.cas import CasStats, Versioned, cas_document, load_document
from icefloe.store.retry import RetryPolicy
from pipeline.iceberg import SHARD_BITS

log = logging.getLogger("icefloe.collector")

MAX_FILES = 128
"""Beyond this many staged files of a table, the oldest ``MERGE_FILES`` are merged."""
MERGE_FILES = 64
READ_AHEAD = 8
COMMIT_CHUNK_BYTES = 64 * 1024 * 1024
"""Staged Parquet bytes committed per Iceberg append: a 500 MB size condition is committed
as several appends (in sequence order) instead of one decompressed run in memory."""


def due(state: StagingState, conditions: Conditions, now_ms: int) -> str | None:
    """Why the staged rows must be committed now (``age``, ``bytes``, ``events``), or None."""
    if not state.files:
        return None
    oldest = state.oldest_ms
    if oldest is not None and now_ms - oldest >= conditions.max_age_s * 1000:
        return "age"
    if state.bytes >= conditions.max_bytes:
        return "bytes"
    if state.rows >= conditions.max_events:
        return "events"
    return None


_LOCAL = (1 << SHARD_BITS) - 1


def _positions(rows: pa.Table) -> np.ndarray:
    return rows.column("_sequence").combine_chunks().to_numpy(zero_copy_only=False)


def _past(rows: pa.Table, floor: Mapping[int, int]) -> pa.Table:
    """Rows whose run position is past their shard's ``floor`` (absent: -1)."""
    pos = _positions(rows)
    shards = pos >> SHARD_BITS
    limit = np.full(len(pos), -1, dtype=np.int64)
    for shard, seq in floor.items():
        limit[shards == shard] = seq
    return rows.filter(pa.array((pos & _LOCAL) > limit))


def _last_per_shard(rows: pa.Table) -> dict[int, int]:
    """Per shard, the last sequence of ``rows`` (run positions in ``_sequence``)."""
    pos = _positions(rows)
    shards = pos >> SHARD_BITS
    return {int(shard): int((pos[shards == shard] & _LOCAL).max())
            for shard in np.unique(shards)}


def parquet_bytes(rows: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(rows, sink, compression="zstd")
    return sink.getvalue()


@dataclass
class Staged:
    """The outcome of staging one run's rows of one table."""

    rows: int
    skipped: int
    state: StagingState


class StagingArea:
    """Reads and writes the staging states and files of one collector (async)."""

    def __init__(self, store: AsyncObjectStore, *, backoff: RetryPolicy | None = None,
                 confirm: Callable[[], Awaitable[object]] | None = None,
                 clock: Clock = SYSTEM) -> None:
        """``confirm`` raises when this collector was replaced (the collector passes its
        manifest-epoch check); it runs after this area created a state object. ``clock``
        paces the compare-and-swap retries (the simulator drives it)."""
        self.store = store
        self.clock = clock
        self.confirm = confirm
        self._confirmed: set[str] = set()
        self.backoff = backoff or RetryPolicy(max_attempts=20, budget_s=30.0)
        self.stats = CasStats()
        self.states: dict[str, StagingState] = {}

    async def load(self, table: str) -> StagingState:
        doc = await load_document(self.store, state_key(table), StagingState.decode,
                                  lambda: StagingState(table=table), clock=self.clock)
        self.states[table] = doc.value
        return doc.value

    async def _update(self, table: str, epoch: int,
                      change: Callable[[StagingState], StagingState | None]) -> StagingState:
        def mutate(doc: Versioned[StagingState]) -> StagingState | None:
            state = doc.value
            if state.epoch > epoch:  # a newer collector staged here: we were replaced
                raise TableFencedError(f"{table} (staging)", epoch, state.epoch)
            new = change(state)
            if new is None:
                return None
            return msgspec.structs.replace(new, epoch=epoch, revision=state.revision + 1,
                                           table=table)

        loaded, written = await cas_document(
            self.store, state_key(table), StagingState.decode,
            lambda: StagingState(table=table), mutate, backoff=self.backoff,
            stats=self.stats, what="staging state", clock=self.clock)
        state = written if written is not None else loaded.value
        if state.revision == 1 and state.epoch == epoch and table not in self._confirmed:
            # We created it (maybe by a retried PUT whose first answer was lost): a newer
            # collector may have found it missing, so check we are still current.
            if self.confirm is not None:
                await self.confirm()
            self._confirmed.add(table)
        self.states[table] = state
        return state

    async def floor(self, table: str,
                    committed: Mapping[int, int]) -> tuple[StagingState, dict[int, int]]:
        """The state and, per shard, the sequence at or below which ``table``'s rows are
        staged or committed already (``committed``: the table's per-shard sequences): a
        run stages only rows above it."""
        current = self.states.get(table) or await self.load(table)
        return current, merge_through((current.staged_through, committed))

    async def stage(self, table: str, rows: pa.Table, *, committed: Mapping[int, int],
                    epoch: int, through: Mapping[int, int]) -> Staged:
        """Stage ``rows`` (this run's, for ``table``; ``_sequence`` holds run positions)
        durably. ``through`` is the run's last sequence per shard, ``committed`` the
        table's; rows already staged or committed (per shard, at or below the state's
        ``through_sequences`` or ``committed``) are skipped."""
        current, floor = await self.floor(table, committed)
        fresh = _past(rows, floor) if rows.num_rows else rows
        skipped = rows.num_rows - fresh.num_rows
        if fresh.num_rows == 0:
            return Staged(0, skipped, current)
        first = pc.min(fresh["_sequence"]).as_py()
        last = pc.max(fresh["_sequence"]).as_py()
        oldest = pc.min(fresh["_received_at"]).cast(pa.int64()).as_py() // 1000
        data = parquet_bytes(fresh)
        key = data_key(table, first, last, str(ULID()))
        await self.store.put(key, data)
        lasts = _last_per_shard(fresh)
        staged = StagedFile(key, first, last, fresh.num_rows, len(data), oldest,
                            sequences=lasts if any(lasts) else {})
        return await self.record(table, (staged,), epoch=epoch, through=through,
                                 skipped=skipped)

    async def record(self, table: str, files: tuple[StagedFile, ...], *, epoch: int,
                     through: Mapping[int, int], skipped: int = 0) -> Staged:
        """Add one run's staged ``files`` (already in the store; each carrying its
        per-shard last sequences) to the state, staged through ``through`` (the run's
        last sequence per shard), in one compare-and-swap.

        The files of one run are recorded together or not at all: a lost race (the run
        was staged meanwhile, by an earlier attempt whose answer was lost or by a replay)
        leaves them unreferenced, and they are deleted here (else swept). Files of one run
        may overlap in sequences (the cluster path writes one per task); they are kept in
        order of their last sequence, and the import commits overlapping files together
        (:func:`collector.staged_path.chunk_of`)."""
        keys = {f.key for f in files}
        ordered = tuple(sorted(files, key=lambda f: (f.last_sequence, f.first_sequence)))

        def add(state: StagingState) -> StagingState | None:
            if any(f.key in keys for f in state.files):
                return None  # our earlier attempt landed (its response was lost)
            done = state.staged_through
            if all(done.get(shard, -1) >= seq for shard, seq in through.items()):
                return None  # staged meanwhile: our files stay unreferenced
            return msgspec.structs.replace(state, files=(*state.files, *ordered)
                                           ).with_through(through)
        state = await self._update(table, epoch, add)
        rows = sum(f.rows for f in files)
        if not any(f.key in keys for f in state.files):
            for key in keys:
                await self.store.delete(key)
            return Staged(0, rows + skipped, state)
        return Staged(rows, skipped, state)

    async def claim(self, table: str, epoch: int, *, create: bool = False) -> StagingState:
        """Stamp the table's staging state with this collector's epoch, so a replaced
        collector's next staging write is refused from now on (not only after our first
        write). ``create``: the table is staged, so a missing state is created (stamped);
        otherwise a table without staging keeps no state object."""
        doc = await load_document(self.store, state_key(table), StagingState.decode,
                                  lambda: StagingState(table=table), clock=self.clock)
        if (doc.etag is None and not create) or (doc.etag is not None
                                                 and doc.value.epoch == epoch):
            self.states[table] = doc.value
            return doc.value
        return await self._update(table, epoch, lambda state: state)

    async def tables(self) -> list[str]:
        """Every table with a staging state in the store (cached or not)."""
        listing = await self.store.list(f"{PREFIX}/")
        return [table for info in listing.objects
                if (table := table_of_state(info.key)) is not None]

    async def claim_existing(self, epoch: int) -> int:
        """Stamp every staging state in the store with ``epoch`` (takeover), also those of
        tables this collector does not route (yet): a replaced collector's write to any of
        them is refused from now on. Not cached here: only prepared tables are staged or
        committed by this collector. Returns how many states were found."""
        listing = await self.store.list(f"{PREFIX}/")
        tables = [table for info in listing.objects
                  if (table := table_of_state(info.key)) is not None]
        for table in tables:
            cached = table in self.states
            await self.claim(table, epoch)
            if not cached:
                self.states.pop(table, None)
        return len(tables)

    async def read(self, state: StagingState,
                   files: tuple[StagedFile, ...] | None = None, *,
                   each: Callable[[pa.Table], pa.Table] | None = None) -> pa.Table | None:
        """The staged rows of ``files`` (default: all of ``state``), in staging order; None
        when there are none. Fetched a few at a time. ``each`` is applied to every file's
        rows before they are put together (a Protobuf table's files staged before a
        rename: their columns under today's names, or both names would be merged)."""
        chosen = state.files if files is None else files
        if not chosen:
            return None

        async def fetch(staged: StagedFile) -> pa.Table:
            try:
                result = await self.store.get(staged.key)
            except NotFound:
                raise NotFound(f"staged file {staged.key} is missing: the staging area of "
                               f"{state.table} was changed outside icefloe") from None
            return pq.read_table(io.BytesIO(result.data))

        tables: list[pa.Table] = []
        for start in range(0, len(chosen), READ_AHEAD):
            tables += await asyncio.gather(*(fetch(f) for f in chosen[start:start + READ_AHEAD]))
        if each is not None:
            tables = [each(t) for t in tables]
        return pa.concat_tables(tables, promote_options="permissive")

    async def compact(self, table: str, epoch: int, *,
                      each: Callable[[pa.Table], pa.Table] | None = None) -> StagingState:
        """Merge the oldest staged files into one once there are more than ``MAX_FILES``,
        so the state object (rewritten by every run) and the number of objects to read at
        commit time stay bounded however long the age condition is."""
        state = self.states.get(table) or await self.load(table)
        if len(state.files) <= MAX_FILES:
            return state
        group = state.files[:MERGE_FILES]
        rows = await self.read(state, group, each=each)
        assert rows is not None
        first = min(f.first_sequence for f in group)
        last = max(f.last_sequence for f in group)
        data = parquet_bytes(rows)
        key = data_key(table, first, last, str(ULID()))
        await self.store.put(key, data)
        lasts = merge_through(f.through for f in group)
        merged = StagedFile(key, first, last, rows.num_rows, len(data),
                            min(f.oldest_ms for f in group),
                            sequences=lasts if any(lasts) else {})
        keys = [f.key for f in group]

        def swap(current: StagingState) -> StagingState | None:
            if [f.key for f in current.files[:len(keys)]] != keys:
                return None  # changed meanwhile (committed): the merged file is an orphan
            return msgspec.structs.replace(current, files=(merged,
                                                           *current.files[len(keys):]))
        new = await self._update(table, epoch, swap)
        if new.files and new.files[0].key == key:
            for old in keys:
                await self.store.delete(old)
        return new

    async def drop(self, table: str, through: Mapping[int, int], epoch: int) -> StagingState:
        """Forget (and delete) the staged files whose rows the table holds now: those
        whose every shard's last sequence is at or below ``through`` (per shard)."""
        gone: list[str] = []

        def held(staged: StagedFile) -> bool:
            return all(through.get(shard, -1) >= seq for shard, seq in staged.through.items())

        def forget(state: StagingState) -> StagingState | None:
            keep = tuple(f for f in state.files if not held(f))
            if len(keep) == len(state.files):
                return None
            gone[:] = [f.key for f in state.files if held(f)]
            return msgspec.structs.replace(state, files=keep)
        state = await self._update(table, epoch, forget)
        for key in gone:
            await self.store.delete(key)
        return state

    async def sweep(self, table: str, older_than_s: float) -> int:
        """Delete staged files no state references (a run that failed after writing its
        file), once older than ``older_than_s``. Returns how many were deleted."""
        state = await self.load(table)
        referenced = {f.key for f in state.files}
        listing = await self.store.list(f"{PREFIX}/{table}/")
        deleted = 0
        for info in listing.objects:
            if not info.key.endswith(".parquet") or info.key in referenced:
                continue
            if listing.store_time - info.last_modified >= older_than_s:
                await self.store.delete(info.key)
                deleted += 1
        return deleted
