"""Versions: what ``AT (VERSION => n)`` reads, and which snapshots are whole commits.

**Catalog versions.** ``n`` is a catalog version (:mod:`icefloe.catalog_version`): each
collector run and model run claims one and records it as ``icefloe.version`` in every
snapshot it commits, so one number names one moment of every table, as in DuckLake: ``a AT
(VERSION => 3) JOIN b AT (VERSION => 3)`` reads both as they were after run 3. A table at
version ``n`` is its newest snapshot (along the current snapshot's ancestry) whose
*effective* version is at most ``n`` (:func:`effective_versions`):

* a snapshot that records a version has it; fencing and maintenance snapshots record the
  version they carry forward (they change no rows), so they never take a number of their
  own and a takeover shifts nothing;
* a snapshot without one in a table that has versions (another engine's commit, a redrive,
  a commit of an older icefloe) counts from the next run's version on, the first moment
  icefloe's numbering can place it after; one after the table's last run counts from none
  yet. Numbers along a table's history never decrease (a run that committed to it after a
  newer-numbered one counts as that one), so what a version reads never changes later;
* a table with no version anywhere (written only by other engines or an older icefloe)
  resolves by commit time: the moment of version ``n`` is the newest commit time of a
  snapshot that *introduced* a version at most ``n`` (:func:`introduced_versions`) in the
  query's other tables (:class:`CatalogVersions`). A compaction or fence that carries a
  version forward is committed later but changes nothing a version reads, so its time is
  not that version's moment (it would let a commit of the other engine made in between
  into version ``n``). A query that has no such table cannot place ``n`` in time and is
  refused.

The per-table forms stay: Spark's ``FOR VERSION AS OF <snapshot id>`` and ``--as-of``
take a snapshot id, ``AT (TIMESTAMP => t)`` a time. A number given in the other form
(a snapshot id to ``AT (VERSION => ...)``, a small version to ``FOR VERSION AS OF``) is
refused with the right spelling, never read as the other.

**Whole commits.** Only the end of a commit is a state time travel reads. icefloe commits
one snapshot per change, but before issue #37 a ``table`` model's rerun, a ``merge`` model's
commit and an overflow redrive went through pyiceberg's ``overwrite``/``upsert``, which
leave a ``delete`` (and maybe an ``overwrite``) snapshot, then one or two ``append``
snapshots, all in one catalog commit. No reader ever saw the ones in the middle (the catalog
swapped them in together), and time travel must not show them either: ``FOR VERSION AS OF``
refuses their snapshot id, and ``AT (TIMESTAMP => t)`` at a moment between them reads the
state before the commit (they record no catalog version, so ``AT (VERSION => n)`` never
lands there either). They are recognized by what those commits left: a snapshot whose child
carries the same ``icefloe.*`` summary properties (pyiceberg put the commit's properties on
every snapshot it made) and continues the pattern (``delete`` then ``overwrite`` or
``append``, ``overwrite`` then ``append``, and a model merge's two appends, which its run id
tells apart from two runs). Tables written by other engines have no ``icefloe.*``
properties: every snapshot of theirs is a whole commit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from icefloe.catalog_version import VERSION_PROP, read_version
from icefloe.errors import CatalogError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from icefloe.config import Config


class SnapshotSummary(Protocol):
    """A snapshot's summary as this module reads it (pyiceberg's, or a LocalTable's)."""

    @property
    def operation(self) -> Any: ...  # pyiceberg: its Operation enum; LocalTable: the text

    @property
    def additional_properties(self) -> dict[str, str]: ...


class SnapshotLike(Protocol):
    """A snapshot: pyiceberg's ``Snapshot`` or :class:`pipeline.read.local_table.Snapshot`."""

    @property
    def snapshot_id(self) -> int: ...

    @property
    def parent_snapshot_id(self) -> int | None: ...

    @property
    def sequence_number(self) -> int | None: ...

    @property
    def timestamp_ms(self) -> int: ...

    @property
    def summary(self) -> SnapshotSummary | None: ...


class SnapshotHistory(Protocol):
    """What pinning reads of a table: pyiceberg's ``Table``, or a
    :class:`pipeline.read.local_table.LocalTable`, which answers the same way."""

    def snapshots(self) -> Sequence[SnapshotLike]: ...

    def snapshot_by_id(self, snapshot_id: int, /) -> SnapshotLike | None: ...

    def current_snapshot(self) -> SnapshotLike | None: ...

    def snapshot_as_of_timestamp(self, timestamp_ms: int, /) -> SnapshotLike | None: ...


