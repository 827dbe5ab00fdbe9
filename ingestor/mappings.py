"""The ingestor's half of column mappings: ``path`` and ``body`` values, request metadata.

Why here: the ingestor already parses every event to validate it, so reading a value at a
JSON path costs one small decode of the subtree it lives in, and a value of the wrong type
is refused with the event index, the column and the path — the producer learns at once
instead of finding nulls or dead letters later. The extracted values become ordinary
top-level fields of the canonical payload, so the collector's columnar fast path reads them
like any plain column. ``ip`` and ``header`` values are request metadata: only the ones a
mapping names are kept, once per record, in the envelope's meta (:func:`request_meta`).
A Kafka record's metadata (topic, partition, offset, timestamp, key, headers) rides in the
same meta, under its own key (:func:`kafka_meta`), for the ``from = "kafka_*"`` columns.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from icefloe.redact import redact
from icefloe.streams.mappings import (
    KAFKA_SOURCES,
    META_ALL_HEADERS,
    META_HEADERS,
    META_IP,
    Step,
    parse_path,
    stored_header,
)
from icefloe.streams.model import Column, StreamConfig

Convert = Callable[[str, Any, bool], Any]


class MappingViolation(Exception):
    """An event's mapped value is missing or of the wrong type (``code``: the stable
    error code, ``validation_failed`` unless a more precise one applies)."""

    def __init__(self, field: str, reason: str, code: str = "validation_failed") -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class _Path:
    """One ``path`` column: where its value is and how it becomes canonical.

    ``chain`` is the attribute chain through typed structs (the root's field, then one
    field per key), or None when the root is kept raw and ``rest`` is walked in Python
    (paths with array indexes, overlapping paths, a root that is also a json column).
    """

    column: Column
    root_attr: str
    chain: tuple[str, ...] | None
    rest: tuple[Step, ...]
    key: bytes
    default: Any


_MISSING = object()
_NULL = b"null"


def _walk(value: Any, steps: tuple[Step, ...]) -> Any:
    """The value at ``steps`` below ``value``; _MISSING when a key, an index or a value on
    the way is absent or null. Raises ValueError when a value on the way has the wrong
    shape (a number where the path needs an object), as the typed decode does."""
    for step in steps:
        if value is None:
            return _MISSING
        if isinstance(step, str):
            if not isinstance(value, dict):
                raise ValueError(f"expected `object` before key {step!r}, got "
                                 f"`{_json_kind(value)}`")
            value = value.get(step, _MISSING)
        else:
            if not isinstance(value, list):
                raise ValueError(f"expected `array` before index {step}, got "
                                 f"`{_json_kind(value)}`")
            value = value[step] if step < len(value) else _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def _json_kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "str", bool: "bool", int: "int",
            float: "float"}.get(type(value), type(value).__name__)


class EventMappings:
    """Evaluates a stream's ``path`` and ``body`` columns for decoded events.

    Why typed roots: when every path under a root is a chain of keys, the validator decodes
    that root into nested msgspec structs whose leaves have the columns' types, so msgspec
    checks types while parsing (in C) and extraction is a few attribute reads per value —
    several times cheaper than decoding the subtree to dicts and converting each value.
    Other roots are kept as ``msgspec.Raw`` and walked in Python.
    """

    def __init__(self, stream: StreamConfig, plain_json: set[str],
                 leaf_type: Callable[[Column], Any], convert: Convert) -> None:
        self._convert = convert
        self.fields: list[tuple[Any, ...]] = []
        """Extra validator struct fields (one per root that is not a plain json column)."""
        self.root_attrs: list[str] = []
        """Their attributes: cleared before encoding, so subtrees never reach the payload."""
        self.violations: dict[str, tuple[str, str]] = {}
        """msgspec error path (``user.id``) → (column, config path), to name the column."""
        by_root: dict[str, list[tuple[Column, tuple[Step, ...]]]] = {}
        for column in stream.columns:
            if column.path is not None:
                steps = parse_path(column.path)
                by_root.setdefault(str(steps[0]), []).append((column, steps[1:]))
        self._paths: list[_Path] = []
        encode = msgspec.json.encode
        for root, paths in by_root.items():
            attr = root if root in plain_json else f"_root{len(self.root_attrs)}"
            typed = root not in plain_json and _typable(paths)
            if typed:
                kind = _struct_for(f"{stream.name}_{len(self.root_attrs)}", paths, leaf_type)
                self.fields.append((attr, kind if kind is msgspec.Raw else kind | None,
                                    msgspec.field(default=None, name=root)))
            elif root not in plain_json:
                self.fields.append((attr, msgspec.Raw, msgspec.field(default=None, name=root)))
            if root not in plain_json:
                self.root_attrs.append(attr)
            for column, rest in paths:
                chain = tuple(f"f{_key_index(paths, rest, i)}" for i in range(len(rest))) \
                    if typed else None
                default = None if column.default is None else \
                    convert(column.type, column.default, column.raw)
                self._paths.append(_Path(column, attr, chain, rest,
                                         b"," + encode(column.name) + b":", default))
                if typed:
                    where = ".".join([root, *map(str, rest)])
                    self.violations[where] = (column.name, column.path or "")
                    for cut in range(len(rest)):  # a non-object on the way names it too
                        self.violations.setdefault(".".join([root, *map(str, rest[:cut])]),
                                                   (column.name, column.path or ""))
        self.bodies = [(c, b"," + encode(c.name) + b":") for c in stream.columns
                       if c.source == "body" or c.template is not None]
        """``body`` columns, and ``template`` ones: the collector evaluates a template
        over the event's JSON text, which waits in the column's own field."""
        self.event_id: str | None = None
        """After :meth:`extract`: the event id column's value when a path maps it."""
        self._id_column = stream.event_id_field
        self._decode = msgspec.json.decode
        self._encode = msgspec.json.encode

    @property
    def needs_raw(self) -> bool:
        """True when a ``from = "body"`` or ``template`` column needs each event's own JSON
        text."""
        return bool(self.bodies)

    # per-event hot path, inline: ruff's caps (noqa below)
    def extract(self, event: Any, raw: bytes | None) -> bytes:  # noqa: PLR0912
        """The mapped values of one event as JSON members (``,"col":value`` each) to append
        to its canonical payload; b"" when none is present."""
        parts: list[bytes] = []
        decoded: dict[str, Any] = {}
        encode = self._encode
        self.event_id = None
        for path in self._paths:
            column = path.column
            value = getattr(event, path.root_attr)
            if path.chain is not None:
                for attr in path.chain:
                    if value is None:
                        break
                    value = getattr(value, attr)
                if value is not None:
                    value = self._typed(column, value)
            elif value is not None:
                root = decoded.get(path.root_attr, _MISSING)
                if root is _MISSING:
                    root = decoded[path.root_attr] = self._decoded_root(column, value)
                try:
                    value = _walk(root, path.rest)
                except ValueError as exc:
                    raise MappingViolation(column.name, f"value at {column.path}: {exc}"
                                           ) from None
                if value is not _MISSING and value is not None:
                    value = self._converted(column, value)
                else:
                    value = None
            if value is None:
                if path.default is not None:
                    value = path.default
                elif column.required:
                    raise MappingViolation(column.name, f"required value at {column.path} is "
                                           "missing or null")
                else:
                    continue
            parts.append(path.key + encode(value))
            if column.name == self._id_column:
                self.event_id = str(value)
        for column, key in self.bodies:
            assert raw is not None
            # the event's own text, checked like a json value (depth, number range)
            text = self._converted(column, msgspec.Raw(raw), "json")
            parts.append(key + encode(text))
        return b"".join(parts)

    def _decoded_root(self, column: Column, value: Any) -> Any:
        """A raw root decoded to walk its path; a number no double holds is the column's
        violation (not a crash)."""
        try:
            return self._decode(value)
        except msgspec.ValidationError as exc:
            raise MappingViolation(column.name, f"value at {column.path}: {exc}",
                                   "number_out_of_range") from None

    def _typed(self, column: Column, value: Any) -> Any:
        """A leaf msgspec already type-checked, in canonical form (None for JSON null)."""
        if isinstance(value, msgspec.Raw):
            text = bytes(value)
            if text == _NULL:
                return None
            if column.type == "string" and text[:1] == b'"':  # raw = true, a JSON string
                return self._decode(text)
            return self._converted(column, value, "json")  # JSON text: depth, numbers
        if column.type == "timestamp":
            if value.__class__ is int:
                return self._converted(column, value)
            try:
                return value.astimezone(dt.UTC) if value.utcoffset() else value
            except OverflowError:  # past year 9999 or before year 1 once in UTC
                return self._converted(column, value)  # refuses it, naming the column
        return value

    def _converted(self, column: Column, value: Any, kind: str | None = None) -> Any:
        try:
            return self._convert(kind or column.type, value, column.raw)
        except (msgspec.ValidationError, ValueError) as exc:
            reason = str(exc)
            where = column.path or "the event body"
            raise MappingViolation(column.name, f"value at {where}: "
                                   f"{reason[:1].lower()}{reason[1:]}",
                                   getattr(exc, "code", "validation_failed")) from None


