"""Write a model's result into its Iceberg target through pyiceberg, in one commit.

Why one transaction per run: the rows and the run's state (:mod:`pipeline.models.state`)
must land together or not at all. Targets are created with ``commit.retry.num-retries=0``
like every icefloe table, so a run that lost a race (another run committed the target since
this one read its state) is refused instead of silently rebased, which could double count.

Modes: ``overwrite`` replaces every row (``table``, and ``--full-refresh``); ``append`` adds
rows; ``merge`` upserts by the unique key (as pyiceberg's ``upsert`` decides: matched rows
whose values changed are rewritten, new keys inserted). Each is ONE snapshot
(:mod:`pipeline.iceberg.replace`): pyiceberg's own ``overwrite``/``upsert`` commit a delete
and an append (or more) as separate snapshots, and time travel to the one in the middle read
a table no reader ever saw. A merge that changes nothing still commits an empty append,
which carries the run's state: the watermark still advances.

From the collector, a write is fenced like every icefloe commit (``fence``): the snapshot
records ``icefloe.epoch``, a target whose log records a newer epoch refuses it, and the
manifest epoch is confirmed after the target is loaded or created and before the commit,
so a replaced collector's model run lands nowhere (see :mod:`pipeline.iceberg.fence`).

Columns are written nullable: a ``count(*)`` is non-null to Spark, but a later SQL version
may make it nullable, and Iceberg cannot relax ``required`` on existing files by itself.

The table's schema follows the result's columns (:mod:`pipeline.iceberg.evolution`): new
columns are added, ``renames`` (detected by the runner from the SQL) keep a column's data
under its new name, int/float/decimal columns widen, and columns the SQL no longer selects
are dropped from the current schema (older snapshots, and time travel to them, keep them).
The change is staged in the same transaction as the rows, so the commit that shows the new
schema is the one that holds the first rows written with it; a change Iceberg cannot make
raises :class:`~pipeline.iceberg.evolution.EvolutionError` before anything is committed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from icefloe.errors import AlreadyExistsError, CommitConflictError, TableFencedError
from pipeline.iceberg.commit import EPOCH_PROP
from pipeline.iceberg.errors import iceberg_errors, load_table_or_none
from pipeline.iceberg.evolution import apply_changes, plan_changes
from pipeline.iceberg.fence import table_epoch
from pipeline.iceberg.replace import merge_rows, replace_rows
from pipeline.iceberg.tables import MANAGED_PROP, TABLE_PROPERTIES
from pipeline.models.spec import ModelError
from pipeline.models.state import COLUMNS, compact_json

MODES = ("overwrite", "append", "merge")


@dataclass(frozen=True, slots=True)
class WriteFence:
    """The collector epoch a model write commits as, and how to confirm it is current:
    ``confirm`` reads the manifest and raises :class:`~icefloe.errors.FencedError` when
    another collector took over."""

    epoch: int
    confirm: Callable[[], object]


def load_target(catalog: Catalog, identifier: str) -> Table | None:
    """The target table, or None before the model's first run."""
    return load_table_or_none(catalog, identifier)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """All fields nullable, large strings/binaries as plain ones (what Iceberg maps back)."""
    fields = []
    for item in schema:
        kind = item.type
        if pa.types.is_large_string(kind):
            kind = pa.string()
        elif pa.types.is_large_binary(kind):
            kind = pa.binary()
        fields.append(pa.field(item.name, kind, nullable=True))
    return pa.schema(fields)


def write_result(catalog: Catalog, identifier: str, result: pa.Table, *, mode: str,
                 unique_key: tuple[str, ...], properties: dict[str, str],
                 expected_snapshot_id: int | None, fence: WriteFence | None = None,
                 renames: Mapping[str, str] | None = None) -> None:
    """Commit ``result`` to ``identifier`` with ``properties`` on the snapshot.

    ``expected_snapshot_id`` is the target's current snapshot when the run read its state
    (None: no table or no snapshot yet); if another run committed since, the write is
    refused, because this result was computed from a watermark that is no longer current.
    ``fence``: commit as this collector epoch, refused once a newer one took over.
    ``renames``: ``{old column: new column}`` the table's schema applies with the rows.

    Raises:
        ModelError: the write was refused (lost race, duplicate keys).
        EvolutionError: the table's schema cannot become the result's (nothing written).
        TableFencedError, FencedError: a newer collector epoch exists (``fence`` only).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    result = result.cast(plain_schema(result.schema))
    table = _ensure_target(catalog, identifier, result.schema)
    if fence is not None:  # first: "replaced" explains a changed target best
        properties = {**properties, EPOCH_PROP: str(fence.epoch)}
        _check_fence(identifier, table, fence)
    now = table.current_snapshot()
    if (now.snapshot_id if now is not None else None) != expected_snapshot_id:
        raise ModelError(f"{identifier} changed while the model ran (another run "
                         "committed first); run it again")
    target = arrow_to_iceberg(result.schema)
    changes = plan_changes(table.schema(), target, renames or {}, table=identifier)
    properties = {**properties, COLUMNS: compact_json(column_definitions(target))}
    try:
        with iceberg_errors(CommitConflictError), table.transaction() as tx:
            apply_changes(tx, changes)
            if mode == "merge":
                merge_rows(tx, result, unique_key, properties)
            else:
                replace_rows(tx, result, AlwaysTrue() if mode == "overwrite"
                             else AlwaysFalse(), properties)
    except CommitConflictError as exc:
        raise ModelError(f"{identifier} changed while the model ran (another run "
                         f"committed first); run it again: {exc}") from exc
    except ValueError as exc:  # pyiceberg: duplicate keys, incompatible schema
        if "Mismatch in fields" in str(exc):
            raise ModelError(f"cannot write {identifier}: the result's column types do not "
                             "fit the table's (changed SQL?); write to a new target or drop "
                             "the table, then run again") from exc
        reason = " ".join(str(exc).split())[:300]
        raise ModelError(f"cannot write {identifier}: {reason}") from exc


def _check_fence(identifier: str, table: Table, fence: WriteFence) -> None:
    """Refuse when the target records a newer epoch; then confirm the manifest epoch. The
    commit that follows requires the head read here, so a fence landing in between
    rejects it."""
    recorded = table_epoch(table)
    if recorded > fence.epoch:
        raise TableFencedError(identifier, fence.epoch, recorded)
    fence.confirm()


def arrow_to_iceberg(schema: pa.Schema) -> Schema:
    """The Iceberg schema pyiceberg would create for ``schema`` (field ids unassigned)."""
    return Catalog._convert_schema_if_needed(schema)


def column_definitions(schema: Schema) -> list[str]:
    """``["name:type", ...]`` of the top-level columns, types as Iceberg spells them."""
    return [f"{field.name}:{field.field_type}" for field in schema.fields]


def _ensure_target(catalog: Catalog, identifier: str, schema: pa.Schema) -> Table:
    """Load or create the target (its schema then evolves inside the data's commit)."""
    table = load_target(catalog, identifier)
    if table is None:
        namespace = identifier.split(".", 1)[0]
        with contextlib.suppress(AlreadyExistsError), iceberg_errors(AlreadyExistsError):
            catalog.create_namespace(namespace)
        try:
            with iceberg_errors(AlreadyExistsError):
                return catalog.create_table(identifier, schema, properties=TABLE_PROPERTIES)
        except AlreadyExistsError:
            table = catalog.load_table(identifier)
    if table.properties.get(MANAGED_PROP) != "true":  # a target made by an older icefloe
        table.transaction().set_properties({MANAGED_PROP: "true"}).commit_transaction()
        table = catalog.load_table(identifier)
    return table
