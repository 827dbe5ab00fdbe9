"""Column mappings: where a stream column's value comes from when it is not a top-level field.

A column is *plain* (the event's top-level field of the same name) or *mapped*:

* ``path = "$.user.id"``: a JSON path into the event (keys and array indexes), with an
  optional ``default`` and ``raw`` (a string column takes any JSON value as its JSON text);
* ``header = "User-Agent"``: a request header (HTTP header, gRPC metadata key);
* ``from = "ip" | "body" | "datetime" | "id" | "headers"``: the client address, the raw
  event JSON, the receive time, the event id, all request headers as one JSON object
  (secrets left out: :data:`NEVER_STORED_HEADERS`);
* ``from = "kafka_key" | "kafka_headers" | "kafka_partition" | "kafka_timestamp" |
  "kafka_offset" | "kafka_topic"``: the Kafka record's metadata, for events that arrived
  through the Kafka produce listener (null for events that arrived over HTTP or gRPC);
* ``sql = "lower(url)"``: a SQL expression over the stream's other columns, in ``dialect``
  (spark, duckdb or postgres; transpiled to Spark SQL by sqlglot);
* ``template = "Body('a.b') + '-' + Ip()"``: a Jsonnet template with Keboola's globals,
  evaluated by the collector (:mod:`icefloe.streams.templates`; the ingestor keeps the
  event's JSON text in the column's field for it).

Why the work is split by where the data is: ``path`` and ``body`` read the event, which the
ingestor parses anyway, so they are extracted and type-checked there and a bad value is a
400 for the producer (index, column, reason), never a silent null or a dead letter later.
``ip``, ``header`` and the ``kafka_*`` sources come from the request (or the Kafka record):
the ingestor keeps exactly the ones mappings use in the record envelope's meta, and the
pipeline's decode (in the Spark workers) turns them into columns, as it does ``datetime``
and ``id`` from the envelope. ``sql`` runs on
Spark over the decoded columns, calling only allow-listed functions
(:mod:`icefloe.streams.sql_functions`). This module only
parses and validates; :mod:`ingestor.mappings` and :mod:`pipeline.load.mapped` evaluate.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, Any

import msgspec
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from icefloe.errors import ConfigError
from icefloe.streams.dialects import DIALECTS
from icefloe.streams.divergent import refuse_divergent
from icefloe.streams.sql_functions import check_functions, check_sizes
from icefloe.streams.sql_size import check_value_bound
from icefloe.streams.templates import check_template
from icefloe.streams.types import convert_value

if TYPE_CHECKING:
    from icefloe.streams.model import Column, StreamConfig

KAFKA_SOURCES = ("kafka_key", "kafka_headers", "kafka_partition", "kafka_timestamp",
                 "kafka_offset", "kafka_topic")
"""``from`` values read from the Kafka record an event arrived in (:data:`META_KAFKA`)."""
MAPPING_FROM = ("ip", "body", "datetime", "id", "headers", *KAFKA_SOURCES)
"""Values of ``from``: request or envelope data rather than event fields."""
SQL_DIALECTS = DIALECTS
ENVELOPE_COLUMNS = ("_event_id", "_received_at", "_sequence")
"""Envelope columns a ``sql`` mapping may read besides the stream's columns."""
META_IP = "ip"
META_HEADERS = "h"
META_ALL_HEADERS = "hs"
"""Keys of the envelope meta object: ``{"ip": "1.2.3.4", "h": {"user-agent": "..."},
"hs": "{\"accept\":\"*/*\",...}"}`` (``hs``: the JSON text a ``from = "headers"`` column
stores); the ingestor writes it (:mod:`ingestor.mappings`), the pipeline's decode reads it."""
META_KAFKA = "kf"
"""Key of the Kafka record's metadata in the envelope meta object, set only for events that
arrived through the Kafka listener: ``{"t": topic, "p": partition, "o": offset, "ts":
producer timestamp (ms since the epoch), "k": the key in base64 or null, "hs": the headers
as JSON text}`` (:data:`KAFKA_META_KEYS`; written by :func:`ingestor.mappings.kafka_meta`)."""
KAFKA_META_KEYS = {"kafka_topic": "t", "kafka_partition": "p", "kafka_offset": "o",
                   "kafka_timestamp": "ts", "kafka_key": "k", "kafka_headers": "hs"}
