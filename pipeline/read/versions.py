"""Table versions: a table's snapshots numbered 1, 2, 3 ... in commit order.

Why a number besides the snapshot id: ids are 19-digit random numbers nobody types; DuckLake
users write ``AT (VERSION => 3)``. The number is the snapshot's Iceberg sequence number,
which the table assigns once per commit: it never changes when old snapshots expire
(version 1 then simply no longer exists), so a version written down today means the same
snapshot tomorrow. ``icefloe tables history`` shows it, ``icefloe query`` and the models read
it. No Spark here: the CLI's history imports this without starting a JVM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icefloe.errors import CatalogError

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot


def snapshot_versions(table: Table) -> dict[int, Snapshot]:
    """``{version: snapshot}``. A format-version 1 table has no sequence numbers; its
    snapshots are numbered by commit time instead."""
    snapshots = list(table.snapshots())
    if all(s.sequence_number for s in snapshots):
        return {int(s.sequence_number or 0): s for s in snapshots}
    ordered = sorted(snapshots, key=lambda s: s.timestamp_ms)
    return dict(enumerate(ordered, start=1))


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
    if table.snapshot_by_id(version) is not None:
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
