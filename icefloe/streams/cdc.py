"""Change data capture (#42): change events turned into the rows a keyed table's upsert takes.

Why at the ingestor, as a rewrite of each event before validation: a change event is a
row image (``after``, or ``before`` for a delete) plus an operation and a source position.
Flattened into one object — the image's fields at the top, the operation, the position and
a tombstone flag as three more columns — it is an ordinary event of the stream: validated,
canonicalised, evolved (``unknown_fields``) and decoded column-wise like any other, and the
collector applies it with the one upsert machinery (:mod:`pipeline.iceberg.upsert`), which
orders a key's changes by :data:`POSITION_COLUMN` instead of the accepted order.

The position is stored as text that sorts as the source orders changes: each part a
non-negative integer, zero-padded to 20 digits, parts joined by ``.``; so any engine can
compare two positions with a plain ``<``, and the table keeps each row's position (a
late change, older than the stored one, is a no-op). Event ids derive from the position and
the key (:func:`change_id`), so a connector that re-delivers after a restart sends ids
the dedup window already holds.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from icefloe.errors import ConfigError
from icefloe.streams.cdc_time import Convert, converters
from icefloe.streams.mappings import Step, parse_path
from icefloe.streams.model import CdcConfig, Column, StreamConfig

OP_COLUMN = "_cdc_op"
"""The change's operation, one of ``c`` (create), ``u`` (update), ``r`` (snapshot read),
``d`` (delete; such rows only delete and are never stored)."""
POSITION_COLUMN = "_cdc_position"
"""The change's source position as sortable text (module doc)."""
DELETED_COLUMN = "_cdc_deleted"
"""The upsert's tombstone: true for a delete (the stream's ``tombstone_field``)."""
BEFORE_PREFIX = "before_"
OPS = ("c", "u", "d", "r")
POSITIONS: Mapping[str, tuple[str, ...]] = {
    "postgresql": ("$.source.lsn", "$.source.txId"),
    "mysql": ("$.source.file", "$.source.pos", "$.source.row"),
}
"""The parts of a Debezium connector's position, most significant first. PostgreSQL: the
change's WAL position, then its transaction; MySQL: the binlog file (its number), the
event's offset in it, the row within the event. A missing ``txId``/``row`` reads 0."""
_OPTIONAL_PARTS = frozenset({"$.source.txId", "$.source.row"})
_DIGITS = 20
_TRAILING = re.compile(r"(\d+)$")


UNAVAILABLE = "__debezium_unavailable_value"
"""Debezium's placeholder for a value a change did not carry (PostgreSQL: an unchanged
TOASTed column of an update without ``REPLICA IDENTITY FULL``; also its default
``unavailable.value.placeholder``). Stored, it would overwrite the row's real value."""
_UNAVAILABLE_FORMS = (UNAVAILABLE, base64.b64encode(UNAVAILABLE.encode()).decode())
"""The placeholder as text, and as a bytes column's base64 in JSON."""


class ChangeError(ValueError):
    """A change event icefloe cannot apply: ``field`` names where, ``reason`` why."""

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


def cdc_columns(stream: StreamConfig) -> tuple[Column, ...]:
    """The columns a change stream adds to its declared ones (before images included)."""
    assert stream.cdc is not None
    declared = {c.name: c for c in stream.columns}
    before = tuple(Column(name=BEFORE_PREFIX + name, type=declared[name].type,
                          doc=f"{name} before the change (null: no before image)")
                   for name in stream.cdc.before_columns)
    return (Column(name=OP_COLUMN, type="string",
                   doc="the row's last change: c, u, r (d: a kept delete)"),
            Column(name=POSITION_COLUMN, type="string",
                   doc="source position of the row's last change (sortable text)"),
            Column(name=DELETED_COLUMN, type="boolean",
                   doc="true for a kept delete (deletes = keep); else always false"), *before)


def with_cdc_columns(streams: Sequence[StreamConfig], where: str) -> tuple[StreamConfig, ...]:
    """Each change stream checked and given its :func:`cdc_columns` and tombstone field."""
    out = []
    for index, stream in enumerate(streams):
        if stream.cdc is not None and not any(c.name == OP_COLUMN for c in stream.columns):
            at = f"{where}: streams[{index}]"
            check_cdc(stream, at)
            stream = msgspec.structs.replace(stream, columns=stream.columns + cdc_columns(stream),
                                             tombstone_field=DELETED_COLUMN)
        out.append(stream)
    return tuple(out)