PREFIX = "icefloe."
RUN_ID = "icefloe.model.run-id"  # pipeline.models.state.RUN_ID (no import: models need Spark)
_CONTINUES = {"delete": ("overwrite", "append"), "overwrite": ("append",)}
"""Operation of a snapshot -> those of the next snapshot of the same old two-step commit."""


def _numbered(table: SnapshotHistory) -> dict[int, SnapshotLike]:
    """Every snapshot by number (sequence number; commit order on format version 1)."""
    snapshots = list(table.snapshots())
    if all(s.sequence_number for s in snapshots):
        return {int(s.sequence_number or 0): s for s in snapshots}
    ordered = sorted(snapshots, key=lambda s: s.timestamp_ms)
    return dict(enumerate(ordered, start=1))


def snapshot_versions(table: SnapshotHistory) -> dict[int, SnapshotLike]:
    """``{sequence number: snapshot}``: the snapshots that end a commit (module docstring;
    the numbers are the table's own, not catalog versions). A
    format-version 1 table has no sequence numbers; its snapshots are numbered by commit
    time instead."""
    middle = intermediate_snapshots(table)
    return {n: s for n, s in _numbered(table).items() if s.snapshot_id not in middle}


def intermediate_snapshots(table: SnapshotHistory) -> set[int]:
    """Ids of the snapshots an older icefloe left in the middle of one commit (module
    docstring); never the current snapshot, which readers did see."""
    snapshots = list(table.snapshots())
    by_parent: dict[int, list[SnapshotLike]] = {}
    for snapshot in snapshots:
        parent = getattr(snapshot, "parent_snapshot_id", None)
        if parent is not None:
            by_parent.setdefault(parent, []).append(snapshot)
    current = table.current_snapshot()
    now = current.snapshot_id if current is not None else None
    return {s.snapshot_id for s in snapshots if s.snapshot_id != now and
            any(_same_commit(s, child) for child in by_parent.get(s.snapshot_id, ()))}


def _same_commit(snapshot: SnapshotLike, child: SnapshotLike) -> bool:
    """Whether ``child`` is the next step of the old multi-snapshot commit ``snapshot``
    began."""
    operation, props = _summary(snapshot)
    child_operation, child_props = _summary(child)
    if not props or props != child_props:
        return False
    if operation == "append":  # a merge's updated rows, then its new ones
        return child_operation == "append" and RUN_ID in props
    return child_operation in _CONTINUES.get(operation, ())


def _summary(snapshot: SnapshotLike) -> tuple[str, dict[str, str]]:
    """``(operation, icefloe.* properties)`` of a snapshot (pyiceberg's or a LocalTable's)."""
    summary = snapshot.summary
    if summary is None:
        return "", {}
    operation = getattr(summary.operation, "value", summary.operation)
    return str(operation), {k: v for k, v in summary.additional_properties.items()
                            if k.startswith(PREFIX)}


def complete_snapshot(table: SnapshotHistory, snapshot: SnapshotLike | None) -> SnapshotLike | None:
    """``snapshot``, or when it is in the middle of an old commit the state before that
    commit (what readers saw until it landed); None when there was none."""
    middle = intermediate_snapshots(table)
    while snapshot is not None and snapshot.snapshot_id in middle:
        parent = getattr(snapshot, "parent_snapshot_id", None)
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return snapshot


def refuse_intermediate(table: SnapshotHistory, identifier: str, snapshot_id: int,
                        asked: str) -> None:
    """Raise a :class:`CatalogError` when ``snapshot_id`` is in the middle of an old
    commit; ``asked`` is how the caller named it (``version 4``, ``snapshot 123``)."""
    if snapshot_id not in intermediate_snapshots(table):
        return
    ends = {s.snapshot_id: s.snapshot_id for s in snapshot_versions(table).values()}
    end = _end_of(table, snapshot_id, ends)
    then = f"; the commit ends at snapshot {end}" if end is not None else ""
    raise CatalogError(f"table {identifier!r}: {asked} is the middle of one commit (an older "
                       f"icefloe wrote it as several snapshots), a state no reader ever saw"
                       f"{then} (see `icefloe tables history {identifier}`)")


