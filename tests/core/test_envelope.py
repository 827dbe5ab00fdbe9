"""Record envelopes: golden bytes, round trips, rejections, split_by_stream, fuzzing."""

from __future__ import annotations

import io
import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icefloe.errors import BatchFormatError
from icefloe.formats.batch import Compression, decode_block, encode_batch
from icefloe.formats.envelope import (
    ENVELOPE_VERSION,
    TYPED_VERSION,
    BadRecord,
    Envelope,
    StreamColumns,
    StreamSplit,
    decode_envelope,
    encode_envelope,
    frame_typed,
    split_by_stream,
)

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])

# 60 code points are at most 240 UTF-8 bytes: always within the 255-byte limit.
names = st.text(min_size=1, max_size=60)
payloads = st.binary(min_size=1, max_size=200).map(
    lambda b: b.replace(b"\n", b" ").replace(b"\r", b" "))
times = st.integers(-(1 << 63), (1 << 63) - 1)
metas = st.one_of(st.just(b""), st.binary(min_size=1, max_size=100))

GOLDEN = bytes([
    0x01,                                            # envelope version 1
    0x00,                                            # flags: no meta
    0x00, 0x68, 0xE5, 0xCF, 0x8B, 0x01, 0x00, 0x00,  # received_at_ms 1700000000000, i64 LE
    0x06, *b"clicks",                                # stream_len 6, stream
    0x03, *b"ev1",                                   # event_id_len 3, event id
    *b'{"a":1}',                                     # payload: the rest
])


def raises(reason: str, data: bytes) -> str:
    with pytest.raises(BatchFormatError) as info:
        decode_envelope(data)
    assert info.value.reason == reason
    return str(info.value)


def outcome(data: bytes) -> tuple[Envelope | None, BatchFormatError | None]:
    try:
        return decode_envelope(data), None
    except BatchFormatError as exc:
        return None, exc


def block_of(records: list[bytes]) -> tuple[bytes, int]:
    return decode_block(encode_batch(records, Compression.NONE))


# --- golden bytes and round trips -----------------------------------------------------------

def test_golden_envelope() -> None:
    assert ENVELOPE_VERSION == 1
    assert encode_envelope("clicks", "ev1", 1_700_000_000_000, b'{"a":1}') == GOLDEN
    assert decode_envelope(GOLDEN) == Envelope("clicks", "ev1", 1_700_000_000_000, b'{"a":1}')


def test_golden_envelope_with_meta() -> None:
    meta = b'{"ip":"10.0.0.1"}'
    expected = bytes([0x01, 0x01, *struct.pack("<q", -5), 0x01, *b"s", 0x01, *b"e",
                      0x11, 0x00, 0x00, 0x00, *meta, *b"[]"])
    assert encode_envelope("s", "e", -5, b"[]", meta=meta) == expected
    assert decode_envelope(memoryview(expected)) == Envelope("s", "e", -5, b"[]", meta)


@FUZZ
@given(stream=names, event_id=names, received=times, payload=payloads, meta=metas)
def test_round_trip(stream: str, event_id: str, received: int, payload: bytes,
                    meta: bytes) -> None:
    data = encode_envelope(stream, event_id, received, payload, meta)
    assert decode_envelope(data) == Envelope(stream, event_id, received, payload, meta)
    assert decode_envelope(bytearray(data)) == decode_envelope(data)


