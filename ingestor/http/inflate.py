"""Request bodies decompressed as they stream in, refused once they grow past the limit.

Why bounded and incremental: a few KiB of gzip or zstd can expand to gigabytes; checking
only the compressed size, or decompressing first and measuring after, lets one request
exhaust memory. Each :class:`Inflater` here costs at most ``limit`` bytes of output before
the request is refused with 413, and a stream cut short is refused (400), never half-used.
"""

from __future__ import annotations

import zlib
from typing import Final

import zstandard

from ingestor.errors import BadRequest, PayloadTooLarge

__all__ = ["ENCODINGS", "ZSTD_MAX_WINDOW", "Inflater", "bad_encoding", "body_too_large"]

ZSTD_MAX_WINDOW: Final = 1 << 23  # 8 MiB: zstd levels 1-19; refuses --ultra/--long memory


def body_too_large(limit: int, what: str) -> PayloadTooLarge:
    return PayloadTooLarge(f"the {what} body exceeds the {limit}-byte limit "
                           "(ingestor.max_body_bytes); split it into smaller requests")


def bad_encoding(name: str, reason: str) -> BadRequest:
    return BadRequest(f"the body is not valid {name}: {reason}", code="invalid_encoding")


class Inflater:
    """Decompresses a body as it streams in and refuses it once the output passes the limit.

    Why incremental with a bound: a few KiB of gzip/zstd can expand to gigabytes; checking
    only the compressed size, or decompressing first and measuring after, lets one request
    exhaust memory. Here a bomb costs at most ``limit`` bytes of output before 413.
    """

    name = ""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []
        self.fed = False

    def feed(self, data: bytes) -> None:
        raise NotImplementedError

    def _complete(self) -> bool:
        raise NotImplementedError

    def _keep(self, out: bytes) -> None:
        self.size += len(out)
        if self.size > self.limit:
            raise body_too_large(self.limit, "decompressed")
        if out:
            self.parts.append(out)

    def finish(self) -> bytes:
        """The whole decompressed body; a stream cut short is refused, never half-used."""
        if self.fed and not self._complete():
            raise bad_encoding(self.name, "the body ends in the middle of a compressed stream")
        return b"".join(self.parts)


class _Gunzip(Inflater):
    """gzip via zlib, whose ``max_length`` bounds each call's output (several members OK)."""

    name = "gzip"

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._z = zlib.decompressobj(wbits=31)

    def feed(self, data: bytes) -> None:
        self.fed = True
        try:
            while data:
                if self._z.eof:  # RFC 1952 allows several members back to back
                    self._z = zlib.decompressobj(wbits=31)
                self._keep(self._z.decompress(data, self.limit - self.size + 1))
                data = self._z.unused_data if self._z.eof else b""
        except zlib.error as exc:
            raise bad_encoding(self.name, str(exc)) from None

    def _complete(self) -> bool:
        return self._z.eof


class _Meter:
    """A write sink that only counts, and raises once more than ``limit`` bytes arrive."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self.limit:
            raise body_too_large(self.limit, "decompressed")
        return len(data)


class _Unzstd(Inflater):
    """zstd, bounded although zstandard's ``decompressobj`` has no ``max_length``.

    Why two decoders: ``decompressobj().decompress`` returns all output at once (a 64 KiB
    chunk can expand to gigabytes), while ``stream_writer`` hands output to a sink piece by
    piece (so the sink can stop it) but cannot tell a complete frame from a truncated one.
    Each chunk goes first through a counting stream_writer (refuses a bomb after ``limit``
    bytes), then through decompressobj, whose output is then known to be bounded and which
    reports ``eof``. zstd decodes at >1.5 GB/s, so the second pass costs little next to JSON.
    """

    name = "zstd"

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        meter = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
        # (a sink needs only write(): zstandard's hint asks for a whole IO[bytes])
        self._meter = meter.stream_writer(_Meter(limit),  # type: ignore[arg-type]
                                          closefd=False)
        # A separate decompressor: the writer and the decompressobj must not share a context.
        self._dctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
        self._z = self._dctx.decompressobj()

    def feed(self, data: bytes) -> None:
        self.fed = True
        try:
            self._meter.write(data)
            while data:
                if self._z.eof:  # the next frame of a multi-frame body
                    self._z = self._dctx.decompressobj()
                self._keep(self._z.decompress(data))
                data = self._z.unused_data if self._z.eof else b""
        except zstandard.ZstdError as exc:
            raise bad_encoding(self.name, str(exc)) from None

    def _complete(self) -> bool:
        return self._z.eof


ENCODINGS: Final[dict[bytes, type[Inflater] | None]] = {
    b"": None, b"identity": None, b"gzip": _Gunzip, b"x-gzip": _Gunzip, b"zstd": _Unzstd,
}