def _end_of(table: SnapshotHistory, snapshot_id: int, ends: dict[int, int]) -> int | None:
    """The version of the snapshot that ends the commit ``snapshot_id`` is in."""
    children = {getattr(s, "parent_snapshot_id", None): s for s in table.snapshots()}
    seen = snapshot_id
    for _ in range(len(children) + 1):
        if seen in ends:
            return ends[seen]
        child = children.get(seen)
        if child is None:
            return None
        seen = child.snapshot_id
    return None


# -- expired history -------------------------------------------------------------------


EXPIRY = ("snapshot expiry: the collector's `snapshot_keep_last` / `snapshot_max_age_s`, "
          "or another engine's")
"""What expires snapshots, for messages that say some were."""


def history_cut(oldest: SnapshotLike) -> bool:
    """Whether snapshots older than ``oldest`` (the oldest one reached) were expired: its
    parent is gone, or (pyiceberg's expiry clears the pointer) its sequence number says
    commits came before it. A format-v1 table tells neither: not judged (the rule of
    :func:`pipeline.iceberg.commit.history_cut`, for either kind of snapshot)."""
    return oldest.parent_snapshot_id is not None or (oldest.sequence_number or 0) > 1


def expired_before(table: SnapshotHistory) -> SnapshotLike | None:
    """The table's oldest snapshot still kept when older ones were expired; None when its
    history is whole (or cannot tell)."""
    snapshots = list(table.snapshots())
    if not snapshots:
        return None
    oldest = min(snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms))
    return oldest if history_cut(oldest) else None


# -- catalog versions ------------------------------------------------------------------


def run_version(snapshot: SnapshotLike) -> int | None:
    """The catalog version ``snapshot`` records (None: none, or unreadable)."""
    summary = snapshot.summary
    text = summary.additional_properties.get(VERSION_PROP) if summary is not None else None
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def lineage(table: SnapshotHistory) -> list[SnapshotLike]:
    """The current snapshot and its ancestors, oldest first: the states the table had (a
    rolled-back snapshot is not one of them)."""
    chain: list[SnapshotLike] = []
    snapshot = table.current_snapshot()
    seen: set[int] = set()
    while snapshot is not None and snapshot.snapshot_id not in seen:
        seen.add(snapshot.snapshot_id)
        chain.append(snapshot)
        parent = getattr(snapshot, "parent_snapshot_id", None)
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    chain.reverse()
    return chain


def effective_versions(chain: list[SnapshotLike]) -> list[int | None]:
    """Per snapshot of :func:`lineage`, the first catalog version that reads it or a later
    state (module docstring); None: no version reads it yet."""
    filled: list[int | None] = []
    following: int | None = None
    for snapshot in reversed(chain):
        own = run_version(snapshot)
        following = own if own is not None else following
        filled.append(following)
    filled.reverse()
    effective: list[int | None] = []
    highest: int | None = None
    for number in filled:
        if number is not None:
            highest = number if highest is None else max(highest, number)
        effective.append(highest if number is not None else None)
    return effective


def introduced_versions(table: SnapshotHistory) -> dict[int, int]:
    """``{snapshot id: catalog version}`` of the snapshots that introduced a version (a run's
    commit), leaving out those that only carry one forward (fencing, maintenance) and the
    middle of an old multi-snapshot commit."""
    numbers: dict[int, int] = {}
    previous: int | None = None
    middle = intermediate_snapshots(table)
    for snapshot in lineage(table):
        if snapshot.snapshot_id in middle:
            continue
        own = run_version(snapshot)
        if own is not None and own != previous:
            numbers[snapshot.snapshot_id] = own
        previous = own if own is not None else previous
    return numbers