def test_length_limits_are_bytes_not_characters() -> None:
    longest = "é" * 127 + "a"  # 255 UTF-8 bytes, 128 characters
    data = encode_envelope(longest, "x" * 255, 0, b"{}")
    assert decode_envelope(data).stream == longest
    with pytest.raises(ValueError, match="256 bytes"):
        encode_envelope("é" * 128, "e", 0, b"{}")
    with pytest.raises(ValueError, match="256 bytes"):
        encode_envelope("s", "x" * 256, 0, b"{}")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"stream": ""}, "stream name is 0 bytes"),
    ({"event_id": ""}, "event id is 0 bytes"),
    ({"stream": "\ud800"}, "not encodable as UTF-8"),
    ({"received_at_ms": 1 << 63}, "signed 64-bit"),
    ({"received_at_ms": -(1 << 63) - 1}, "signed 64-bit"),
    ({"payload": b""}, "payload is empty"),
    ({"payload": b'{"a":\n1}'}, "raw LF byte at offset 5"),
    ({"payload": b'{"a":1}\r'}, "raw CR byte at offset 7"),
])
def test_encode_rejects(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"stream": "s", "event_id": "e", "received_at_ms": 0,
                               "payload": b"{}"}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        encode_envelope(**args)  # type: ignore[arg-type]


def test_encode_rejects_wrong_types() -> None:
    with pytest.raises(TypeError):
        encode_envelope(b"s", "e", 0, b"{}")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_envelope("s", "e", 1.5, b"{}")  # type: ignore[arg-type]


# --- decode rejections ----------------------------------------------------------------------

def with_meta(meta_len: int, meta: bytes, payload: bytes = b"{}") -> bytes:
    return (bytes([1, 1]) + struct.pack("<q", 0) + b"\x01s\x01e"
            + struct.pack("<I", meta_len) + meta + payload)


@pytest.mark.parametrize(("data", "reason", "needles"), [
    (b"", "bad_envelope", ["0 bytes", "11-byte"]),
    (b"\x03" + GOLDEN[1:], "unknown_envelope_version", ["version is 3", "versions 1 and 2"]),
    (b"\x02" + GOLDEN[1:], "bad_envelope", ["payload format 123", "1 = Protobuf"]),
    (b"\x00", "unknown_envelope_version", ["version is 0"]),
    (GOLDEN[:10], "bad_envelope", ["10 bytes", "11-byte"]),
    (GOLDEN[:1] + b"\x06" + GOLDEN[2:], "bad_envelope", ["0x06", "unknown bits 0x06"]),
    (GOLDEN[:1] + b"\x80" + GOLDEN[2:], "bad_envelope", ["0x80"]),
    (GOLDEN[:10] + b"\x00" + GOLDEN[11:], "bad_envelope", ["stream name length is 0"]),
    (GOLDEN[:10] + b"\xff" + GOLDEN[11:], "bad_envelope",
     ["255 bytes at offset 11", f"{len(GOLDEN)}-byte envelope"]),
    (GOLDEN[:17], "bad_envelope", ["offset 17", "event id length"]),
    (GOLDEN[:17] + b"\x00" + GOLDEN[18:], "bad_envelope", ["event id length is 0"]),
    (GOLDEN[:17] + b"\x09ev1", "bad_envelope", ["9 bytes at offset 18", "21-byte"]),
    (GOLDEN[:11] + b"cl\xffcks" + GOLDEN[17:], "bad_envelope",
     ["stream name", "UTF-8", "0xff"]),
    (GOLDEN[:18] + b"e\xc0\x80" + GOLDEN[21:], "bad_envelope", ["event id", "UTF-8"]),
    (GOLDEN[:17] + b"\x03\xed\xa0\x80" + GOLDEN[21:], "bad_envelope", ["UTF-8"]),  # surrogate
    (GOLDEN[:21], "bad_envelope", ["payload is empty", "offset 21"]),
    (GOLDEN + b"\n", "bad_envelope", ["raw LF", "payload offset 7"]),
    (GOLDEN[:21] + b"{\r}", "bad_envelope", ["raw CR", "payload offset 1"]),
    (with_meta(0, b""), "bad_envelope", ["meta length", "is 0"]),
    (with_meta(50, b"{}"), "bad_envelope", ["meta of 50 bytes", "offset 18"]),
    (with_meta(2, b"{}", b""), "bad_envelope", ["payload is empty"]),
    (bytes([1, 1]) + struct.pack("<q", 0) + b"\x01s\x01e\x02\x00", "bad_envelope",
     ["only 2 bytes remain", "4-byte meta length"]),
])
def test_decode_rejects(data: bytes, reason: str, needles: list[str]) -> None:
    message = raises(reason, data)
    for needle in needles:
        assert needle in message


