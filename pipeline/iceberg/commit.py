"""The exactly-once commit protocol: each Iceberg commit records how far it got.

Why the table is the offset store: a commit's snapshot summary carries ``icefloe.sequence``
(the highest manifest sequence whose rows it contains) and ``icefloe.epoch`` (the collector
epoch that wrote it). Data and offset are thus committed in one atomic catalog operation; no
second store (Spark checkpoint, manifest ack) can disagree with the data. On every commit we

1. load the table and read sequence and epoch from *that* snapshot,
2. refuse if the table's epoch is newer than ours (a newer collector took over),
3. drop rows whose ``_sequence`` the table already holds (a replay after a crash),
4. append on the same table object. Tables carry ``commit.retry.num-retries=0``, so the
   catalog rejects the commit if anyone committed in between instead of silently rebasing
   (pyiceberg's default retry would re-append and duplicate).

On a rejected commit *or* an unknown outcome (timeout, catalog 5xx) we reload and re-check
before anything else: if the table now holds our sequence, the commit landed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import msgspec
import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from icefloe.catalog_version import VERSION_PROP
from icefloe.clock import SYSTEM, Clock
from icefloe.errors import CatalogError, OffsetLostError, TableFencedError, TableMismatchError
from pipeline.iceberg.confirm import confirmed

SEQUENCE_PROP = "icefloe.sequence"
SEQUENCES_PROP = "icefloe.sequences"
"""Every manifest shard's committed sequence, as ``shard:sequence`` pairs joined by commas
(``"0:41,1:17,2:9"``), written once a table holds rows of a shard other than 0.
:data:`SEQUENCE_PROP` stays shard 0's, so a single-shard table (and a reader that knows no
shards) reads exactly as before; a table without this property is all shard 0."""
SHARD_BITS = 40
"""Inside a collector run an entry's position ``(shard, sequence)`` travels through the
pipeline as one int64 ``shard << SHARD_BITS | sequence`` (the ``_sequence`` column and the
run spec's sequences), so the decode and SQL steps stay shard-blind; :func:`commit_rows`
splits it into ``_shard`` and ``_sequence`` before the write. Shard 0's positions equal its
sequences, so a single-manifest run is unchanged. 2**40 sequences per shard is centuries at
any CAS rate a shard sustains."""
_SEQ_MASK = (1 << SHARD_BITS) - 1
EPOCH_PROP = "icefloe.epoch"
COMMITTED_AT_PROP = "icefloe.committed-at"
"""Store-clock milliseconds of the commit: ages (expiry, orphan sweep, dedup) are judged by
it, not by ``timestamp-ms``, which is the committing host's clock."""
SOURCES_PROP = "icefloe.sources"
"""Which source the rows of each manifest sequence came from, as JSON runs
``[[source, first, last], ...]`` over the sequences the commit added (see
:mod:`collector.dedup`): the dedup window is keyed by source, and a table keeps no per-row
source column."""
REPLAY_PROP = "icefloe.replay"
"""Snapshot summary key: the id of the ``icefloe replay`` whose marker set the table's offset
(:mod:`collector.replay`); carried by commits that change no rows, as the offset is."""
NO_SEQUENCE = -1

log = logging.getLogger("icefloe.commit")


@dataclass(frozen=True, slots=True)
class CommittedState:
    """What a table's snapshot log says icefloe committed: highest sequence, and by whom."""

    sequence: int = NO_SEQUENCE
    epoch: int = 0
    snapshot_id: int | None = None
    shards: tuple[tuple[int, int], ...] = ()
    """``(shard, sequence)`` of every shard committed (empty: shard 0 only, ``sequence``)."""

    @property
    def sequences(self) -> dict[int, int]:
        """Committed sequence per shard; a shard never committed is absent (-1)."""
        if self.shards:
            return dict(self.shards)
        return {} if self.sequence == NO_SEQUENCE else {0: self.sequence}


def position(shard: int, sequence: int) -> int:
    """An entry's run position (see :data:`SHARD_BITS`)."""
    return shard << SHARD_BITS | sequence


def split_position(pos: int) -> tuple[int, int]:
    """``(shard, sequence)`` of a run position."""
    return pos >> SHARD_BITS, pos & _SEQ_MASK


def encode_sequences(sequences: Mapping[int, int]) -> str:
    return ",".join(f"{shard}:{seq}" for shard, seq in sorted(sequences.items()))


def decode_sequences(text: str | None) -> dict[int, int] | None:
    """:data:`SEQUENCES_PROP` as a dict; None when absent. Unreadable is refused loudly:
    guessing an offset would replay or skip entries."""
    if not text:
        return None
    try:
        return {int(k): int(v) for k, v in (pair.split(":") for pair in text.split(","))}
    except ValueError as exc:
        raise CatalogError(f"{SEQUENCES_PROP} = {text!r} cannot be read") from exc


def offset_props(props: Mapping[str, str]) -> dict[str, str]:
    """The offset properties of a snapshot summary, to carry forward on another commit."""
    return {k: props[k] for k in (SEQUENCE_PROP, SEQUENCES_PROP) if k in props}


def committed_state(table: Table) -> CommittedState:
    """Sequence of the newest snapshot that carries it, and the newest epoch in the log.

    Walks back from the current snapshot past snapshots without the sequence (a maintenance
    commit made by another tool, an epoch-only fence), so the answer survives them; icefloe's
    own commits carry both forward, so the walk normally stops at the first snapshot. The
    epoch is the highest one seen on the way: a fence records the new epoch even where it
    carries no sequence.

    Raises:
        OffsetLostError: the walk ran into an expired snapshot before finding a sequence
            (expiry outside icefloe dropped the offset); answering "nothing committed"
            would replay and duplicate every entry still in the manifest.
    """
    snapshot = table.current_snapshot()
    epoch = 0
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        epoch = max(epoch, int(props.get(EPOCH_PROP, 0)))
        if SEQUENCE_PROP in props:
            shards = decode_sequences(props.get(SEQUENCES_PROP)) or {}
            return CommittedState(int(props[SEQUENCE_PROP]), epoch, snapshot.snapshot_id,
                                  tuple(sorted(shards.items())))
        parent = snapshot.parent_snapshot_id
        older = table.snapshot_by_id(parent) if parent is not None else None
        if older is None and history_cut(snapshot):
            raise OffsetLostError(".".join(table.name()))
        snapshot = older
    return CommittedState(epoch=epoch)


def history_cut(oldest: Snapshot) -> bool:
    """Whether snapshots older than ``oldest`` (the end of the walk) were expired: its
    parent is gone, or (pyiceberg's expiry clears the pointer) its data sequence number
    says commits came before it. In a format-v1 table nothing tells: not judged."""
    return oldest.parent_snapshot_id is not None or (oldest.sequence_number or 0) > 1


def summary_props(sequence: int, epoch: int, committed_ms: int | None = None,
                  sequences: Mapping[int, int] | None = None,
                  version: int | None = None) -> dict[str, str]:
    """Offset and epoch of a commit; ``sequences`` (per shard) adds
    :data:`SEQUENCES_PROP` when it names a shard other than 0; ``version`` is the catalog
    version of the run (:mod:`icefloe.catalog_version`)."""
    props = {SEQUENCE_PROP: str(sequence), EPOCH_PROP: str(epoch)}
    if version is not None:
        props[VERSION_PROP] = str(version)
    if sequences and any(shard for shard in sequences):
        props[SEQUENCES_PROP] = encode_sequences(sequences)
    if committed_ms is not None:
        props[COMMITTED_AT_PROP] = str(committed_ms)
    return props


def carried_version(table: Table) -> int | None:
    """The catalog version of the table's current state: the newest
    :data:`~icefloe.catalog_version.VERSION_PROP` walking back from the current snapshot
    (None: no icefloe run recorded one). A commit that changes no rows (a fence, a
    compaction) records it again, so it takes no version of its own and expiring the
    snapshot that first held it loses nothing."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if VERSION_PROP in props:
            try:
                return int(props[VERSION_PROP])
            except ValueError:
                return None
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return None


def version_props(table: Table) -> dict[str, str]:
    """``{icefloe.version: ...}`` to carry forward on a commit that changes no rows
    (:func:`carried_version`), or nothing."""
    version = carried_version(table)
    return {} if version is None else {VERSION_PROP: str(version)}


def replay_marker(table: Table) -> str | None:
    """The :data:`REPLAY_PROP` of the snapshot that holds the table's offset (the newest
    with :data:`SEQUENCE_PROP`, walking back from the current one; None: none)."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if SEQUENCE_PROP in props:
            return props.get(REPLAY_PROP)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return None


