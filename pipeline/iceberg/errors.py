"""pyiceberg's exceptions, translated into icefloe's (:class:`icefloe.errors.IcefloeError`).

Why one place: callers of icefloe (the collector's loop, the CLI, the admin API, models and
redrive) decide on *what happened* — the table is missing, someone else committed first,
nobody knows whether the commit landed — not on which library said so. This module is the
one that names pyiceberg's exception classes for code outside :mod:`pipeline.iceberg`
(``tests/system/test_foreign_errors.py`` holds every other module to it). Every translated
error keeps pyiceberg's as its ``__cause__``.

Translate only what the caller handles (``iceberg_errors(TableNotFoundError)``): an
exception the caller does not expect keeps its own type on its way up, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyiceberg import exceptions as pe

from icefloe.errors import (
    AlreadyExistsError,
    CatalogError,
    CommitConflictError,
    CommitUnknownError,
    IcebergValidationError,
    NamespaceNotFoundError,
    TableNotFoundError,
)

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

TRANSLATED: tuple[tuple[type[Exception], type[CatalogError]], ...] = (
    (pe.NoSuchTableError, TableNotFoundError),
    (pe.NoSuchNamespaceError, NamespaceNotFoundError),
    (pe.TableAlreadyExistsError, AlreadyExistsError),
    (pe.NamespaceAlreadyExistsError, AlreadyExistsError),
    (pe.CommitFailedException, CommitConflictError),
    (pe.CommitStateUnknownException, CommitUnknownError),
    (pe.ValidationException, IcebergValidationError),
)
"""pyiceberg's class -> icefloe's, most specific first."""


def translated(exc: BaseException) -> BaseException:
    """The icefloe error for a pyiceberg one (its message kept, ``exc`` its cause), or
    ``exc`` itself when it is not one this module translates."""
    for theirs, ours in TRANSLATED:
        if isinstance(exc, theirs):
            error = ours(str(exc) or type(exc).__name__)
            error.__cause__ = exc
            return error
    return exc


@contextlib.contextmanager
def iceberg_errors(*only: type[CatalogError]) -> Iterator[None]:
    """Raise pyiceberg's exceptions from the block as icefloe's; with ``only``, just those
    kinds (the rest keep their type)."""
    try:
        yield
    except tuple(theirs for theirs, _ in TRANSLATED) as exc:
        error = translated(exc)
        if only and not isinstance(error, only):
            raise
        raise error from exc


def load_table_or_none(catalog: Catalog, identifier: str) -> Table | None:
    """The table, or None when the catalog has no such table (or no such namespace)."""
    try:
        with iceberg_errors(TableNotFoundError, NamespaceNotFoundError):
            return catalog.load_table(identifier)
    except (TableNotFoundError, NamespaceNotFoundError):
        return None