# --- split_by_stream ------------------------------------------------------------------------

events = st.tuples(st.sampled_from(["pageviews", "clicks", "é-stream"]), names, times,
                   payloads, metas)


@FUZZ
@given(items=st.lists(events, max_size=40))
def test_split_groups_in_order(items: list[tuple[str, str, int, bytes, bytes]]) -> None:
    records = [encode_envelope(*item) for item in items]
    split = split_by_stream(*block_of(records))
    assert isinstance(split, dict)
    assert split.bad == []
    first_seen = list(dict.fromkeys(item[0] for item in items))
    assert list(split) == first_seen
    for stream, cols in split.items():
        assert isinstance(cols, StreamColumns)
        assert cols.stream == stream
        mine = [(i, item) for i, item in enumerate(items) if item[0] == stream]
        assert cols.record_indexes == [i for i, _ in mine]
        assert cols.event_ids == [item[1] for _, item in mine]
        assert cols.received_at_ms == [item[2] for _, item in mine]
        assert cols.ndjson == b"".join(item[3] + b"\n" for _, item in mine)
    assert sum(len(c.record_indexes) for c in split.values()) == len(items)


def test_split_returns_malformed_records_separately() -> None:
    good = [encode_envelope("a", f"e{i}", i, b'{"i":%d}' % i) for i in range(3)]
    records = [
        good[0],
        b"\x03" + good[1][1:],       # unknown version
        good[1],
        GOLDEN[:21] + b'{"x":\n1}',  # raw newline: would shift the JSON lines
        b"",                         # empty record
        encode_envelope("b", "z", 7, b"[1]"),
        good[2],
    ]
    split = split_by_stream(*block_of(records))
    assert list(split) == ["a", "b"]
    assert split["a"].record_indexes == [0, 2, 6]
    assert split["a"].event_ids == ["e0", "e1", "e2"]
    assert split["a"].ndjson == b'{"i":0}\n{"i":1}\n{"i":2}\n'
    assert split["b"].record_indexes == [5]
    assert [(b.index, b.reason) for b in split.bad] == [
        (1, "unknown_envelope_version"), (3, "bad_envelope"), (4, "bad_envelope")]
    assert all(isinstance(b, BadRecord) for b in split.bad)
    assert split.bad[0].data == records[1]
    assert "raw LF" in split.bad[1].message
    assert [json.loads(line) for line in split["a"].ndjson.splitlines()] == [
        {"i": 0}, {"i": 1}, {"i": 2}]


def test_split_drops_stream_whose_records_are_all_bad() -> None:
    records = [GOLDEN[:21] + b"{\n}", encode_envelope("ok", "e", 0, b"1")]
    split = split_by_stream(*block_of(records))
    assert list(split) == ["ok"]
    assert [b.index for b in split.bad] == [0]


def test_split_empty_block() -> None:
    split = split_by_stream(b"", 0)
    assert split == {}
    assert split.bad == []
    assert isinstance(split, StreamSplit)


@pytest.mark.parametrize(("block", "count", "reason"), [
    (struct.pack("<I", 50) + GOLDEN, 1, "record_overrun"),
    (struct.pack("<I", len(GOLDEN)) + GOLDEN, 2, "count_mismatch"),
    ((struct.pack("<I", len(GOLDEN)) + GOLDEN) * 2, 1, "count_mismatch"),
    (struct.pack("<I", len(GOLDEN)) + GOLDEN + b"\x01", 2, "truncated"),
])
def test_split_framing_errors_fail_the_batch(block: bytes, count: int, reason: str) -> None:
    with pytest.raises(BatchFormatError) as info:
        split_by_stream(block, count)
    assert info.value.reason == reason


