"""The dedup window: first copy wins, bounded by time and count, rebuilt by commit time."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
from collector_support import CLICKS, collector_config

from collector.dedup import DedupWindow
from pipeline.catalog import open_catalog
from pipeline.commit import summary_props
from pipeline.schema import table_arrow_schema
from pipeline.tables import ensure_stream_table


def rows(ids: list[str], sequence: int = 0) -> pa.Table:
    schema = table_arrow_schema(CLICKS)
    n = len(ids)
    data = {f.name: pa.nulls(n, f.type) for f in schema}
    data["_event_id"] = pa.array(ids, pa.string())
    data["_sequence"] = pa.array([sequence] * n, pa.int64())
    data["_received_at"] = pa.array([0] * n, pa.int64()).cast(schema.field("_received_at").type)
    return pa.table(data, schema=schema)


def test_first_copy_wins_and_seen_ids_are_dropped():
    window = DedupWindow(600, 1000)
    fresh, dropped = window.filter(rows(["a", "b", "a", "c"]))
    assert fresh.column("_event_id").to_pylist() == ["a", "b", "c"]
    assert dropped == 1
    window.remember(fresh)
    fresh, dropped = window.filter(rows(["c", "d"]))
    assert fresh.column("_event_id").to_pylist() == ["d"]
    assert dropped == 1


def test_ids_are_forgotten_after_the_window_and_beyond_the_size_bound():
    window = DedupWindow(10, 1000)
    window.remember(rows(["a"]), now_s=100)
    window.remember(rows(["b"]), now_s=105)
    window.expire(now_s=112)
    assert window.seen == {"b"}
    small = DedupWindow(600, 3)
    for i, name in enumerate("abcde"):
        small.remember(rows([name]), now_s=100 + i)
    assert small.seen == {"c", "d", "e"}


def test_a_disabled_window_keeps_everything():
    window = DedupWindow(0, 10)
    fresh, dropped = window.filter(rows(["a", "a"]))
    assert (fresh.num_rows, dropped) == (2, 0)


def test_rebuild_uses_commit_time_from_the_snapshot_log(tmp_path: Path):
    config = collector_config(tmp_path)
    catalog = open_catalog(config.catalog)
    table = ensure_stream_table(catalog, CLICKS)
    stamps = []
    for sequence, ids in enumerate((["a", "b"], ["c"], ["d", "e"])):
        table.append(rows(ids, sequence), snapshot_properties=summary_props(sequence, 1))
        stamps.append(table.current_snapshot().timestamp_ms)
        time.sleep(0.05)
    table = catalog.load_table(CLICKS.table)
    everything = DedupWindow(600, 1000)
    everything.rebuild(table)
    assert everything.seen == {"a", "b", "c", "d", "e"}
    assert len(everything.chunks) == 3
    # As seen 600 s after a moment between the first and the second commit:
    later = DedupWindow(600, 1000)
    later.rebuild(table, now_s=(stamps[0] + stamps[1]) / 2000 + 600)
    assert later.seen == {"c", "d", "e"}
    gone = DedupWindow(600, 1000)
    gone.rebuild(table, now_s=stamps[2] / 1000 + 601)
    assert gone.seen == set()