def _typable(paths: list[tuple[Column, tuple[Step, ...]]]) -> bool:
    """Every path is keys only and none is a prefix of another (a leaf is never a node)."""
    rests = [rest for _, rest in paths]
    if any(not isinstance(step, str) for rest in rests for step in rest):
        return False
    return not any(i != j and b[:len(a)] == a
                   for i, a in enumerate(rests) for j, b in enumerate(rests))


def _key_index(paths: list[tuple[Column, tuple[Step, ...]]], rest: tuple[Step, ...],
               depth: int) -> int:
    """The field number of ``rest[depth]`` among its siblings (keys in first-seen order)."""
    siblings: list[Step] = []
    for _, other in paths:
        if len(other) > depth and other[:depth] == rest[:depth] and other[depth] not in siblings:
            siblings.append(other[depth])
    return siblings.index(rest[depth])


def _struct_for(name: str, paths: list[tuple[Column, tuple[Step, ...]]],
                leaf_type: Callable[[Column], Any], depth: int = 0,
                prefix: tuple[Step, ...] = ()) -> Any:
    """The type of the node at ``prefix``: a leaf column's type, or a struct of children."""
    here = [(c, r) for c, r in paths if r[:depth] == prefix]
    leaf = next((c for c, r in here if len(r) == depth), None)
    if leaf is not None:
        return leaf_type(leaf)
    keys: list[Step] = []
    for _, rest in here:
        if rest[depth] not in keys:
            keys.append(rest[depth])
    fields = []
    for i, key in enumerate(keys):
        child = _struct_for(f"{name}_{i}", here, leaf_type, depth + 1, (*prefix, key))
        kind = child if child is msgspec.Raw else child | None
        fields.append((f"f{i}", kind, msgspec.field(default=None, name=str(key))))
    return msgspec.defstruct(f"Path_{name}", fields, kw_only=True, gc=False)


