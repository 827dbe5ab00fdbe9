"""uuid columns are written without min/max bounds unless the table says otherwise (#36).

Why: the Iceberg spec orders uuids as unsigned bytes, and so do the bounds icefloe's
writers compute; Java Iceberg up to 1.10 compares them signed, so Spark with Iceberg's
runtime skips the file holding ``WHERE uid = '8…'`` and answers 0. ``icefloe.uuid-bounds``
(``omit``, the default, or ``write``) becomes Iceberg's own per-column metrics mode
``write.metadata.metrics.column.<uuid column> = counts``, which every writer honours: the
embedded append, the cluster path's executor files, compaction and upsert rewrites; and
the files themselves carry no uuid row-group statistics nor dictionary (Java prunes by
those as well). Real SQLite catalog and files; the bounds are read back from the
manifests and the Parquet footers.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefloe.config import CatalogSection, Column, StreamConfig
from icefloe.errors import ConfigError
from icefloe.streams.layout import check_properties
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import commit_rows
from pipeline.iceberg.data_files import AddFiles, FileSet, TableFiles, TableTarget
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.maintenance import MaintenanceSettings, run_maintenance
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.iceberg.upsert import CopyOnWrite

T0 = dt.datetime(2026, 11, 23, 12, tzinfo=dt.UTC)
# One uuid with the top bit set: signed, it sorts below the others (the upstream bug).
HIGH = uuid.UUID("f0000000-0000-4000-8000-000000000001")
LOW = uuid.UUID("10000000-0000-4000-8000-000000000002")


def orders(**properties: str) -> StreamConfig:
    return StreamConfig(name="orders", table="shop.orders", columns=(
        Column("uid", "uuid"), Column("n", "long")),
        primary_key=("n",), partition="none", table_properties=properties)


def rows(stream: StreamConfig, ns: list[int], sequence: int) -> pa.Table:
    return pa.Table.from_pylist([
        {"uid": (HIGH if n % 2 else LOW).bytes, "n": n,
         "_event_id": f"e{sequence}-{n}", "_received_at": T0, "_sequence": sequence}
        for n in ns], schema=table_arrow_schema(stream))


@pytest.fixture
def catalog(tmp_path: Path):
    return open_catalog(CatalogSection(uri=f"sqlite:///{tmp_path / 'c.db'}",
                                       warehouse=(tmp_path / "wh").as_uri()))


def bounds(table) -> list[tuple[str, bool, bool, bool]]:
    """Per live data file: (file name, uid has a lower bound, an upper bound, a value
    count), and the same check that ``n`` does keep its bounds."""
    schema = table.schema()
    uid, n = schema.find_field("uid").field_id, schema.find_field("n").field_id
    out = []
    for task in table.scan().plan_files():
        f = task.file
        assert n in f.lower_bounds
        assert n in f.upper_bounds
        out.append((f.file_path.rsplit("/", 1)[-1], uid in f.lower_bounds,
                    uid in f.upper_bounds, uid in f.value_counts))
    assert out
    return out


def executor_files(table, stream: StreamConfig, data: pa.Table) -> AddFiles:
    """What the cluster path does: an executor writes the files from plain data
    (:class:`TableTarget` as JSON), the driver adds them."""
    target = TableTarget.of(stream.name, table, [(n, n) for n in data.column_names])
    files = TableFiles(msgspec.json.decode(msgspec.json.encode(target), type=TableTarget),
                       "attempt", "task-0")
    files.add(data)
    return AddFiles(FileSet(tuple(files.close())))


def write_every_way(catalog, stream: StreamConfig):
    """Each writer once: the embedded append (``add_files`` of icefloe's own files), the
    cluster path's executor files, an upsert's rewrite, then compaction of it all."""
    table = ensure_stream_table(catalog, stream)
    commit_rows(catalog, stream.table, rows(stream, [1, 2], 1), sequence=1, epoch=1,
                append=WriteThenAdd(stream.name))
    commit_rows(catalog, stream.table, rows(stream, [3, 4], 2), sequence=2, epoch=1,
                append=executor_files(table, stream, rows(stream, [3, 4], 2)))
    commit_rows(catalog, stream.table, rows(stream, [2, 5], 3), sequence=3, epoch=1,
                append=CopyOnWrite(("n",)))
    table = catalog.load_table(stream.table)
    assert len(list(table.scan().plan_files())) >= 3
    run_maintenance(table, epoch=1, settings=MaintenanceSettings(min_input_files=2))
    return catalog.load_table(stream.table)


def footers(table) -> set[tuple[bool, bool]]:
    """Per data file ever written (also those compaction replaced): whether the uid
    column has Parquet row-group statistics, and a dictionary page."""
    out = set()
    for path in Path(table.location().removeprefix("file://"), "data").rglob("*.parquet"):
        footer = pq.read_metadata(path)
        for g in range(footer.num_row_groups):
            column = footer.row_group(g).column(0)
            assert column.path_in_schema == "uid"
            out.add((column.is_stats_set, column.has_dictionary_page))
            assert footer.row_group(g).column(1).is_stats_set  # n keeps its statistics
    return out


def test_uuid_bounds_are_omitted_by_every_writer(catalog):
    """Neither the manifests nor the files carry uuid min/max (Java 1.10 prunes by the
    Parquet row groups' min/max and dictionary too, each compared wrongly)."""
    table = ensure_stream_table(catalog, orders())
    assert table.properties["write.metadata.metrics.column.uid"] == "counts"
    table = write_every_way(catalog, orders())
    assert {(lower, upper, counts) for _, lower, upper, counts in bounds(table)} == {
        (False, False, True)}
    assert footers(table) == {(False, False)}
    assert sorted(r["n"] for r in table.scan().to_arrow().to_pylist()) == [1, 2, 3, 4, 5]


def test_write_keeps_the_bounds_and_switching_back_omits_them_again(catalog):
    table = ensure_stream_table(catalog, orders(**{"icefloe.uuid-bounds": "write"}))
    assert "write.metadata.metrics.column.uid" not in table.properties
    table = write_every_way(catalog, orders(**{"icefloe.uuid-bounds": "write"}))
    assert {(lower, upper) for _, lower, upper, _ in bounds(table)} == {(True, True)}
    assert footers(table) == {(True, True)}
    table = ensure_stream_table(catalog, orders())  # the key dropped from the config
    assert table.properties["write.metadata.metrics.column.uid"] == "counts"
    assert "icefloe.uuid-bounds" not in table.properties


def test_an_existing_table_gets_the_property_at_the_next_start(catalog):
    """A table made before this change: files written before keep their bounds (they need
    a rewrite); the next start sets the mode, and files written from then on have none."""
    table = ensure_stream_table(catalog, orders())
    with table.transaction() as tx:  # as today's main left it
        tx.remove_properties("write.metadata.metrics.column.uid")
    # a file as main wrote it: pyiceberg's writer keeps Parquet statistics, so bounds
    commit_rows(catalog, "shop.orders", rows(orders(), [1], 1), sequence=1, epoch=1)
    table = ensure_stream_table(catalog, orders())
    commit_rows(catalog, "shop.orders", rows(orders(), [2], 2), sequence=2, epoch=1,
                append=WriteThenAdd("orders"))
    assert sorted((lower, upper) for _, lower, upper, _ in bounds(
        catalog.load_table("shop.orders"))) == [(False, False), (True, True)]


def test_a_uuid_column_added_later_gets_counts_too(catalog):
    before = StreamConfig(name="orders", table="shop.orders", columns=(Column("n", "long"),))
    ensure_stream_table(catalog, before)
    table = ensure_stream_table(catalog, orders())
    assert table.properties["write.metadata.metrics.column.uid"] == "counts"


def test_the_stream_may_set_the_metrics_key_itself(catalog):
    table = ensure_stream_table(catalog, orders(**{
        "write.metadata.metrics.column.uid": "full"}))
    assert table.properties["write.metadata.metrics.column.uid"] == "full"


@pytest.mark.parametrize("value", ["off", "Write", ""])
def test_a_bad_mode_is_refused_by_name(value):
    with pytest.raises(ConfigError, match=r"icefloe.uuid-bounds.*omit, write"):
        check_properties({"icefloe.uuid-bounds": value}, "streams[0].table_properties")
    check_properties({"icefloe.uuid-bounds": "write"}, "streams[0].table_properties")
    with pytest.raises(ConfigError, match="set by icefloe itself"):
        check_properties({"icefloe.managed": "x"}, "streams[0].table_properties")
