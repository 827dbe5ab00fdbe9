"""A model class's fields as icefloe columns: each annotation's column type and its encoder.

Why one walk gives both: the column type a field declares and the JSON its values are sent
as must agree (a ``decimal(12,2)`` column is sent as exact text, a ``timestamp`` as RFC 3339
UTC, ``binary`` as base64 — what :mod:`icefloe.streams.native` accepts), so each
annotation is read once into a :class:`Kind` holding both. Anything the mapping has no
faithful column for is refused here, naming the field path and the annotation, before a
stream exists.

The mapping (see docs/python-models.md):

``str`` string · ``int`` long · ``float`` double · ``bool`` boolean · ``datetime``
timestamp (aware only) · ``date`` date · ``time`` time (naive only) · ``uuid.UUID`` uuid ·
``bytes`` binary · ``Annotated[Decimal, Precision(p, s)]`` decimal(p,s) · a str or int
``Enum``/``Literal`` string/long · ``list[T]`` list<T> · ``dict[str, T]`` map<string,T> ·
``dict[str, Any]``, ``dict`` and ``Any`` json · a dataclass or pydantic model
struct<...> · ``T | None`` nullable (otherwise required).
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import datetime as dt
import decimal
import enum
import inspect
import itertools
import math
import textwrap
import types
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union

from icefloe.errors import ModelError
from icefloe.streams.typespec import MAX_DECIMAL_PRECISION, MAX_TYPE_DEPTH

T = TypeVar("T")
Encoder = Callable[[Any, str], Any]
"""``(value, path) -> JSON-ready value`` (``path`` names the value in errors)."""


class _KeyMarker:
    """The metadata :data:`Key` puts on an annotation (one instance, compared by identity)."""

    def __repr__(self) -> str:
        return "icefloe.KEY"


KEY = _KeyMarker()
"""Marks a field as part of the stream's ``primary_key``: ``Annotated[str, KEY]``."""

Key = Annotated[T, KEY]
"""``Key[str]``: a primary-key field (the table keeps the latest row per key). Several
``Key`` fields make a compound key, in field order."""


@dataclass(frozen=True, slots=True)
class Precision:
    """``Annotated[Decimal, Precision(12, 2)]``: a ``decimal(12,2)`` column. Why required: a
    Python ``Decimal`` carries no precision, and Iceberg's decimal type needs one fixed for
    the table's life (it may only widen), so icefloe will not guess it."""

    precision: int
    scale: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.precision <= MAX_DECIMAL_PRECISION:
            raise ModelError(f"Precision({self.precision}, {self.scale}): precision must be "
                             f"1..{MAX_DECIMAL_PRECISION}")
        if not 0 <= self.scale <= self.precision:
            raise ModelError(f"Precision({self.precision}, {self.scale}): scale must be "
                             f"0..precision")


@dataclass(frozen=True, slots=True)
class Kind:
    """What one annotation becomes: the column type string, whether ``None`` is allowed,
    whether it is marked :data:`Key`, and how a value is encoded."""

    type: str
    encode: Encoder
    nullable: bool = False
    key: bool = False


@dataclass(frozen=True, slots=True)
class ModelField:
    """One field of a model class as a column."""

    name: str
    kind: Kind
    doc: str = ""


SUPPORTED = ("str, int, float, bool, datetime, date, time, uuid.UUID, bytes, "
             "Annotated[Decimal, icefloe.Precision(p, s)], a str or int Enum or Literal, "
             "list[T], dict[str, T], dict[str, Any], Any, a dataclass or pydantic model, "
             "T | None")


def is_model(cls: object) -> bool:
    """A dataclass or pydantic model class."""
    return isinstance(cls, type) and (dataclasses.is_dataclass(cls) or _is_pydantic(cls))


def _is_pydantic(cls: type) -> bool:
    return isinstance(getattr(cls, "model_fields", None), dict) and hasattr(cls, "model_dump")