def check_cdc(stream: StreamConfig, at: str) -> None:
    """What a change stream needs (a key, no tombstone of its own, known ops and positions)
    and what it cannot be combined with; every refusal names the key."""
    cdc = stream.cdc
    assert cdc is not None
    if not stream.primary_key:
        raise ConfigError(f"{at}.cdc: a change stream applies changes by key; set "
                          "primary_key (the source table's key columns)")
    for key, value, why in (("tombstone_field", stream.tombstone_field, "a delete (op d) "
                             "removes the key"), ("event_id_field", stream.event_id_field,
                             "change ids come from the source position and the key"),
                            ("where", stream.where, "a delete carries only the key, so a "
                             "where over other columns would drop it and keep the row"),
                            ("format", None if stream.format == "json" else stream.format,
                             "change events are JSON"),
                            ("payload", None if stream.payload == "json" else stream.payload,
                             "change events are JSON")):
        if value is not None:
            raise ConfigError(f"{at}.{key}: not with cdc: {why}; remove it")
    names = {c.name for c in stream.columns}
    for i, column in enumerate(stream.columns):
        if column.name.startswith("_cdc_") or (column.name.startswith(BEFORE_PREFIX) and
                                               column.name[7:] in cdc.before_columns):
            raise ConfigError(f"{at}.columns[{i}].name: {column.name!r} is a column cdc adds")
        if column.required and column.name not in stream.primary_key:
            raise ConfigError(f"{at}.columns[{i}].required: only key columns may be required "
                              "in a change stream (a delete's before image holds the key only)")
    for i, name in enumerate(cdc.before_columns):
        if name not in names:
            raise ConfigError(f"{at}.cdc.before_columns[{i}]: {name!r} is not a declared column")
    _check_format(cdc, f"{at}.cdc")


def check_expanded(stream: StreamConfig, at: str) -> None:
    """A change stream as every process gets it (its columns added): what an admin API
    change to its sink (columns, ``where``) must keep, checked with the stream's rules."""
    if stream.cdc is None:
        return
    if stream.where is not None:
        raise ConfigError(f"{at}.where: not with cdc: a delete carries only the key, so a "
                          "where over other columns would drop it and keep the row")
    types = {c.name: c.type for c in stream.columns}
    for column in cdc_columns(stream) if all(n in types for n in stream.cdc.before_columns) \
            else ():
        if types.get(column.name) != column.type:
            raise ConfigError(f"{at}.columns: change stream {stream.name!r} needs its column "
                              f"{column.name!r} ({column.type}); keep the columns cdc adds")
    if stream.tombstone_field != DELETED_COLUMN:
        raise ConfigError(f"{at}.tombstone_field: a change stream's tombstone is "
                          f"{DELETED_COLUMN!r}")


def _check_format(cdc: CdcConfig, at: str) -> None:
    if isinstance(cdc.position, str):
        if cdc.format == "op" or cdc.position not in ("auto", *POSITIONS):
            raise ConfigError(f"{at}.position: {cdc.position!r}: give JSON paths of the "
                              "position's parts, most significant first (e.g. [\"$.lsn\"])"
                              + ("" if cdc.format == "op" else
                                 ", or one of auto, postgresql, mysql"))
    else:
        if not cdc.position:
            raise ConfigError(f"{at}.position: name at least one JSON path")
        for i, path in enumerate(cdc.position):
            try:
                parse_path(path)
            except ValueError as exc:
                raise ConfigError(f"{at}.position[{i}]: {path!r}: {exc}") from None
    if cdc.format == "debezium":
        # (op_field's default is Debezium's own field: only another name is refused)
        for key, given in (("op_field", cdc.op_field != "op"), ("ops", bool(cdc.ops)),
                           ("before_field", cdc.before_field is not None)):
            if given:
                raise ConfigError(f"{at}.{key}: only for format = \"op\" (a Debezium "
                                  "event's operation is its `op` field, valued c, u, d or r, "
                                  "and its before image is `before`); remove it")
        return
    for value, op in cdc.ops.items():
        if op not in OPS:
            raise ConfigError(f"{at}.ops.{value}: {op!r} is not an operation (c, u, d, r)")


