"""Kafka's wire primitives: fixed-width integers, varints, (compact) strings, bytes, arrays
and tagged fields, read from and written to one request or response frame.

Why hand-written and small: the produce path needs six request types out of ~70, and the
readers must refuse malformed frames precisely (offset and what was expected) instead of
raising whatever an index error says; every read checks the remaining length first, so a
frame that lies about a length can never make the listener allocate more than the frame
holds. Layouts follow the protocol's published message definitions.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")

MAX_ARRAY = 100_000
"""More elements than any produce-path request holds (topics, partitions, tagged fields):
a count above it is a malformed frame, refused before anything is allocated for it."""


class Malformed(ValueError):
    """A frame that does not parse: the listener answers ``CORRUPT_MESSAGE``/
    ``INVALID_REQUEST`` where the protocol has a place for it, and closes otherwise."""


class Reader:
    """Reads one frame front to back; every method raises :class:`Malformed` on a short
    or inconsistent frame."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _take(self, size: int, what: str) -> bytes | memoryview:
        if size < 0 or self.pos + size > len(self.data):
            raise Malformed(f"{what} at byte {self.pos} needs {size} bytes; the frame has "
                            f"{max(len(self.data) - self.pos, 0)} left")
        start = self.pos
        self.pos += size
        return self.data[start:self.pos]

    def _fixed(self, fmt: struct.Struct, what: str) -> int:
        if self.pos + fmt.size > len(self.data):
            raise Malformed(f"{what} at byte {self.pos} needs {fmt.size} bytes; the frame "
                            f"has {max(len(self.data) - self.pos, 0)} left")
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return int(value)

    def int8(self, what: str = "int8") -> int:
        return self._fixed(_I8, what)

    def int16(self, what: str = "int16") -> int:
        return self._fixed(_I16, what)

    def int32(self, what: str = "int32") -> int:
        return self._fixed(_I32, what)

    def uint32(self, what: str = "uint32") -> int:
        return self._fixed(_U32, what)

    def int64(self, what: str = "int64") -> int:
        return self._fixed(_I64, what)

    def boolean(self, what: str = "boolean") -> bool:
        return self._fixed(_I8, what) != 0

    def uuid(self, what: str = "uuid") -> uuid.UUID:
        return uuid.UUID(bytes=bytes(self._take(16, what)))

    def uvarint(self, what: str = "varint") -> int:
        value = shift = 0
        while True:
            if self.pos >= len(self.data):
                raise Malformed(f"{what} at byte {self.pos} runs past the end of the frame")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise Malformed(f"{what} at byte {self.pos} is longer than 10 bytes")

    def varint(self, what: str = "varint") -> int:
        """A zig-zag signed varint (records use these for lengths and deltas)."""
        raw = self.uvarint(what)
        return (raw >> 1) ^ -(raw & 1)

    def string(self, what: str = "string") -> str:
        value = self.nullable_string(what)
        if value is None:
            raise Malformed(f"{what} is null where the protocol requires a string")
        return value

    def nullable_string(self, what: str = "string") -> str | None:
        size = self.int16(what)
        return None if size == -1 else self._text(size, what)

    def compact_string(self, what: str = "string") -> str:
        value = self.compact_nullable_string(what)
        if value is None:
            raise Malformed(f"{what} is null where the protocol requires a string")
        return value

    def compact_nullable_string(self, what: str = "string") -> str | None:
        size = self.uvarint(what) - 1
        return None if size == -1 else self._text(size, what)

    def _text(self, size: int, what: str) -> str:
        raw = self._take(size, what)
        try:
            return bytes(raw).decode()
        except UnicodeDecodeError:
            raise Malformed(f"{what} at byte {self.pos - size} is not UTF-8") from None

    def nullable_bytes(self, what: str = "bytes") -> bytes | memoryview | None:
        size = self.int32(what)
        return None if size == -1 else self._take(size, what)

    def compact_nullable_bytes(self, what: str = "bytes") -> bytes | memoryview | None:
        size = self.uvarint(what) - 1
        return None if size == -1 else self._take(size, what)

    def raw(self, size: int, what: str) -> bytes | memoryview:
        return self._take(size, what)

    def array(self, item: Callable[[Reader], T], what: str, *, compact: bool,
              nullable: bool = False) -> list[T] | None:
        """An array of ``item``s (int32 count, or uvarint count + 1 when ``compact``)."""
        count = self.uvarint(what) - 1 if compact else self.int32(what)
        if count == -1:
            if not nullable:
                raise Malformed(f"{what} is a null array where the protocol requires one")
            return None
        if count < 0 or count > MAX_ARRAY:
            raise Malformed(f"{what} claims {count} elements (at most {MAX_ARRAY})")
        return [item(self) for _ in range(count)]

    def tagged_fields(self) -> None:
        """Skip a flexible version's tagged fields (none of them changes what we do)."""
        count = self.uvarint("tagged fields")
        if count > MAX_ARRAY:
            raise Malformed(f"{count} tagged fields (at most {MAX_ARRAY})")
        for _ in range(count):
            self.uvarint("tag")
            self._take(self.uvarint("tagged field size"), "tagged field")


class Writer:
    """Builds one response frame body (the 4-byte size is added by the listener)."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def int8(self, value: int) -> Writer:
        self.parts.append(_I8.pack(value))
        return self

    def int16(self, value: int) -> Writer:
        self.parts.append(_I16.pack(value))
        return self

    def int32(self, value: int) -> Writer:
        self.parts.append(_I32.pack(value))
        return self

    def int64(self, value: int) -> Writer:
        self.parts.append(_I64.pack(value))
        return self

    def boolean(self, value: bool) -> Writer:
        return self.int8(1 if value else 0)

    def uuid(self, value: uuid.UUID) -> Writer:
        self.parts.append(value.bytes)
        return self

    def uvarint(self, value: int) -> Writer:
        out = bytearray()
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        self.parts.append(bytes(out))
        return self

    def string(self, value: str | None, *, compact: bool) -> Writer:
        raw = None if value is None else value.encode()
        return self.bytes_(raw, compact=compact, short=True)

    def bytes_(self, value: bytes | None, *, compact: bool, short: bool = False) -> Writer:
        """Nullable bytes (or, ``short``, a string's int16 length)."""
        if compact:
            self.uvarint(0 if value is None else len(value) + 1)
        elif short:
            self.int16(-1 if value is None else len(value))
        else:
            self.int32(-1 if value is None else len(value))
        if value:
            self.parts.append(value)
        return self

    def array_len(self, count: int | None, *, compact: bool) -> Writer:
        if compact:
            return self.uvarint(0 if count is None else count + 1)
        return self.int32(-1 if count is None else count)

    def int32_array(self, values: Sequence[int], *, compact: bool) -> Writer:
        self.array_len(len(values), compact=compact)
        for value in values:
            self.int32(value)
        return self

    def tagged_fields(self) -> Writer:
        return self.uvarint(0)

    def getvalue(self) -> bytes:
        return b"".join(self.parts)