def carried_props(table: Table) -> dict[str, str]:
    """What a commit that changes no rows (a fence, a compaction) carries forward besides
    the offset: the catalog version (:func:`version_props`) and a replay's marker
    (:func:`replay_marker`). Why the marker: a replay checks, before each chunk, that the
    offset still carries its id; a fence by a collector starting up, or a compaction of
    the replay's small files, is not a commit to the table by someone else."""
    props = version_props(table)
    marker = replay_marker(table)
    if marker is not None:
        props[REPLAY_PROP] = marker
    return props


def committed_at_ms(snapshot: Snapshot) -> int:
    """When ``snapshot`` was committed, by the store's clock where icefloe recorded it;
    snapshots of older icefloe versions and of other tools fall back to ``timestamp-ms``."""
    props = snapshot.summary.additional_properties if snapshot.summary else {}
    recorded = props.get(COMMITTED_AT_PROP)
    if recorded is not None:
        try:
            return int(recorded)
        except ValueError:
            pass
    return snapshot.timestamp_ms


SourceRun = tuple[str, int, int]
"""``(source, first_sequence, last_sequence)``: consecutive sequences of one source."""


def encode_sources(runs: Sequence[SourceRun]) -> str:
    return msgspec.json.encode([list(run) for run in runs]).decode()


