"""Fence every icefloe table on takeover, so a replaced collector commits nowhere.

Why a fence snapshot: a table refuses a commit by an older epoch only once its log records
a newer one (:func:`pipeline.iceberg.commit.check_epoch`). Without a fence, a replaced collector
keeps committing to every table the new one has not committed to yet: rows land after the
new collector read the table's offset and dedup window. So the new collector, right after
bumping the manifest epoch and before consuming, appends an empty snapshot to each icefloe
table carrying the table's ``icefloe.sequence`` forward and its own ``icefloe.epoch``. The
append is an ordinary commit with a branch-head requirement and tables have
``commit.retry.num-retries=0``: an older commit racing it either lands first (before the
takeover completes, and the new collector reads it) or is rejected, and on reload sees the
newer epoch. Never a properties-only commit: the catalog applies those last-writer-wins,
with no requirement an older writer could fail.

Which tables are icefloe's: those the collector routes, the dead letters, the configured
model targets, and every table marked ``icefloe.managed`` (set when icefloe creates or first
evolves a table, and by every fence) or whose log records an ``icefloe.epoch``. A table that
is marked after the listing was marked after the new epoch existed; the collector that
marked it confirms the manifest epoch before its first commit to it and stops (see
``Collector.confirm_table``), so tables created during a takeover are covered too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NoSuchNamespaceError,
    NoSuchTableError,
)
from pyiceberg.table import Table

from icefloe.errors import CatalogError, TableFencedError
from pipeline.iceberg.commit import (
    EPOCH_PROP,
    SEQUENCE_PROP,
    carried_props,
    committed_state,
    offset_props,
    summary_props,
)
from pipeline.iceberg.tables import MANAGED_PROP

log = logging.getLogger("icefloe.fence")

_ATTEMPTS = 5


@dataclass(frozen=True, slots=True)
class FencedTable:
    """One fenced table: its name and ``table_uuid`` (a dropped and recreated table is
    another table)."""

    table: str
    uuid: str


def table_epoch(table: Table) -> int:
    """The highest ``icefloe.epoch`` anywhere in the table's snapshot log (0: none)."""
    epochs = (int((s.summary.additional_properties if s.summary else {}).get(EPOCH_PROP, 0))
              for s in table.snapshots())
    return max(epochs, default=0)


def _last_offsets(table: Table) -> dict[str, str]:
    """The newest offset properties in the log, without judging a cut log (model and
    unrouted tables: their offset is not ours to defend)."""
    newest = sorted(table.snapshots(), key=lambda s: s.sequence_number or 0, reverse=True)
    for snapshot in newest:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if SEQUENCE_PROP in props:
            return offset_props(props)
    return {}


def is_icefloe_table(table: Table) -> bool:
    """Marked by icefloe, or committed to by a collector."""
    return table.properties.get(MANAGED_PROP) == "true" or table_epoch(table) > 0


def fence_table(catalog: Catalog, identifier: str, epoch: int, *, offsets: bool
                ) -> FencedTable | None:
    """Append the fence snapshot for ``epoch`` to ``identifier`` (None: no such table).

    ``offsets``: the collector consumes into this table, so its sequence must be known
    (:func:`committed_state` refuses a log that lost it) and is carried forward; otherwise
    a sequence is carried if the log has one.

    Raises:
        TableFencedError: the table already records a newer epoch: we were replaced.
        OffsetLostError: ``offsets`` and the table's offset was expired outside icefloe.
    """
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            table = catalog.load_table(identifier)
        except NoSuchTableError:
            return None
        if offsets:
            state = committed_state(table)
            recorded = state.epoch
            carried = offset_props(summary_props(state.sequence, 0,
                                                 sequences=state.sequences))
        else:
            recorded, carried = table_epoch(table), _last_offsets(table)
        if recorded > epoch:
            raise TableFencedError(identifier, epoch, recorded)
        managed = table.properties.get(MANAGED_PROP) == "true"
        if recorded == epoch and managed:
            return FencedTable(identifier, str(table.metadata.table_uuid))  # fenced already
        # an empty snapshot: the state's catalog version carried, no number of its own
        props = {EPOCH_PROP: str(epoch), **carried, **carried_props(table)}
        try:
            with table.transaction() as tx:
                if not managed:
                    tx.set_properties({MANAGED_PROP: "true"})
                tx.append(table.schema().as_arrow().empty_table(), snapshot_properties=props)
        except (CommitFailedException, CommitStateUnknownException) as exc:
            # Someone committed meanwhile (maybe the collector we replace), or the answer
            # was lost: reload; the next look sees our fence or fences on top.
            log.info("fence of %s not confirmed (attempt %d): %s", identifier, attempt, exc)
            continue
        log.info("fenced %s at epoch %d (sequence %s)", identifier, epoch,
                 props.get(SEQUENCE_PROP, "none"))
        return FencedTable(identifier, str(table.metadata.table_uuid))
    raise CatalogError(f"cannot fence table {identifier} at epoch {epoch}: {_ATTEMPTS} "
                       "commits in a row were rejected; the collector will retry its start")


def catalog_tables(catalog: Catalog) -> list[str]:
    """Every table in the catalog, namespaces walked recursively."""
    found: list[str] = []
    pending: list[tuple[str, ...]] = [tuple(ns) for ns in catalog.list_namespaces()]
    seen: set[tuple[str, ...]] = set()
    while pending:
        namespace = pending.pop()
        if namespace in seen:
            continue
        seen.add(namespace)
        try:
            found += [".".join(ident) for ident in catalog.list_tables(namespace)]
            pending += [tuple(ns) for ns in catalog.list_namespaces(namespace)
                        if tuple(ns) != namespace]
        except NoSuchNamespaceError:
            continue  # dropped while we listed
    return sorted(set(found))


def fence_all(catalog: Catalog, epoch: int, *, consumed: Iterable[str],
              known: Iterable[str] = (),
              skip: Callable[[str, Exception], bool] | None = None) -> list[FencedTable]:
    """Fence the tables the collector consumes into (``consumed``: routed tables and dead
    letters), the ``known`` icefloe tables (model targets), and every other table of the
    catalog that :func:`is_icefloe_table`. Blocking; raises like :func:`fence_table`,
    unless ``skip(identifier, error)`` says to leave that table alone (the collector
    parks a table nobody can load, and fences it before its first use)."""
    consumed = set(consumed)
    named = consumed | set(known)
    fenced: list[FencedTable] = []

    def one(identifier: str, offsets: bool) -> None:
        try:
            done = fence_table(catalog, identifier, epoch, offsets=offsets)
        except Exception as exc:
            if skip is None or not skip(identifier, exc):
                raise
            return
        if done is not None:
            fenced.append(done)

    for identifier in sorted(named):
        one(identifier, identifier in consumed)
    try:
        listed = catalog_tables(catalog)
    except Exception as exc:  # drivers raise their own trees; the start is retried
        raise CatalogError(f"cannot list the tables of catalog {catalog.name!r} to fence "
                           f"them: {' '.join(str(exc).split())[:300]}") from exc
    for identifier in listed:
        if identifier in named:
            continue
        try:
            table = catalog.load_table(identifier)
        except NoSuchTableError:
            continue
        except Exception as exc:
            if skip is None or not skip(identifier, exc):
                raise
            continue
        if is_icefloe_table(table):
            one(identifier, False)
    return fenced

