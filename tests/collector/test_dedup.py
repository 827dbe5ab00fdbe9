"""The dedup window: first copy wins per (table, source, id), bounded by time and count
(oldest ids first), rebuilt by store-clock commit time from the window's commits only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from collector_support import (
    BASE_MS,
    CLICKS,
    click,
    collector_config,
    drain,
    open_store_of,
    publish,
    read_table,
    start,
)

from collector.dedup import (
    ANY_SOURCE,
    DedupWindow,
    source_runs,
    sources_props,
    with_source,
    without_source,
)
from icefloe.clock import ManualClock
from icefloe.registry import Registry, RegistryStore, ops
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import commit_rows, committed_at_ms, summary_props
from pipeline.iceberg.maintenance import expire_snapshots
from pipeline.iceberg.tables import ensure_stream_table


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
    window.remember(rows(["a"]), "s", now_s=100)
    window.remember(rows(["b"]), "s", now_s=105)
    window.expire(now_s=112)
    assert window.ids("s") == {"b"}
    small = DedupWindow(600, 3)
    for i, name in enumerate("abcde"):
        small.remember(rows([name]), "s", now_s=100 + i)
    assert small.ids("s") == {"c", "d", "e"}


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
    assert everything.ids(ANY_SOURCE) == {"a", "b", "c", "d", "e"}  # older commits: no source
    assert len(everything.chunks) == 3
    # As seen 600 s after a moment between the first and the second commit:
    later = DedupWindow(600, 1000)
    later.rebuild(table, now_s=(stamps[0] + stamps[1]) / 2000 + 600)
    assert later.ids(ANY_SOURCE) == {"c", "d", "e"}
    gone = DedupWindow(600, 1000)
    gone.rebuild(table, now_s=stamps[2] / 1000 + 601)
    assert len(gone) == 0


# ----------------------------------------------------------- keyed by source (issue #22, 3)


def test_ids_are_keyed_by_source_within_a_table():
    window = DedupWindow(600, 1000)
    window.remember(rows(["1", "2"]), "a")
    fresh, dropped = window.filter(rows(["1", "2", "3"]), "b")
    assert (fresh.num_rows, dropped) == (3, 0)  # b's ids never collide with a's
    fresh, dropped = window.filter(rows(["1", "3"]), "a")
    assert (fresh.column("_event_id").to_pylist(), dropped) == (["3"], 1)
    # Rows of a run that carry their source (a table fed by two sources in one run):
    mixed = pa.concat_tables([with_source(rows(["1", "9"], 1), "a"),
                              with_source(rows(["1", "9", "9"], 2), "b")])
    fresh, dropped = window.filter_in_sequence_order(mixed)
    assert dropped == 2  # a's "1" (seen) and b's second "9" (a repeat in the run)
    assert list(zip(fresh.column("_source").to_pylist(), fresh.column("_event_id").to_pylist(),
                    strict=True)) == [("a", "9"), ("b", "1"), ("b", "9")]
    assert source_runs(fresh) == [("a", 1, 1), ("b", 2, 2)]
    assert without_source(fresh).column_names == rows([]).column_names


def move() -> list[Callable[[Registry], Registry]]:
    """Sink of table web.t on source ``a`` (v1), deleted (v2), re-created on ``b`` (v3)."""
    sink = ops.SinkSpec(name="t", table="web.t", columns=CLICKS.columns)
    return [lambda r: ops.create_source(r, ops.SourceSpec(id="a", sinks=(sink,))),
            lambda r: ops.create_source(r, ops.SourceSpec(id="b")),
            lambda r: ops.delete_sink(r, "a", "t"),
            lambda r: ops.create_sink(r, "b", sink)]


def events(source: str, count: int) -> list[tuple[str, str, int, bytes]]:
    """Events 1..count of ``source``; ids collide across sources (business ids)."""
    return [(source, str(i), BASE_MS + i, click(i)[3]) for i in range(1, count + 1)]


async def test_a_table_moved_to_another_source_takes_its_colliding_ids(tmp_path: Path):
    """Source a commits ids 1..10 to web.t; the registry moves web.t's sink to source b;
    b's acknowledged ids 1..10 all land (per-table keys dropped them). b's retry of them is
    still dropped, also by a collector restarted after the move (window rebuilt)."""
    from pipeline.load.run import LocalEngine

    config = collector_config(tmp_path, (CLICKS,))
    store = open_store_of(config)
    registry = RegistryStore(store, config.admin.registry_key)
    steps = move()
    await registry.update(steps[0])
    await registry.update(steps[1])
    await publish(store, [events("a", 10)], registry_version=2)
    collector = await start(config, LocalEngine())
    await drain(collector)
    assert read_table(config, "web.t").num_rows == 10
    await registry.update(steps[2])
    await registry.update(steps[3])
    await publish(store, [events("b", 10)], registry_version=4)
    await drain(collector)
    table = read_table(config, "web.t")
    assert table.num_rows == 20
    assert sorted(table.column("_event_id").to_pylist()) == sorted([str(i) for i in
                                                                   range(1, 11)] * 2)
    await collector.store.close()
    # A restart rebuilds the window keyed by source: b's retry is dropped, a's ids are not
    # b's.
    await publish(store, [events("b", 10)], registry_version=4)
    restarted = await start(config, LocalEngine())
    await asyncio.to_thread(restarted.apply_registry, await registry.read())
    assert restarted.windows["web.t"].ids("a") == {str(i) for i in range(1, 11)}
    assert restarted.windows["web.t"].ids("b") == {str(i) for i in range(1, 11)}
    await drain(restarted)
    assert read_table(config, "web.t").num_rows == 20
    await restarted.store.close()
    await store.close()


# --------------------------------------------- bounded, and rebuilt without a full scan (4)


def test_the_size_bound_evicts_the_oldest_ids_not_whole_recent_commits(caplog):
    seen: list[tuple[float, int]] = []
    window = DedupWindow(600, 5, name="web.t", on_effective=lambda s, n: seen.append((s, n)))
    window.remember(rows(["a", "b", "c", "d"]), "s", now_s=100)
    window.remember(rows(["e", "f", "g", "h"]), "s", now_s=160)
    assert window.ids("s") == {"d", "e", "f", "g", "h"}  # the 3 oldest ids only
    assert seen[-1] == (60.0, 5)  # reaches back to the first commit, 60 s, not 600
    assert "dedup_max_ids (5) cuts it to the last 60 s" in caplog.text
    one = DedupWindow(600, 3)
    one.remember(rows(["a", "b", "c", "d", "e"]), "s", now_s=100)  # one commit past the bound
    assert one.ids("s") == {"c", "d", "e"}  # not everything forgotten with it
    assert one.effective_s(now_s=100) == 0.0
    assert one.effective_s(now_s=701) == 600  # the evicted ids left the window anyway


def commit(catalog, ids: list[str], sequence: int, source: str, clock: ManualClock,
           advance_s: float = 10) -> None:
    """An icefloe commit of ``ids`` from ``source`` at the store time of ``clock``."""
    tagged = with_source(rows(ids, sequence), source)
    commit_rows(catalog, CLICKS.table, without_source(tagged), sequence=sequence, epoch=1,
                props=sources_props(tagged), clock=clock)
    clock.advance(advance_s)


def test_rebuild_after_expiry_reads_only_the_window_and_keys_by_source(tmp_path: Path):
    """Old commits expired (no snapshot older than the window survives): the rebuild reads
    the window's commits only (not the whole table), by source, and within ``max_ids``
    keeps the newest ids."""
    catalog = open_catalog(collector_config(tmp_path).catalog)
    ensure_stream_table(catalog, CLICKS)
    store = ManualClock(time.time())
    for sequence in range(3):  # an hour ago
        commit(catalog, [f"old{sequence}"], sequence, "a", store)
    store.advance(3600)
    commit(catalog, ["1", "2"], 3, "a", store)
    commit(catalog, ["1", "2", "3"], 4, "b", store)
    table = catalog.load_table(CLICKS.table)
    assert expire_snapshots(table, keep_last=0, max_age_s=600, clock=store) == 3
    assert all(committed_at_ms(s) >= (store.time() - 600) * 1000
               for s in table.metadata.snapshots)

    window = DedupWindow(600, 1000, clock=store)
    window.rebuild(catalog.load_table(CLICKS.table))
    assert (window.ids("a"), window.ids("b")) == ({"1", "2"}, {"1", "2", "3"})
    assert len(window) == 5  # the hour-old ids are still in the table, never read
    assert window.effective_s() == 600

    bounded = DedupWindow(600, 4, clock=store)
    bounded.rebuild(catalog.load_table(CLICKS.table))
    assert bounded.ids("b") == {"1", "2", "3"}
    assert len(bounded) == 4  # one of a's, the oldest, gave way
    assert bounded.effective_s() == pytest.approx(20, abs=0.01)  # a's commit, partly kept


def test_rebuild_judges_age_by_the_store_clock_not_the_committing_host(tmp_path: Path):
    """The store's clock runs 10 h ahead of this host's (whose time pyiceberg writes as
    timestamp-ms): commits of a minute ago by the store's clock are in the window."""
    catalog = open_catalog(collector_config(tmp_path).catalog)
    ensure_stream_table(catalog, CLICKS)
    store = ManualClock(time.time()).skewed(10 * 3600)
    commit(catalog, ["x", "y"], 0, "a", store, advance_s=60)
    table = catalog.load_table(CLICKS.table)
    assert table.current_snapshot().timestamp_ms < (store.time() - 3600) * 1000
    window = DedupWindow(600, 1000)
    window.rebuild(table, now_s=store.time())
    assert window.ids("a") == {"x", "y"}
    later = DedupWindow(600, 1000, clock=store)
    store.advance(600)
    later.rebuild(table)
    assert len(later) == 0