def decode_sources(text: str | None) -> list[SourceRun] | None:
    """The runs of :data:`SOURCES_PROP`; None when absent or unreadable (treated like a
    commit of an older icefloe: its rows' source is unknown)."""
    if not text:
        return None
    try:
        raw = msgspec.json.decode(text, type=list[tuple[str, int, int]])
    except msgspec.DecodeError:
        return None
    return [(str(s), int(a), int(b)) for s, a, b in raw]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """``rows`` appended (0 when everything was already committed); ``replayed`` rows dropped."""

    table: str
    rows: int
    replayed: int
    sequence: int
    seconds: float
    attempts: int
    sequences: tuple[tuple[int, int], ...] = ()
    """The table's committed sequence per shard after this call."""
    noops: tuple[tuple[str, int], ...] = ()
    """A change stream's changes that did nothing, by reason (:mod:`pipeline.iceberg.cdc_apply`)."""


def check_epoch(name: str, state: CommittedState, epoch: int) -> None:
    if state.epoch > epoch:
        raise TableFencedError(name, epoch, state.epoch)


def commit_rows(catalog: Catalog, identifier: str, rows: pa.Table, *, sequence: int,
                epoch: int, max_attempts: int = 5,
                append: Callable[[Table, pa.Table, dict[str, str]], None] | None = None,
                props: Mapping[str, str] | None = None, clock: Clock = SYSTEM,
                sequences: Mapping[int, int] | None = None,
                version: int | Callable[[], int] | None = None) -> CommitResult:
    """Append ``rows`` (with a ``_sequence``/``sequence`` column) exactly once.

    ``sequence`` is the highest manifest sequence of the run the rows come from; the
    commit records it even when every row was a replay, so the table's offset advances.
    With several manifest shards, ``sequences`` gives the run's last sequence per shard
    instead, the rows' sequence column holds run positions (:data:`SHARD_BITS`), and a row
    is a replay when its shard's committed sequence reaches it; the write gets ``_shard``
    (``shard``) and shard-local ``_sequence`` (``sequence``) columns.
    ``append`` is the write itself (default: ``Table.append``); the cluster output path
    passes one that adds already-written Parquet files instead. ``props`` are extra summary
    properties (the dedup window's :data:`SOURCES_PROP`); ``clock`` is the store's clock
    (:class:`~icefloe.clock.StoreClock`): stamped as :data:`COMMITTED_AT_PROP`, and it
    times the commit and the backoff after an unknown outcome. ``version``: the run's
    catalog version (:mod:`icefloe.catalog_version`), or a function that claims it, called
    only when a snapshot is about to be committed (a run that commits nothing claims none).
    """
    started = clock.monotonic()
    write = append or _append
    seq_column = "_sequence" if "_sequence" in rows.column_names else "sequence"
    through = dict(sequences) if sequences is not None else {0: sequence}
    last_error: Exception | None = None
    for attempt in range(1, max_attempts + 1):
        table, state = _load_state(catalog, identifier, epoch)
        done = state.sequences
        if covers(done, through):
            # Everything up to `sequence` is already in: a replay after a crash before ack.
            return CommitResult(identifier, 0, rows.num_rows, state.sequence,
                                clock.monotonic() - started, attempt, state.shards)
        fresh = not_committed(rows, seq_column, done) if done and rows.num_rows else rows
        if fresh.num_rows == 0:  # nothing new: leave the offset, a replay filters again
            return CommitResult(identifier, 0, rows.num_rows, state.sequence,
                                clock.monotonic() - started, attempt, state.shards)
        check_required(identifier, table, fresh)
        merged = {shard: max(done.get(shard, NO_SEQUENCE), through.get(shard, NO_SEQUENCE))
                  for shard in {*done, *through}}
        try:
            # A refusal is confirmed against the table first (pipeline.iceberg.confirm): a retried
            # commit whose first try landed must not read as "not committed".
            stamped = summary_props(merged.get(0, NO_SEQUENCE), epoch,
                                    int(clock.time() * 1000), merged,
                                    version() if callable(version) else version)
            write(confirmed(table), with_shard_column(table, fresh, seq_column),
                  {**(props or {}), **stamped})
            return CommitResult(identifier, fresh.num_rows, rows.num_rows - fresh.num_rows,
                                merged.get(0, NO_SEQUENCE), clock.monotonic() - started,
                                attempt, tuple(sorted(merged.items())))
        except (CommitFailedException, CommitStateUnknownException) as exc:
            # Someone committed in between, or we cannot tell whether we did: re-read the
            # table before anything else (the loop does), never blindly retry the append.
            log.warning("commit to %s not confirmed (attempt %d): %s", identifier, attempt,
                        exc)
            continue
        except Exception as exc:
            # Timeouts and catalog 5xx surface as assorted exceptions: same treatment.
            log.warning("commit to %s failed with an unknown outcome (attempt %d): %r",
                        identifier, attempt, exc)
            last_error = exc
            clock.sleep_sync(min(2.0, 0.1 * 2 ** attempt))
            continue
    return _last_look(catalog, identifier, rows, epoch, through, started, max_attempts,
                      clock, last_error)


