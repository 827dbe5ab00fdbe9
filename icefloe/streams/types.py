"""Column types: what each declared type accepts and the canonical form a value takes.

Why in the core: the config checks a mapping's ``default`` against its column's type when
it loads, the ingestor converts every mapped value the same way, and both must agree to the
byte; the ingestor's compiled validator (:mod:`ingestor.validate`) builds its msgspec
fields from :data:`FIELD_TYPES`. ``json`` values are checked as a reader will need them:
no deeper than :data:`MAX_JSON_DEPTH`, no number beyond the double range.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

import msgspec

_INT32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
_INT64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_TIMESTAMP = Annotated[dt.datetime, msgspec.Meta(tz=True)] | int
_TIMESTAMP_NTZ = Annotated[dt.datetime, msgspec.Meta(tz=False)]
"""A wall-clock time: RFC 3339 text without an offset; text with one is refused (which
instant it names is no wall-clock time), and so are epoch numbers (an instant again)."""
FIELD_TYPES: dict[str, Any] = {
    "string": str, "long": _INT64, "int": _INT32, "float": float, "double": float,
    "boolean": bool, "timestamp": _TIMESTAMP, "date": dt.date, "json": msgspec.Raw,
    "timestamp_ntz": _TIMESTAMP_NTZ,
}
MAX_EPOCH_MS = 253402300799999  # 9999-12-31T23:59:59.999Z
MAX_JSON_DEPTH = 64
"""How deep arrays and objects may nest in a value icefloe stores as JSON text (a ``json``
column, a raw string, a ``from = "body"`` column). Why: the collector and the engines that
read the tables parse that text again (Spark's JSON functions refuse deep documents), so
icefloe refuses at the door what a reader could not take apart later."""
_MAX_DOUBLE_BITS = 1024  # an integer of more bits is beyond the largest double (~1.8e308)
_BIG_NUMBER = re.compile(rb"\d[eE][+-]?0*[1-9]\d\d|\d{309}")
"""Text that may hold a number outside the double range (an exponent of three digits, or
309 digits in a row); only such values pay for a full parse."""
_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


class OutOfRange(ValueError):
    """A value that decoded but cannot be normalized (e.g. a timestamp past year 9999)."""

    def __init__(self, field: str, reason: str, code: str = "validation_failed") -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason
        self.code = code


def json_text(field: str, text: bytes) -> str:
    """``text`` (JSON, already parsed once, UTF-8 checked) as the text a ``json`` column
    stores, if every reader can parse it again.

    Raises:
        OutOfRange: nested deeper than :data:`MAX_JSON_DEPTH` (``json_too_deep``), or a
            number beyond the double range (``number_out_of_range``), which other readers
            would turn into an error or infinity.
    """
    if _too_deep_text(text):
        raise OutOfRange(field, f"nested deeper than {MAX_JSON_DEPTH} levels",
                          "json_too_deep")
    if _BIG_NUMBER.search(text) is not None:
        try:
            check_json_numbers(field, msgspec.json.decode(text))
        except msgspec.ValidationError as exc:
            raise OutOfRange(field, f"{_lower(str(exc))} (a number beyond the double "
                              "range)", "number_out_of_range") from None
    return text.decode()


def check_json_numbers(field: str, value: Any) -> None:
    """Refuse an integer beyond the double range anywhere in a decoded JSON value (floats
    beyond it do not decode at all). Recursion is bounded: the value's depth was checked."""
    if value.__class__ is int:
        if value.bit_length() > _MAX_DOUBLE_BITS:
            raise OutOfRange(field, f"an integer of {len(str(abs(value)))} digits is beyond "
                              "the double range", "number_out_of_range")
    elif value.__class__ is list:
        for item in value:
            check_json_numbers(field, item)
    elif value.__class__ is dict:
        for item in value.values():
            check_json_numbers(field, item)


def _too_deep_text(text: bytes) -> bool:
    """True when arrays/objects in the JSON ``text`` nest deeper than MAX_JSON_DEPTH.

    Why this shape: only bytes-level operations that run in C. Values with few brackets
    (nearly all) are passed by two counts; otherwise escapes and strings are dropped, the
    brackets kept as ``(``/``)``, and innermost pairs removed a level per round.
    """
    limit = MAX_JSON_DEPTH
    if text.count(b"[") + text.count(b"{") <= limit:
        return False
    unescaped = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    parens = b"".join(unescaped.split(b'"')[::2]).translate(_BRACKETS, _NOT_BRACKETS)
    if parens.count(b"(") <= limit:
        return False
    for _ in range(limit):
        parens = parens.replace(b"()", b"")
        if not parens:
            return False
    return True


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]


def convert_value(kind: str, value: Any, raw: bool = False) -> Any:
    """A JSON value (already decoded) as column type ``kind``, in canonical form: what a
    mapped column holds in the payload. Raises ``msgspec.ValidationError`` or ValueError."""
    if kind == "json":
        text = msgspec.json.encode(value)
        json_text("value", text)  # raises ValueError (an OutOfRange) if no reader could
        return text.decode()
    if kind == "string" and raw:
        return value if isinstance(value, str) else msgspec.json.encode(value).decode()
    if kind == "timestamp":
        try:
            if value.__class__ is int:
                if not -MAX_EPOCH_MS <= value <= MAX_EPOCH_MS:
                    raise ValueError(f"epoch milliseconds {value} out of range")
                return EPOCH + dt.timedelta(milliseconds=value)
            return msgspec.convert(value, _TZ_DATETIME).astimezone(dt.UTC)
        except OverflowError:  # past year 9999 or before year 1 once in UTC
            raise ValueError(f"{value} is outside the years 1-9999 in UTC") from None
    return msgspec.convert(value, FIELD_TYPES[kind])


_TZ_DATETIME = Annotated[dt.datetime, msgspec.Meta(tz=True)]