"""Each ``kafka_*`` source → its key inside the :data:`META_KAFKA` object."""
NEVER_STORED_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie",
                                  "set-cookie", "x-api-key", "api-key", "x-amz-security-token"})
SECRET_HEADER_WORDS = ("auth", "token", "secret", "password", "credential", "session",
                       "cookie", "api-key", "apikey", "signature")
"""A ``from = "headers"`` column leaves out these headers and every header whose name
contains one of these words: credentials are never stored by a catch-all column (a
``header = "..."`` mapping stores exactly the header it names, by choice)."""


def stored_header(name: str) -> bool:
    """Whether a ``from = "headers"`` column keeps header ``name`` (lower case)."""
    return name not in NEVER_STORED_HEADERS and not any(
        word in name for word in SECRET_HEADER_WORDS)

_FROM_TYPES = {"ip": ("string",), "body": ("string", "json"), "id": ("string",),
               "headers": ("json", "string"),
               "datetime": ("timestamp", "long", "date"),
               "kafka_key": ("string", "binary"), "kafka_headers": ("json", "string"),
               "kafka_partition": ("int", "long"),
               "kafka_timestamp": ("timestamp", "long", "date"),
               "kafka_offset": ("long",), "kafka_topic": ("string",)}


def gives_type(source: str | None, kind: str) -> bool:
    """Whether ``from = source`` gives a column of type ``kind`` (None: not a ``from``)."""
    return source is not None and kind in _FROM_TYPES.get(source, ())


_KEY_STEP = re.compile(r"\.([A-Za-z_$][\w$-]*)")
_QUOTED_STEP = re.compile(r"\[(?:'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\")\]")
_INDEX_STEP = re.compile(r"\[(\d{1,9})\]")
_HEADER = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
_PER_ROW_ERRORS = (exp.AggFunc, exp.Window, exp.Subquery, exp.Select, exp.Star)

Step = str | int
"""A path step: an object key or an array index."""


def parse_path(text: str) -> tuple[Step, ...]:
    """``$.a.b[0]['c d']`` → ``("a", "b", 0, "c d")``; the first step must be a key (events
    are objects). Wildcards, slices and filters are refused: a column holds one value."""
    if not text.startswith("$"):
        raise ValueError("a JSON path starts with '$' (e.g. '$.user.id')")
    steps: list[Step] = []
    pos = 1
    while pos < len(text):
        for pattern in (_KEY_STEP, _QUOTED_STEP, _INDEX_STEP):
            match = pattern.match(text, pos)
            if match:
                break
        else:
            raise ValueError(f"unsupported syntax at offset {pos} ({text[pos:pos + 12]!r}); "
                             "use .key, ['key'] or [index] steps (no wildcards or filters)")
        if pattern is _INDEX_STEP:
            steps.append(int(match.group(1)))
        elif pattern is _QUOTED_STEP:
            quoted = match.group(1) if match.group(1) is not None else match.group(2)
            steps.append(re.sub(r"\\(.)", r"\1", quoted))
        else:
            steps.append(match.group(1))
        pos = match.end()
    if not steps:
        raise ValueError("the path '$' is the whole event; use from = \"body\" for that")
    if not isinstance(steps[0], str):
        raise ValueError("the first step must be a key: an event is a JSON object")
    return tuple(steps)


