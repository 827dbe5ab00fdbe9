"""Batch files: length-prefixed records, zstd-compressed, with a 7-byte footer (version 1).

Why this shape: an ingestor turns thousands of small events into one object-store PUT, so the
file must be cheap to build incrementally (append ``[u32 length][data]`` to a buffer), cheap
to split again (one ``unpack_from`` per record, no per-record parsing), and self-describing
enough that a reader in any language can validate it from its last 7 bytes. The layout is
byte-compatible with the reference ingest buffer; ``docs/formats.md`` documents it for other
languages::

    block    record*                      record = [length: u32 LE][data: length bytes]
    file     compress(block) footer       compress = identity (0) or one zstd frame (1)
    footer   "<BIH": compression u8 | record_count u32 LE | version u16 LE = 1

zstd frames are written with the content size and the content checksum (XXH64, low 32 bits)
in the frame, so a flipped bit in the compressed bytes fails decompression instead of
yielding wrong records, and a reader can refuse an oversized block before allocating it.

Every malformed input raises :class:`~icefloe.errors.BatchFormatError`; no ``IndexError``,
``struct.error`` or ``zstandard.ZstdError`` escapes. ``reason`` is one of these stable codes,
checked in this order:

``short_footer``
    The file is shorter than the 7-byte footer.
``unknown_version``
    The footer's version is not 1. Checked before the compression byte, because a future
    version may define other compression codes.
``unknown_compression``
    The footer's compression byte is neither 0 (none) nor 1 (zstd).
``block_too_large``
    The uncompressed block would exceed ``max_block_bytes``: for zstd, the frame header
    declares a larger content size (checked before allocating anything) or, for a frame
    without a declared size, decompression produces more; for no compression, the stored
    block itself is larger.
``truncated``
    The zstd frame is incomplete: fewer bytes than its magic number and header need, or the
    decompressor consumed every byte without reaching the end of the frame. Also a record
    whose 4-byte length header is cut short (1 to 3 bytes left in the block).
``corrupt_frame``
    The bytes are not a valid zstd frame: wrong magic number, a header zstd rejects, a
    corrupt block, a content-size mismatch, or a content checksum mismatch.
``trailing_garbage``
    Bytes remain between the end of the zstd frame and the footer.
``record_overrun``
    A record's length runs past the end of the block.
``count_mismatch``
    The block is well framed but holds a different number of records than the footer says.
    The whole block is parsed first, so a framing error is reported in preference.
"""

from __future__ import annotations

import enum
import pickle
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final, SupportsIndex

import zstandard

from icefloe.errors import BatchFormatError
from icefloe.zstd_contexts import compressor, decompressor

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_BLOCK_BYTES",
    "FOOTER_SIZE",
    "FORMAT_VERSION",
    "MAX_RECORDS",
    "MAX_RECORD_BYTES",
    "BatchBuilder",
    "Compression",
    "Footer",
    "check_block_end",
    "decode_batch",
    "decode_block",
    "encode_batch",
    "framing_error",
    "iter_records",
    "read_footer",
    "record_offsets",
    "split_records",
]

FORMAT_VERSION: Final = 1
"""The only batch format version this module reads and writes."""

FOOTER_SIZE: Final = 7
"""Bytes in the footer: compression u8, record_count u32 LE, version u16 LE."""

DEFAULT_LEVEL: Final = 3
"""zstd level 3: zstd's own default, several hundred MB/s on JSON with a good ratio."""

DEFAULT_MAX_BLOCK_BYTES: Final = 1 << 30
"""Largest uncompressed block a reader accepts by default (1 GiB), against zip bombs."""

MAX_RECORD_BYTES: Final = 0xFFFF_FFFF
"""A record's length must fit the u32 length prefix."""

MAX_RECORDS: Final = 0xFFFF_FFFF
"""The record count must fit the footer's u32."""

_FOOTER: Final = struct.Struct("<BIH")
_LENGTH: Final = struct.Struct("<I")
_LENGTH_SIZE: Final = _LENGTH.size
_ZSTD_MAGIC: Final = b"\x28\xb5\x2f\xfd"
_ZSTD_MIN_HEADER: Final = 5  # magic + frame header descriptor: enough to size the header
_UNKNOWN_CHUNK: Final = 1024  # input fed per step when a frame does not declare its size
_UNKNOWN_WRITE_SIZE: Final = 1 << 17

assert _FOOTER.size == FOOTER_SIZE


