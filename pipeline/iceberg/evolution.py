"""Plan and apply a table's schema evolution: one module for models and streams.

Why one module: a model's table (``pipeline.models.write``) and a stream's table evolve by
the same Iceberg rules, and two copies of those rules would drift. Callers describe what
the table should look like (a target :class:`~pyiceberg.schema.Schema`, plus the renames
they detected themselves — a model compares its SQL's AST, a stream its config);
:func:`plan_changes` turns that into a list of :data:`SchemaChange` or refuses it, and
:func:`apply_changes` stages the list inside the caller's pyiceberg ``Transaction``, so the
schema change and the data it belongs to land in one metadata commit or not at all.

The rules (Iceberg's own, so Spark, Trino and Flink read the result):

* a column the target has and the table lacks is **added**, always optional (old rows read
  back as null; a required column cannot be added to files that lack it);
* a field added inside a struct column is added the same way (nested additions only);
* a rename keeps the column's field id, so old files read under the new name;
* a type may only be **promoted**: int→long, float→double, decimal(p,s)→decimal(P,s), P>p;
* a column the table has and the target lacks is **dropped** from the table's current
  schema (data files are not rewritten; time travel to older snapshots still shows it).
  Callers that must keep such columns (streams) filter :class:`DropColumn` out;
* anything else (narrowing, string→int, a struct becoming a list, ...) raises
  :class:`EvolutionError` naming the table, column and both types, before anything is
  staged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StructType,
)

from icefloe.errors import IcefloeError

if TYPE_CHECKING:
    from pyiceberg.table import Transaction


class EvolutionError(IcefloeError):
    """A schema change Iceberg cannot make without rewriting data (or losing it).

    ``table``, ``column``, ``from_type`` and ``to_type`` say which; the message says why.
    """

    def __init__(self, table: str, column: str, from_type: str, to_type: str,
                 reason: str = "") -> None:
        where = f"table {table}: " if table else ""
        why = reason or ("Iceberg only widens int→long, float→double and a decimal's "
                         "precision (same scale)")
        super().__init__(f"{where}column {column!r} cannot change from {from_type} to "
                         f"{to_type}: {why}")
        self.table = table
        self.column = column
        self.from_type = from_type
        self.to_type = to_type
        self.reason = why


@dataclass(frozen=True)
class AddColumn:
    """Add ``name`` (inside the struct at ``parent``, top level when empty) as optional."""

    name: str
    type: IcebergType
    doc: str | None = None
    parent: tuple[str, ...] = ()


@dataclass(frozen=True)
class RenameColumn:
    """Rename top-level column ``old`` to ``new``; its field id (and data) stay."""

    old: str
    new: str


@dataclass(frozen=True)
class PromoteColumn:
    """Widen column ``name`` (its name in the *target*, i.e. after any rename) to ``type``."""

    name: str
    type: IcebergType


@dataclass(frozen=True)
class DropColumn:
    """Remove top-level column ``name`` from the table's current schema."""

    name: str


SchemaChange = AddColumn | RenameColumn | PromoteColumn | DropColumn

_PROMOTIONS = {(IntegerType(), LongType()), (FloatType(), DoubleType())}


def promotable(have: IcebergType, want: IcebergType) -> bool:
    """Iceberg's legal primitive promotions: int→long, float→double, and a decimal's
    precision widening at the same scale."""
    if (have, want) in _PROMOTIONS:
        return True
    return isinstance(have, DecimalType) and isinstance(want, DecimalType) and \
        have.scale == want.scale and want.precision > have.precision


def shape(kind: IcebergType) -> str:
    """A type without its field ids or nullability (two schemas' nested fields never share
    ids, so nested types are compared by shape)."""
    if isinstance(kind, ListType):
        return f"list<{shape(kind.element_type)}>"
    if isinstance(kind, MapType):
        return f"map<{shape(kind.key_type)},{shape(kind.value_type)}>"
    if isinstance(kind, StructType):
        return "struct<" + ",".join(f"{f.name}:{shape(f.field_type)}"
                                    for f in kind.fields) + ">"
    return str(kind)


