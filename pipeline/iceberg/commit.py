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
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import CatalogError, OffsetLostError, TableFencedError
from pipeline.iceberg.confirm import confirmed

SEQUENCE_PROP = "icefloe.sequence"
EPOCH_PROP = "icefloe.epoch"
COMMITTED_AT_PROP = "icefloe.committed-at"
"""Store-clock milliseconds of the commit: ages (expiry, orphan sweep, dedup) are judged by
it, not by ``timestamp-ms``, which is the committing host's clock."""
SOURCES_PROP = "icefloe.sources"
"""Which source the rows of each manifest sequence came from, as JSON runs
``[[source, first, last], ...]`` over the sequences the commit added (see
:mod:`collector.dedup`): the dedup window is keyed by source, and a table keeps no per-row
source column."""
NO_SEQUENCE = -1

log = logging.getLogger("icefloe.commit")


@dataclass(frozen=True, slots=True)
class CommittedState:
    """What a table's snapshot log says icefloe committed: highest sequence, and by whom."""

    sequence: int = NO_SEQUENCE
    epoch: int = 0
    snapshot_id: int | None = None


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
            return CommittedState(int(props[SEQUENCE_PROP]), epoch, snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        older = table.snapshot_by_id(parent) if parent is not None else None
        if older is None and _history_cut(snapshot):
            raise OffsetLostError(".".join(table.name()))
        snapshot = older
    return CommittedState(epoch=epoch)


def _history_cut(oldest: Snapshot) -> bool:
    """Whether snapshots older than ``oldest`` (the end of the walk) were expired: its
    parent is gone, or (pyiceberg's expiry clears the pointer) its data sequence number
    says commits came before it. In a format-v1 table nothing tells: not judged."""
    return oldest.parent_snapshot_id is not None or (oldest.sequence_number or 0) > 1


def summary_props(sequence: int, epoch: int, committed_ms: int | None = None
                  ) -> dict[str, str]:
    props = {SEQUENCE_PROP: str(sequence), EPOCH_PROP: str(epoch)}
    if committed_ms is not None:
        props[COMMITTED_AT_PROP] = str(committed_ms)
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


def check_epoch(name: str, state: CommittedState, epoch: int) -> None:
    if state.epoch > epoch:
        raise TableFencedError(name, epoch, state.epoch)


def commit_rows(catalog: Catalog, identifier: str, rows: pa.Table, *, sequence: int,
                epoch: int, max_attempts: int = 5,
                append: Callable[[Table, pa.Table, dict[str, str]], None] | None = None,
                props: Mapping[str, str] | None = None, clock: Clock = SYSTEM,
                ) -> CommitResult:
    """Append ``rows`` (with a ``_sequence``/``sequence`` column) exactly once.

    ``sequence`` is the highest manifest sequence of the run the rows come from; the
    commit records it even when every row was a replay, so the table's offset advances.
    ``append`` is the write itself (default: ``Table.append``); the cluster output path
    passes one that adds already-written Parquet files instead. ``props`` are extra summary
    properties (the dedup window's :data:`SOURCES_PROP`); ``clock`` is the store's clock
    (:class:`~icefloe.clock.StoreClock`): stamped as :data:`COMMITTED_AT_PROP`, and it
    times the commit and the backoff after an unknown outcome.
    """
    started = clock.monotonic()
    write = append or _append
    seq_column = "_sequence" if "_sequence" in rows.column_names else "sequence"
    for attempt in range(1, max_attempts + 1):
        try:
            table = catalog.load_table(identifier)
        except Exception as exc:  # catalog down: the caller retries the whole cycle
            raise CatalogError(f"cannot load table {identifier}: {exc}") from exc
        state = committed_state(table)
        check_epoch(identifier, state, epoch)
        if state.sequence >= sequence:
            # Everything up to `sequence` is already in: a replay after a crash before ack.
            return CommitResult(identifier, 0, rows.num_rows, state.sequence,
                                clock.monotonic() - started, attempt)
        fresh = rows
        if state.sequence > NO_SEQUENCE and rows.num_rows:
            fresh = rows.filter(pc.greater(rows[seq_column], state.sequence))
        if fresh.num_rows == 0:  # nothing new: leave the offset, a replay filters again
            return CommitResult(identifier, 0, rows.num_rows, state.sequence,
                                clock.monotonic() - started, attempt)
        try:
            # A refusal is confirmed against the table first (pipeline.iceberg.confirm): a retried
            # commit whose first try landed must not read as "not committed".
            stamped = summary_props(sequence, epoch, int(clock.time() * 1000))
            write(confirmed(table), fresh, {**(props or {}), **stamped})
            return CommitResult(identifier, fresh.num_rows, rows.num_rows - fresh.num_rows,
                                sequence, clock.monotonic() - started, attempt)
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
            clock.sleep_sync(min(2.0, 0.1 * 2 ** attempt))
            continue
    # Out of attempts: one last look decides between "landed" and "failed".
    try:
        table = catalog.load_table(identifier)
    except Exception as exc:
        raise CatalogError(f"cannot load table {identifier}: {exc}") from exc
    state = committed_state(table)
    check_epoch(identifier, state, epoch)
    if state.sequence >= sequence and state.epoch == epoch:
        return CommitResult(identifier, rows.num_rows, 0, sequence,
                            clock.monotonic() - started, max_attempts)
    raise CatalogError(f"commit to {identifier} failed after {max_attempts} attempts; "
                       "the collector will retry the batch run")


def _append(table: Table, rows: pa.Table, props: dict[str, str]) -> None:
    table.append(rows, snapshot_properties=props)