def header_columns(stream: StreamConfig) -> list[Column]:
    return [c for c in stream.columns if c.header is not None]


def all_headers_json(pairs: Iterable[tuple[str, str]]) -> str:
    """The JSON text a ``from = "headers"`` column stores: one object, names in lower case
    and sorted, a repeated header's values joined with ``,`` (as a ``header`` mapping
    joins them), secrets left out (:func:`icefloe.streams.mappings.stored_header`) and every
    value passed through the log redaction (a bearer or ``ifl_`` token in any header is
    masked)."""
    joined: dict[str, list[str]] = {}
    for name, value in pairs:
        lowered = name.lower()
        if lowered.startswith(":") or lowered.endswith("-bin") or not stored_header(lowered):
            continue
        joined.setdefault(lowered, []).append(value)
    return msgspec.json.encode({name: redact(",".join(joined[name]))
                                for name in sorted(joined)}).decode()


def request_meta(stream: StreamConfig, client: str | None,
                 header: Callable[[str], str | None],
                 all_headers: Callable[[], Iterable[tuple[str, str]]] | None = None
                 ) -> dict[str, Any] | None:
    """The meta object a request's records carry, or None when no mapping needs one.

    ``header(name)`` looks a request header up by its lower-case name; ``all_headers()``
    lists them all (name, value), for a ``from = "headers"`` column. A missing required
    header raises :class:`MappingViolation`; a missing optional one takes its default or is
    left out (the column is null).
    """
    templates = any(c.template is not None for c in stream.columns)
    wants_ip = templates or any(c.source == "ip" for c in stream.columns)
    wants_all = templates or any(c.source == "headers" for c in stream.columns)
    headers = header_columns(stream)
    if not wants_ip and not headers and not wants_all:
        return None
    meta: dict[str, Any] = {}
    if wants_ip and client is not None:
        meta[META_IP] = client
    if wants_all and all_headers is not None:
        meta[META_ALL_HEADERS] = all_headers_json(all_headers())
    values: dict[str, str] = {}
    for column in headers:
        name = column.header.lower()  # type: ignore[union-attr]  # header_columns: set
        value = header(name)
        if value is None:
            if column.default is not None:
                value = str(column.default)
            elif column.required:
                raise MappingViolation(column.name, f"required header {column.header!r} is "
                                       "missing")
            else:
                continue
        values[name] = value
    if values:
        meta[META_HEADERS] = values
    return meta


