"""The vectorized split must agree with the exact per-record split, or step aside."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icefloe.formats.batch import BatchBuilder, decode_block
from icefloe.formats.envelope import encode_envelope, frame_events, split_by_stream
from pipeline.load.split import split_columnar

names = st.sampled_from(["a", "clicks", "buys", "é-stream", "x" * 40])
ids = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20).filter(
    lambda s: 0 < len(s.encode()) <= 255)
payloads = st.dictionaries(st.text(max_size=5), st.integers(), max_size=3).map(
    lambda d: __import__("msgspec").json.encode(d))
metas = st.one_of(st.just(b""), st.just(b'{"ip":"::1"}'), payloads.filter(lambda p: p != b"{}"))
events = st.lists(st.tuples(names, ids, st.integers(-(2**62), 2**62), payloads, metas),
                  min_size=1, max_size=40)


def block_of(records: list[bytes]) -> tuple[bytes, int]:
    builder = BatchBuilder()
    for record in records:
        builder.add(record)
    return decode_block(builder.finish())


def framed(evts) -> list[bytes]:
    return [encode_envelope(stream, event_id, at, payload, meta=meta)
            for stream, event_id, at, payload, meta in evts]


@settings(max_examples=150, deadline=None)
@given(events)
def test_agrees_with_the_exact_split(evts):
    block, count = block_of(framed(evts))
    fast = split_columnar(block, count)
    exact = split_by_stream(block, count)
    assert fast is not None
    assert not exact.bad
    assert set(fast) == set(exact)
    for name, cols in exact.items():
        got = fast[name]
        assert got.event_ids.to_pylist() == cols.event_ids
        assert got.received_at_ms.tolist() == cols.received_at_ms
        assert got.record_indexes.tolist() == cols.record_indexes
        assert got.ndjson == cols.ndjson
        assert (None if got.metas is None else got.metas.to_pylist()) == cols.metas


def test_a_single_stream_batch_of_many_events():
    payload = [b'{"n":%d}' % i for i in range(1000)]
    record = frame_events("clicks", 123, [f"id{i}" for i in range(1000)], payload)
    builder = BatchBuilder()
    builder.add_framed(record, 1000)
    block, count = decode_block(builder.finish())
    [(name, cols)] = split_columnar(block, count).items()
    assert name == "clicks"
    assert cols.ndjson == b"".join(p + b"\n" for p in payload)
    assert cols.event_ids.to_pylist()[999] == "id999"
    assert set(cols.received_at_ms.tolist()) == {123}


@pytest.mark.parametrize(("record", "valid"), [
    (b"\x07short", False),                                              # bad version
    (struct.pack("<BBqB", 1, 1, 1, 1) + b"s\x01i" + struct.pack("<I", 0) + b"{}", False),
    (struct.pack("<BBqB", 1, 1, 1, 1) + b"s\x01i" + struct.pack("<I", 9) + b"{}", False),
    (struct.pack("<BBqB", 1, 3, 1, 1) + b"s\x01i{}", False),           # unknown flag bits
    (encode_envelope("s", "i", 1, b'{"a":1}').replace(b'{"a":1}', b'{"a"\n:1}'), False),
    (struct.pack("<BBqB", 1, 0, 1, 1) + b"s" + b"\x02\xff\xfe" + b"{}", False),  # not UTF-8
])
def test_anything_unusual_falls_back_to_the_exact_path(record, valid):
    good = encode_envelope("s", "ok", 1, b'{"a":1}')
    block, count = block_of([good, record])
    assert split_columnar(block, count) is None
    exact = split_by_stream(block, count)
    assert [b.index for b in exact.bad] == ([] if valid else [1])
    assert len(exact["s"].event_ids) == (2 if valid else 1)


def test_empty_block():
    assert split_columnar(b"", 0) == {}