def encode_position(parts: Sequence[int]) -> str:
    """Sortable text of a position (module doc)."""
    return ".".join(str(part).zfill(_DIGITS) for part in parts)


def change_id(position: str, key: Sequence[Any]) -> str:
    """The event id of a change: its position and a digest of its key values (a
    re-delivered change gets the same id; two keys at one position, as a key update's
    delete and create, get two)."""
    digest = hashlib.blake2b(msgspec.json.encode(list(key)), digest_size=10).hexdigest()
    return f"cdc:{position}:{digest}"


class Flattener:
    """One change stream's rewrite of change events into rows (module doc)."""

    def __init__(self, stream: StreamConfig) -> None:
        assert stream.cdc is not None
        self.cdc = stream.cdc
        self.key = stream.primary_key
        self._paths: dict[str, tuple[tuple[str, tuple[Step, ...]], ...]] = {}
        if isinstance(self.cdc.position, tuple):
            self._paths["*"] = tuple((p, parse_path(p)) for p in self.cdc.position)
        else:
            for name, paths in POSITIONS.items():
                self._paths[name] = tuple((p, parse_path(p)) for p in paths)
        self._ops = dict(self.cdc.ops) or {op: op for op in OPS}
        self._types = {c.name: c.type for c in stream.columns if c.mapping is None}
        self._evolve = stream.unknown_fields == "evolve"  # undeclared fields become columns

    def flatten(self, event: Any) -> tuple[dict[str, Any], str] | None:
        """``(row, event id)`` of one decoded change event; None for a null event (a
        Kafka tombstone, or a wrapper whose payload is null).

        Raises:
            ChangeError: an event that is not a change icefloe can apply.
        """
        if event is None:
            return None
        if not isinstance(event, dict):
            raise ChangeError(None, f"a change event is a JSON object, not {_kind(event)}")
        if self.cdc.format == "op":
            return self._plain(event)
        schema = None
        if "payload" in event and "schema" in event:  # the JSON converter's wrapper
            schema, event = event["schema"], event["payload"]
            if event is None:
                return None
            if not isinstance(event, dict):
                raise ChangeError("payload", f"the payload is {_kind(event)}, not an object")
        op = event.get("op")
        if op not in OPS:
            raise ChangeError("op", _unknown_op(op))
        image = "before" if op == "d" else "after"
        row = event.get(image)
        if row is not None and not isinstance(row, dict):
            raise ChangeError(image, f"the {image} image is {_kind(row)}, not an object")
        if row is None and op != "d":
            raise ChangeError(image, f"op {op!r} carries its row in {image}, which is null")
        before = event.get("before")
        before = before if isinstance(before, dict) else None
        if schema is not None:  # Debezium's temporal encodings, as the schema names them
            row = _converted(row, converters(schema, image, self._types))
            before = _converted(before, converters(schema, "before", self._types))
        return self._row(op, row or {}, before, self._position(event))

    def _plain(self, event: dict[str, Any]) -> tuple[dict[str, Any], str]:
        name = self.cdc.op_field
        value = event.get(name)
        op = self._ops.get(value) if isinstance(value, str) else None
        if op is None:
            raise ChangeError(name, f"{value!r} is not an operation of cdc.ops "
                              f"({', '.join(sorted(self._ops))})")
        position = self._position(event)
        before = None
        row = {k: v for k, v in event.items() if k != name}
        if self.cdc.before_field is not None:
            before = row.pop(self.cdc.before_field, None)
            if before is not None and not isinstance(before, dict):
                raise ChangeError(self.cdc.before_field, f"the before image is "
                                  f"{_kind(before)}, not an object")
        return self._row(op, row, before, position)

    def _row(self, op: str, row: dict[str, Any], before: dict[str, Any] | None,
             position: str) -> tuple[dict[str, Any], str]:
        if op == "d":  # only the key: a delete stores nothing, its other fields never land
            row = {k: row[k] for k in self.key if k in row}
            if before is not None:
                row.update((k, before[k]) for k in self.key if k not in row and k in before)
        else:
            row = dict(row)  # never the caller's object
            self._refuse_unavailable(row, "")
        if before is not None and self.cdc.before_columns:
            self._refuse_unavailable({k: before.get(k) for k in self.cdc.before_columns},
                                     "before.")
        for name in (OP_COLUMN, POSITION_COLUMN, DELETED_COLUMN):
            if name in row:
                raise ChangeError(name, f"the row holds a field {name!r}, which cdc sets")
        for name in self.cdc.before_columns:
            column = BEFORE_PREFIX + name
            if column in row:
                raise ChangeError(column, f"the row holds a field {column!r}, which "
                                  "cdc.before_columns sets")
            row[column] = before.get(name) if before is not None else None
        row[OP_COLUMN] = op
        row[POSITION_COLUMN] = position
        row[DELETED_COLUMN] = op == "d"
        return row, change_id(position, [row.get(k) for k in self.key])

    def _refuse_unavailable(self, row: dict[str, Any], prefix: str) -> None:
        """Refuse a declared column holding :data:`UNAVAILABLE` (or a list of nothing
        else): the change did not carry that value, and no value icefloe could store is
        right (the table would hold the placeholder instead of the row's value)."""
        for name, value in row.items():
            if name not in self._types and prefix == "" and not self._evolve:
                continue  # an undeclared field never lands
            if value in _UNAVAILABLE_FORMS or (
                    isinstance(value, list) and value
                    and all(v in _UNAVAILABLE_FORMS for v in value)):
                raise ChangeError(prefix + name, f"{prefix}{name} holds Debezium's "
                                  f"placeholder {UNAVAILABLE!r}: the change did not carry "
                                  "its value (PostgreSQL sends it for an unchanged TOASTed "
                                  "column); set REPLICA IDENTITY FULL on the source table, "
                                  "or leave the column out of the stream")

    def _position(self, event: dict[str, Any]) -> str:
        paths = self._paths.get("*")
        if paths is None:
            paths = self._connector_paths(event)
        parts = []
        for text, steps in paths:
            value = _at(event, steps)
            if value is None and text in _OPTIONAL_PARTS:
                value = 0
            parts.append(_part(text, value))
        return encode_position(parts)

    def _connector_paths(self, event: dict[str, Any]
                         ) -> tuple[tuple[str, tuple[Step, ...]], ...]:
        name: Any = self.cdc.position
        if name == "auto":
            source = event.get("source")
            name = source.get("connector") if isinstance(source, dict) else None
            if name not in POSITIONS:
                raise ChangeError("source.connector", f"connector {name!r} has no known "
                                  "position (known: postgresql, mysql); set cdc.position to "
                                  "the JSON paths of its parts")
        return self._paths[str(name)]


