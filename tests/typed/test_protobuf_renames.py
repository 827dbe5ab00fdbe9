"""A Protobuf table's renames by field number across a crash and across staged rows (#39).

Both cases were found by the simulator's ``protobuf-rename`` family (docs/simulator.md):
a collector that died between creating the table and recording its field numbers lost
every later rename (seed 44), and rows staged under the old names before a rename were
refused by the renamed table at every import (seeds 91, 92). Real SQLite catalog, real
local object store; the messages are the simulator's (``testing/sim/typed.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import pipeline.iceberg.tables as tables
from collector.staging import StagingArea, parquet_bytes
from icefloe.staging import StagedFile, StagingState
from icefloe.store import open_async_store
from icefloe.streams.model import StreamConfig
from pipeline.iceberg.field_numbers import FIELDS_PROP, number_paths, rows_under_current_names
from pipeline.iceberg.tables import ensure_stream_table
from testing.sim import typed

TABLE = "shop.readings"


def stream(version: int) -> StreamConfig:
    return StreamConfig(name="readings", table=TABLE, columns=typed.columns(version),
                        format="protobuf", schema=typed.schema(version))


@pytest.fixture
def catalog(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("test", uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                      warehouse=(tmp_path / "warehouse").as_uri())


class Died(Exception):
    """The collector's process ends here."""


def test_a_table_created_by_a_collector_that_died_at_once_still_follows_renames(
        catalog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's field numbers are in its creating commit: a collector that dies right
    after creating it (before anything else is committed) leaves them recorded, so the
    next descriptor's renames, top-level and nested, are renames."""
    def died(catalog: Any, stream: StreamConfig) -> None:
        raise Died

    with monkeypatch.context() as patch:
        patch.setattr(tables, "remember_numbers", died)
        with pytest.raises(Died):
            ensure_stream_table(catalog, stream(1))
    created = catalog.load_table(TABLE)
    assert json.loads(created.properties[FIELDS_PROP]) == number_paths(stream(1))
    ids = {f.name: f.field_id for f in created.schema().fields}

    renamed = ensure_stream_table(catalog, stream(2))
    fields = {f.name: f for f in renamed.schema().fields}
    assert "amount" not in fields
    assert fields["total"].field_id == ids["amount"]  # the same column, renamed
    assert [f.name for f in fields["detail"].field_type.fields] == ["label", "weight"]
    assert "channel" in fields
    assert json.loads(renamed.properties[FIELDS_PROP]) == number_paths(stream(2))


def v1_rows(first: int, count: int) -> pa.Table:
    """Rows as the collector decodes version 1 messages (v1's column names)."""
    sent = [typed.reading(1, f"s0/{n}", n)[1] for n in range(first, first + count)]
    return pa.table({
        "uid": [f"s0/{s.n}" for s in sent], "n": [s.n for s in sent],
        "amount": [s.total for s in sent],
        "detail": pa.array([{"note": s.label, "weight": s.weight} for s in sent],
                           pa.struct([("note", pa.string()), ("weight", pa.int64())])),
        "tags": pa.array([list(s.tags) for s in sent], pa.list_(pa.string())),
        "_sequence": pa.array(range(first, first + count), pa.int64())})


def test_rows_decoded_before_a_rename_read_under_the_new_names(catalog: Any) -> None:
    ensure_stream_table(catalog, stream(1))
    table = ensure_stream_table(catalog, stream(2))
    rows = rows_under_current_names(table, v1_rows(1, 3).slice(1))
    assert rows.column_names == ["uid", "n", "total", "detail", "tags", "_sequence"]
    assert rows.to_pylist() == [
        {"uid": f"s0/{n}", "n": n, "_sequence": n, **{
            k: v for k, v in typed.reading(1, f"s0/{n}", n)[1].row().items()
            if k != "channel"}} for n in (2, 3)]
    assert rows_under_current_names(table, rows) is rows  # already current: untouched


async def test_files_staged_on_both_sides_of_a_rename_import_under_the_new_names(
        catalog: Any, tmp_path: Path) -> None:
    """One file staged under v1's names, one under v2's: read together by name they would
    hold ``amount`` and ``total`` side by side (and be refused by the table); each file is
    put under the current names before they are merged."""
    ensure_stream_table(catalog, stream(1))
    table = ensure_stream_table(catalog, stream(2))
    old = v1_rows(1, 2)
    new = rows_under_current_names(table, v1_rows(3, 2)).append_column(
        "channel", pa.array(["web", None]))
    store = open_async_store((tmp_path / "store").as_uri())
    try:
        files = []
        for i, rows in enumerate((old, new)):
            data = parquet_bytes(rows)
            await store.put(f"staging/f{i}.parquet", data)
            files.append(StagedFile(f"staging/f{i}.parquet", 2 * i + 1, 2 * i + 2,
                                    rows.num_rows, len(data), 0))
        state = StagingState(table=TABLE, files=tuple(files))
        area = StagingArea(store)
        by_name = await area.read(state)
        assert by_name is not None
        assert {"amount", "total"} <= set(by_name.column_names)  # what the import refused
        merged = await area.read(state, each=lambda rows: rows_under_current_names(table,
                                                                                   rows))
    finally:
        await store.close()
    assert merged is not None
    assert "amount" not in merged.column_names
    assert merged.column("total").to_pylist() == [8, 15, 22, 29]
    assert [d["label"] for d in merged.column("detail").to_pylist()] == \
        ["L1", "L2", "L3", "L4"]
    assert merged.column("channel").to_pylist() == [None, None, "web", None]


def test_renamed_fields_inside_lists_and_maps_of_messages_keep_their_values(
        catalog: Any) -> None:
    """Structs inside a list and a map's values, the rows a slice (offsets not from zero):
    rebuilt under the new names, nulls kept (Arrow's cast would null renamed fields)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import ListType, MapType, NestedField, StringType, StructType

    catalog.create_namespace("shop")
    table = catalog.create_table("shop.items", Schema(
        NestedField(1, "items", ListType(2, StructType(NestedField(3, "sku", StringType())))),
        NestedField(4, "by", MapType(5, StringType(), 6, StructType(
            NestedField(7, "sku", StringType()))))))
    item = pa.struct([("sku", pa.string())])
    rows = pa.table({
        "items": pa.array([[{"sku": "x"}], [{"sku": "a"}, None], None], pa.list_(item)),
        "by": pa.array([[("k", {"sku": "y"})], [("k", {"sku": "b"})], None],
                       pa.map_(pa.string(), item))}).slice(1)
    with table.update_schema() as update:
        update.rename_column(("items", "element", "sku"), "code")
        update.rename_column(("by", "value", "sku"), "code")
    out = rows_under_current_names(catalog.load_table("shop.items"), rows)
    assert out.to_pylist() == [{"items": [{"code": "a"}, None], "by": [("k", {"code": "b"})]},
                               {"items": None, "by": None}]
