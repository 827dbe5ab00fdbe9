"""Native column types in Iceberg tables: created with their Iceberg types and field ids,
and evolved only by Iceberg's legal promotions (no Spark here: pyiceberg + SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import index_by_id
from pyiceberg.types import (
    DecimalType,
    ListType,
    LongType,
    MapType,
    StructType,
    TimeType,
    UUIDType,
)

from icefloe.config import CatalogSection, Column, StreamConfig
from icefloe.errors import SchemaConflictError
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return open_catalog(CatalogSection(uri=f"sqlite:///{tmp_path / 'c.db'}",
                                       warehouse=(tmp_path / "wh").as_uri()))


def stream(**columns: str) -> StreamConfig:
    return StreamConfig(name="s", table="shop.t", columns=tuple(
        Column(name, kind) for name, kind in columns.items()))


def test_a_table_gets_native_iceberg_types_with_their_own_field_ids(catalog):
    table = ensure_stream_table(catalog, stream(
        d="decimal(9,3)", u="uuid", t="time", l="list<struct<a: int, b: map<string,long>>>"))
    schema = table.schema()
    assert schema.find_type("d") == DecimalType(9, 3)
    assert schema.find_type("u") == UUIDType()
    assert schema.find_type("t") == TimeType()
    items = schema.find_type("l")
    assert isinstance(items, ListType)
    assert isinstance(items.element_type, StructType)
    assert isinstance(items.element_type.fields[1].field_type, MapType)
    # 4 columns + 3 envelope + list element, a, b, map key, map value: each its own id
    assert sorted(index_by_id(schema)) == list(range(1, 13))
    again = ensure_stream_table(catalog, stream(
        d="decimal(9,3)", u="uuid", t="time", l="list<struct<a: int, b: map<string,long>>>"))
    assert again.metadata_location == table.metadata_location  # same shape: nothing to do


def test_decimal_precision_widens_in_place(catalog):
    ensure_stream_table(catalog, stream(d="decimal(9,2)", n="int"))
    table = ensure_stream_table(catalog, stream(d="decimal(18,2)", n="long"))
    assert table.schema().find_type("d") == DecimalType(18, 2)
    assert table.schema().find_type("n") == LongType()


@pytest.mark.parametrize(("was", "now"), [
    ("decimal(9,2)", "decimal(9,3)"),   # a scale change rewrites every value
    ("decimal(9,2)", "decimal(5,2)"),   # narrowing
    ("uuid", "string"),
    ("list<int>", "list<long>"),        # nested changes are not evolved (yet)
    ("struct<a: int>", "struct<a: int, b: int>"),
    ("string", "list<string>"),
])
def test_any_other_type_change_is_refused_naming_the_column(catalog, was, now):
    table = ensure_stream_table(catalog, stream(k=was))
    with pytest.raises(SchemaConflictError, match=r"column 'k' is .* in the table but "
                       r"configured as") as info:
        ensure_stream_table(catalog, stream(k=now))
    assert now in str(info.value)
    assert catalog.load_table("shop.t").metadata_location == table.metadata_location