def _converted(image: dict[str, Any] | None, convert: Mapping[str, Convert]
               ) -> dict[str, Any] | None:
    if image is None or not convert:
        return image
    return {k: convert[k](v) if k in convert else v for k, v in image.items()}


def _part(path: str, value: Any) -> int:
    """One position part as a non-negative integer: an integer, or the number a string
    ends with (a MySQL binlog file, ``mysql-bin.000003`` → 3)."""
    if isinstance(value, str):
        match = _TRAILING.search(value)
        if match is None:
            raise ChangeError(path, f"position part {value[:40]!r} does not end in a number")
        value = int(match.group(1))
    if isinstance(value, bool) or not isinstance(value, int):
        raise ChangeError(path, f"position part is {_kind(value)}, not an integer")
    if not 0 <= value < 10 ** _DIGITS:
        raise ChangeError(path, f"position part {value} is negative or over 20 digits")
    return int(value)


def _at(event: Any, steps: tuple[Step, ...]) -> Any:
    for step in steps:
        if isinstance(step, str) and isinstance(event, dict):
            event = event.get(step)
        elif isinstance(step, int) and isinstance(event, list) and -len(event) <= step < len(event):
            event = event[step]
        else:
            return None
    return event


def _unknown_op(op: Any) -> str:
    if op == "t":
        return ("op 't' (truncate) is not supported: icefloe applies row changes only "
                "(Debezium skips truncates unless skipped.operations allows them)")
    if op == "m":
        return "op 'm' (a logical decoding message) is not a row change"
    return f"op {op!r} is not a change operation (c, u, d, r)"


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