def _load_state(catalog: Catalog, identifier: str, epoch: int
                ) -> tuple[Table, CommittedState]:
    """The table and its committed state, refused if a newer epoch has taken it."""
    try:
        table = catalog.load_table(identifier)
    except Exception as exc:  # catalog down: the caller retries the whole cycle
        raise CatalogError(f"cannot load table {identifier}: {exc}") from exc
    state = committed_state(table)
    check_epoch(identifier, state, epoch)
    return table, state


def _last_look(catalog: Catalog, identifier: str, rows: pa.Table, epoch: int,
               through: Mapping[int, int], started: float, attempts: int, clock: Clock,
               last_error: Exception | None) -> CommitResult:
    """Out of attempts: one last look decides between "landed" and "failed"."""
    _, state = _load_state(catalog, identifier, epoch)
    if covers(state.sequences, through) and state.epoch == epoch:
        return CommitResult(identifier, rows.num_rows, 0, state.sequence,
                            clock.monotonic() - started, attempts, state.shards)
    last = "" if last_error is None else \
        f" (last: {type(last_error).__name__}: {str(last_error).strip()[:300]})"
    raise CatalogError(f"commit to {identifier} failed after {attempts} attempts{last}; "
                       "the collector will retry the batch run") from last_error


def check_required(identifier: str, table: Table, rows: pa.Table) -> None:
    """Refuse rows that leave a required column of the table empty: another engine may
    have added one, and a data file without it would break the table's own schema for
    every reader. Raised before any write, and not retried (no retry can fix it)."""
    for field in table.schema().fields:
        if not field.required:
            continue
        if field.name not in rows.column_names:
            raise TableMismatchError(
                f"table {identifier} requires column {field.name!r}, which its rows do not "
                "carry (added outside icefloe?): declare it in the stream or make it "
                "optional in the table")
        if rows.column(field.name).null_count:
            raise TableMismatchError(
                f"table {identifier} requires column {field.name!r}, but "
                f"{rows.column(field.name).null_count} of the rows leave it empty")


