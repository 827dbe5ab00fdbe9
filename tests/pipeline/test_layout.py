"""Table layout on the embedded output path, through a real SQLite catalog: every
partition transform splits rows into the right files, several fields combine, the spec
evolves on a table with data, files follow the sort order, table properties reach the
table and the writer, and compaction keeps partitions apart and its output sorted."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from collector_support import collector_config
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan
from pyiceberg.table import Table

from icefloe.config import Column, StreamConfig
from icefloe.streams.layout import parse_partition
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import commit_rows, summary_props
from pipeline.iceberg.data_files import AddFiles, FileSet, StaleFilesError, TableFiles, TableTarget
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.maintenance import compact
from pipeline.iceberg.tables import ensure_stream_table, iceberg_transform

UTC = dt.UTC
BASE = dt.datetime(2026, 1, 30, 22, tzinfo=UTC)
EVENTS = StreamConfig(name="events", table="web.events", columns=(
    Column("user_id", "string"), Column("country", "string"), Column("n", "long"),
    Column("day", "date"), Column("ts", "timestamp"), Column("price", "decimal(9,2)"),
    Column("url", "string")))
COUNTRIES = ("de", "fr", "us", None)


def rows(count: int, *, sequence: int = 1, start: int = 0) -> pa.Table:
    """Rows across two months, four countries (one null), ten users, long urls."""
    return pa.Table.from_pylist([
        {"user_id": f"user-{i % 10}", "country": COUNTRIES[i % 4], "n": i * 7 - 50,
         "day": (BASE + dt.timedelta(hours=5 * i)).date(),
         "ts": BASE + dt.timedelta(hours=5 * i), "price": Decimal(i * 3) / 4,
         "url": f"https://example.com/a/rather/long/path/{i % 3}",
         "_event_id": f"e{sequence}-{i}", "_received_at": BASE + dt.timedelta(minutes=i),
         "_sequence": sequence}
        for i in range(start, start + count)], schema=table_arrow_schema(EVENTS))


def make(tmp_path, **layout: object) -> tuple[object, StreamConfig]:
    stream = msgspec.structs.replace(EVENTS, **layout)
    catalog = open_catalog(collector_config(tmp_path, streams=(stream,)).catalog)
    ensure_stream_table(catalog, stream)
    return catalog, stream


def commit(catalog: object, data: pa.Table, sequence: int) -> Table:
    append = WriteThenAdd("events")
    outcome = commit_rows(catalog, "web.events", data, sequence=sequence, epoch=1,
                          append=append)
    assert outcome.rows == data.num_rows
    return catalog.load_table("web.events")  # type: ignore[attr-defined]


def read(table: Table, path: str) -> pa.Table:
    with table.io.new_input(path).open() as stream:
        return pq.read_table(stream)


def assert_files_hold_their_partition(table: Table) -> int:
    """Every live data file's rows map, through the spec's own transforms, to the
    partition the manifest records for it. Returns the number of files."""
    specs = table.specs()
    files = [task.file for task in table.scan().plan_files()]
    for data_file in files:
        spec = specs[data_file.spec_id]
        content = read(table, data_file.file_path)
        for pos, part in enumerate(spec.fields):
            column = table.schema().find_column_name(part.source_id)
            kind = table.schema().find_field(part.source_id).field_type
            values = part.transform.pyarrow_transform(kind)(content.column(column))
            distinct = set(values.to_pylist())
            assert len(distinct) == 1, (data_file.file_path, part.name, distinct)
            expected = data_file.partition[pos]
            [got] = distinct
            if got is not None and kind.__class__.__name__ in ("DateType",) and \
                    part.transform.__class__.__name__ == "IdentityTransform":
                got = (got - dt.date(1970, 1, 1)).days
            assert got == expected, (part.name, got, expected)
    return len(files)


@pytest.mark.parametrize(("text", "column", "value", "expected_files"), [
    ("country", "country", "de", 4),
    ("identity(url)", "url", "https://example.com/a/rather/long/path/1", 3),
    ("year(ts)", "ts", None, 1),
    ("month(ts)", "ts", None, 2),
    ("day(day)", "day", None, 10),
    ("hour(ts)", "ts", None, 40),
    ("bucket(4, user_id)", "user_id", "user-3", None),
    ("bucket(3, n)", "n", 13, None),
    ("truncate(3, country)", "country", "fr", 4),
    ("truncate(100, n)", "n", 13, 4),
    ("truncate(50, price)", "price", Decimal("3.75"), None),
])
def test_each_transform_splits_rows_into_their_partitions(tmp_path, text, column, value,
                                                          expected_files) -> None:
    catalog, _ = make(tmp_path, partition_by=(text,))
    data = rows(40)
    table = commit(catalog, data, 1)
    field = table.spec().fields[0]
    assert str(field.transform) == str(iceberg_transform(parse_partition(text)))
    files = assert_files_hold_their_partition(table)
    if expected_files is not None:
        assert files == expected_files
    assert table.scan().to_arrow().num_rows == 40
    if value is not None:  # a filter on the column prunes to its partition, counts exact
        want = sum(1 for v in data.column(column).to_pylist() if v == value)
        scan = table.scan(row_filter=EqualTo(column, value))
        assert len(list(scan.plan_files())) == 1
        assert scan.to_arrow().num_rows == want > 0


def test_several_fields_combine(tmp_path) -> None:
    catalog, _ = make(tmp_path, partition_by=("day(_received_at)", "bucket(4, user_id)",
                                              "truncate(1, country)"))
    table = commit(catalog, rows(100), 1)
    assert [f.name for f in table.spec().fields] == ["_received_at_day", "user_id_bucket",
                                                      "country_trunc"]
    files = assert_files_hold_their_partition(table)
    assert 4 < files <= 2 * 4 * 4
    scan = table.scan(row_filter=And(EqualTo("country", "fr"), EqualTo("user_id", "user-1")))
    assert scan.to_arrow().num_rows == sum(1 for i in range(100)
                                           if i % 4 == 1 and i % 10 == 1)
    assert len(list(scan.plan_files())) < files


def test_the_partition_spec_evolves_on_a_table_with_data(tmp_path) -> None:
    catalog, stream = make(tmp_path)  # the default: day(_received_at)
    commit(catalog, rows(40), 1)
    evolved = msgspec.structs.replace(stream, partition_by=("bucket(2, user_id)",
                                                            "country"))
    ensure_stream_table(catalog, evolved)  # what the next start or registry change does
    table = catalog.load_table("web.events")
    assert table.spec().spec_id == 1
    assert [f.name for f in table.spec().fields] == ["user_id_bucket", "country"]
    table = commit(catalog, rows(60, sequence=2, start=40), 2)
    by_spec: dict[int, int] = {}
    for task in table.scan().plan_files():
        by_spec[task.file.spec_id] = by_spec.get(task.file.spec_id, 0) + task.file.record_count
    assert by_spec == {0: 40, 1: 60}  # old files keep the spec they were written with
    assert_files_hold_their_partition(table)
    assert table.scan().to_arrow().num_rows == 100
    de = table.scan(row_filter=EqualTo("country", "de")).to_arrow()
    assert de.num_rows == 25
    assert sorted(de.column("_event_id").to_pylist()) == sorted(
        [f"e1-{i}" for i in range(0, 40, 4)] + [f"e2-{i}" for i in range(40, 100, 4)])
    ensure_stream_table(catalog, evolved)  # unchanged config: no new spec, no commit
    assert catalog.load_table("web.events").metadata.last_updated_ms == \
        table.metadata.last_updated_ms


def test_files_are_written_in_the_sort_order(tmp_path) -> None:
    catalog, stream = make(tmp_path, partition_by=("month(ts)",),
                           sort_by=("country desc nulls first", "n"))
    table = commit(catalog, rows(80), 1)
    order = table.sort_order()
    assert order.order_id == 1
    assert [(table.schema().find_column_name(f.source_id), str(f.direction),
             str(f.null_order)) for f in order.fields] == [
        ("country", "DESC", "NULLS FIRST"), ("n", "ASC", "NULLS FIRST")]
    for task in table.scan().plan_files():
        assert task.file.sort_order_id == 1
        content = read(table, task.file.file_path).to_pylist()
        keys = [((r["country"] is not None), r["country"] or "", r["n"]) for r in content]
        expect = sorted(keys, key=lambda k: (k[0], _neg(k[1]), k[2]))
        assert keys == expect
    unsorted = msgspec.structs.replace(stream, sort_by=())
    assert ensure_stream_table(catalog, unsorted).sort_order().is_unsorted


def _neg(text: str) -> tuple[int, ...]:
    return (*tuple(-ord(c) for c in text), 1)


def test_table_properties_reach_the_table_and_the_writer(tmp_path) -> None:
    props = {"write.parquet.compression-codec": "gzip",
             "write.target-file-size-bytes": "40000", "comment": "clicks"}
    catalog, stream = make(tmp_path, partition_by=(), table_properties=props)
    table = catalog.load_table("web.events")
    assert {k: table.properties.get(k) for k in props} == props
    assert table.metadata.format_version == 2
    big = rows(3000)
    table = commit(catalog, big, 1)
    files = [task.file for task in table.scan().plan_files()]
    assert len(files) > 1  # the target size rolled the output
    assert sum(f.record_count for f in files) == 3000
    for data_file in files:
        meta = pq.read_metadata(table.io.new_input(data_file.file_path).open())
        assert meta.row_group(0).column(0).compression == "GZIP"
    assert table.scan().to_arrow().num_rows == 3000
    # a key dropped from the config is removed again; other tools' keys stay
    with table.transaction() as tx:
        tx.set_properties({"owner": "ops"})
    fewer = msgspec.structs.replace(stream, table_properties={"comment": "clicks"})
    table = ensure_stream_table(catalog, fewer)
    assert "write.parquet.compression-codec" not in table.properties
    assert (table.properties["comment"], table.properties["owner"]) == ("clicks", "ops")


def test_compaction_keeps_partitions_and_writes_sorted(tmp_path) -> None:
    catalog, _ = make(tmp_path, partition_by=("country",), sort_by=("n desc",))
    for sequence in range(1, 5):
        table = commit(catalog, rows(20, sequence=sequence, start=20 * sequence), sequence)
    before = assert_files_hold_their_partition(table)
    assert before == 16
    result = compact(table, epoch=1, min_input_files=2)
    assert (result.files_removed, result.files_added, result.partitions) == (16, 4, 4)
    table = catalog.load_table("web.events")
    assert assert_files_hold_their_partition(table) == 4
    assert table.scan().to_arrow().num_rows == 80
    for task in table.scan().plan_files():
        n = read(table, task.file.file_path).column("n").to_pylist()
        assert n == sorted(n, reverse=True)
    fr = table.scan(row_filter=And(EqualTo("country", "fr"),
                                   GreaterThanOrEqual("n", 0), LessThan("n", 10**6)))
    assert fr.to_arrow().num_rows == 20


def test_files_written_under_an_older_spec_are_not_committed_under_the_new_one(
        tmp_path) -> None:
    """The cluster path writes on executors and commits later: if the spec evolved in
    between, the files are stale (the run is retried), never filed under the wrong spec."""
    catalog, stream = make(tmp_path)
    table = catalog.load_table("web.events")
    data = rows(10)
    files = TableFiles(TableTarget.of("events", table, [(n, n) for n in data.column_names]),
                       "a1", "t1")
    files.add(data)
    written = FileSet(tuple(files.close()))
    ensure_stream_table(catalog, msgspec.structs.replace(stream, partition_by=("country",)))
    with pytest.raises(StaleFilesError, match="partition spec 0"):
        AddFiles(written)(catalog.load_table("web.events"), data, summary_props(1, 1))
    assert catalog.load_table("web.events").current_snapshot() is None
