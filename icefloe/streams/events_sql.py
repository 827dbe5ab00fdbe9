"""Streams declared as SQL: a ``models/SCHEMA/NAME.sql`` file headed ``-- @kind: events``.

OndatraSQL declares its event tables this way, and its users bring such files along::

    -- @kind: events
    event_name VARCHAR NOT NULL,
    page_url VARCHAR,
    user_id VARCHAR,
    received_at TIMESTAMPTZ

The file is a ``[[streams]]`` entry written in SQL: it declares the stream ``SCHEMA.NAME``
writing the table ``SCHEMA.NAME`` (``POST /collect/SCHEMA/NAME`` reaches it), one column
per line of the list. The list is parsed by sqlglot (DuckDB dialect, as the source system
writes it); each SQL type maps to one icefloe column type (:data:`SQL_TYPES`), ``NOT NULL``
means required, and whatever icefloe would not honour — a type it lacks, a length, a
``DEFAULT``, a key or check constraint, an unknown directive — is refused by name, never
dropped. Why here, in the core: the ingestor validates against these streams and the
collector writes their tables, and neither may import the pipeline's model reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from icefloe.errors import ConfigError
from icefloe.streams.check import validate_stream
from icefloe.streams.model import COLUMN_TYPES, Column, StreamConfig

EVENTS_KIND = "events"
SQL_TYPES: dict[str, str] = {
    "VARCHAR": "string", "CHAR": "string", "TEXT": "string", "NVARCHAR": "string",
    "NCHAR": "string", "BIGINT": "long", "INT": "int", "FLOAT": "float", "DOUBLE": "double",
    "BOOLEAN": "boolean", "TIMESTAMPTZ": "timestamp", "DATE": "date", "JSON": "json",
}
"""sqlglot's type name (DuckDB spellings: ``VARCHAR``/``STRING`` are TEXT, ``INTEGER``/``INT4``
INT, ``INT8``/``LONG`` BIGINT, ``REAL``/``FLOAT4`` FLOAT, ``FLOAT8`` DOUBLE, ``BOOL`` BOOLEAN,
``TIMESTAMP WITH TIME ZONE`` TIMESTAMPTZ) → icefloe column type. Everything else is refused
by name: icefloe has no column type that keeps its meaning (SMALLINT, HUGEINT, DECIMAL,
UUID, BLOB, TIME, INTERVAL, lists, structs, maps, and a plain TIMESTAMP: icefloe's
timestamps are instants, stored in UTC, so a zone-less one must say TIMESTAMPTZ)."""
SUPPORTED = ("VARCHAR (TEXT, CHAR), BIGINT, INTEGER, FLOAT (REAL), DOUBLE, BOOLEAN, "
             "TIMESTAMPTZ, DATE, JSON")
_DIRECTIVES = ("kind", "description")
_HEADER = re.compile(r"^--\s*@([A-Za-z_]+)\s*:\s*(.*?)\s*$")
_DIRECTIVE = re.compile(r"^\s*--\s*@(\S*)")
_KIND = re.compile(r"^\s*--\s*@kind\s*:\s*events\s*$", re.I | re.M)

assert set(SQL_TYPES.values()) <= set(COLUMN_TYPES)


@dataclass(frozen=True)
class EventsFile:
    """A stream declared by a file, and the file (for messages naming both sides)."""

    stream: StreamConfig
    path: Path
    label: str  # as messages name it: models/SCHEMA/NAME.sql
    description: str = ""


def is_events_file(text: str) -> bool:
    """Whether a model file's header says ``-- @kind: events`` (a stream, not a model)."""
    header = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("--"):
            break
        header.append(stripped)
    return _KIND.search("\n".join(header)) is not None


def with_events_files(streams: tuple[StreamConfig, ...], folder: Path, where: str
                      ) -> tuple[StreamConfig, ...]:
    """``streams`` (the config's ``[[streams]]``) and then the events files' streams.

    An events file is one more stream entry, not an override: a name or a table that
    ``[[streams]]`` also declares is refused, naming both, since neither can be meant to
    win silently. (Afterwards they are the config's streams like any other: the admin API
    seeds its registry from them, and a registry, once written, governs.)
    """
    files = load_events_files(folder)
    names = {s.name: i for i, s in enumerate(streams)}
    tables = {s.table: i for i, s in enumerate(streams)}
    for declared in files:
        stream = declared.stream
        index = names.get(stream.name, tables.get(stream.table))
        if index is not None:
            other = streams[index]
            raise ConfigError(
                f"{where}: streams[{index}] (stream {other.name!r}, table {other.table}) and "
                f"{declared.label} (stream {stream.name!r}, table {stream.table}) both "
                "declare it; keep one: delete the [[streams]] entry or the events file")
    return streams + tuple(f.stream for f in files)