def plan_changes(current: Schema, target: Schema, renames: Mapping[str, str] | None = None,
                 *, table: str = "") -> list[SchemaChange]:
    """The changes that turn ``current`` into ``target``, renames first, then drops,
    promotions and additions; empty when nothing changes.

    ``renames`` maps a current top-level column name to its target name; a pair whose old
    column is gone or whose new name already exists in ``current`` is ignored (the plan then
    treats the columns by name). ``table`` only names the table in errors.

    Raises:
        EvolutionError: a column's type changes in a way Iceberg cannot promote.
    """
    have = {field.name: field for field in current.fields}
    want = {field.name: field for field in target.fields}
    renamed = {old: new for old, new in (renames or {}).items()
               if old in have and new in want and new not in have and old not in want}
    origin = {new: old for old, new in renamed.items()}
    changes: list[SchemaChange] = [RenameColumn(old, new) for old, new in renamed.items()]
    changes += [DropColumn(name) for name in have if name not in want and name not in renamed]
    for field in target.fields:
        before = have.get(origin.get(field.name, field.name))
        if before is None:
            changes.append(AddColumn(field.name, field.field_type, field.doc))
        else:
            changes += _compare(table, (field.name,), before.field_type, field.field_type)
    return changes


def _compare(table: str, path: tuple[str, ...], have: IcebergType, want: IcebergType
             ) -> list[SchemaChange]:
    """Changes for one column whose table type is ``have`` and target type ``want``."""
    if have == want or shape(have) == shape(want):
        return []
    if have.is_primitive and want.is_primitive and promotable(have, want):
        if len(path) > 1:
            raise _refuse(table, path, have, want, "promoting a field inside a struct is "
                          "not supported; add a new top-level column instead")
        return [PromoteColumn(path[0], want)]
    if isinstance(have, StructType) and isinstance(want, StructType):
        return _compare_struct(table, path, have, want)
    raise _refuse(table, path, have, want)


def _compare_struct(table: str, path: tuple[str, ...], have: StructType, want: StructType
                    ) -> list[SchemaChange]:
    """Fields added to a struct; fields it lost stay (read back as null)."""
    old: dict[str, NestedField] = {field.name: field for field in have.fields}
    changes: list[SchemaChange] = []
    for field in want.fields:
        before = old.get(field.name)
        if before is None:
            changes.append(AddColumn(field.name, field.field_type, field.doc, parent=path))
        else:
            changes += _compare(table, (*path, field.name), before.field_type,
                                field.field_type)
    return changes


def _refuse(table: str, path: tuple[str, ...], have: IcebergType, want: IcebergType,
            reason: str = "") -> EvolutionError:
    return EvolutionError(table, ".".join(path), shape(have), shape(want), reason)


def apply_changes(txn: Transaction, changes: Sequence[SchemaChange]) -> None:
    """Stage ``changes`` as one schema update inside ``txn``, the transaction that also
    writes the data, so both commit together. No-op for an empty list.

    A promotion names the column as the target does; pyiceberg resolves columns against
    the schema before the update, so a renamed column is promoted under its old name.
    """
    if not changes:
        return
    origin = {c.new: c.old for c in changes if isinstance(c, RenameColumn)}
    with txn.update_schema() as update:
        for change in changes:
            if isinstance(change, RenameColumn):
                update.rename_column(change.old, change.new)
            elif isinstance(change, DropColumn):
                update.delete_column(change.name)
            elif isinstance(change, PromoteColumn):
                update.update_column(origin.get(change.name, change.name),
                                     field_type=change.type)
            else:
                parent = (origin.get(change.parent[0], change.parent[0]), *change.parent[1:]) \
                    if change.parent else ()
                update.add_column((*parent, change.name), change.type,
                                  doc=change.doc, required=False)


def describe(change: SchemaChange) -> str:
    """One line for logs and the CLI (``added x long``, ``renamed a → b`` ...)."""
    if isinstance(change, AddColumn):
        return f"added {'.'.join((*change.parent, change.name))} {change.type}"
    if isinstance(change, RenameColumn):
        return f"renamed {change.old} → {change.new}"
    if isinstance(change, PromoteColumn):
        return f"widened {change.name} to {change.type}"
    return f"dropped {change.name}"