class Compression(enum.IntEnum):
    """How the block is stored in the file (the footer's first byte)."""

    NONE = 0
    ZSTD = 1


@dataclass(frozen=True, slots=True)
class Footer:
    """The last 7 bytes of a batch file, validated."""

    compression: Compression
    record_count: int
    version: int


def read_footer(data: bytes | bytearray | memoryview) -> Footer:
    """Parse and validate the footer at the end of ``data`` (a whole batch file).

    Why separate from :func:`decode_block`: the footer alone tells a reader how many records
    a file holds and how it is compressed, without touching the block (``icefloe inspect``).

    Raises ``BatchFormatError`` (``short_footer``, ``unknown_version``,
    ``unknown_compression``).
    """
    size = len(data)
    if size < FOOTER_SIZE:
        raise BatchFormatError(
            "short_footer",
            f"batch file is {size} bytes, shorter than the {FOOTER_SIZE}-byte footer",
        )
    compression, record_count, version = _FOOTER.unpack_from(data, size - FOOTER_SIZE)
    if version != FORMAT_VERSION:
        raise BatchFormatError(
            "unknown_version",
            f"footer version is {version}; this reader understands version {FORMAT_VERSION}",
        )
    if compression not in _COMPRESSIONS:
        raise BatchFormatError(
            "unknown_compression",
            f"footer compression byte is {compression}; expected 0 (none) or 1 (zstd)",
        )
    return Footer(_COMPRESSIONS[compression], record_count, version)


_COMPRESSIONS: Final = {c.value: c for c in Compression}


def _footer_bytes(compression: Compression, record_count: int) -> bytes:
    return _FOOTER.pack(compression, record_count, FORMAT_VERSION)


def _compress(block: bytes | bytearray | memoryview, compression: Compression, level: int) -> bytes:
    """Return the stored form of ``block``.

    zstd is called one-shot so the frame header carries the content size (readers use it to
    refuse oversized blocks before allocating) and with ``write_checksum=True`` so corruption
    inside the frame is detected by the decompressor itself.
    """
    if compression == Compression.NONE:
        return bytes(block)
    if compression == Compression.ZSTD:
        if not isinstance(level, int) or not (
            -(1 << 17) <= level <= zstandard.MAX_COMPRESSION_LEVEL
        ):
            raise ValueError(
                f"zstd level must be an int in {-(1 << 17)}..{zstandard.MAX_COMPRESSION_LEVEL},"
                f" got {level!r}"
            )
        return compressor(level, checksum=True).compress(block)
    raise ValueError(f"unknown compression {compression!r}; expected one of {list(Compression)}")


@dataclass(frozen=True, slots=True)
class BatchBlock:
    """A finished builder's records, not yet compressed: an
    :class:`~icefloe.store.base.Encodable` whose :meth:`encode` is the batch file.

    Why: the ingestor hands this to the store, which compresses where it is cheapest (the
    local store's helper process), instead of compressing on the event loop.
    """

    block: bytes | bytearray | memoryview  # a view of the helper's request frame there
    record_count: int
    compression: Compression = Compression.ZSTD
    level: int = DEFAULT_LEVEL

    def __len__(self) -> int:
        return len(self.block)

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        """Pickled with the records out of band where the protocol allows it: a pickler
        with a ``buffer_callback`` (the store helper's channel) then sends them without
        copying them into the pickle."""
        block: Any = self.block
        if int(protocol) >= 5:
            block = pickle.PickleBuffer(block)
        return BatchBlock, (block, self.record_count, self.compression, self.level)

    def encode(self) -> bytes:
        """The batch file: the (compressed) block and the footer."""
        footer = _footer_bytes(Compression(self.compression), self.record_count)
        if self.compression == Compression.NONE:
            return b"".join((self.block, footer))
        return _compress(self.block, Compression(self.compression), self.level) + footer


