"""Table versions: a table's snapshots numbered 1, 2, 3 ... in commit order.

Why a number besides the snapshot id: ids are 19-digit random numbers nobody types; DuckLake
users write ``AT (VERSION => 3)``. The number is the snapshot's Iceberg sequence number,
which the table assigns once per commit: it never changes when old snapshots expire
(version 1 then simply no longer exists), so a version written down today means the same
snapshot tomorrow. ``icefloe tables history`` shows it, ``icefloe query`` and the models read
it. No Spark here: the CLI's history imports this without starting a JVM.

Only the end of a commit is a version. icefloe commits one snapshot per change, but before
issue #37 a ``table`` model's rerun, a ``merge`` model's commit and an overflow redrive went
through pyiceberg's ``overwrite``/``upsert``, which leave a ``delete`` (and maybe an
``overwrite``) snapshot, then one or two ``append`` snapshots, all in one catalog commit. No
reader ever saw the ones in the middle (the catalog swapped them in together), and time
travel must not show them either: they get no version, ``AT (VERSION => n)`` refuses their
number and their snapshot id, and ``AT (TIMESTAMP => t)`` at a moment between them reads the
state before the commit. They are recognized by what those commits left: a snapshot whose
child carries the same ``icefloe.*`` summary properties (pyiceberg put the commit's
properties on every snapshot it made) and continues the pattern (``delete`` then
``overwrite`` or ``append``, ``overwrite`` then ``append``, and a model merge's two appends,
which its run id tells apart from two runs). Tables written by other engines have no
``icefloe.*`` properties: every snapshot of theirs is a version.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icefloe.errors import CatalogError

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


PREFIX = "icefloe."
RUN_ID = "icefloe.model.run-id"  # pipeline.models.state.RUN_ID (no import: models need Spark)
_CONTINUES = {"delete": ("overwrite", "append"), "overwrite": ("append",)}
"""Operation of a snapshot -> those of the next snapshot of the same old two-step commit."""


def _numbered(table: Table) -> dict[int, Snapshot]:
    """Every snapshot by number (sequence number; commit order on format version 1)."""
    snapshots = list(table.snapshots())
    if all(s.sequence_number for s in snapshots):
        return {int(s.sequence_number or 0): s for s in snapshots}
    ordered = sorted(snapshots, key=lambda s: s.timestamp_ms)
    return dict(enumerate(ordered, start=1))


def snapshot_versions(table: Table) -> dict[int, Snapshot]:
    """``{version: snapshot}``: the snapshots that end a commit (module docstring). A
    format-version 1 table has no sequence numbers; its snapshots are numbered by commit
    time instead."""
    middle = intermediate_snapshots(table)
    return {n: s for n, s in _numbered(table).items() if s.snapshot_id not in middle}


def intermediate_snapshots(table: Table) -> set[int]:
    """Ids of the snapshots an older icefloe left in the middle of one commit (module
    docstring); never the current snapshot, which readers did see."""
    snapshots = list(table.snapshots())
    by_parent: dict[int, list[Snapshot]] = {}
    for snapshot in snapshots:
        parent = getattr(snapshot, "parent_snapshot_id", None)
        if parent is not None:
            by_parent.setdefault(parent, []).append(snapshot)
    current = table.current_snapshot()
    now = current.snapshot_id if current is not None else None
    return {s.snapshot_id for s in snapshots if s.snapshot_id != now and
            any(_same_commit(s, child) for child in by_parent.get(s.snapshot_id, ()))}


def _same_commit(snapshot: Snapshot, child: Snapshot) -> bool:
    """Whether ``child`` is the next step of the old multi-snapshot commit ``snapshot``
    began."""
    operation, props = _summary(snapshot)
    child_operation, child_props = _summary(child)
    if not props or props != child_props:
        return False
    if operation == "append":  # a merge's updated rows, then its new ones
        return child_operation == "append" and RUN_ID in props
    return child_operation in _CONTINUES.get(operation, ())


def _summary(snapshot: Snapshot) -> tuple[str, dict[str, str]]:
    """``(operation, icefloe.* properties)`` of a snapshot (pyiceberg's or a LocalTable's)."""
    summary = snapshot.summary
    if summary is None:
        return "", {}
    operation = getattr(summary.operation, "value", summary.operation)
    return str(operation), {k: v for k, v in summary.additional_properties.items()
                            if k.startswith(PREFIX)}


def complete_snapshot(table: Table, snapshot: Snapshot | None) -> Snapshot | None:
    """``snapshot``, or when it is in the middle of an old commit the state before that
    commit (what readers saw until it landed); None when there was none."""
    middle = intermediate_snapshots(table)
    while snapshot is not None and snapshot.snapshot_id in middle:
        parent = getattr(snapshot, "parent_snapshot_id", None)
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return snapshot


def refuse_intermediate(table: Table, identifier: str, snapshot_id: int,
                        asked: str) -> None:
    """Raise a :class:`CatalogError` when ``snapshot_id`` is in the middle of an old
    commit; ``asked`` is how the caller named it (``version 4``, ``snapshot 123``)."""
    if snapshot_id not in intermediate_snapshots(table):
        return
    ends = {s.snapshot_id: n for n, s in snapshot_versions(table).items()}
    end = _end_of(table, snapshot_id, ends)
    then = f"; the commit is version {end}" if end is not None else ""
    raise CatalogError(f"table {identifier!r}: {asked} is the middle of one commit (an older "
                       f"icefloe wrote it as several snapshots), a state no reader ever saw"
                       f"{then} (see `icefloe tables history {identifier}`)")


def _end_of(table: Table, snapshot_id: int, ends: dict[int, int]) -> int | None:
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


def version_of(table: Table, snapshot_id: int) -> int | None:
    """The version of snapshot ``snapshot_id`` (None: no such snapshot)."""
    return next((n for n, s in snapshot_versions(table).items()
                 if s.snapshot_id == snapshot_id), None)


def resolve_version(table: Table, identifier: str, version: int) -> int:
    """The snapshot id of ``version``, or ``version`` itself when it is a snapshot id of
    the table; otherwise a :class:`CatalogError` saying which versions exist."""
    versions = snapshot_versions(table)
    if version in versions:
        return versions[version].snapshot_id
    numbered = _numbered(table)
    if version in numbered:  # the number of a snapshot in the middle of an old commit
        refuse_intermediate(table, identifier, numbered[version].snapshot_id,
                            f"version {version}")
    if table.snapshot_by_id(version) is not None:
        refuse_intermediate(table, identifier, version, f"snapshot {version}")
        return version
    raise CatalogError(f"table {identifier!r} has no version {version}: "
                       f"{_describe(sorted(versions))} (see `icefloe tables history "
                       f"{identifier}`)")


def _describe(numbers: list[int]) -> str:
    if not numbers:
        return "it has no commits yet"
    if len(numbers) == 1:
        return f"its only version is {numbers[0]}"
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"its versions are {numbers[0]} to {numbers[-1]}"
    shown = ", ".join(map(str, numbers[-10:]))
    return f"its versions are {'..., ' if len(numbers) > 10 else ''}{shown}"
