"""The dedup journal on a real (local) store: records round-trip by source, count only once
the table's committed sequence covers them, stop at ``max_ids``, and old ones are swept;
the first collector to begin a table's journal sets its marker."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from collector.dedup import DedupWindow
from collector.journal import (
    DedupJournal,
    JournalView,
    Marker,
    decode_record,
    encode_record,
    id_rows,
)
from icefloe.clock import ManualClock
from icefloe.store import open_async_store


def tagged(ids: list[str], sources: list[str | None] | None = None) -> pa.Table:
    data = {"_event_id": pa.array(ids, pa.string())}
    if sources is not None:
        data["_source"] = pa.array(sources, pa.string())
    return pa.table(data)


def test_a_record_round_trips_by_source():
    rows = id_rows(tagged(["1", "2", "1"], ["a", "b", None]), "_source", "*")
    record = decode_record(encode_record(1234, {0: 7, 2: 9}, rows))
    assert (record.committed_ms, record.through) == (1234, {0: 7, 2: 9})
    assert record.ids == {"a": ["1"], "b": ["2"], "*": ["1"]}
    plain = decode_record(encode_record(1, {0: 1}, id_rows(tagged(["x"]), "_source", "s")))
    assert plain.ids == {"s": ["x"]}


def test_a_record_of_many_chunks_is_one_batch():
    """A run's ids arrive in as many chunks as it had source runs; the record holds them in
    one record batch (each compressed batch costs a decompression set-up when a takeover
    reads the journal back), in order."""
    chunks = [tagged([f"{i}-{j}" for j in range(3)], ["a" if i % 2 else "b"] * 3)
              for i in range(50)]
    rows = id_rows(pa.concat_tables(chunks), "_source", "*")
    assert rows.column("event_id").num_chunks == 50
    data = encode_record(5, {0: 1}, rows)
    batches = list(pa.ipc.open_stream(data))
    assert len(batches) == 1
    record = decode_record(data)
    assert record.ids == {"a": [f"{i}-{j}" for i in range(1, 50, 2) for j in range(3)],
                          "b": [f"{i}-{j}" for i in range(0, 50, 2) for j in range(3)]}


@pytest.fixture
async def journal(tmp_path: Path):
    store = open_async_store((tmp_path / "store").as_uri())
    yield DedupJournal(store)
    await store.close()


async def test_only_committed_records_within_the_time_count(journal: DedupJournal):
    marker = await journal.begin("t", "u1", {}, 1_000)
    assert await journal.begin("t", "u1", {0: 5}, 9_000) == marker  # first writer wins
    for ms, seq, ids in ((1_000, 0, ["a"]), (2_000, 1, ["b"]), (3_000, 2, ["c"])):
        await journal.record("t", "u1", ms, {0: seq}, id_rows(tagged(ids), "_source", "s"))
    view = await journal.load("t", "u1", marker, {0: 1}, 1_500, 100)
    assert [r.ids for r in view.records] == [{"s": ["b"]}]  # a: too old; c: not committed
    other = await journal.load("t", "u2", marker, {0: 2}, 0, 100)
    assert other.records == []  # a re-created table (another uuid) has a journal of its own
    capped = await journal.load("t", "u1", marker, {0: 2}, 0, 1)
    assert [r.ids for r in capped.records] == [{"s": ["c"]}]
    assert capped.capped_ms is not None
    assert await journal.sweep("t", "u1", 2_500) == 2
    assert (await journal.begin("t", "u1", {}, 0)) == marker  # the marker is never swept
    left = await journal.load("t", "u1", marker, {0: 2}, 0, 100)
    assert [r.ids for r in left.records] == [{"s": ["c"]}]


def test_the_window_reads_the_journal_and_reports_where_max_ids_cut_it(tmp_path: Path):
    """With a journal that covers the window, no table is needed: the records are the
    window (ids keyed by source, each at its commit time); ``max_ids`` cuts oldest first."""
    from collector.journal import Record

    clock = ManualClock(1_000.0)
    view = JournalView(Marker(since_ms=0, before={}), [
        Record(990_000 - 900_000, {0: 0}, {"a": ["old"]}),  # outside the window
        Record(990_000, {0: 1}, {"a": ["1", "2"]}),
        Record(995_000, {0: 2}, {"b": ["1"]}),
    ])
    window = DedupWindow(600, 2, clock=clock)
    window.rebuild(None, journal=view)  # type: ignore[arg-type]  # the table is not read
    assert (window.ids("a"), window.ids("b")) == ({"2"}, {"1"})
    assert window.effective_s() == pytest.approx(10, abs=0.01)