class BatchBuilder:
    """Accumulates records into an uncompressed block; :meth:`finish` makes the file.

    Why a builder: the ingestor's in-memory buffer grows one record at a time and must know
    its size at every step to decide when to flush (``block_size``), so records are framed
    as they arrive, appended to one ``bytearray`` with a pre-built ``struct.Struct``. Nothing
    is compressed until :meth:`finish`.

    Not thread-safe: one builder per buffer, guarded by its owner.
    """

    __slots__ = ("_buf", "_count")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._count = 0

    def add(self, record: bytes | bytearray | memoryview) -> None:
        """Append one record (any bytes-like object, may be empty).

        Raises ``ValueError`` if the record exceeds 0xFFFFFFFF bytes or the builder already
        holds 0xFFFFFFFF records: neither fits the format's u32 fields.
        """
        if type(record) is not bytes:
            record = memoryview(record).cast("B")  # byte length, also for wide formats
        size = len(record)
        if size > MAX_RECORD_BYTES:
            raise ValueError(
                f"record is {size} bytes; a record holds at most {MAX_RECORD_BYTES} bytes"
            )
        if self._count >= MAX_RECORDS:
            raise ValueError(f"batch already holds {self._count} records, the u32 maximum")
        buf = self._buf
        buf += _LENGTH.pack(size)
        buf += record
        self._count += 1

    def extend(self, records: Iterable[bytes | bytearray | memoryview]) -> None:
        """Append every record of ``records`` in order (same rules as :meth:`add`).

        Records appended before a rejected one stay in the builder.
        """
        buf = self._buf
        pack = _LENGTH.pack
        count = self._count
        try:
            for record in records:
                if type(record) is not bytes:
                    record = memoryview(record).cast("B")
                size = len(record)
                if size > MAX_RECORD_BYTES:
                    raise ValueError(
                        f"record is {size} bytes; a record holds at most {MAX_RECORD_BYTES} "
                        "bytes"
                    )
                if count >= MAX_RECORDS:
                    raise ValueError(f"batch already holds {count} records, the u32 maximum")
                buf += pack(size)
                buf += record
                count += 1
        finally:
            self._count = count

    def add_framed(self, framed: bytes, count: int) -> None:
        """Append ``count`` records that are already framed (``envelope.frame_events``).

        The caller vouches for the framing; this is the ingestor's hot path, which frames a
        whole request in one pass instead of calling :meth:`add` per event.
        """
        if self._count + count > MAX_RECORDS:
            raise ValueError(f"batch would hold {self._count + count} records, over the "
                             "u32 maximum")
        self._buf += framed
        self._count += count

    @property
    def record_count(self) -> int:
        """Records added so far."""
        return self._count

    @property
    def block_size(self) -> int:
        """Uncompressed block bytes so far, including the 4-byte length prefixes."""
        return len(self._buf)

    def clear(self) -> None:
        """Forget every record, so the buffer can be reused for the next batch."""
        self._buf = bytearray()
        self._count = 0

    def finish(self, compression: Compression = Compression.ZSTD,
               level: int = DEFAULT_LEVEL) -> bytes:
        """Return the complete batch file: the (compressed) block followed by the footer.

        The builder is left unchanged, so calling ``finish`` again gives the same file.
        ``level`` applies to zstd only. Raises ``ValueError`` for an unknown compression or
        an invalid zstd level.
        """
        return self.to_block(compression, level).encode()

    def to_block(self, compression: Compression = Compression.ZSTD,
                 level: int = DEFAULT_LEVEL) -> BatchBlock:
        """The records as a :class:`BatchBlock` to encode later (or elsewhere).

        It shares this builder's buffer: add nothing more to the builder afterwards
        (:meth:`clear` is fine, it starts a new buffer).
        """
        return BatchBlock(self._buf, self._count, Compression(compression), level)


def encode_batch(records: Iterable[bytes | bytearray | memoryview],
                 compression: Compression = Compression.ZSTD,
                 level: int = DEFAULT_LEVEL) -> bytes:
    """Encode ``records`` into one batch file (see :class:`BatchBuilder` for the rules)."""
    builder = BatchBuilder()
    builder.extend(records)
    return builder.finish(compression, level)