def place_value(event: dict[str, Any], column: Column, value: Any) -> None:
    """Put ``value`` where ``column`` reads it: its own top-level field, or the nested place
    its ``path`` names (objects and lists created as needed). Columns whose value does not
    come from the event (``from``, ``header``, ``sql``) are left alone. Used to generate
    sample events (``icefloe demo``, the ``up`` curl example)."""
    if column.mapping is None:
        event[column.name] = value
        return
    if column.path is None:
        return
    steps = parse_path(column.path)
    node: Any = event
    for step, after in itertools.pairwise(steps):
        container = dict if isinstance(after, str) else list
        if isinstance(step, int):
            node.extend([None] * (step + 1 - len(node)))
            child = node[step]
        else:
            child = node.get(step)
        if not isinstance(child, container):
            child = node[step] = container()
        node = child
    last = steps[-1]
    if isinstance(last, int):
        node.extend([None] * (last + 1 - len(node)))
    node[last] = value


def sql_expression(column: Column) -> exp.Expr:
    """The parsed ``sql`` of ``column`` in its dialect (one per-row scalar expression)."""
    assert column.sql is not None
    try:
        parsed = sqlglot.parse(column.sql, read=column.dialect)
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        raise ValueError(f"invalid {column.dialect} SQL: {first.get('description', exc)}"
                         ) from None
    if len(parsed) != 1 or parsed[0] is None:
        raise ValueError("give exactly one SQL expression (no ';')")
    tree = parsed[0]
    if isinstance(tree, exp.Select) or not isinstance(tree, exp.Expression) or \
            isinstance(tree, exp.Command):
        raise ValueError("give a SQL expression (e.g. lower(url)), not a statement")
    bad = tree.find(*_PER_ROW_ERRORS)
    if bad is not None:
        what = {exp.AggFunc: "an aggregate", exp.Window: "a window function",
                exp.Star: "'*'"}.get(next((k for k in _PER_ROW_ERRORS if isinstance(bad, k)),
                                          exp.Select), "a subquery")
        raise ValueError(f"{what} ({bad.sql(column.dialect)[:60]}) is not allowed: a "
                         "mapping computes one value per event")
    refuse_divergent(tree, column.dialect)  # Spark evaluates it: same rules, or refused
    spark = _as_spark(tree)
    check_functions(spark)
    check_sizes(spark)
    check_value_bound(spark)
    return tree


def _as_spark(tree: exp.Expr) -> exp.Expr:
    """``tree`` as Spark will run it: transpiled, then read back as Spark SQL (the function
    allow-list is checked on what Spark resolves, whatever dialect the mapping is in)."""
    try:
        return sqlglot.parse_one(tree.sql(dialect="spark"), read="spark")
    except ParseError as exc:
        raise ValueError(f"the expression does not transpile to Spark SQL: {exc}") from None


def sql_references(tree: exp.Expr) -> list[str]:
    """The column names an expression reads (unqualified; a qualified one is an error)."""
    names: list[str] = []
    for col in tree.find_all(exp.Column):
        if col.table:
            raise ValueError(f"column {col.sql()} is qualified: refer to the stream's "
                             "columns by name only")
        if col.name not in names:
            names.append(col.name)
    return names


def spark_sql(column: Column, rename: dict[str, str]) -> str:
    """``column.sql`` transpiled to Spark SQL with each column reference renamed (the
    pipeline's wide frame names stream columns ``s<i>__<name>``)."""
    tree = sql_expression(column).copy()
    for col in list(tree.find_all(exp.Column)):
        col.replace(exp.column(exp.to_identifier(rename.get(col.name, col.name),
                                                 quoted=True)))
    return tree.sql(dialect="spark")


def _check_default(column: Column) -> None:
    if column.default is None:
        return
    if column.mapping not in ("path", "header"):
        raise ValueError("'default' applies only to path and header mappings")
    if column.required:
        raise ValueError("a required column cannot have a default (drop one of them)")
    try:
        convert_value(column.type, column.default, raw=column.raw)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ValueError(f"default {column.default!r} is not a valid {column.type}: "
                         f"{exc}") from None