def test_split_ndjson_reads_with_pyarrow() -> None:
    pa_json = pytest.importorskip("pyarrow.json")
    records = [encode_envelope("s", f"e{i}", i, b'{"n":%d,"t":"x"}' % i) for i in range(5)]
    cols = split_by_stream(*block_of(records))["s"]
    table = pa_json.read_json(io.BytesIO(cols.ndjson))
    assert table.column("n").to_pylist() == [0, 1, 2, 3, 4]


# --- fuzzing: only BatchFormatError may escape ----------------------------------------------

@FUZZ
@given(data=st.binary(max_size=120))
def test_decode_random_bytes_is_canonical(data: bytes) -> None:
    envelope, _error = outcome(data)
    if envelope is not None:  # every accepted envelope has exactly one encoding
        assert encode_envelope(envelope.stream, envelope.event_id, envelope.received_at_ms,
                               envelope.payload, envelope.meta) == data


@st.composite
def mutated_envelopes(draw: st.DrawFn) -> bytes:
    data = bytearray(encode_envelope(*draw(events)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        if kind == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        else:
            del data[at:at + draw(st.integers(1, 4))]
    return bytes(data)


@FUZZ
@given(data=mutated_envelopes())
def test_decode_mutated_envelopes(data: bytes) -> None:
    envelope, _error = outcome(data)
    if envelope is not None:
        assert encode_envelope(envelope.stream, envelope.event_id, envelope.received_at_ms,
                               envelope.payload, envelope.meta) == data


@FUZZ
@given(records=st.lists(st.one_of(mutated_envelopes(), st.binary(max_size=40),
                                  events.map(lambda e: encode_envelope(*e))), max_size=20))
def test_split_agrees_with_decode_envelope(records: list[bytes]) -> None:
    split = split_by_stream(*block_of(records))
    bad = {b.index: b for b in split.bad}
    assert list(bad) == sorted(bad)
    kept: dict[int, tuple[str, str, int, bytes]] = {}
    for cols in split.values():
        lines = cols.ndjson.split(b"\n")
        assert lines[-1] == b""
        for i, index in enumerate(cols.record_indexes):
            kept[index] = (cols.stream, cols.event_ids[i], cols.received_at_ms[i], lines[i])
        assert len(lines) - 1 == len(cols.record_indexes)
    assert sorted(kept.keys() | bad.keys()) == list(range(len(records)))
    assert not kept.keys() & bad.keys()
    for index, record in enumerate(records):
        envelope, error = outcome(record)
        if error is not None:
            assert bad[index].reason == error.reason
            assert f"{error.reason}: {bad[index].message}" == str(error)
            assert bad[index].data == record
        else:
            assert envelope is not None
            assert kept[index] == (envelope.stream, envelope.event_id,
                                   envelope.received_at_ms, envelope.payload)


@FUZZ
@given(block=st.binary(max_size=150), count=st.integers(0, 10))
def test_split_random_blocks(block: bytes, count: int) -> None:
    try:
        split_by_stream(block, count)
    except BatchFormatError as exc:
        reason = exc.reason
    else:
        reason = None
    assert reason in {None, "truncated", "record_overrun", "count_mismatch"}


def test_frame_events_matches_per_record_encoding_and_validates():
    from icefloe.formats.batch import BatchBuilder, decode_block, iter_records
    from icefloe.formats.envelope import frame_events

    ids, payloads = ["a", "é" * 10], [b'{"x":1}', b"{}"]
    builder = BatchBuilder()
    builder.add_framed(frame_events("pv", 42, ids, payloads), 2)
    block, count = decode_block(builder.finish())
    expected = [encode_envelope("pv", i, 42, p) for i, p in zip(ids, payloads, strict=True)]
    assert list(iter_records(block, count)) == expected
    with pytest.raises(ValueError, match="event id"):
        frame_events("pv", 1, ["x" * 256], [b"{}"])
    with pytest.raises(ValueError, match="one line"):
        frame_events("pv", 1, ["a"], [b'{"a":\n1}'])
    with pytest.raises(ValueError, match="2 event ids for 1 payloads"):
        frame_events("pv", 1, ["a", "b"], [b"{}"])


# -- version 2: binary payloads (#39) ---------------------------------------------------------


def test_typed_envelope_round_trips_any_bytes() -> None:
    """A binary payload may hold LF, CR and NUL: version 2 carries it with its format and
    writer schema id, and re-encoding the decoded envelope gives the same bytes."""
    payload = b"\x08\x96\x01\n\r\x00"
    data = encode_envelope("orders", "e1", 1_700_000_000_000, payload, b'{"ip":"1"}',
                           format=1, schema_id=42)
    assert data[0] == TYPED_VERSION
    env = decode_envelope(data)
    assert (env.payload, env.format, env.schema_id, env.meta) == (
        payload, 1, 42, b'{"ip":"1"}')
    assert encode_envelope(env.stream, env.event_id, env.received_at_ms, env.payload,
                           env.meta, format=env.format, schema_id=env.schema_id) == data


@pytest.mark.parametrize(("tail", "needles"), [
    (b"", ["before its 5-byte payload format"]),
    (b"\x01\x00\x00", ["before its 5-byte payload format"]),
    (b"\x09\x00\x00\x00\x00x", ["payload format 9"]),
    (b"\x02\x07\x00\x00\x00", ["payload is empty", "after the schema id"]),
])
def test_typed_envelope_refuses_a_broken_tail(tail: bytes, needles: list[str]) -> None:
    head = encode_envelope("s", "e", 1, b"x", format=2, schema_id=7)[:-6]
    message = raises("bad_envelope", head + tail)
    for needle in needles:
        assert needle in message


def test_typed_envelope_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ValueError, match="payload format 3"):
        encode_envelope("s", "e", 1, b"x", format=3)
    with pytest.raises(ValueError, match="schema id"):
        encode_envelope("s", "e", 1, b"x", format=1, schema_id=1 << 32)


def test_split_keeps_json_and_typed_records_of_one_stream_apart() -> None:
    """A queue written during a rolling upgrade holds version 1 (JSON) and version 2
    (binary) records of the same stream in one batch: each kind keeps its rows, in order,
    with its ids, receive times and record indexes; nothing is a bad record."""
    typed = frame_typed("s", 5, [b"a", b"b", b"c"], [b"\n1", b"2", b"3"], 2, [1, 1, 3],
                        meta=b'{"m":1}')
    records = [encode_envelope("s", "j0", 4, b'{"x":0}'), *split_framed(typed),
               encode_envelope("s", "j1", 6, b'{"x":1}')]
    split = split_by_stream(*block_of(records))
    assert split.bad == []
    assert split["s"].event_ids == ["j0", "j1"]
    assert split["s"].record_indexes == [0, 4]
    rows = split.typed["s"]
    assert rows.event_ids == ["a", "b", "c"]
    assert rows.payloads == [b"\n1", b"2", b"3"]
    assert rows.schema_ids == [1, 1, 3]
    assert rows.formats == [2, 2, 2]
    assert rows.record_indexes == [1, 2, 3]
    assert rows.metas == [b'{"m":1}'] * 3


def split_framed(framed: bytes) -> list[bytes]:
    """The records of ``frame_*`` output (each ``[u32 length][envelope]``)."""
    out, pos = [], 0
    while pos < len(framed):
        size = int.from_bytes(framed[pos:pos + 4], "little")
        out.append(framed[pos + 4:pos + 4 + size])
        pos += 4 + size
    return out
