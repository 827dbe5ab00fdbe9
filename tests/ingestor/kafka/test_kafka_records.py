"""Record batches through :func:`ingestor.kafka.records.read_batch`: every codec, the compiled
and the Python record parsers held to the same results, and each check refusing exactly
one lie."""

from __future__ import annotations

import cramjam
import pytest

from icefloe.formats import speedups
from ingestor.kafka import records as records_module
from ingestor.kafka.codes import Code, KafkaError
from ingestor.kafka.produce import sequence_ids
from ingestor.kafka.records import read_batch
from testing.kafka_batches import CODECS, Batch, Record, encode_record

RECORDS = [Record(b'{"n":1}', b"k1", [("trace", b"abc"), ("bin", b"\xff")], 0),
           Record(b'{"n":2}', None, [], 5),
           Record(b"", b"", [("empty", None)], 9)]


@pytest.fixture(params=["compiled", "python"])
def parser(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(speedups, "compiled", None)
    elif speedups.compiled is None:
        pytest.fail("the compiled speedups are not built (make venv builds them)")
    return request.param


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_should_read_every_codec_with_either_parser(parser, codec):
    got = read_batch(Batch(RECORDS, codec=codec).encode(), 1 << 20)
    assert got.values == [r.value for r in RECORDS]
    assert got.keys == [r.key for r in RECORDS]
    assert [list(h) for h in got.headers] == [list(r.headers) for r in RECORDS]
    assert got.timestamps == [1_767_225_600_000 + r.timestamp_delta for r in RECORDS]
    assert got.header.count == 3
    assert got.header.codec == CODECS[codec]


def test_should_leave_the_metadata_out_but_still_check_it_without_meta(parser):
    got = read_batch(Batch(RECORDS).encode(), 1 << 20, meta=False)
    assert got.values == [r.value for r in RECORDS]
    assert (got.keys, got.timestamps, got.headers) == ([], [], [])
    bad_name = Record(b'{"n":1}', None, [("zz", b"x")])
    raw = encode_record(0, bad_name).replace(b"zz", b"\xff\xfe")
    with pytest.raises(KafkaError) as info:
        read_batch(Batch([bad_name], body=raw).encode(), 1 << 20, meta=False)
    assert info.value.code == Code.CORRUPT_MESSAGE
    assert "not UTF-8" in info.value.message


@pytest.mark.parametrize(("base", "count"), [(0, 3), (1_000_000, 2), (0x7FFFFFFE, 4)])
def test_should_give_the_same_sequence_ids_with_either_parser(parser, base, count):
    stem, suffixes = sequence_ids("t", 3, 7, 0, base, count)
    assert stem == b"kafka:t:3:7:0:"
    assert suffixes == [b"%d" % ((base + i) & 0x7FFFFFFF) for i in range(count)]


def test_should_read_the_java_clients_snappy_framing():
    raw = b"".join(encode_record(i, r) for i, r in enumerate(RECORDS))
    block = bytes(cramjam.snappy.compress_raw(raw))
    framed = b"\x82SNAPPY\x00" + (1).to_bytes(4, "big") + (1).to_bytes(4, "big") + \
        len(block).to_bytes(4, "big") + block
    got = read_batch(Batch(RECORDS, codec="snappy", body=framed).encode(), 1 << 20)
    assert got.values == [r.value for r in RECORDS]


def test_should_take_the_log_append_time_when_the_batch_says_so(parser):
    got = read_batch(Batch(RECORDS, attributes_extra=0x08).encode(), 1 << 20)
    assert set(got.timestamps) == {1_767_225_600_000}


LIES = [
    ("crc", Batch(RECORDS, crc=12345), Code.CORRUPT_MESSAGE, "CRC32C"),
    ("magic", Batch(RECORDS, magic=1), Code.UNSUPPORTED_FOR_MESSAGE_FORMAT, "magic 1"),
    ("count", Batch(RECORDS, count=4, last_offset_delta=3), Code.CORRUPT_MESSAGE, "parse"),
    ("delta", Batch(RECORDS, last_offset_delta=7), Code.INVALID_RECORD, "last offset delta"),
    ("two batches", Batch(RECORDS, extra=Batch(RECORDS).encode()), Code.INVALID_RECORD,
     "more than one record batch"),
    ("transactional", Batch(RECORDS, attributes_extra=0x10), Code.INVALID_RECORD,
     "transactional"),
    ("control", Batch(RECORDS, attributes_extra=0x20), Code.INVALID_RECORD, "control batch"),
    ("trailing", Batch(RECORDS, body=b"".join(encode_record(i, r)
                                               for i, r in enumerate(RECORDS)) + b"\x00"),
     Code.CORRUPT_MESSAGE, "follow"),
    ("gzip garbage", Batch(RECORDS, codec="gzip", body=b"not gzip"), Code.CORRUPT_MESSAGE,
     "gzip"),
]


@pytest.mark.parametrize(("batch", "code", "words"), [case[1:] for case in LIES],
                         ids=[case[0] for case in LIES])
def test_should_refuse_each_lie_with_its_code(parser, batch, code, words):
    with pytest.raises(KafkaError) as refused:
        read_batch(batch.encode(), 1 << 20)
    assert refused.value.code == code
    assert words in refused.value.message


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_should_refuse_a_batch_that_decompresses_past_the_limit(codec):
    big = [Record(b"x" * 200_000)]
    with pytest.raises(KafkaError) as refused:
        read_batch(Batch(big, codec=codec).encode(), 64 * 1024)
    assert refused.value.code == Code.MESSAGE_TOO_LARGE
    assert "65536 bytes" in refused.value.message


def test_should_name_a_short_batch():
    with pytest.raises(KafkaError) as refused:
        read_batch(bytes(16) + b"\x02" + bytes(3), 1 << 20)
    assert refused.value.code == Code.CORRUPT_MESSAGE
    assert "61 bytes" in refused.value.message
    assert records_module.HEADER_BYTES == 61