def model_fields(cls: type, seen: tuple[type, ...] = ()) -> tuple[ModelField, ...]:
    """The fields of model class ``cls`` in declaration order. ``seen`` holds the models
    that enclose this one (a model met again inside itself is recursive: refused)."""
    if not is_model(cls):
        raise ModelError(f"{_name(cls)} is not a dataclass or a pydantic model")
    seen = (*seen, cls)
    out = []
    for name, annotation, doc in _declared(cls):
        path = f"{cls.__name__}.{name}"
        out.append(ModelField(name, kind_of(annotation, path, seen), doc))
    if not out:
        raise ModelError(f"{cls.__name__} has no fields")
    return tuple(out)


def _declared(cls: type) -> list[tuple[str, Any, str]]:
    """``(name, annotation, doc)`` of each field: pydantic's ``model_fields`` (its
    ``Annotated`` metadata put back), or a dataclass's resolved type hints."""
    if _is_pydantic(cls):
        found = []
        for name, info in cls.model_fields.items():  # type: ignore[attr-defined]
            annotation = info.annotation
            if info.metadata:
                annotation = Annotated[(annotation, *info.metadata)]
            found.append((name, annotation, info.description or ""))
        return found
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except NameError as exc:
        raise ModelError(f"{cls.__name__}.{_unresolved(cls)}: the annotation names something "
                         f"not defined at module level ({exc}); define the classes it uses "
                         "at module level") from None
    docs = _attribute_docs(cls)
    return [(f.name, hints[f.name], str(f.metadata.get("doc") or docs.get(f.name, "")))
            for f in dataclasses.fields(cls)]


def _unresolved(cls: type) -> str:
    """The first field whose annotation (a string, under ``from __future__ import
    annotations``) does not resolve in the class's module, as ``name`` (its text)."""
    for name, text in inspect.get_annotations(cls).items():
        probe = type("_Probe", (), {"__annotations__": {name: text},
                                    "__module__": cls.__module__})
        try:
            typing.get_type_hints(probe)
        except NameError:
            return f"{name} ({text})"
    return "?"


def _attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings (a string literal right below a field), read from the source;
    empty when the source is not available (a class made at run time)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for here, after in itertools.pairwise(body):
        if isinstance(here, ast.AnnAssign) and isinstance(here.target, ast.Name) \
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            docs[here.target.id] = inspect.cleandoc(after.value.value)
    return docs


def kind_of(annotation: Any, path: str, seen: tuple[type, ...] = (), depth: int = 0) -> Kind:
    """The :class:`Kind` of ``annotation`` at field ``path``; raises :class:`ModelError`
    naming the path and the annotation when there is no faithful column type."""
    if depth > MAX_TYPE_DEPTH:
        raise ModelError(f"{path}: nested deeper than {MAX_TYPE_DEPTH} levels")
    annotation, marks = _unannotated(annotation)
    key = any(m is KEY for m in marks)
    precision = next((m for m in marks if isinstance(m, Precision)), None)
    origin = typing.get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return _union(annotation, path, seen, depth, key, precision)
    kind = _plain(annotation, path, seen, depth, precision)
    return dataclasses.replace(kind, key=key) if key else kind


def _unannotated(annotation: Any) -> tuple[Any, tuple[Any, ...]]:
    """``Annotated[X, m...]`` → ``(X, (m, ...))`` (nested ``Annotated`` flattened)."""
    marks: tuple[Any, ...] = ()
    while typing.get_origin(annotation) is Annotated:
        args = typing.get_args(annotation)
        annotation, marks = args[0], (*marks, *args[1:])
    return annotation, marks


def _union(annotation: Any, path: str, seen: tuple[type, ...], depth: int, key: bool,
           precision: Precision | None) -> Kind:
    members = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(members) != 1:
        raise ModelError(f"{path}: {_name(annotation)} is a union of several types; a "
                         "column has one type (use T | None for an optional field, or Any "
                         "for a json column)")
    inner = members[0]
    if precision is not None:
        inner = Annotated[inner, precision]
    kind = kind_of(inner, path, seen, depth)
    if key or kind.key:
        raise ModelError(f"{path}: a Key field cannot be optional ({_name(annotation)}): a "
                         "row without a key value has no row to replace")
    return dataclasses.replace(kind, nullable=True)


_SCALARS: dict[type, tuple[str, Encoder]] = {}