def decode_block(data: bytes | bytearray | memoryview, *,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> tuple[bytes, int]:
    """Validate the footer, decompress, and return ``(block, footer record_count)``.

    Why the block and not the records: the collector splits the block its own way
    (:func:`icefloe.formats.envelope.split_by_stream`), and other callers use :func:`iter_records`.
    Framing inside the block is *not* checked here; the splitting functions check it.

    ``max_block_bytes`` bounds the uncompressed size, so a small hostile file cannot make
    the reader allocate gigabytes (``block_too_large``).
    """
    view = memoryview(data).cast("B")  # byte offsets even if given a wide-format view
    footer = read_footer(view)
    body = view[: len(view) - FOOTER_SIZE]
    if footer.compression is Compression.NONE:
        if len(body) > max_block_bytes:
            raise BatchFormatError(
                "block_too_large",
                f"uncompressed block is {len(body)} bytes; the limit is {max_block_bytes}",
            )
        return bytes(body), footer.record_count
    return _decompress_frame(body, max_block_bytes), footer.record_count


def _decompress_frame(frame: memoryview, max_block_bytes: int) -> bytes:
    """Decompress exactly one zstd frame filling ``frame``; translate every zstd failure."""
    size = len(frame)
    head = bytes(frame[:4])
    if head != _ZSTD_MAGIC[: len(head)]:
        raise BatchFormatError(
            "corrupt_frame",
            f"expected the zstd magic number {_ZSTD_MAGIC.hex()} at offset 0, found "
            f"{head.hex()}",
        )
    if size < _ZSTD_MIN_HEADER:
        raise BatchFormatError(
            "truncated",
            f"zstd frame is {size} bytes, shorter than the {_ZSTD_MIN_HEADER} bytes that "
            "start a frame header",
        )
    try:
        header_size = zstandard.frame_header_size(frame)
    except zstandard.ZstdError as exc:
        raise BatchFormatError("corrupt_frame", f"invalid zstd frame header: {exc}") from None
    if size < header_size:
        raise BatchFormatError(
            "truncated",
            f"zstd frame is {size} bytes but its header alone needs {header_size} bytes",
        )
    try:
        params = zstandard.get_frame_parameters(frame)
    except zstandard.ZstdError as exc:
        raise BatchFormatError("corrupt_frame", f"invalid zstd frame header: {exc}") from None
    content_size: int = params.content_size
    known = content_size != zstandard.CONTENTSIZE_UNKNOWN
    if content_size == zstandard.CONTENTSIZE_ERROR:
        raise BatchFormatError("corrupt_frame", "zstd cannot read the frame's content size")
    if known and content_size > max_block_bytes:
        raise BatchFormatError(
            "block_too_large",
            f"zstd frame declares {content_size} bytes of content; the limit is "
            f"{max_block_bytes}",
        )
    dctx = decompressor()
    try:
        if known:
            # zstd itself fails the frame if it produces more or less than declared.
            dobj = dctx.decompressobj(write_size=max(content_size, 1))
            block = dobj.decompress(frame)
            complete, unused = dobj.eof, len(dobj.unused_data)
        else:
            block, complete, unused = _decompress_unknown_size(dctx, frame, max_block_bytes)
    except zstandard.ZstdError as exc:
        raise BatchFormatError(
            "corrupt_frame", f"zstd rejected the {size}-byte frame: {exc}"
        ) from None
    if not complete:
        declared = f"{content_size} bytes" if known else "unknown"
        raise BatchFormatError(
            "truncated",
            f"zstd frame ends early: all {size} bytes consumed without reaching the end of "
            f"the frame ({len(block)} bytes decompressed, declared content size {declared})",
        )
    if unused:
        raise BatchFormatError(
            "trailing_garbage",
            f"{unused} bytes follow the zstd frame: the frame ends at offset {size - unused} "
            f"but the footer starts at offset {size}",
        )
    return block


def _decompress_unknown_size(dctx: zstandard.ZstdDecompressor, frame: memoryview,
                             max_block_bytes: int) -> tuple[bytes, bool, int]:
    """Decompress a frame without a declared content size, stopping past ``max_block_bytes``.

    We never write such frames, but other writers may (streaming compressors). Input is fed
    in small chunks so the output can overshoot the limit by at most one chunk's expansion
    (zstd's ratio is bounded, about 32768:1) before we stop. Returns the block, whether the
    frame ended, and how many input bytes follow it.
    """
    dobj = dctx.decompressobj(write_size=_UNKNOWN_WRITE_SIZE)
    parts: list[bytes] = []
    produced = 0
    size = len(frame)
    for start in range(0, size, _UNKNOWN_CHUNK):
        stop = min(start + _UNKNOWN_CHUNK, size)
        out = dobj.decompress(frame[start:stop])
        produced += len(out)
        if produced > max_block_bytes:
            raise BatchFormatError(
                "block_too_large",
                f"zstd frame without a declared content size decompressed to {produced} "
                f"bytes after {stop} input bytes; the limit is {max_block_bytes}",
            )
        parts.append(out)
        if dobj.eof:
            # unused_data covers the rest of the chunk that ended the frame; add the rest.
            return b"".join(parts), True, len(dobj.unused_data) + size - stop
    return b"".join(parts), False, 0


# --- splitting the block into records --------------------------------------------------------

def framing_error(block: bytes | bytearray | memoryview, pos: int, index: int,
                   record_count: int) -> BatchFormatError:
    """The error for a block whose record ``index`` cannot be read at offset ``pos``.

    Shared by every splitter (here and the envelope's in :mod:`icefloe.formats.envelope`)
    so they report identical reasons and messages.
    """
    size = len(block)
    left = size - pos
    if left == 0:
        return BatchFormatError(
            "count_mismatch",
            f"footer says {record_count} records but the {size}-byte block holds {index}",
        )
    if left < _LENGTH_SIZE:
        return BatchFormatError(
            "truncated",
            f"record {index} at block offset {pos} needs a {_LENGTH_SIZE}-byte length header "
            f"but only {left} bytes remain in the {size}-byte block",
        )
    (length,) = _LENGTH.unpack_from(block, pos)
    return BatchFormatError(
        "record_overrun",
        f"record {index} at block offset {pos} declares {length} bytes but only "
        f"{left - _LENGTH_SIZE} bytes remain in the {size}-byte block",
    )


def check_block_end(block: bytes | bytearray | memoryview, pos: int,
                     record_count: int) -> None:
    """After ``record_count`` records ended at ``pos``: raise if the block holds more.

    The rest is parsed so that a framing error there is reported as such, and otherwise
    the message gives the real record count.
    """
    size = len(block)
    if pos == size:
        return
    unpack = _LENGTH.unpack_from
    index = record_count
    while pos < size:
        if size - pos < _LENGTH_SIZE:
            raise framing_error(block, pos, index, record_count)
        end = pos + _LENGTH_SIZE + unpack(block, pos)[0]
        if end > size:
            raise framing_error(block, pos, index, record_count)
        pos = end
        index += 1
    raise BatchFormatError(
        "count_mismatch",
        f"footer says {record_count} records but the {size}-byte block holds {index}",
    )


def split_records(block: bytes | bytearray | memoryview, record_count: int) -> list[bytes]:
    """Split a block into its records, validating the framing and the count.

    Why a list and not a generator: the whole block is validated before the caller sees a
    single record, so a bad file never yields a partial result. This is the fast path: one
    ``unpack_from`` and one slice per record.

    Raises ``BatchFormatError`` (``truncated``, ``record_overrun``, ``count_mismatch``).
    """
    if type(block) is not bytes:
        block = bytes(block)  # slices of bytes are bytes; of a memoryview they would not be
    unpack = _LENGTH.unpack_from
    size = len(block)
    records: list[bytes] = []
    append = records.append
    pos = 0
    for index in range(record_count):
        if size - pos < _LENGTH_SIZE:
            raise framing_error(block, pos, index, record_count)
        start = pos + _LENGTH_SIZE
        pos = start + unpack(block, pos)[0]
        if pos > size:
            raise framing_error(block, start - _LENGTH_SIZE, index, record_count)
        append(block[start:pos])
    check_block_end(block, pos, record_count)
    return records


def record_offsets(block: bytes | bytearray | memoryview,
                   record_count: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each record's data in ``block``, validated like split_records.

    For callers that want to slice lazily (e.g. into a memoryview) instead of copying.
    """
    unpack = _LENGTH.unpack_from
    size = len(block)
    offsets: list[tuple[int, int]] = []
    append = offsets.append
    pos = 0
    for index in range(record_count):
        if size - pos < _LENGTH_SIZE:
            raise framing_error(block, pos, index, record_count)
        start = pos + _LENGTH_SIZE
        pos = start + unpack(block, pos)[0]
        if pos > size:
            raise framing_error(block, start - _LENGTH_SIZE, index, record_count)
        append((start, pos))
    check_block_end(block, pos, record_count)
    return offsets


def iter_records(block: bytes | bytearray | memoryview, record_count: int) -> Iterator[bytes]:
    """Iterate over the records of a block (from :func:`decode_block`), as ``bytes``.

    The whole block is validated before the first record is returned (see
    :func:`split_records`), so iteration itself never raises.
    """
    return iter(split_records(block, record_count))


def decode_batch(data: bytes | bytearray | memoryview, *,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> list[bytes]:
    """Decode a whole batch file into its records (footer, frame, framing, count)."""
    block, record_count = decode_block(data, max_block_bytes=max_block_bytes)
    return split_records(block, record_count)
