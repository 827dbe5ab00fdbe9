"""Confirm a refused commit against the table before anyone trusts the refusal.

Why: pyiceberg reads ``CommitFailedException`` as "certainly not committed" and deletes
the manifest list and manifests it wrote for the commit; icefloe's file cleanup deletes the
data files. But a catalog client may retry a commit whose answer was lost: botocore retries
Glue's ``UpdateTable`` after a 5xx or a cut connection, and when the first try was applied
the retry is refused (``ConcurrentModificationException``: the version moved — by us). The
refusal then hides a commit that landed, and the cleanups would delete files the table's
current snapshot references.

A commit that adds a snapshot carries its id (random 64 bits, fixed before the commit), so
the table itself can say whether the commit landed: on a refusal or an unknown outcome we
load the table, and if every snapshot the commit adds is there, the commit is answered as
the success it was. A refusal that cannot be confirmed because the table cannot be loaded
becomes an unknown outcome, so no one deletes anything; any other failure is re-raised as
it was.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import AddSnapshotUpdate

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table.update import TableRequirement, TableUpdate

log = logging.getLogger("icefloe.commit")


class ConfirmingCatalog:
    """A catalog whose ``commit_table`` checks a refusal against the table (module doc).

    Everything else is the wrapped catalog's; tables it loads are bound to it, so their
    commits (``append``, ``add_files``) go through the check.
    """

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def __getattr__(self, name: str) -> Any:
        return getattr(self._catalog, name)

    def load_table(self, identifier: Any) -> Table:
        return _bind(self._catalog.load_table(identifier), self)

    def commit_table(self, table: Table, requirements: tuple[TableRequirement, ...],
                     updates: tuple[TableUpdate, ...]) -> CommitTableResponse:
        try:
            return self._catalog.commit_table(table, requirements, updates)
        except CommitFailedException as refused:
            landed = self._landed(table, updates)
            if landed is None:
                raise CommitStateUnknownException(
                    f"commit refused ({refused}) and the table cannot be read to confirm "
                    "the refusal") from refused
            if not isinstance(landed, Table):
                raise
            return self._confirm(table, landed, refused)
        except Exception as unknown:
            # Outcome unknown (5xx, cut connection, timeout): if the table shows the commit,
            # say so now, so the caller counts the rows it committed and keeps its files.
            landed = self._landed(table, updates)
            if not isinstance(landed, Table):
                raise
            return self._confirm(table, landed, unknown)

    def _landed(self, table: Table, updates: tuple[TableUpdate, ...]
                ) -> Table | bool | None:
        """The table as it is now if every snapshot the commit adds is in it; ``False`` if
        not (or the commit adds none), ``None`` if the table cannot be read."""
        added = {u.snapshot.snapshot_id for u in updates if isinstance(u, AddSnapshotUpdate)}
        if not added:
            return False
        try:
            current = self._catalog.load_table(table.name())
        except Exception as exc:
            log.warning("cannot read %s to confirm a commit's outcome: %s",
                        ".".join(table.name()), exc)
            return None
        if all(current.metadata.snapshot_by_id(i) is not None for i in added):
            return current
        return False

    @staticmethod
    def _confirm(table: Table, current: Table, error: Exception) -> CommitTableResponse:
        log.warning("commit to %s failed (%r) but its snapshot is in the table: it landed",
                    ".".join(table.name()), error)
        return CommitTableResponse(metadata=current.metadata,
                                   metadata_location=current.metadata_location)


def confirmed(table: Table) -> Table:
    """``table``, bound to a :class:`ConfirmingCatalog` over its own catalog."""
    catalog = table.catalog
    if isinstance(catalog, ConfirmingCatalog):
        return table
    return _bind(table, ConfirmingCatalog(catalog))


def _bind(table: Table, catalog: ConfirmingCatalog) -> Table:
    return Table(table.name(), table.metadata, table.metadata_location, table.io,
                 catalog, table.config)  # type: ignore[arg-type]  # duck-typed catalog


def confirm_in_place(table: Table) -> Table:
    """Make ``table``'s own commits confirming, keeping the object.

    Why in place: maintenance commits through the caller's table object, and callers read
    that object's metadata afterwards (pyiceberg updates it on each commit); a rebound copy
    would leave them looking at the metadata from before.
    """
    if not isinstance(table.catalog, ConfirmingCatalog):
        table.catalog = ConfirmingCatalog(table.catalog)  # type: ignore[assignment]  # duck
    return table