def _plain(annotation: Any, path: str, seen: tuple[type, ...], depth: int,
           precision: Precision | None) -> Kind:
    if annotation is decimal.Decimal:
        if precision is None:
            raise ModelError(f"{path}: a bare Decimal has no precision; annotate it as "
                             "Annotated[Decimal, icefloe.Precision(12, 2)] (precision, scale)")
        return Kind(f"decimal({precision.precision},{precision.scale})",
                    _decimal_encoder(precision))
    if precision is not None:
        raise ModelError(f"{path}: icefloe.Precision applies to Decimal, not "
                         f"{_name(annotation)}")
    if annotation is Any:
        return Kind("json", _json)
    if isinstance(annotation, type) and annotation in _SCALARS:
        name, encode = _SCALARS[annotation]
        return Kind(name, encode)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return _literal(annotation, path)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum(annotation, path)
    if origin is list or annotation is list:
        return _list(annotation, path, seen, depth)
    if origin is dict or annotation is dict:
        return _dict(annotation, path, seen, depth)
    if is_model(annotation):
        return _struct(annotation, path, seen, depth)
    raise ModelError(f"{path}: {_name(annotation)} is not supported{_why(annotation)} "
                     f"(supported: {SUPPORTED})")


def _why(annotation: Any) -> str:
    origin = typing.get_origin(annotation) or annotation
    if origin in (set, frozenset):
        return ": a set has no column type (use list[T])"
    if origin is tuple:
        return ": a tuple has no column type (use list[T], or a dataclass for fixed members)"
    if isinstance(annotation, TypeVar):
        return ": a type variable is not a type"
    return ""


def _literal(annotation: Any, path: str) -> Kind:
    values = typing.get_args(annotation)
    if all(isinstance(v, str) for v in values):
        return Kind("string", _same)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return Kind("long", _same)
    raise ModelError(f"{path}: {_name(annotation)} mixes value types; a Literal column "
                     "takes only strings or only ints")


def _enum(cls: type[enum.Enum], path: str) -> Kind:
    values = [m.value for m in cls]
    if values and all(isinstance(v, str) for v in values):
        return Kind("string", _enum_value)
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return Kind("long", _enum_value)
    raise ModelError(f"{path}: enum {cls.__name__} has values that are not all str or all "
                     "int; its column would have no single type")


def _list(annotation: Any, path: str, seen: tuple[type, ...], depth: int) -> Kind:
    args = typing.get_args(annotation)
    if not args:
        raise ModelError(f"{path}: a bare list has no element type; write list[T]")
    element = kind_of(args[0], f"{path}[]", seen, depth + 1)
    _no_key(element, f"{path}[]")
    encode = element.encode

    def encode_list(value: Any, at: str) -> Any:
        return [None if v is None else encode(v, f"{at}[{i}]") for i, v in enumerate(value)]
    return Kind(f"list<{element.type}>", encode_list)


def _dict(annotation: Any, path: str, seen: tuple[type, ...], depth: int) -> Kind:
    args = typing.get_args(annotation)
    if not args or args[1] is Any:
        if args and args[0] is not str:
            raise ModelError(f"{path}: {_name(annotation)}: keys must be str (a JSON "
                             "object's keys are)")
        return Kind("json", _json)
    if args[0] is not str:
        raise ModelError(f"{path}: {_name(annotation)} is not supported: map keys must be "
                         "str (a JSON object's keys are); use dict[str, T]")
    value = kind_of(args[1], f"{path}[]", seen, depth + 1)
    _no_key(value, f"{path}[]")
    encode = value.encode

    def encode_map(mapping: Any, at: str) -> Any:
        return {k: None if v is None else encode(v, f"{at}[{k!r}]")
                for k, v in mapping.items()}
    return Kind(f"map<string,{value.type}>", encode_map)


def _struct(cls: type, path: str, seen: tuple[type, ...], depth: int) -> Kind:
    if cls in seen:
        raise ModelError(f"{path}: {cls.__name__} contains itself (a recursive model); a "
                         "column type is finite: cut the cycle, or make the field Any "
                         "(a json column)")
    members = []
    for name, annotation, _ in _declared(cls):
        kind = kind_of(annotation, f"{path}.{name}", (*seen, cls), depth + 1)
        _no_key(kind, f"{path}.{name}")
        members.append((name, kind))
    if not members:
        raise ModelError(f"{path}: {cls.__name__} has no fields (a struct needs one)")
    encoders = tuple((name, kind.encode) for name, kind in members)

    def encode_struct(value: Any, at: str) -> Any:
        if not isinstance(value, cls):
            raise ModelError(f"{at}: expected a {cls.__name__}, got {type(value).__name__}")
        out = {}
        for name, encode in encoders:
            member = getattr(value, name)
            if member is not None:
                out[name] = encode(member, f"{at}.{name}")
        return out
    return Kind("struct<" + ", ".join(f"{n}: {k.type}" for n, k in members) + ">",
                encode_struct)


