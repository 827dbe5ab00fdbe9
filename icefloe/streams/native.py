"""Native column types at ingest: the msgspec type a value decodes as, and its canonical form.

Why apart from :mod:`icefloe.streams.types`: the flat types there decode straight into
their canonical form; the native ones (``decimal(p,s)``, ``uuid``, ``binary``, ``time``,
``list``/``map``/``struct``) are built from a parsed :class:`~icefloe.streams.typespec.TypeSpec`
into msgspec types once per stream, so msgspec checks shape and leaf types while it parses
(errors name the path, ``items[2].price``). What msgspec cannot check — a decimal's precision
and scale, timestamps and ``json`` values nested in a struct — is done by a per-column
*normalizer* built here, visited only for columns whose type needs it.

Canonical forms (what the collector's Arrow reader gets): decimals as plain text (no
exponent) with at most ``s`` digits after the point; uuids as 36-character text; binary as
base64 text; times as microseconds since midnight; timestamps as RFC 3339 UTC; ``json``
as JSON text; maps as arrays of ``{"key": k, "value": v}`` (Arrow's JSON reader has no
map conversion); structs as objects without null members.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from collections.abc import Callable
from typing import Annotated, Any

import msgspec

from icefloe.streams.types import EPOCH, FIELD_TYPES, MAX_EPOCH_MS, OutOfRange, json_text
from icefloe.streams.typespec import TypeSpec, parse_type

Normalizer = Callable[[Any, str], Any]
"""``(value, path) -> canonical value``; raises :class:`OutOfRange` naming the path of the
refused value (``path`` and the steps below it, e.g. ``items[2].price``)."""

_TIME = Annotated[dt.time, msgspec.Meta(tz=False)]
_LEAVES: dict[str, Any] = {"uuid": uuid.UUID, "binary": bytes, "time": _TIME,
                           "decimal": decimal.Decimal}
_NEEDS_VISIT = ("decimal", "time", "timestamp", "json", "map")
_DECIMAL_CONTEXT = decimal.Context(prec=80)
_US_PER_SECOND = 1_000_000


def field_type(kind: str, owner: str, forbid_unknown: bool) -> Any:
    """The msgspec type a value of column type ``kind`` decodes as; nested structs are
    named after ``owner`` (the stream and column) and refuse unknown members when
    ``forbid_unknown`` (the stream's ``unknown_fields = "reject"``)."""
    return _msgspec_type(parse_type(kind), owner, forbid_unknown)


def _msgspec_type(spec: TypeSpec, owner: str, forbid: bool) -> Any:
    if spec.name in _LEAVES:
        return _LEAVES[spec.name]
    # (types built at run time from the spec: no static type to check)
    if spec.name == "list":
        assert spec.element is not None
        return list[_optional(_msgspec_type(spec.element, owner + "_item", forbid))]  # type: ignore[misc]
    if spec.name == "map":
        assert spec.element is not None
        return dict[str, _optional(_msgspec_type(spec.element, owner + "_value", forbid))]  # type: ignore[misc]
    if spec.name == "struct":
        members = [(name, _optional(_msgspec_type(kind, f"{owner}_{name}", forbid)), None)
                   for name, kind in spec.fields]
        return msgspec.defstruct(re.sub(r"\W", "_", owner), members, omit_defaults=True,
                                 gc=False, kw_only=True, forbid_unknown_fields=forbid)
    return FIELD_TYPES[spec.name]


def _optional(kind: Any) -> Any:
    """``kind | None``; a ``json`` leaf (msgspec.Raw) takes null as its own value."""
    return kind if kind is msgspec.Raw else kind | None


def normalizer(kind: str) -> Normalizer | None:
    """The canonicalizer of a column of type ``kind``, or None when msgspec's own decoding
    and encoding already give the canonical form (no visit needed)."""
    spec = parse_type(kind)
    if not spec.contains(*_NEEDS_VISIT):
        return None
    return _normalizer(spec)


def _normalizer(spec: TypeSpec) -> Normalizer:
    if spec.name == "decimal":
        return _decimal_normalizer(spec.precision, spec.scale)
    if spec.name == "time":
        return _time
    if spec.name == "timestamp":
        return _timestamp
    if spec.name == "json":
        return _json
    if spec.name in ("list", "map"):
        assert spec.element is not None
        inner = _normalizer(spec.element) if spec.element.contains(*_NEEDS_VISIT) else _same
        return _list_normalizer(inner) if spec.name == "list" else _map_normalizer(inner)
    if spec.name == "struct":
        visits = tuple((name, _normalizer(kind)) for name, kind in spec.fields
                       if kind.contains(*_NEEDS_VISIT))
        return _struct_normalizer(visits)
    return _same


def _same(value: Any, path: str) -> Any:
    return value


def _list_normalizer(inner: Normalizer) -> Normalizer:
    def visit(value: Any, path: str) -> Any:
        if value is None:
            return None
        out: list[Any] = []
        append = out.append
        try:
            for item in value:
                append(None if item is None else inner(item, path))
        except OutOfRange as exc:
            exc.field = _inserted(exc.field, path, f"[{len(out)}]")
            raise
        return out
    return visit


def _map_normalizer(inner: Normalizer) -> Normalizer:
    def visit(value: Any, path: str) -> Any:
        if value is None:
            return None
        out: list[dict[str, Any]] = []
        key = None
        try:
            for key, item in value.items():
                out.append({"key": key,
                            "value": None if item is None else inner(item, path)})
        except OutOfRange as exc:
            exc.field = _inserted(exc.field, path, f"[{key!r}]")
            raise
        return out
    return visit


def _struct_normalizer(visits: tuple[tuple[str, Normalizer], ...]) -> Normalizer:
    def visit(value: Any, path: str) -> Any:
        if value is None:
            return None
        for name, inner in visits:
            member = getattr(value, name)
            if member is not None:
                try:
                    setattr(value, name, inner(member, path))
                except OutOfRange as exc:
                    exc.field = _inserted(exc.field, path, f".{name}")
                    raise
        return value
    return visit


def _inserted(field: str, path: str, step: str) -> str:
    """``field`` (``path`` + the deeper steps) with ``step`` put right after ``path``.

    Why paths are built this way: containers hand their own path down unchanged, so the
    happy path builds no strings; only a refused value's path is spelled out, step by step
    as the error passes up through each container."""
    return path + step + field[len(path):]


def _decimal_normalizer(precision: int, scale: int) -> Normalizer:
    """A decimal checked against ``decimal(precision, scale)`` and written in plain
    notation with at most ``scale`` digits after the point (Arrow pads). Never rounds: more
    digits after the point than the scale, or more before it than ``precision - scale``, is
    refused."""
    quantum = decimal.Decimal(1).scaleb(-scale)
    whole = precision - scale

    def visit(value: Any, path: str) -> Any:
        if value is None:
            return None
        _, digits, exponent = value.as_tuple()
        if exponent.__class__ is int and -scale <= exponent <= 0 and \
                len(digits) + exponent <= whole and len(digits) - 1 + exponent >= -6:
            return value  # fits, and str() writes it without an exponent: the common case
        if not value.is_finite():
            raise OutOfRange(path, f"{value} is not a number decimal({precision},{scale}) "
                             "can hold")
        try:
            exact = value.quantize(quantum, context=_DECIMAL_CONTEXT)
        except decimal.InvalidOperation:
            raise OutOfRange(path, f"{value} has more than {whole} digits before the point "
                             f"(decimal({precision},{scale}))") from None
        if exact != value:
            raise OutOfRange(path, f"{value} has more than {scale} digits after the point "
                             f"(decimal({precision},{scale}); icefloe never rounds)")
        if len(exact.as_tuple().digits) > precision and exact != 0:
            raise OutOfRange(path, f"{value} has more than {whole} digits before the point "
                             f"(decimal({precision},{scale}))")
        return format(exact, "f")
    return visit


def _time(value: Any, path: str) -> Any:
    if value is None:
        return None
    return ((value.hour * 60 + value.minute) * 60 + value.second) * _US_PER_SECOND + \
        value.microsecond


def _timestamp(value: Any, path: str) -> Any:
    if value is None:
        return None
    if value.__class__ is int:
        if not -MAX_EPOCH_MS <= value <= MAX_EPOCH_MS:
            raise OutOfRange(path, f"epoch milliseconds {value} out of range")
        return EPOCH + dt.timedelta(milliseconds=value)
    return value.astimezone(dt.UTC) if value.utcoffset() else value


def _json(value: Any, path: str) -> Any:
    if value is None:
        return None
    text = bytes(value)
    return None if text == b"null" else json_text(path, text)
