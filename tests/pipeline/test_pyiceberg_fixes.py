"""pyiceberg's Arrow projection turns a null list of structs into ``[]`` on write and scan;
icefloe's wrapper (:mod:`pipeline.iceberg.pyiceberg_fixes`) keeps it null. If the
``unpatched`` test starts failing, pyiceberg fixed it and the wrapper can go."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from pyiceberg.io.pyarrow import ArrowProjectionVisitor

from icefloe.config import CatalogSection, Column, StreamConfig
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table

STREAM = StreamConfig(name="s", table="shop.t", columns=(
    Column("items", "list<struct<a: int>>"), Column("tags", "list<string>")))


def roundtrip(tmp_path: Path) -> list[dict]:
    catalog = open_catalog(CatalogSection(uri=f"sqlite:///{tmp_path / 'c.db'}",
                                          warehouse=(tmp_path / "wh").as_uri()))
    table = ensure_stream_table(catalog, STREAM)
    schema = table_arrow_schema(STREAM)
    rows = [{"items": [{"a": 1}], "tags": ["x"]}, {"items": None, "tags": None},
            {"items": [None], "tags": []}]
    table.append(pa.Table.from_pylist(rows, schema=schema))
    return [{k: r[k] for k in ("items", "tags")} for r in table.scan().to_arrow().to_pylist()]


def test_a_null_list_of_structs_stays_null_through_append_and_scan(tmp_path):
    assert roundtrip(tmp_path) == [{"items": [{"a": 1}], "tags": ["x"]},
                                   {"items": None, "tags": None},
                                   {"items": [None], "tags": []}]


def test_unpatched_pyiceberg_still_loses_the_null(tmp_path, monkeypatch):
    monkeypatch.setattr(ArrowProjectionVisitor, "list", ArrowProjectionVisitor.list.wrapped)
    assert roundtrip(tmp_path)[1]["items"] == []
