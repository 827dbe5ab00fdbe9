"""One stream's own rules: its name, table, columns, mappings, event id field, partition.

Why apart from the config's cross-key checks: a stream is checked the same way whether it
comes from ``icefloe.toml`` (:func:`icefloe.config.validate.validate`) or from the admin
API (:mod:`icefloe.registry.ops`); ``at`` names where it came from in every message.
"""

from __future__ import annotations

import re

from icefloe.errors import ConfigError
from icefloe.streams.cdc import check_expanded
from icefloe.streams.dynamic_tables import DEFAULT_LIMITS, check_limits, is_template, parse_template
from icefloe.streams.layout import check_layout
from icefloe.streams.mappings import check_mappings, gives_type
from icefloe.streams.model import PARTITIONS, Column, StreamConfig
from icefloe.streams.typespec import BadType, is_native, parse_type
from icefloe.streams.where import check_where

_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")
_RESERVED_COLUMNS = ("_event_id", "_received_at", "_sequence", "_stream")


def validate_stream(stream: StreamConfig, at: str) -> None:
    """One stream's own rules (name, table, columns, mappings, id field, partition); ``at``
    prefixes every message (the config key, or the admin API's field)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", stream.name):
        raise ConfigError(f"{at}.name: {stream.name!r} must be 1-128 letters, digits, '_', '-' "
                          "or '.'")
    parts = stream.table.split(".")
    if is_template(stream.table) or stream.dynamic_tables is not None:
        parts = _check_template(stream, at)
    if stream.table == "icefloe.dead_letters":
        raise ConfigError(f"{at}.table: 'icefloe.dead_letters' is icefloe's dead-letter "
                          "table; choose another name")
    if len(parts) != 2 or not all(_NAME_RE.fullmatch(p) for p in parts):
        raise ConfigError(f"{at}.table: {stream.table!r} must be 'namespace.table' in lower "
                          "case letters, digits and '_'")
    if not stream.columns and not (stream.schema is not None and stream.schema.subject):
        # (a schema registry subject's stream has its columns once its subject is read)
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
    check_expanded(stream, at)
    _check_key(stream, at)
    if stream.where is not None:
        try:
            check_where(stream.where, stream.columns)
        except ValueError as exc:
            raise ConfigError(f"{at}.where: sink {stream.name!r} (table {stream.table!r}): "
                              f"where {stream.where[:80]!r}: {exc}") from None
    if stream.partition not in PARTITIONS:
        raise ConfigError(f"{at}.partition: unknown partition {stream.partition!r} (expected "
                          f"one of {', '.join(PARTITIONS)}; it partitions the table by "
                          "_received_at)")
    if not 1 <= stream.kafka_partitions <= 10_000:
        raise ConfigError(f"{at}.kafka_partitions: {stream.kafka_partitions} is not 1-10000 "
                          "(the partitions Kafka producers see for this stream's topic)")
    check_layout(stream, at)
    _check_quota(stream, at)
    _check_bytes_payload(stream, at)


def _check_template(stream: StreamConfig, at: str) -> list[str]:
    """A table template (:mod:`icefloe.streams.dynamic_tables`) and its limits; returns
    what the plain-name check then sees (the namespace and a stand-in name)."""
    if not is_template(stream.table):
        raise ConfigError(f"{at}.dynamic_tables: table {stream.table!r} is not a template "
                          "(a {column} part); drop dynamic_tables or name the table by a "
                          "column, e.g. 'ns.events_{tenant_id}'")
    try:
        template = parse_template(stream.table, stream.columns)
        check_limits(stream.dynamic_tables or DEFAULT_LIMITS, template)
    except ValueError as exc:
        key = "dynamic_tables" if str(exc).startswith("max_") else "table"
        raise ConfigError(f"{at}.{key}: table template {stream.table!r}: {exc}") from None
    for key, used in (("primary_key", bool(stream.primary_key)),
                      ("unknown_fields", stream.unknown_fields == "evolve")):
        if used:  # not built for templates yet: refused rather than half-working
            raise ConfigError(f"{at}.{key}: a table template ({stream.table!r}) cannot be "
                              f"combined with {key} yet (upserts and schema evolution per "
                              "dynamic table are not built); use a plain table name")
    return [template.namespace, "t"]


def _check_bytes_payload(stream: StreamConfig, at: str) -> None:
    """``payload = "bytes"``: one plain ``binary`` column holds each entry; nothing may
    read inside an entry (no id field, key, route or mapping), since it is opaque."""
    if stream.payload != "bytes":
        return
    columns = stream.columns
    if len(columns) != 1 or columns[0].type != "binary" or columns[0].mapping is not None:
        raise ConfigError(f"{at}.columns: a payload = \"bytes\" stream has exactly one plain "
                          "column of type binary (it holds each entry's bytes), e.g. "
                          "columns = [{ name = \"entry\", type = \"binary\" }]")
    for key in ("event_id_field", "tombstone_field", "where"):
        if getattr(stream, key) is not None:
            raise ConfigError(f"{at}.{key}: a payload = \"bytes\" stream's entries are "
                              "opaque; nothing can be read from inside one")
    if stream.primary_key:
        raise ConfigError(f"{at}.primary_key: a payload = \"bytes\" stream's entries are "
                          "opaque; nothing can be read from inside one")


_QUOTA_MAX = 100_000


def _check_quota(stream: StreamConfig, at: str) -> None:
    """``evolve_quota`` bounds are whole numbers 0 (no bound) to 100,000, and only on a
    stream that evolves (``unknown_fields = "evolve"``): elsewhere no column is ever added,
    so the bounds would be accepted and mean nothing."""
    if stream.evolve_quota is None:
        return
    if stream.unknown_fields != "evolve":
        key = at.rsplit(": ", 1)[-1]  # the key path alone, when naming a second key
        raise ConfigError(f"{at}.evolve_quota: bounds the columns schema evolution adds, "
                          f"but {key}.unknown_fields is {stream.unknown_fields!r}, not "
                          "'evolve', so no column is ever added; set unknown_fields = "
                          "\"evolve\" or remove evolve_quota")
    for key in stream.evolve_quota.__struct_fields__:
        value = getattr(stream.evolve_quota, key)
        if isinstance(value, bool) or not isinstance(value, int) \
                or not 0 <= value <= _QUOTA_MAX:
            raise ConfigError(f"{at}.evolve_quota.{key}: {value!r:.24} must be a whole "
                              f"number of columns, 0 (no bound) to {_QUOTA_MAX:,}")


KEY_TYPES = ("string", "long", "int", "boolean", "timestamp", "date", "uuid", "time")
"""Column types a ``primary_key`` may use (and ``decimal(p,s)``): values that compare
exactly. ``float``/``double`` (rounding), ``json`` (text of a free-form value), ``binary``
and nested types are refused."""


def always_present(column: Column) -> bool:
    """A column that has a value for every event without being declared required: an
    envelope value (``from`` = id, datetime, body, headers), a ``template`` (an event whose
    template fails is dead-lettered, never stored without it) or a ``path`` with a
    ``default``. A null such a column still gives (a JSON null at the path) is
    dead-lettered by the upsert, as for any key."""
    return (column.source in ("id", "datetime", "body", "headers")
            or column.template is not None
            or (column.path is not None and column.default is not None))


def _check_key(stream: StreamConfig, at: str) -> None:
    """``primary_key`` names declared, required columns of exact types, once each, not the
    event id field; ``tombstone_field`` is a declared boolean column and needs a key.

    Why required: a row without a key value has no row to replace; the ingestor refuses an
    event missing a required field, and the collector dead-letters one whose mapping gave
    no value (:mod:`pipeline.iceberg.upsert`). Why not the event id: the dedup window drops
    a second event with a seen id, so every update of a key after the first would vanish.
    """
    columns = {c.name: c for c in stream.columns}
    key = at.rsplit(": ", 1)[-1]  # the key path alone, when naming a second key
    if stream.tombstone_field is not None and not stream.primary_key:
        raise ConfigError(f"{at}.tombstone_field: {stream.tombstone_field!r} deletes rows by "
                          f"key, but {key}.primary_key is not set")
    for i, name in enumerate(stream.primary_key):
        column = columns.get(name)
        if column is None:
            raise ConfigError(f"{at}.primary_key[{i}]: {name!r} is not a declared column of "
                              f"stream {stream.name!r}")
        if column.type not in KEY_TYPES and not column.type.startswith("decimal("):
            raise ConfigError(f"{at}.primary_key[{i}]: column {name!r} of stream "
                              f"{stream.name!r} has type {column.type!r}, which cannot be a "
                              f"key (use one of {', '.join(KEY_TYPES)} or decimal)")
        if not column.required and not always_present(column):
            raise ConfigError(f"{at}.primary_key[{i}]: column {name!r} of stream "
                              f"{stream.name!r} must be declared required = true (a key "
                              "cannot be null)")
        if name in stream.primary_key[:i]:
            raise ConfigError(f"{at}.primary_key[{i}]: column {name!r} is named twice")
        if name == stream.event_id_field:
            raise ConfigError(f"{at}.primary_key[{i}]: column {name!r} is also "
                              f"{key}.event_id_field: the dedup window would drop every "
                              "update of a key after the first; use another event id field")
    if stream.tombstone_field is not None:
        column = columns.get(stream.tombstone_field)
        if column is None or column.type != "boolean":
            raise ConfigError(f"{at}.tombstone_field: {stream.tombstone_field!r} must be a "
                              f"declared boolean column of stream {stream.name!r}")
        if stream.tombstone_field in stream.primary_key:
            raise ConfigError(f"{at}.tombstone_field: {stream.tombstone_field!r} is part of "
                              f"{key}.primary_key")


def _check_type(column: Column, at: str) -> None:
    """The column's type string parses (:mod:`icefloe.streams.typespec`), and a type beyond
    the original flat ones sits on a plain column: mappings (path, header, from, sql)
    convert values with the flat types' rules only (a ``from`` that gives a native type as
    it is, ``kafka_key`` as ``binary``, is the exception: :func:`gives_type`)."""
    try:
        parse_type(column.type)
    except BadType as exc:
        raise ConfigError(f"{at}.type: {exc} (column {column.name!r}, type "
                          f"{column.type!r})") from None
    if is_native(column.type) and column.mapping is not None and \
            not gives_type(column.source, column.type):
        raise ConfigError(f"{at}.type: type {column.type!r} (column {column.name!r}) applies to "
                          f"plain columns only, not to a {column.mapping} mapping; map the "
                          "value into a json column or declare the field as a plain column")
