"""Copy-on-write upserts on a real SQLite catalog: the latest row per key, one snapshot per
commit carrying the offset, only the files holding replaced keys rewritten."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
from collector_support import collector_config
from pyiceberg.exceptions import CommitFailedException

from icefloe.config import Column, StreamConfig
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import (
    EPOCH_PROP,
    SEQUENCE_PROP,
    SEQUENCES_PROP,
    commit_rows,
    committed_state,
    position,
    summary_props,
)
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.iceberg.upsert import CopyOnWrite, latest_per_key, split_missing_keys

USERS = StreamConfig(name="users", table="app.users", columns=(
    Column("user_id", "string", required=True), Column("name", "string"),
    Column("deleted", "boolean")), primary_key=("user_id",), tombstone_field="deleted",
    partition="none")
BASE = dt.datetime(2026, 11, 23, 12, tzinfo=dt.UTC)


def users(rows: list[tuple[str | None, str, bool | None]], sequence: int) -> pa.Table:
    return pa.Table.from_pylist([
        {"user_id": uid, "name": name, "deleted": deleted, "_event_id": f"e{sequence}-{i}",
         "_received_at": BASE, "_sequence": sequence}
        for i, (uid, name, deleted) in enumerate(rows)], schema=table_arrow_schema(USERS))


def state(catalog, name: str = "app.users") -> dict[str, str]:
    rows = catalog.load_table(name).scan().to_arrow().to_pylist()
    keys = [r["user_id"] for r in rows]
    assert len(keys) == len(set(keys)), "a key is in the table twice"
    return {r["user_id"]: r["name"] for r in rows}


def data_files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*.parquet") if "/data/" in p.as_posix()}


@pytest.fixture
def catalog(tmp_path):
    catalog = open_catalog(collector_config(tmp_path, streams=(USERS,)).catalog)
    ensure_stream_table(catalog, USERS)
    return catalog


def upsert(catalog, rows: pa.Table, sequence: int, epoch: int = 1):
    hook = CopyOnWrite(USERS.primary_key, USERS.tombstone_field)
    outcome = commit_rows(catalog, "app.users", rows, sequence=sequence, epoch=epoch,
                          append=hook)
    hook.cleanup(catalog, "app.users", sequence=sequence, epoch=epoch)
    return outcome, hook


def test_updates_replace_and_tombstones_delete_in_one_snapshot(catalog):
    upsert(catalog, users([(f"u{i}", "v1", None) for i in range(10)], 1), 1)
    before = len(catalog.load_table("app.users").snapshots())
    rows = users([("u0", "v2", False), ("u1", "v2", None), ("u2", "x", True),
                  ("u0", "v3", None), ("u42", "new", None), ("u43", "gone", True)], 2)
    outcome, hook = upsert(catalog, rows, 2)
    assert outcome.rows == 6
    table = catalog.load_table("app.users")
    assert len(table.snapshots()) == before + 1  # one commit for the whole run
    expected = {f"u{i}": "v1" for i in range(3, 10)} | {"u0": "v3", "u1": "v2", "u42": "new"}
    assert state(catalog) == expected
    summary = table.current_snapshot().summary
    assert summary.additional_properties[SEQUENCE_PROP] == "2"
    assert summary.additional_properties[EPOCH_PROP] == "1"
    assert hook.rows_removed == 3
    assert hook.files_rewritten == 1


def test_a_replayed_run_is_dropped_by_the_sequence_check(catalog):
    upsert(catalog, users([("u0", "v1", None), ("u1", "v1", None)], 1), 1)
    upsert(catalog, users([("u0", "v2", None), ("u1", "x", True)], 2), 2)
    snapshots = len(catalog.load_table("app.users").snapshots())
    # crash between commit and ack: the same entries come again, and then a regrouped run
    # (entries 1..3) whose committed part must not be applied a second time
    outcome, _ = upsert(catalog, users([("u0", "v2", None), ("u1", "x", True)], 2), 2)
    assert (outcome.rows, outcome.replayed) == (0, 2)
    assert len(catalog.load_table("app.users").snapshots()) == snapshots
    regrouped = pa.concat_tables([users([("u1", "back", None)], 1),
                                  users([("u0", "v2", None), ("u1", "x", True)], 2),
                                  users([("u9", "v3", None)], 3)])
    outcome, _ = upsert(catalog, regrouped, 3)
    assert (outcome.rows, outcome.replayed) == (1, 3)
    assert state(catalog) == {"u0": "v2", "u9": "v3"}  # u1 stays deleted


def test_keys_spread_over_several_files_rewrite_only_the_files_holding_them(catalog, tmp_path):
    for part in range(4):  # four files with key ranges a..., b..., c..., d...
        prefix = "abcd"[part]
        upsert(catalog, users([(f"{prefix}{i:03d}", "v1", None) for i in range(250)], part),
               part)
    assert len(data_files(tmp_path)) == 4
    before = data_files(tmp_path)
    rows = users([("a007", "v2", None), ("c100", "v2", None), ("c200", "x", True),
                  ("a249", "v2", None)], 10)
    _, hook = upsert(catalog, rows, 10)
    assert hook.files_rewritten == 2
    assert hook.rows_removed == 4
    table = catalog.load_table("app.users")
    live = {Path(t.file.file_path.removeprefix("file://")) for t in table.scan().plan_files()}
    assert len(live & before) == 2  # the b and d files are untouched
    got = state(catalog)
    assert len(got) == 999
    assert "c200" not in got
    assert got["a007"] == got["c100"] == got["a249"] == "v2"
    assert got["b005"] == "v1"


def test_within_a_run_the_last_row_wins_by_shard_sequence_position():
    rows = pa.table({"k": ["a", "a", "b", "a", "b"], "v": [1, 2, 3, 4, 5],
                     "_sequence": [7, 7, 3, 5, 3], "_shard": [0, 0, 1, 1, 0]})
    latest = latest_per_key(rows, ["k"]).to_pydict()
    # a: (1,5) beats (0,7) — shard first; b: same (shard 1, sequence 3) beats shard 0
    assert dict(zip(latest["k"], latest["v"], strict=True)) == {"a": 4, "b": 3}
    same = pa.table({"k": ["a", "a"], "v": [1, 2], "_sequence": [4, 4]})
    assert latest_per_key(same, ["k"]).column("v").to_pylist() == [2]  # later position


def test_composite_keys_and_rows_without_a_key_value():
    rows = pa.table({"a": ["x", "x", "y", None], "b": [1, 2, 1, 1], "v": [1, 2, 3, 4],
                     "_sequence": [1, 2, 3, 4]})
    good, bad = split_missing_keys(rows, ["a", "b"])
    assert bad.column("v").to_pylist() == [4]
    assert sorted(latest_per_key(good, ["a", "b"]).column("v").to_pylist()) == [1, 2, 3]


def test_several_shards_record_every_shard_sequence(catalog):
    rows = users([("u0", "v1", None), ("u1", "v1", None)], 0)
    rows = rows.set_column(rows.column_names.index("_sequence"), "_sequence",
                           pa.array([position(0, 4), position(2, 9)], pa.int64()))
    hook = CopyOnWrite(USERS.primary_key, USERS.tombstone_field)
    commit_rows(catalog, "app.users", rows, sequence=4, epoch=1, append=hook,
                sequences={0: 4, 2: 9})
    table = catalog.load_table("app.users")
    assert table.current_snapshot().summary.additional_properties[SEQUENCES_PROP] == "0:4,2:9"
    assert committed_state(table).sequences == {0: 4, 2: 9}


def test_files_of_a_refused_upsert_are_deleted(catalog, tmp_path):
    upsert(catalog, users([("u0", "v1", None), ("u2", "v1", None)], 1), 1)
    stale = catalog.load_table("app.users")
    upsert(catalog, users([("u1", "v1", None)], 2), 2)  # someone commits meanwhile
    kept = data_files(tmp_path)
    hook = CopyOnWrite(USERS.primary_key, USERS.tombstone_field)
    with pytest.raises(CommitFailedException):
        hook(stale, users([("u0", "v2", None)], 3), summary_props(3, 1))
    assert len(data_files(tmp_path)) == len(kept) + 2  # the rewrite and the new rows
    assert hook.cleanup(catalog, "app.users", sequence=3, epoch=1) == 2
    assert data_files(tmp_path) == kept
    assert state(catalog) == {"u0": "v1", "u1": "v1", "u2": "v1"}


def test_upserts_write_their_files_in_the_sink_s_sort_order(tmp_path):
    """A keyed sink with ``sort_by``: the files an upsert writes (new rows and rewrites)
    are sorted and say so, as the append path's are."""
    import msgspec
    import pyarrow.parquet as pq

    sorted_users = msgspec.structs.replace(USERS, sort_by=("name",))
    catalog = open_catalog(collector_config(tmp_path, streams=(sorted_users,)).catalog)
    ensure_stream_table(catalog, sorted_users)
    names = ["m", "c", "x", "a", "q", "b", "z", "k"]
    upsert(catalog, users([(f"u{i}", name, None) for i, name in enumerate(names)], 1), 1)
    upsert(catalog, users([("u0", "d", None), ("u9", "e", None), ("u8", "aa", None)], 2), 2)
    table = catalog.load_table("app.users")
    order = table.sort_order().order_id
    assert order != 0
    files = [task.file for task in table.scan().plan_files()]
    assert files
    for data_file in files:
        assert data_file.sort_order_id == order
        with table.io.new_input(data_file.file_path).open() as stream:
            got = pq.read_table(stream).column("name").to_pylist()
        assert got == sorted(got)
    assert state(catalog)["u0"] == "d"
