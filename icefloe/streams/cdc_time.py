"""Debezium's temporal encodings read through the envelope's ``schema`` (#42).

Why: Debezium sends a PostgreSQL ``timestamp`` as microseconds since the epoch
(``io.debezium.time.MicroTimestamp``), a ``date`` as days (``io.debezium.time.Date``), a
``time`` as microseconds of the day. A ``timestamp`` column reads a bare number as epoch
*milliseconds*, so such a value would be refused, or for dates before 1978 silently read
as another instant. When the JSON converter wraps the event with its schema
(``schemas.enable=true``), the schema names each field's encoding, and the value is turned
into the text the column type takes; only for columns of the matching type (a ``long``
column keeps the number). Without the schema nothing is guessed (docs/cdc.md says which
connector settings give values a column reads as they are).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

_EPOCH = dt.datetime(1970, 1, 1)
_DIVISORS = {"io.debezium.time.Timestamp": 1_000, "org.apache.kafka.connect.data.Timestamp":
             1_000, "io.debezium.time.MicroTimestamp": 1_000_000,
             "io.debezium.time.NanoTimestamp": 1_000_000_000}
_TIMES = {"io.debezium.time.Time": 1_000, "org.apache.kafka.connect.data.Time": 1_000,
          "io.debezium.time.MicroTime": 1_000_000, "io.debezium.time.NanoTime": 1_000_000_000}
_DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")

Convert = Callable[[Any], Any]


def converters(schema: Any, image: str, types: Mapping[str, str]) -> dict[str, Convert]:
    """Per field of the ``image`` struct (``after``/``before``) of an envelope's ``schema``:
    how its value becomes the text its column's type (``types``) takes; fields that need
    nothing are left out."""
    fields = _image_fields(schema, image)
    out: dict[str, Convert] = {}
    for field in fields:
        if not isinstance(field, dict):
            continue
        name, logical = field.get("field"), field.get("name")
        kind = types.get(name) if isinstance(name, str) else None
        if not isinstance(name, str) or kind is None:
            continue
        if logical in _DIVISORS and kind in ("timestamp", "timestamp_ntz"):
            out[name] = _instant(_DIVISORS[logical], zone=kind == "timestamp")
        elif logical in _DATES and kind == "date":
            out[name] = _date
        elif logical in _TIMES and kind == "time":
            out[name] = _time(_TIMES[logical])
    return out


def _image_fields(schema: Any, image: str) -> list[Any]:
    if not isinstance(schema, dict):
        return []
    for field in schema.get("fields") or ():
        if isinstance(field, dict) and field.get("field") == image:
            inner = field.get("fields")
            return inner if isinstance(inner, list) else []
    return []


def _instant(per_second: int, *, zone: bool) -> Convert:
    def convert(value: Any) -> Any:
        if not isinstance(value, int) or isinstance(value, bool):
            return value  # the validator refuses it, naming the field
        seconds, rest = divmod(value, per_second)
        moment = _EPOCH + dt.timedelta(seconds=seconds,
                                       microseconds=rest * 1_000_000 // per_second)
        return moment.isoformat(timespec="microseconds") + ("Z" if zone else "")
    return convert


def _date(value: Any) -> Any:
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    return (_EPOCH + dt.timedelta(days=value)).date().isoformat()


def _time(per_second: int) -> Convert:
    def convert(value: Any) -> Any:
        if not isinstance(value, int) or isinstance(value, bool):
            return value
        moment = _EPOCH + dt.timedelta(microseconds=value * 1_000_000 // per_second)
        return moment.time().isoformat(timespec="microseconds")
    return convert