def load_events_files(folder: Path) -> list[EventsFile]:
    """Every events file among ``folder``'s ``SCHEMA/NAME.sql`` files (none when the folder
    does not exist: a project without models has no such streams)."""
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.rglob("*.sql")):
        parts = path.relative_to(folder).parts
        if any(part.startswith(".") for part in parts):
            continue
        text = path.read_text(encoding="utf-8")
        if not is_events_file(text):
            continue
        label = "/".join((folder.name, *parts))
        if len(parts) != 2:
            raise ConfigError(f"{label}: an events file sits in a schema folder, "
                              "models/SCHEMA/NAME.sql (its table is SCHEMA.NAME)")
        found.append(parse_events_file(text, parts[0], path.stem, path, label))
    return found


def parse_events_file(text: str, schema: str, name: str, path: Path,
                      label: str | None = None) -> EventsFile:
    """The stream of one events file; a :class:`ConfigError` naming the file otherwise."""
    label = label or str(path)
    header, body = _split(text)
    description = _directives(label, header)
    table = f"{schema}.{name}"
    columns = parse_column_list(body, label)
    stream = StreamConfig(name=table, table=table, columns=columns)
    validate_stream(stream, label)
    return EventsFile(stream, path, label, description)


def parse_column_list(body: str, label: str) -> tuple[Column, ...]:
    """``name TYPE [NOT NULL], ...`` as icefloe columns (see the module docstring)."""
    import sqlglot  # lazy: sqlglot
    from sqlglot import exp  # lazy: sqlglot
    from sqlglot.errors import ParseError  # lazy: sqlglot

    text = body.strip().rstrip(";").strip()
    if not text:
        raise ConfigError(f"{label}: an events file lists its columns: name TYPE [NOT NULL], "
                          "...")
    try:
        tree = sqlglot.parse_one(f"CREATE TABLE t (\n{text}\n)", read="duckdb")
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        reason = str(first.get("description") or exc).splitlines()[0]
        line = first.get("line")
        where = f" (line {line - 1} of the column list)" if isinstance(line, int) else ""
        raise ConfigError(f"{label}: the column list does not parse{where}: {reason}") from None
    schema = tree.this if isinstance(tree, exp.Create) else None
    if not isinstance(schema, exp.Schema):
        raise ConfigError(f"{label}: expected a column list: name TYPE [NOT NULL], ...")
    columns = []
    for item in schema.expressions:
        if isinstance(item, exp.Column | exp.Identifier):
            raise ConfigError(f"{label}: column {item.name!r} needs a type")
        if not isinstance(item, exp.ColumnDef):
            raise ConfigError(f"{label}: {item.sql(dialect='duckdb')!r} is not a column; an "
                              "events file lists columns only (no table constraints)")
        columns.append(_column(item, label))
    return tuple(columns)


def _column(item: object, label: str) -> Column:
    from sqlglot import exp  # lazy: sqlglot

    assert isinstance(item, exp.ColumnDef)
    name = item.name
    kind = item.args.get("kind")
    if not isinstance(kind, exp.DataType):
        raise ConfigError(f"{label}: column {name!r} needs a type")
    written = kind.sql(dialect="duckdb")
    ours = SQL_TYPES.get(kind.this.name)
    if ours is None:
        hint = "; write TIMESTAMPTZ (icefloe stores instants, in UTC)" \
            if kind.this.name == "TIMESTAMPNTZ" else ""
        raise ConfigError(f"{label}: column {name!r}: type {written} has no icefloe column "
                          f"type{hint} (supported: {SUPPORTED})")
    if kind.expressions:
        raise ConfigError(f"{label}: column {name!r}: {written}: icefloe does not enforce a "
                          f"length or precision; write {kind.this.name} alone")
    required = False
    for constraint in item.args.get("constraints") or []:
        what = constraint.args.get("kind")
        if isinstance(what, exp.NotNullColumnConstraint):
            required = not what.args.get("allow_null")
            continue
        raise ConfigError(f"{label}: column {name!r}: {constraint.sql(dialect='duckdb')} is "
                          "not supported in an events file (only NOT NULL, which means "
                          "required)")
    return Column(name=name, type=ours, required=required)


def _split(text: str) -> tuple[list[str], str]:
    lines = text.splitlines()
    for index, line in enumerate(lines):
        stripped = line.strip()
        if stripped and not stripped.startswith("--"):
            return [raw.strip() for raw in lines[:index] if raw.strip()], \
                "\n".join(lines[index:])
    return [raw.strip() for raw in lines if raw.strip()], ""


def _directives(label: str, header: list[str]) -> str:
    """Check the header's ``-- @key: value`` lines; returns the description."""
    description = ""
    for line in header:
        match = _HEADER.match(line)
        if match is None:
            directive = _DIRECTIVE.match(line)
            if directive is not None:
                raise ConfigError(f"{label}: directive `-- @{directive.group(1)}` is not "
                                  "understood: write `-- @key: value`")
            continue
        key = match.group(1).lower()
        if key not in _DIRECTIVES:
            raise ConfigError(f"{label}: directive `-- @{match.group(1)}` is not supported in "
                              f"an events file (known: {', '.join('@' + k for k in _DIRECTIVES)})")
        if key == "description":
            description = match.group(2)
    return description