class CatalogVersions:
    """What one query knows about catalog versions: the newest one, and when each was
    reached, from its own tables (and the counter, when it can be read)."""

    def __init__(self, tables: Iterable[SnapshotHistory],
                 claimed: Callable[[], int | None] | None = None) -> None:
        """``claimed`` reads the counter; asked only for a version above every one the
        tables record (a cold query then touches no store)."""
        self._commits: list[tuple[int, int]] = []  # (version, time it was introduced, ms)
        self.seen = 0
        for table in tables:
            chain = {s.snapshot_id: s for s in lineage(table)}
            self.seen = max([self.seen, *(v for s in chain.values()
                                          if (v := run_version(s)) is not None)])
            # not a compaction's or a fence's later time: it carries a version forward
            self._commits.extend((v, chain[i].timestamp_ms)
                                 for i, v in introduced_versions(table).items() if i in chain)
        self._claimed = claimed

    def exists(self, version: int) -> bool:
        """Whether catalog version ``version`` has been claimed (by the tables, else the
        counter)."""
        if version <= self.seen:
            return True
        claimed = self._claimed() if self._claimed is not None else None
        if claimed is not None:
            self.seen = max(self.seen, claimed)
        self._claimed = None
        return version <= self.seen

    def moment(self, version: int) -> int | None:
        """Commit time (ms) of the newest snapshot among the query's tables that introduced
        a version at most ``version`` (None: none); snapshots that only carry a version
        forward (compaction, fencing) do not count (module docstring)."""
        return max((at for v, at in self._commits if v <= version), default=None)


def claimed_version(config: Config) -> Callable[[], int | None]:
    """A function reading the newest catalog version claimed so far from the counter (None:
    unreadable; the query's tables then say which versions exist)."""
    def read() -> int | None:
        from icefloe.store import open_store, options_for  # lazy: icefloe.store

        section = config.store
        try:
            store = open_store(section.control_url or section.url,
                               options_for(section.endpoint_url, section.region))
            try:
                return read_version(store)
            finally:
                store.close()
        except Exception:  # no store here (a reader with catalog access only)
            return None
    return read


def at_version(table: SnapshotHistory, identifier: str, version: int,
               versions: CatalogVersions) -> int:
    """The snapshot id ``table`` had at catalog version ``version`` (module docstring), or
    a :class:`CatalogError` naming what is wrong, and the right spelling when the number
    is a snapshot id."""
    if not versions.exists(version):
        if table.snapshot_by_id(version) is not None:
            raise CatalogError(
                f"AT (VERSION => {version}) reads catalog version {version}, and {version} "
                f"is a snapshot id of table {identifier!r}: to read that snapshot of that "
                f"table, write {identifier} FOR VERSION AS OF {version}")
        newest = f"the newest is {versions.seen}" if versions.seen else \
            "no icefloe run has committed one yet"
        raise CatalogError(f"AT (VERSION => {version}): there is no catalog version {version} "
                           f"yet; {newest} (see `icefloe tables history`)")
    chain = lineage(table)
    effective = effective_versions(chain)
    if any(number is not None for number in effective):
        picked = [s for s, n in zip(chain, effective, strict=True)
                  if n is not None and n <= version]
        if not picked:
            first = min(n for n in effective if n is not None)
            if history_cut(chain[0]):
                raise CatalogError(
                    f"table {identifier!r} can no longer be read at catalog version "
                    f"{version}: its snapshots before version {first} were expired ({EXPIRY}"
                    f"); read it at version {first} or later, or keep snapshots longer to "
                    f"travel further back (see `icefloe tables history {identifier}`)")
            raise CatalogError(f"table {identifier!r} had no state at catalog version "
                               f"{version}: its first is version {first} (see `icefloe "
                               f"tables history {identifier}`)")
        return picked[-1].snapshot_id
    return _by_commit_time(table, identifier, version, versions)


def _by_commit_time(table: SnapshotHistory, identifier: str, version: int,
                    versions: CatalogVersions) -> int:
    """A table that records no catalog version: its snapshot current at the moment of
    ``version``."""
    moment = versions.moment(version)
    if moment is None:
        raise CatalogError(
            f"table {identifier!r} records no catalog versions (written by another engine or "
            f"an older icefloe), and no other table of this query places version {version} "
            "in time: read it AT (TIMESTAMP => '<ISO 8601 time>') or FOR VERSION AS OF "
            "<snapshot id>, or join it with an icefloe table at the same version")
    snapshot = complete_snapshot(table, table.snapshot_as_of_timestamp(moment))
    if snapshot is None:
        when = dt.datetime.fromtimestamp(moment / 1000, dt.UTC).isoformat(timespec="seconds")
        raise CatalogError(f"table {identifier!r} had no commit yet at catalog version "
                           f"{version} ({when}, by commit time: it records no versions)")
    return snapshot.snapshot_id
