"""The embedded commit writes Parquet files itself and adds them: same rows, one file per
partition value, and no file left behind when the catalog refuses the commit."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from collector_support import CLICKS, collector_config
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.exceptions import CommitFailedException

from collector.dedup import DedupWindow
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import commit_rows, committed_state, summary_props
from pipeline.iceberg.data_files import TableFiles, TableTarget
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.tables import ensure_stream_table

UTC = dt.UTC


def clicks(n: int, *, days: int = 1, sequence: int = 1) -> pa.Table:
    base = dt.datetime(2026, 11, 23, 12, tzinfo=UTC)
    return pa.Table.from_pylist([
        {"user_id": f"u{i}", "url": f"/p/{i}", "n": i, "ts": base,
         "_event_id": f"e{sequence}-{i}", "_received_at": base + dt.timedelta(days=i % days),
         "_sequence": sequence} for i in range(n)], schema=table_arrow_schema(CLICKS))


def data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if "/data/" in p.as_posix())


@pytest.mark.parametrize(("days", "partition"), [(1, "day"), (3, "day"), (3, "none")])
def test_rows_land_once_with_one_file_per_partition_value(tmp_path, days, partition):
    stream = msgspec.structs.replace(CLICKS, partition=partition)
    config = collector_config(tmp_path, streams=(stream,))
    catalog = open_catalog(config.catalog)
    ensure_stream_table(catalog, stream)
    rows = clicks(300, days=days)
    append = WriteThenAdd("clicks")
    outcome = commit_rows(catalog, "web.clicks", rows, sequence=1, epoch=1, append=append)
    assert append.cleanup(catalog, "web.clicks", sequence=1, epoch=1) == 0
    assert outcome.rows == 300
    table = catalog.load_table("web.clicks")
    back = table.scan().to_arrow().sort_by("n")
    assert back.column("_event_id").to_pylist() == [f"e1-{i}" for i in range(300)]
    assert back.column("_received_at").to_pylist() == rows.column("_received_at").to_pylist()
    files = list(table.scan().plan_files())
    assert len(files) == (days if partition == "day" else 1)
    assert {f.file.record_count for f in files} == {300 // len(files)}
    assert committed_state(table).sequence == 1


def test_files_of_a_refused_commit_are_deleted(tmp_path):
    config = collector_config(tmp_path, streams=(CLICKS,))
    catalog = open_catalog(config.catalog)
    ensure_stream_table(catalog, CLICKS)
    stale = catalog.load_table("web.clicks")
    catalog.load_table("web.clicks").append(clicks(5, sequence=1),
                                            snapshot_properties=summary_props(1, 1))
    kept = data_files(tmp_path)
    append = WriteThenAdd("clicks")
    with pytest.raises(CommitFailedException):  # the table moved on: optimistic check fails
        append(stale, clicks(50, sequence=2), summary_props(2, 1))
    assert len(data_files(tmp_path)) == len(kept) + 1  # written, not committed
    assert append.cleanup(catalog, "web.clicks", sequence=2, epoch=1) == 1
    assert data_files(tmp_path) == kept
    assert catalog.load_table("web.clicks").scan().to_arrow().num_rows == 5


def test_a_failed_write_leaves_no_file(tmp_path):
    config = collector_config(tmp_path, streams=(CLICKS,))
    catalog = open_catalog(config.catalog)
    table = ensure_stream_table(catalog, CLICKS)
    bad = clicks(10).set_column(2, "n", pa.array(["not a number"] * 10))
    with pytest.raises((pa.ArrowInvalid, ValueError)):
        WriteThenAdd("clicks")(table, bad, summary_props(1, 1))
    assert data_files(tmp_path) == []


@pytest.mark.parametrize("threads", [1, 4])
def test_partitions_written_at_once_hold_what_one_thread_writes(tmp_path, threads):
    """Several partitions' files written on threads: the same files (names in the same
    order, one per partition value) with the same rows in the same order as one thread."""
    stream = msgspec.structs.replace(CLICKS, partition="day")
    config = collector_config(tmp_path, streams=(stream,))
    catalog = open_catalog(config.catalog)
    table = ensure_stream_table(catalog, stream)
    rows = clicks(400, days=4)  # the days alternate row by row: four slices each
    target = TableTarget.of("clicks", table, [(n, n) for n in rows.column_names])
    files = TableFiles(target, "attempt", "driver", threads=threads)
    files.add(rows)
    files.add(clicks(40, days=2, sequence=2))  # a second add reuses the open files
    refs = files.close()
    assert [ref.path.rsplit("/", 1)[1][:len("attempt-driver-000")] for ref in refs] == [
        f"attempt-driver-{i:03d}" for i in range(4)]
    assert [ref.rows for ref in refs] == [120, 120, 100, 100]
    for day, ref in enumerate(refs):
        back = pq.read_table(ref.path.removeprefix("file://"))
        expected = [f"e1-{i}" for i in range(400) if i % 4 == day] + [
            f"e2-{i}" for i in range(40) if i % 2 == day and day < 2]
        assert back.column("_event_id").to_pylist() == expected


ids = st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 4)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(ids, st.sets(st.sampled_from("abcdef"), max_size=3))
def test_filter_in_sequence_order_equals_filter_of_sorted_rows(rows, seen):
    table = pa.table({"_event_id": pa.array([i for i, _ in rows], pa.string()),
                      "_sequence": pa.array([s for _, s in rows], pa.int64()),
                      "pos": pa.array(range(len(rows)), pa.int64())})
    window = DedupWindow(600, 1000)
    window.add(sorted(seen), 0, now_s=0)
    expected, dropped = window.filter(table.sort_by([("_sequence", "ascending")]))
    got, got_dropped = window.filter_in_sequence_order(table)
    assert got_dropped == dropped
    assert sorted(got.column("pos").to_pylist()) == sorted(expected.column("pos").to_pylist())
    assert got.column("pos").to_pylist() == sorted(got.column("pos").to_pylist())  # order kept