# one branch per mapping kind: ruff's caps (noqa below)
def _check_one(column: Column, columns: dict[str, Column]) -> None:  # noqa: C901, PLR0912
    kinds = [k for k, v in (("path", column.path), ("header", column.header),
                            ("from", column.source), ("sql", column.sql),
                            ("template", column.template)) if v is not None]
    if len(kinds) > 1:
        raise ValueError(f"a column takes at most one mapping, this one has {' and '.join(kinds)}")
    if column.raw and (column.path is None or column.type != "string"):
        raise ValueError("'raw' applies only to a path mapping into a string column")
    if column.sql is None and column.dialect != "spark":
        raise ValueError("'dialect' applies only to a sql mapping")
    _check_default(column)
    if column.path is not None:
        parse_path(column.path)
    elif column.header is not None:
        if not _HEADER.fullmatch(column.header):
            raise ValueError(f"{column.header!r} is not a header name")
        if column.type != "string":
            raise ValueError("a header mapping gives text: use type = \"string\"")
    elif column.source is not None:
        allowed = _FROM_TYPES.get(column.source)
        if allowed is None:
            raise ValueError(f"unknown from = {column.source!r} (expected one of "
                             f"{', '.join(MAPPING_FROM)})")
        if column.type not in allowed:
            raise ValueError(f"from = {column.source!r} gives {' or '.join(allowed)}, not "
                             f"{column.type}")
        if column.required and column.source in KAFKA_SOURCES:
            raise ValueError(f"from = {column.source!r} cannot be required: only events "
                             "that arrive through the Kafka listener have it (it is null "
                             "for events sent over HTTP or gRPC); drop 'required'")
        if column.required and column.source != "ip":
            raise ValueError(f"from = {column.source!r} is always present; drop 'required'")
    elif column.template is not None:
        if column.type not in ("string", "json"):
            raise ValueError(f"a template gives JSON text: use type = \"string\" or "
                             f"\"json\", not {column.type}")
        if column.required:
            raise ValueError("a template column cannot be required (its value is computed "
                             "after the event was accepted; a failing one dead-letters the "
                             "event)")
        check_template(column.template)
    elif column.sql is not None:
        if column.dialect not in SQL_DIALECTS:
            raise ValueError(f"unknown dialect {column.dialect!r} (expected one of "
                             f"{', '.join(SQL_DIALECTS)})")
        if column.required:
            raise ValueError("a sql column cannot be required (its value is computed after "
                             "the event was accepted); use coalesce() for a fallback")
        for name in sql_references(sql_expression(column)):
            ref = columns.get(name)
            if ref is None and name not in ENVELOPE_COLUMNS:
                raise ValueError(f"unknown column {name!r}: a sql mapping reads the stream's "
                                 f"columns ({', '.join(columns)}) and "
                                 f"{', '.join(ENVELOPE_COLUMNS)}")
            if ref is not None and ref.sql is not None:
                raise ValueError(f"column {name!r} is itself a sql mapping; inline its "
                                 "expression instead")


def check_mappings(stream: StreamConfig, at: str) -> None:
    """Every mapping of ``stream`` is well formed (``at`` names the stream in errors)."""
    columns = {c.name: c for c in stream.columns}
    for i, column in enumerate(stream.columns):
        try:
            _check_one(column, columns)
        except ValueError as exc:
            raise ConfigError(f"{at}.columns[{i}] ({column.name}): {exc}") from None
    for i, column in enumerate(stream.columns):
        if column.path is None:
            continue
        root = parse_path(column.path)[0]
        clash = columns.get(str(root))
        if clash is not None and clash.mapping is None and clash.type != "json":
            raise ConfigError(
                f"{at}.columns[{i}] ({column.name}): path {column.path} reads inside field "
                f"{root!r}, which is also declared as a {clash.type} column; declare it as "
                "json or remove it")
    if stream.event_id_field is not None:
        target = columns.get(stream.event_id_field)
        if target is not None and target.mapping not in (None, "path"):
            raise ConfigError(f"{at}.event_id_field: {stream.event_id_field!r} is a "
                              f"{target.mapping} mapping; the event id must come from the "
                              "event (a plain or path column)")