def test_ids_are_held_while_older_events_still_wait_to_be_committed(tmp_path: Path):
    """A collector outage longer than the window: the original was committed 20 min ago,
    but its retry (received seconds after it) is only committed now. The window reaches
    back from the oldest waiting event, not from now, so the retry is still dropped, in
    memory and after a rebuild. Found by the simulator (seed 2)."""
    catalog = open_catalog(collector_config(tmp_path).catalog)
    ensure_stream_table(catalog, CLICKS)
    store = ManualClock(time.time())
    received_retry_at = store.time() + 5  # the retry reached an ingestor 5 s later
    commit(catalog, ["x", "y"], 0, "a", store, advance_s=1200)  # then 20 min of outage
    window = DedupWindow(300, 1000, clock=store)
    window.hold_s = received_retry_at
    window.add(["x", "y"], int((store.time() - 1200) * 1000), source="a")
    assert window.ids("a") == {"x", "y"}
    kept, dropped = window.filter(rows(["x", "z"]), "a")
    assert dropped == 1
    assert kept.column("_event_id").to_pylist() == ["z"]
    rebuilt = DedupWindow(300, 1000, clock=store)
    rebuilt.hold_s = received_retry_at
    rebuilt.rebuild(catalog.load_table(CLICKS.table))
    assert rebuilt.ids("a") == {"x", "y"}
    window.hold_s = None  # nothing waits any more: the window is measured from now again
    window.expire()
    assert len(window) == 0
