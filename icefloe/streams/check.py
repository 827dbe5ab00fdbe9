"""One stream's own rules: its name, table, columns, mappings, event id field, partition.

Why apart from the config's cross-key checks: a stream is checked the same way whether it
comes from ``icefloe.toml`` (:func:`icefloe.config.validate.validate`) or from the admin
API (:mod:`icefloe.registry.ops`); ``at`` names where it came from in every message.
"""

from __future__ import annotations

import re

from icefloe.errors import ConfigError
from icefloe.streams.mappings import check_mappings
from icefloe.streams.model import PARTITIONS, Column, StreamConfig
from icefloe.streams.typespec import BadType, is_native, parse_type
from icefloe.streams.where import parse_where

_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")
_RESERVED_COLUMNS = ("_event_id", "_received_at", "_sequence", "_stream")


def validate_stream(stream: StreamConfig, at: str) -> None:
    """One stream's own rules (name, table, columns, mappings, id field, partition); ``at``
    prefixes every message (the config key, or the admin API's field)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", stream.name):
        raise ConfigError(f"{at}.name: {stream.name!r} must be 1-128 letters, digits, '_', '-' "
                          "or '.'")
    parts = stream.table.split(".")
    if stream.table == "icefloe.dead_letters":
        raise ConfigError(f"{at}.table: 'icefloe.dead_letters' is icefloe's dead-letter "
                          "table; choose another name")
    if len(parts) != 2 or not all(_NAME_RE.fullmatch(p) for p in parts):
        raise ConfigError(f"{at}.table: {stream.table!r} must be 'namespace.table' in lower "
                          "case letters, digits and '_'")
    if not stream.columns:
        raise ConfigError(f"{at}.columns: a stream needs at least one column")
    seen: set[str] = set()
    for i, column in enumerate(stream.columns):
        _check_type(column, f"{at}.columns[{i}]")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", column.name):
            raise ConfigError(f"{at}.columns[{i}].name: {column.name!r} is not a valid column "
                              "name (letters, digits, '_')")
        if column.name in _RESERVED_COLUMNS:
            raise ConfigError(f"{at}.columns[{i}].name: {column.name!r} is reserved by icefloe")
        if column.name in seen:
            raise ConfigError(f"{at}.columns[{i}].name: duplicate column {column.name!r}")
        seen.add(column.name)
    check_mappings(stream, at)
    if stream.event_id_field is not None and stream.event_id_field not in seen:
        raise ConfigError(f"{at}.event_id_field: {stream.event_id_field!r} is not a declared "
                          "column")
    if stream.where is not None:
        try:
            parse_where(stream.where, stream.columns)
        except ValueError as exc:
            raise ConfigError(f"{at}.where: sink {stream.name!r} (table {stream.table!r}): "
                              f"where {stream.where[:80]!r}: {exc}") from None
    if stream.partition not in PARTITIONS:
        raise ConfigError(f"{at}.partition: unknown partition {stream.partition!r} (expected "
                          f"one of {', '.join(PARTITIONS)}; it partitions the table by "
                          "_received_at)")


def _check_type(column: Column, at: str) -> None:
    """The column's type string parses (:mod:`icefloe.streams.typespec`), and a type beyond
    the original flat ones sits on a plain column: mappings (path, header, from, sql)
    convert values with the flat types' rules only."""
    try:
        parse_type(column.type)
    except BadType as exc:
        raise ConfigError(f"{at}.type: {exc} (column {column.name!r}, type "
                          f"{column.type!r})") from None
    if is_native(column.type) and column.mapping is not None:
        raise ConfigError(f"{at}.type: type {column.type!r} (column {column.name!r}) applies to "
                          f"plain columns only, not to a {column.mapping} mapping; map the "
                          "value into a json column or declare the field as a plain column")
