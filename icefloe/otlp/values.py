"""OTLP's values as column values: times, ids, enums, counts and ``AnyValue``.

Why apart from the row builders: these are the rules docs/otlp.md states (a time of 0 is
unset, ids are lower-case hex, a non-string ``AnyValue`` is its JSON text, a count past
the ``long`` range is refused), and the log, span and metric rows all apply the same ones.
Each is a small function on a hot path: no per-call allocation beyond its result.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
from collections.abc import Iterable
from typing import Any

import msgspec

LONG_MAX = 2**63 - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ENCODE = msgspec.json.Encoder().encode
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
SPAN_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUS_CODES = ("UNSET", "OK", "ERROR")
TEMPORALITIES = ("UNSPECIFIED", "DELTA", "CUMULATIVE")


class Rejected(ValueError):
    """A record that cannot become a row; the message says which and why."""


class KV(msgspec.Struct, gc=False):
    """One map entry in the streams' canonical form (``{"key": k, "value": v}``; the
    value is written even when null, as the validator writes it)."""

    key: str
    value: str | None


_SECONDS: dict[int, str] = {}
"""``YYYY-MM-DDTHH:MM:SS`` by epoch second: records of one export share a few seconds."""
_MAX_SECONDS = 4096


def time_of(ns: int, field: str) -> str | None:
    """A ``fixed64`` nanosecond time as RFC 3339 UTC text in microseconds (0 is unset),
    written as msgspec writes a datetime (no fraction for a whole second, else six digits),
    so the canonical payload is the validator's byte for byte.

    Why text and not a datetime: building a datetime costs twice a cached second's text
    plus the fraction, and a log record has two times."""
    if not ns:
        return None
    if ns > LONG_MAX:
        raise Rejected(f"{field} {ns} is past 2^63 ns (year 2262): not a time")
    second, rest = divmod(ns, 1_000_000_000)
    text = _SECONDS.get(second)
    if text is None:
        if len(_SECONDS) >= _MAX_SECONDS:
            _SECONDS.clear()
        text = _SECONDS[second] = (_EPOCH + dt.timedelta(seconds=second)).strftime(
            "%Y-%m-%dT%H:%M:%S")
    micros = rest // 1000
    return f"{text}.{micros:06d}Z" if micros else text + "Z"


def long_of(value: int, field: str) -> int:
    """A ``uint64``/``fixed64`` count that must fit a signed long."""
    if value > LONG_MAX:
        raise Rejected(f"{field} {value} does not fit a 64-bit signed integer")
    return value


def longs_of(values: Iterable[int], field: str) -> list[int]:
    """Repeated counts (bucket counts) that must each fit a signed long."""
    found = list(values)
    if found and max(found) > LONG_MAX:
        raise Rejected(f"{field} holds a count past 2^63-1")
    return found


def finite(number: float) -> float | None:
    """A double column's value: NaN and infinities are null (JSON, the streams' format,
    has no such numbers; left in, they would be written as null anyway)."""
    return number if math.isfinite(number) else None


def hex_of(raw: bytes) -> str | None:
    """A trace or span id as lower-case hex; empty (unset) is null."""
    return raw.hex() if raw else None


def enum_name(names: tuple[str, ...], value: int) -> str:
    """An enum value's name without its prefix; a number the proto does not name stays
    its decimal text (never refused: newer senders may know more values)."""
    return names[value] if 0 <= value < len(names) else str(value)


def plain(value: Any) -> Any:
    """An ``AnyValue`` as a JSON-ready Python value (arrays and kvlists nested)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        number = value.double_value
        return number if math.isfinite(number) else _non_finite(number)
    if kind == "bool_value":
        return value.bool_value
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind == "array_value":
        return [plain(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: plain(kv.value) for kv in value.kvlist_value.values}
    return None  # unset (an empty AnyValue), or profiles' string_value_strindex


def _non_finite(number: float) -> str:
    return "NaN" if math.isnan(number) else _NON_FINITE[number]


def text_of(value: Any) -> str | None:
    """An ``AnyValue`` as text: a string as it is, anything else as its JSON text, null for
    an empty value."""
    text: str = value.string_value  # the common case, at half the cost of WhichOneof
    if text:
        return text
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return text
    if kind is None:
        return None
    if kind == "int_value":
        return str(value.int_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    found = plain(value)
    if found is None or found.__class__ is str:
        return found
    return _ENCODE(found).decode()


def attribute_map(pairs: Iterable[Any]) -> dict[str, str | None]:
    """``KeyValue`` pairs as a JSON object (a repeated key: the last one wins, as in
    OTLP/JSON): the form a client posts to a ``map<string,string>`` column."""
    return {kv.key: text_of(kv.value) for kv in pairs}


def attribute_pairs(pairs: Iterable[Any]) -> list[KV]:
    """``KeyValue`` pairs in the canonical map form (key/value entries), last key winning
    as in :func:`attribute_map`."""
    entries = [KV(kv.key, text_of(kv.value)) for kv in pairs]
    if len(entries) > 1 and len({e.key for e in entries}) < len(entries):
        last = {e.key: e for e in entries}  # (rare) keeps each key's first place
        entries = [KV(key, entry.value) for key, entry in last.items()]
    return entries
