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
    # 4 columns + 4 envelope (with _shard) + list element, a, b, map key, map value: each
    # its own id
    assert sorted(index_by_id(schema)) == list(range(1, 14))
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


def test_compaction_keeps_native_and_nested_values(catalog):
    """Maintenance rewrites files through pyiceberg: every native value (and a null list of
    structs) survives the rewrite."""
    import datetime as dt
    import uuid
    from decimal import Decimal

    import pyarrow as pa

    from pipeline.columns import table_arrow_schema
    from pipeline.iceberg.maintenance import MaintenanceSettings, run_maintenance

    config = stream(d="decimal(9,2)", u="uuid", b="binary", t="time",
                    items="list<struct<sku: string, n: long>>", m="map<string,double>")
    table = ensure_stream_table(catalog, config)
    rows = [{"d": Decimal("1.25"), "u": uuid.UUID(int=7).bytes, "b": b"\x00\xff",
             "t": dt.time(1, 2, 3), "items": [{"sku": "a", "n": 1}], "m": [("k", 0.5)],
             "_sequence": 1},
            {"items": None, "m": None, "_sequence": 2}]
    for row in rows:  # one file each
        table.append(pa.Table.from_pylist([row], schema=table_arrow_schema(config)))
    report = run_maintenance(catalog.load_table("shop.t"), epoch=1,
                             settings=MaintenanceSettings(min_input_files=2))
    assert (report.compaction.files_removed, report.compaction.files_added) == (2, 1)
    back = sorted(catalog.load_table("shop.t").scan().to_arrow().to_pylist(),
                  key=lambda r: r["_sequence"])
    assert (back[0]["d"], back[0]["u"], back[0]["b"], back[0]["t"]) == (
        Decimal("1.25"), uuid.UUID(int=7), b"\x00\xff", dt.time(1, 2, 3))
    assert (back[0]["items"], back[0]["m"]) == ([{"sku": "a", "n": 1}], [("k", 0.5)])
    assert (back[1]["items"], back[1]["m"]) == (None, None)
