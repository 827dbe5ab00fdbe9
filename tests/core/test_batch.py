"""Batch files: golden bytes, round trips, every rejection reason, and fuzzing."""

from __future__ import annotations

import struct

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icefloe.errors import BatchFormatError
from icefloe.formats import batch
from icefloe.formats.batch import (
    FOOTER_SIZE,
    FORMAT_VERSION,
    BatchBuilder,
    Compression,
    Footer,
    decode_batch,
    decode_block,
    encode_batch,
    iter_records,
    read_footer,
    record_offsets,
    split_records,
)

FUZZ = settings(max_examples=200, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
records_strategy = st.lists(st.binary(max_size=300), max_size=40)
compressions = st.sampled_from(list(Compression))


def footer(compression: int, count: int, version: int = 1) -> bytes:
    return struct.pack("<BIH", compression, count, version)


def zstd_file(block: bytes, count: int, **kwargs: object) -> bytes:
    frame = zstandard.ZstdCompressor(write_checksum=True, **kwargs).compress(block)
    return frame + footer(1, count)


def raises(reason: str, fn: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(BatchFormatError) as info:
        fn(*args, **kwargs)  # type: ignore[operator]
    assert info.value.reason == reason
    message = str(info.value)
    assert message.startswith(f"{reason}: ")
    return message


# --- golden bytes ---------------------------------------------------------------------------

def test_golden_uncompressed_two_records() -> None:
    expected = bytes([
        0x02, 0x00, 0x00, 0x00, 0x61, 0x62,  # record 0: length 2, "ab"
        0x01, 0x00, 0x00, 0x00, 0x63,        # record 1: length 1, "c"
        0x00,                                # footer: compression 0 (none)
        0x02, 0x00, 0x00, 0x00,              #         record_count 2 (u32 LE)
        0x01, 0x00,                          #         version 1 (u16 LE)
    ])
    assert encode_batch([b"ab", b"c"], Compression.NONE) == expected
    assert decode_batch(expected) == [b"ab", b"c"]
    assert read_footer(expected) == Footer(Compression.NONE, 2, 1)


def test_golden_zstd_footer_and_frame() -> None:
    records = [b"ab"] * 10
    data = encode_batch(records)
    assert data[-FOOTER_SIZE:] == bytes([0x01, 0x0A, 0x00, 0x00, 0x00, 0x01, 0x00])
    frame = data[:-FOOTER_SIZE]
    assert frame[:4] == bytes([0x28, 0xB5, 0x2F, 0xFD])  # zstd magic, little-endian 0xFD2FB528
    params = zstandard.get_frame_parameters(frame)
    assert params.has_checksum
    assert params.content_size == 10 * 6
    # Any zstd implementation reads the frame back to the plain block.
    plain = encode_batch(records, Compression.NONE)[:-FOOTER_SIZE]
    assert zstandard.ZstdDecompressor().decompress(frame) == plain
    assert decode_block(data) == (plain, 10)


@pytest.mark.parametrize("compression", list(Compression))
def test_empty_batch_round_trips(compression: Compression) -> None:
    data = encode_batch([], compression)
    assert data[-FOOTER_SIZE:] == bytes([compression, 0, 0, 0, 0, 1, 0])
    if compression is Compression.NONE:
        assert data == bytes([0, 0, 0, 0, 0, 1, 0])
    assert decode_batch(data) == []
    assert decode_block(data) == (b"", 0)


def test_constants() -> None:
    assert FORMAT_VERSION == 1
    assert FOOTER_SIZE == 7
    assert int(Compression.NONE) == 0
    assert int(Compression.ZSTD) == 1


# --- round trips ----------------------------------------------------------------------------

@FUZZ
@given(records=records_strategy, compression=compressions)
def test_round_trip(records: list[bytes], compression: Compression) -> None:
    data = encode_batch(records, compression)
    assert decode_batch(data) == records
    block, count = decode_block(data)
    assert count == len(records)
    assert list(iter_records(block, count)) == records
    assert [block[s:e] for s, e in record_offsets(block, count)] == records
    assert all(type(r) is bytes for r in split_records(memoryview(block), count))


@FUZZ
@given(records=records_strategy, compression=compressions, split=st.integers(0, 40),
       level=st.integers(1, 5))
def test_builder_matches_encode_batch(records: list[bytes], compression: Compression,
                                      split: int, level: int) -> None:
    builder = BatchBuilder()
    for record in records[:split]:
        builder.add(record)
    builder.extend(bytearray(r) for r in records[split:])
    assert builder.record_count == len(records)
    assert builder.block_size == sum(4 + len(r) for r in records)
    data = builder.finish(compression, level)
    assert data == encode_batch(records, compression, level)
    assert builder.finish(compression, level) == data  # finish leaves the builder intact


def test_builder_accepts_buffers_and_clears() -> None:
    builder = BatchBuilder()
    builder.add(memoryview(b"xyz"))
    builder.add(bytearray(b"q"))
    builder.add(memoryview(struct.pack("<2H", 1, 2)).cast("H"))  # byte length, not items
    assert decode_batch(builder.finish()) == [b"xyz", b"q", b"\x01\x00\x02\x00"]
    builder.clear()
    assert (builder.record_count, builder.block_size) == (0, 0)
    assert decode_batch(builder.finish(Compression.NONE)) == []


def test_builder_rejects_oversized_record_and_too_many_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch, "MAX_RECORD_BYTES", 3)
    monkeypatch.setattr(batch, "MAX_RECORDS", 2)
    builder = BatchBuilder()
    with pytest.raises(ValueError, match="4 bytes"):
        builder.add(b"four")
    with pytest.raises(ValueError, match="4 bytes"):
        builder.extend([b"ok", b"four"])
    assert builder.record_count == 1  # records before the rejected one stay
    builder.add(b"ok")
    with pytest.raises(ValueError, match="2 records"):
        builder.add(b"x")
    with pytest.raises(ValueError, match="2 records"):
        builder.extend([b"x"])
    assert decode_batch(builder.finish()) == [b"ok", b"ok"]


def test_finish_rejects_bad_compression_and_level() -> None:
    with pytest.raises(ValueError, match="2"):
        encode_batch([b"x"], 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="99"):
        encode_batch([b"x"], Compression.ZSTD, level=99)
    assert decode_batch(encode_batch([b"x"], Compression.NONE, level=99)) == [b"x"]


def test_frame_without_content_size_is_accepted() -> None:
    block = encode_batch([b"r" * 100] * 50, Compression.NONE)[:-FOOTER_SIZE]
    cobj = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    frame = cobj.compress(block) + cobj.flush()
    assert zstandard.get_frame_parameters(frame).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decode_batch(frame + footer(1, 50)) == [b"r" * 100] * 50


def test_frame_without_checksum_is_accepted() -> None:
    block = encode_batch([b"abc"], Compression.NONE)[:-FOOTER_SIZE]
    frame = zstandard.ZstdCompressor(write_checksum=False).compress(block)
    assert decode_batch(frame + footer(1, 1)) == [b"abc"]


# --- one test per rejection reason ----------------------------------------------------------

def test_short_footer() -> None:
    message = raises("short_footer", decode_batch, b"\x00\x01")
    assert "2 bytes" in message
    assert "7-byte" in message
    raises("short_footer", read_footer, b"")


def test_unknown_compression() -> None:
    message = raises("unknown_compression", decode_batch, footer(7, 0))
    assert "is 7" in message


def test_unknown_version() -> None:
    message = raises("unknown_version", decode_batch, footer(0, 0, version=2))
    assert "is 2" in message
    assert "version 1" in message
    # the version is checked first: its compression codes may differ
    raises("unknown_version", read_footer, footer(9, 0, version=3))


def test_truncated_frame() -> None:
    data = encode_batch([b"hello"] * 20)
    frame = data[:-FOOTER_SIZE]
    cut = frame[:-4]
    message = raises("truncated", decode_batch, cut + data[-FOOTER_SIZE:])
    assert f"all {len(cut)} bytes" in message
    assert "declared content size 180 bytes" in message


def test_truncated_frame_header() -> None:
    message = raises("truncated", decode_batch, b"\x28\xb5\x2f" + footer(1, 0))
    assert "3 bytes" in message
    assert "5 bytes" in message
    raises("truncated", decode_batch, footer(1, 0))  # no frame at all
    frame = encode_batch([b"x" * 300])[:-FOOTER_SIZE]
    header_size = zstandard.frame_header_size(frame)
    message = raises("truncated", decode_batch, frame[:header_size - 1] + footer(1, 1))
    assert f"needs {header_size} bytes" in message


def test_truncated_record_header() -> None:
    block = struct.pack("<I", 1) + b"a" + b"\x05\x00"  # record 1 has half a length header
    message = raises("truncated", decode_batch, block + footer(0, 2))
    assert "record 1 at block offset 5" in message
    assert "only 2 bytes remain" in message
    assert "7-byte block" in message


def test_corrupt_frame_checksum() -> None:
    data = bytearray(encode_batch([b"some record"] * 5))
    data[-FOOTER_SIZE - 1] ^= 0xFF  # last byte of the frame: its checksum
    message = raises("corrupt_frame", decode_batch, bytes(data))
    assert "checksum" in message
    assert f"{len(data) - FOOTER_SIZE}-byte frame" in message


def test_corrupt_frame_bad_magic_and_skippable_frame() -> None:
    message = raises("corrupt_frame", decode_batch, b"abcdefgh" + footer(1, 0))
    assert "28b52ffd" in message
    assert "61626364" in message
    skippable = struct.pack("<II", 0x184D2A50, 0)
    raises("corrupt_frame", decode_batch, skippable + footer(1, 0))


def test_trailing_garbage() -> None:
    data = encode_batch([b"abc"])
    frame = data[:-FOOTER_SIZE]
    message = raises("trailing_garbage", decode_batch, frame + b"zz" + data[-FOOTER_SIZE:])
    assert "2 bytes" in message
    assert f"ends at offset {len(frame)}" in message
    # a second frame is garbage too: a batch file holds exactly one
    raises("trailing_garbage", decode_batch, frame + frame + data[-FOOTER_SIZE:])


def test_trailing_garbage_after_frame_without_content_size() -> None:
    block = encode_batch([b"r" * 100] * 50, Compression.NONE)[:-FOOTER_SIZE]
    cobj = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    frame = cobj.compress(block) + cobj.flush()
    message = raises("trailing_garbage", decode_batch, frame + b"x" * 3000 + footer(1, 50))
    assert "3000 bytes" in message
    raises("truncated", decode_batch, frame[:-2] + footer(1, 50))


def test_record_overrun() -> None:
    block = struct.pack("<I", 100) + b"abc"
    message = raises("record_overrun", decode_batch, block + footer(0, 1))
    assert "declares 100 bytes" in message
    assert "only 3 bytes remain" in message


def test_count_mismatch_fewer_records() -> None:
    data = encode_batch([b"a", b"b"], Compression.NONE)[:-FOOTER_SIZE] + footer(0, 3)
    message = raises("count_mismatch", decode_batch, data)
    assert "footer says 3 records" in message
    assert "holds 2" in message


def test_count_mismatch_more_records() -> None:
    data = encode_batch([b"a", b"b", b"c"], Compression.ZSTD)[:-FOOTER_SIZE] + footer(1, 1)
    message = raises("count_mismatch", decode_batch, data)
    assert "footer says 1 records" in message
    assert "holds 3" in message
    # a framing error in the surplus is reported as such
    block = encode_batch([b"a"], Compression.NONE)[:-FOOTER_SIZE] + b"\x09\x00\x00\x00"
    raises("record_overrun", decode_batch, block + footer(0, 1))


def test_block_too_large() -> None:
    data = encode_batch([b"x" * 1000])
    message = raises("block_too_large", decode_block, data, max_block_bytes=1000)
    assert "declares 1004 bytes" in message
    assert "limit is 1000" in message
    assert decode_block(data, max_block_bytes=1004)[1] == 1
    plain = encode_batch([b"x" * 1000], Compression.NONE)
    message = raises("block_too_large", decode_block, plain, max_block_bytes=10)
    assert "1004 bytes" in message


def test_block_too_large_without_declared_size() -> None:
    block = b"\x00" * 10_000_000
    cobj = zstandard.ZstdCompressor(write_checksum=True).compressobj()
    frame = cobj.compress(block) + cobj.flush()
    message = raises("block_too_large", decode_block, frame + footer(1, 0),
                     max_block_bytes=1_000_000)
    assert "limit is 1000000" in message


# --- fuzzing: only BatchFormatError may escape ----------------------------------------------

REASONS = {"short_footer", "unknown_compression", "unknown_version", "truncated",
           "corrupt_frame", "trailing_garbage", "record_overrun", "count_mismatch",
           "block_too_large"}


def outcome(fn: object, *args: object, **kwargs: object) -> tuple[object, BatchFormatError | None]:
    """Call ``fn``; return its result or the BatchFormatError (anything else propagates)."""
    try:
        return fn(*args, **kwargs), None  # type: ignore[operator]
    except BatchFormatError as exc:
        return None, exc


def decode_or_format_error(data: bytes) -> list[bytes] | None:
    decoded, error = outcome(decode_batch, data, max_block_bytes=1 << 20)
    if error is not None:
        assert error.reason in REASONS
        assert str(error).startswith(f"{error.reason}: ")
    return decoded  # type: ignore[return-value]


@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    decode_or_format_error(data)


@FUZZ
@given(data=st.binary(max_size=100), compression=compressions, count=st.integers(0, 30))
def test_random_block_with_valid_footer(data: bytes, compression: Compression,
                                        count: int) -> None:
    if compression is Compression.ZSTD:
        data = zstandard.ZstdCompressor().compress(data)
    decode_or_format_error(data + footer(compression, count))


@st.composite
def mutated_batches(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    records = draw(records_strategy)
    data = bytearray(encode_batch(records, draw(compressions)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        if not data:
            data.append(draw(st.integers(0, 255)))
            continue
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[at:at + draw(st.integers(1, 8))]
    return bytes(data), records


@FUZZ
@given(case=mutated_batches())
def test_mutated_batches(case: tuple[bytes, list[bytes]]) -> None:
    data, _records = case
    decoded = decode_or_format_error(data)
    if decoded is not None:
        assert isinstance(decoded, list)
        assert all(type(r) is bytes for r in decoded)


@FUZZ
@given(block=st.binary(max_size=100), count=st.integers(0, 20))
def test_split_random_blocks(block: bytes, count: int) -> None:
    records, error = outcome(split_records, block, count)
    offsets, offsets_error = outcome(record_offsets, block, count)
    if error is not None:
        assert error.reason in {"truncated", "record_overrun", "count_mismatch"}
        assert str(offsets_error) == str(error)
    else:
        assert offsets_error is None
        assert isinstance(records, list)
        assert len(records) == count
        assert sum(4 + len(r) for r in records) == len(block)
        assert [block[s:e] for s, e in offsets] == records  # type: ignore[attr-defined]