def _no_key(kind: Kind, path: str) -> None:
    if kind.key:
        raise ModelError(f"{path}: Key marks a top-level field of the model only")


# -- encoders ---------------------------------------------------------------------------------


def _same(value: Any, path: str) -> Any:
    return value


def _double(value: Any, path: str) -> Any:
    """A finite float as it is; NaN and infinities refused naming the field: JSON cannot
    spell them, and the encoder would send null (a required field then refused as missing,
    an optional one stored as null) without a word."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ModelError(f"{path}: {value} is not a finite number; JSON events cannot carry "
                         "NaN or infinity (send None, or leave the field out)")
    return value


def _json(value: Any, path: str) -> Any:
    return value


def _enum_value(value: Any, path: str) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _timestamp(value: Any, path: str) -> Any:
    if not isinstance(value, dt.datetime):
        return value  # the ingestor refuses it, naming the field
    if value.tzinfo is None or value.utcoffset() is None:
        raise ModelError(f"{path}: naive datetime {value.isoformat()} has no time zone; "
                         "icefloe stores UTC instants and will not guess the zone: give "
                         "tzinfo (datetime.now(timezone.utc), .replace(tzinfo=...))")
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _date(value: Any, path: str) -> Any:
    if isinstance(value, dt.datetime):
        raise ModelError(f"{path}: a datetime where a date is declared; pass .date()")
    return value.isoformat() if isinstance(value, dt.date) else value


def _time(value: Any, path: str) -> Any:
    if not isinstance(value, dt.time):
        return value
    if value.tzinfo is not None:
        raise ModelError(f"{path}: time {value.isoformat()} has a time zone; a time column "
                         "holds a wall-clock time of day without one")
    return value.isoformat()


def _uuid(value: Any, path: str) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value


def _binary(value: Any, path: str) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    return value


def _decimal_encoder(precision: Precision) -> Encoder:
    """Sent as exact text: a JSON number would pass through a float on many paths."""
    whole = precision.precision - precision.scale

    def encode(value: Any, path: str) -> Any:
        if not isinstance(value, decimal.Decimal | int):
            return value
        number = decimal.Decimal(value)
        if not number.is_finite():
            raise ModelError(f"{path}: {number} is not a finite decimal")
        exponent = number.as_tuple().exponent
        assert isinstance(exponent, int)
        if -exponent > precision.scale:  # trailing zeros go; other digits would be rounded
            exact = number.quantize(decimal.Decimal(1).scaleb(-precision.scale),
                                    context=_EXACT)
            if exact != number:
                raise ModelError(f"{path}: {number} has more than {precision.scale} digits "
                                 f"after the point (decimal({precision.precision},"
                                 f"{precision.scale}) never rounds)")
            number = exact
        if number.adjusted() >= whole and number != 0:
            raise ModelError(f"{path}: {number} has more than {whole} digits before the point "
                             f"(decimal({precision.precision},{precision.scale}))")
        return format(number, "f")
    return encode


_EXACT = decimal.Context(prec=80)
_SCALARS.update({
    bool: ("boolean", _same), int: ("long", _same), float: ("double", _double),
    str: ("string", _same), bytes: ("binary", _binary), dt.datetime: ("timestamp", _timestamp),
    dt.date: ("date", _date), dt.time: ("time", _time), uuid.UUID: ("uuid", _uuid),
})


def _name(annotation: Any) -> str:
    """An annotation as written (``set[str]``, ``int | str``, ``Decimal``)."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    text = repr(annotation)
    for prefix in ("typing.", "collections.abc.", "datetime.", "decimal.", "uuid.",
                   "builtins."):
        text = text.replace(prefix, "")
    return text.replace("NoneType", "None")