def meta_header_names(streams: Sequence[StreamConfig]) -> set[bytes]:
    """Lower-case header names any stream maps (the HTTP front keeps only those)."""
    # (header_columns keeps the columns whose header is set)
    return {c.header.lower().encode() for s in streams  # type: ignore[union-attr]
            for c in header_columns(s)}


def kafka_meta_wanted(stream: StreamConfig) -> bool:
    """Whether a column of ``stream`` reads the Kafka record's metadata (a ``from =
    "kafka_*"`` column): only then does the Kafka listener put :func:`kafka_meta` in the
    envelope meta of each record."""
    return any(c.source in KAFKA_SOURCES for c in stream.columns)


def kafka_key_text(stream: StreamConfig) -> bool:
    """Whether a ``from = "kafka_key"`` column of ``stream`` is a string: then a record key
    must be UTF-8 (:func:`check_kafka_key`), or the column could not hold it."""
    return any(c.source == "kafka_key" and c.type == "string" for c in stream.columns)


def check_kafka_key(stream: StreamConfig, key: bytes | None) -> str | None:
    """Why the Kafka listener must refuse a record with ``key`` for ``stream``, or None.

    Why at acceptance: a string ``kafka_key`` column stores the key's UTF-8 text, and a key
    that is not UTF-8 has none — refused to the producer now, rather than stored as a null
    (or a mangled text) the collector finds later. A missing key is fine (the column is
    null), and so is any key when the column is binary.
    """
    if key is None or not kafka_key_text(stream):
        return None
    try:
        key.decode()
    except UnicodeDecodeError as exc:
        column = next(c.name for c in stream.columns
                      if c.source == "kafka_key" and c.type == "string")
        return (f"column {column} (from = \"kafka_key\") is a string, but the record key "
                f"is not valid UTF-8 (byte {exc.start} of {len(key)}); send UTF-8 keys or "
                "declare the column as binary")
    return None


def kafka_headers_json(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """The JSON text a ``from = "kafka_headers"`` column stores: an array, in record order,
    of ``{"key": name, "value": text}`` (``null`` for a null value). Why an array and not
    an object: a Kafka record may repeat a header and its order can matter. A value that is
    not UTF-8 is kept whole as ``{"key": name, "value_base64": "..."}`` — never dropped,
    never mangled into replacement characters. Secret names are left out as ``from =
    "headers"`` leaves them out (:func:`icefloe.streams.mappings.stored_header`)."""
    out: list[dict[str, str | None]] = []
    for name, value in headers:
        if not stored_header(name.lower()):
            continue
        if value is None:
            out.append({"key": name, "value": None})
            continue
        try:
            out.append({"key": name, "value": value.decode()})
        except UnicodeDecodeError:
            out.append({"key": name, "value_base64": base64.b64encode(value).decode()})
    return msgspec.json.encode(out).decode()


def kafka_meta(topic: str, partition: int, offset: int, timestamp_ms: int, key: bytes | None,
               headers: Sequence[tuple[str, bytes | None]]) -> dict[str, Any]:
    """The Kafka record's metadata as the envelope meta carries it under
    :data:`~icefloe.streams.mappings.META_KAFKA` (keys:
    :data:`~icefloe.streams.mappings.KAFKA_META_KEYS`). The key is base64 (it is bytes,
    and the meta is JSON); the pipeline's decode turns it back into bytes or text. A
    negative timestamp is Kafka's "none" (-1): null, never a time in 1969."""
    return {"t": topic, "p": partition, "o": offset,
            "ts": timestamp_ms if timestamp_ms >= 0 else None,
            "k": None if key is None else base64.b64encode(key).decode(),
            "hs": kafka_headers_json(headers)}
