"""Schema evolution shared by models and streams (:mod:`pipeline.iceberg.evolution`):
the plan (pure) and its application inside the transaction that appends the data, on a
real pyiceberg SQLite catalog. No Spark."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    StructType,
)

from icefloe.errors import IcefloeError
from pipeline.iceberg.evolution import (
    AddColumn,
    DropColumn,
    EvolutionError,
    PromoteColumn,
    RenameColumn,
    apply_changes,
    plan_changes,
)


def schema(*columns: tuple[str, object]) -> Schema:
    return Schema(*(NestedField(i, name, kind, required=False)  # type: ignore[arg-type]
                    for i, (name, kind) in enumerate(columns, start=1)))


BASE = schema(("day", StringType()), ("hits", IntegerType()), ("ratio", FloatType()),
              ("amount", DecimalType(10, 2)))


def test_should_plan_nothing_for_the_same_schema() -> None:
    assert plan_changes(BASE, BASE) == []


def test_should_plan_add_rename_promote_and_drop() -> None:
    target = schema(("day", StringType()), ("visits", LongType()), ("ratio", DoubleType()),
                    ("amount", DecimalType(12, 2)), ("note", StringType()))
    # amount widened, ratio widened, hits renamed to visits and widened, note added
    assert plan_changes(BASE, target, {"hits": "visits"}) == [
        RenameColumn("hits", "visits"), PromoteColumn("visits", LongType()),
        PromoteColumn("ratio", DoubleType()), PromoteColumn("amount", DecimalType(12, 2)),
        AddColumn("note", StringType())]
    assert plan_changes(BASE, schema(("day", StringType()), ("hits", IntegerType()))) == [
        DropColumn("ratio"), DropColumn("amount")]


def test_should_treat_an_unusable_rename_by_name() -> None:
    """A rename whose old column is gone, or whose new name exists already, is ignored."""
    target = schema(("day", StringType()), ("hits", IntegerType()), ("ratio", FloatType()),
                    ("amount", DecimalType(10, 2)))
    assert plan_changes(BASE, target, {"nope": "hits", "day": "hits"}) == []


@pytest.mark.parametrize(("have", "want"), [
    (LongType(), IntegerType()), (StringType(), IntegerType()), (DoubleType(), FloatType()),
    (DecimalType(10, 2), DecimalType(8, 2)), (DecimalType(10, 2), DecimalType(12, 3)),
    (IntegerType(), StringType()), (StringType(), ListType(9, StringType())),
])
def test_should_refuse_an_incompatible_change(have: object, want: object) -> None:
    with pytest.raises(EvolutionError) as caught:
        plan_changes(schema(("x", have)), schema(("x", want)), table="mart.t")
    error = caught.value
    assert isinstance(error, IcefloeError)
    assert (error.table, error.column) == ("mart.t", "x")
    assert error.from_type == str(have)
    assert error.to_type == str(want)
    assert "mart.t" in str(error)
    assert "'x'" in str(error)


def test_should_add_a_field_to_a_struct() -> None:
    have = schema(("s", StructType(NestedField(10, "a", StringType(), required=False))))
    want = schema(("s", StructType(NestedField(20, "a", StringType(), required=False),
                                   NestedField(21, "b", LongType(), required=False))))
    assert plan_changes(have, want) == [AddColumn("b", LongType(), parent=("s",))]


def test_should_refuse_a_type_change_inside_a_struct() -> None:
    have = schema(("s", StructType(NestedField(10, "a", StringType(), required=False))))
    want = schema(("s", StructType(NestedField(20, "a", LongType(), required=False))))
    with pytest.raises(EvolutionError, match=re.escape("'s.a'")):
        plan_changes(have, want)


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path / 'c.db'}",
                         warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("mart")
    return catalog


def test_should_apply_every_change_in_the_data_commit(catalog: SqlCatalog) -> None:
    """Rename + promote + drop + add + nested add and the append are one metadata commit
    with one new snapshot; the old rows read back under the new schema."""
    struct = StructType(NestedField(10, "a", StringType(), required=False))
    start = schema(("day", StringType()), ("hits", IntegerType()), ("gone", StringType()),
                   ("s", struct))
    table = catalog.create_table("mart.t", start)
    table.append(pa.table({"day": ["d1"], "hits": pa.array([1], pa.int32()),
                           "gone": ["x"], "s": [{"a": "p"}]}))
    target = schema(("day", StringType()), ("visits", LongType()), ("note", StringType()),
                    ("s", StructType(NestedField(20, "a", StringType(), required=False),
                                     NestedField(21, "b", LongType(), required=False))))
    changes = plan_changes(table.schema(), target, {"hits": "visits"})
    data = pa.table({"day": ["d2"], "visits": pa.array([2], pa.int64()), "note": ["n"],
                     "s": [{"a": "q", "b": 5}]})
    before = len(table.metadata.snapshots)
    with table.transaction() as txn:
        apply_changes(txn, changes)
        txn.append(data)
    table = catalog.load_table("mart.t")
    assert len(table.metadata.snapshots) == before + 1
    assert [f.name for f in table.schema().fields] == ["day", "visits", "s", "note"]
    assert table.schema().find_field("s.b").field_type == LongType()
    assert table.schema().find_field("visits").field_type == LongType()
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["day"])
    assert rows == [{"day": "d1", "visits": 1, "s": {"a": "p", "b": None}, "note": None},
                    {"day": "d2", "visits": 2, "s": {"a": "q", "b": 5}, "note": "n"}]


def test_should_do_nothing_for_no_changes(catalog: SqlCatalog) -> None:
    table = catalog.create_table("mart.t", BASE)
    with table.transaction() as txn:
        apply_changes(txn, [])
    assert catalog.load_table("mart.t").schema() == table.schema()