def covers(done: Mapping[int, int], through: Mapping[int, int]) -> bool:
    """Whether every shard's committed sequence (``done``) reaches the run's last one."""
    return all(done.get(shard, NO_SEQUENCE) >= seq for shard, seq in through.items())


def not_committed(rows: pa.Table, column: str, done: Mapping[int, int]) -> pa.Table:
    """Rows whose run position (in ``column``) is past their shard's committed sequence
    in ``done`` (a shard absent from it: nothing committed)."""
    pos = rows.column(column).combine_chunks().to_numpy(zero_copy_only=False)
    shards, local = pos >> SHARD_BITS, pos & _SEQ_MASK
    limit = np.full(len(pos), NO_SEQUENCE, dtype=np.int64)
    for shard, seq in done.items():
        limit[shards == shard] = seq
    return rows.filter(pa.array(local > limit))


def shard_column(sequence_column: str) -> str:
    """``_shard`` next to ``_sequence`` in stream tables, ``shard`` next to ``sequence``
    in the dead-letter table."""
    return "_shard" if sequence_column == "_sequence" else "shard"


def with_shard_column(table: Table, rows: pa.Table, column: str) -> pa.Table:
    """``rows`` with run positions split into the shard column and shard-local sequences,
    when the table has the shard column (tables evolved before this icefloe lack it, and
    then every position must be shard 0's)."""
    name = shard_column(column)
    if column not in rows.column_names or name in rows.column_names:
        return rows
    pos = rows.column(column).combine_chunks().to_numpy(zero_copy_only=False)
    shards = pos >> SHARD_BITS
    if name not in {f.name for f in table.schema().fields}:
        if shards.any():
            raise CatalogError(f"table {'.'.join(table.name())} has no {name} column for "
                               "rows of manifest shards above 0: it was not evolved")
        return rows
    index = rows.column_names.index(column)
    rows = rows.set_column(index, column, pa.array(pos & _SEQ_MASK, pa.int64()))
    return rows.add_column(index + 1, name, pa.array(shards, pa.int32()))


def _append(table: Table, rows: pa.Table, props: dict[str, str]) -> None:
    table.append(rows, snapshot_properties=props)
