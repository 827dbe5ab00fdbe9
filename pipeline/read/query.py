"""``icefloe query``: Spark SQL over the Iceberg tables, each pinned to one snapshot.

Why rewrite the SQL: Spark here has no Iceberg catalog (no JVM packages), so ``web.pageviews``
means nothing to it. sqlglot parses the query once, finds every table reference (skipping
CTE names), and each becomes a temp view over :mod:`pipeline.read.iceberg_source` pinned to one
snapshot — the current one, or the one current at ``--as-of``. Every reference to a table
reads that same snapshot, so a self-join or a ``count(*)`` next to a ``sum`` agree.

Names resolve in this order: ``namespace.table`` as written; a bare name that is a stream
(``pageviews`` → its table); a bare name that is the table part of exactly one stream's
table. A time-travel clause after a reference pins that one reference (it wins over
``--as-of``): DuckLake's ``AT (VERSION => n)`` reads catalog version ``n``, one moment of
every table (:mod:`pipeline.read.versions`); Spark's ``FOR VERSION AS OF id`` reads snapshot
``id`` of that table; ``AT (TIMESTAMP => t)`` and ``FOR TIMESTAMP AS OF t`` the state at
``t``. The same table may then be read at two snapshots in one query (a before/after
comparison).
Only read-only queries run (``SELECT``, set operations, ``WITH``); anything else is refused
before Spark starts, and so is any clause or construct the rewrite would drop or change
(:func:`check_clauses`, :func:`spark_sql`): an error naming it beats a wrong answer.

The query is read in a declared dialect (``spark`` by default, ``duckdb`` for ``icefloe sql``,
or ``postgres``: :data:`icefloe.streams.dialects.DIALECTS`). Spark runs it transpiled by
sqlglot; a construct Spark would answer by its own rules (``substring(s, 0, 2)``, ...:
:mod:`icefloe.streams.divergent`) keeps Spark from answering it. A DuckDB-dialect query
is also kept as DuckDB SQL (:attr:`Plan.native`), which the embedded engine runs as
written.

``uuid`` columns read as their canonical text (``8f0c…-…``, lower case) on every engine:
Spark's reader hands them over as 16 bytes, which a ``WHERE uid = '…'`` would compare with
the string's UTF-8 bytes and never match, while DuckDB reads them as its ``UUID``. A string
literal compared with a uuid column is rewritten to the canonical form first
(:func:`normalize_uuid_literals`: any case, with or without dashes or braces, as ingest
accepts them), and one that is no uuid is an error naming it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, overload

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, UnsupportedError

from icefloe.config import Config
from icefloe.errors import CatalogError, IcefloeError
from icefloe.streams.dialects import check_dialect as known
from icefloe.streams.dialects import sql_types
from icefloe.streams.divergent import Divergent, refuse_divergent
from pipeline.read.local_table import LocalTable, Unusual
from pipeline.read.tables import as_pyiceberg, load_table_to_query, resolve_snapshot
from pipeline.read.versions import (
    EXPIRY,
    CatalogVersions,
    at_version,
    claimed_version,
    complete_snapshot,
    expired_before,
    refuse_intermediate,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession
    from sqlglot import exp

    from pipeline.read.local_table import LocalTable
    from pipeline.read.versions import CatalogVersions

DEAD_LETTERS = "icefloe.dead_letters"


class QueryError(IcefloeError):
    """The query cannot run as written (parse error, unknown table, not read-only, ...)."""


@dataclass(frozen=True)
class AsOf:
    """Where to read a table: a snapshot id (``--as-of``, ``FOR VERSION AS OF``), a catalog
    version (``AT (VERSION => n)``, :mod:`pipeline.read.versions`), or a point in time (ms
    since the epoch). ``spelled``: the clause as written, for errors."""

    snapshot_id: int | None = None
    timestamp_ms: int | None = None
    version: int | None = None
    spelled: str | None = None

    @overload
    @classmethod
    def parse(cls, text: str) -> AsOf: ...

    @overload
    @classmethod
    def parse(cls, text: None) -> None: ...

    @overload
    @classmethod
    def parse(cls, text: str | None) -> AsOf | None: ...

    @classmethod
    def parse(cls, text: str | None) -> AsOf | None:
        """Digits are a snapshot id; anything else must be an ISO 8601 time (UTC if naive)."""
        if text is None:
            return None
        text = text.strip()
        if text.isdigit():
            return cls(snapshot_id=int(text))
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise QueryError(f"--as-of {text!r}: give a snapshot id (digits, see `icefloe "
                             "tables history`) or a time such as 2026-11-23T17:00:00Z") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        return cls(timestamp_ms=int(when.timestamp() * 1000))


@dataclass(frozen=True)
class Plan:
    """The rewritten SQL and, per table, the view and snapshot it reads."""

    sql: str
    tables: dict[str, str]  # identifier -> view name
    snapshots: dict[str, int | None]  # identifier -> snapshot id (None: empty table)
    # Keys of ``tables`` that are not plain identifiers (a reference with its own
    # ``FOR VERSION/TIMESTAMP AS OF``: ``web.t@<snapshot>``) -> the identifier they read.
    identifiers: dict[str, str] = field(default_factory=dict)
    # The tables as loaded to pin them (identifier -> table; a plain local one without
    # pyiceberg, see pipeline.read.local_table), so the embedded engine plans their files
    # without loading them again; Spark loads its own.
    loaded: dict[str, Table | LocalTable] = field(default_factory=dict, compare=False, repr=False)
    # Keys of ``tables`` -> their top-level ``uuid`` columns at the pinned snapshot (each
    # engine shows them as text, see the module docstring).
    uuids: dict[str, frozenset[str]] = field(default_factory=dict)
    # The dialect the query was written in; for ``duckdb``, the statement as DuckDB SQL
    # over the same views (what the embedded engine runs), and, when Spark would answer it
    # by other rules, why (then ``sql`` is empty and :meth:`spark` raises it).
    dialect: str = "spark"
    native: str | None = None
    spark_refusal: str | None = None

    def spark(self) -> str:
        """The Spark SQL to run, or a :class:`QueryError` naming what Spark would answer
        differently from the query's dialect."""
        if self.spark_refusal is not None:
            raise QueryError(self.spark_refusal)
        return self.sql


def check_dialect(dialect: str) -> str:
    """The dialect, lower-cased, or a :class:`QueryError` listing the ones icefloe reads."""
    try:
        return known(dialect)
    except ValueError as exc:
        raise QueryError(str(exc)) from None


def parse(sql: str, dialect: str = "spark") -> exp.Expr:
    """One read-only statement in ``dialect``, or a one-line :class:`QueryError`."""
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f" (line {first.get('line')}, column {first.get('col')})" if first else ""
        reason = str(first.get("description") or exc).splitlines()[0]
        raise QueryError(f"SQL does not parse as {dialect}{where}: {reason}") from None
    if len(statements) != 1:
        raise QueryError(f"give exactly one SQL statement (got {len(statements)})")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise QueryError(f"icefloe query runs read-only queries (SELECT, WITH, UNION ...); "
                         f"this is a {tree.key.upper()} statement")
    return tree


def resolve_name(table: exp.Table, config: Config) -> str:
    """``namespace.table`` for a reference, by the rules in the module docstring."""
    if table.catalog:
        raise QueryError(f"{table.sql(dialect='spark')}: use namespace.table, without a "
                         "catalog name")
    if table.db:
        return f"{table.db}.{table.name}"
    name = table.name
    stream = config.stream(name)
    if stream is not None:
        return stream.table
    matches = sorted({s.table for s in config.streams if s.table_name == name})
    if len(matches) == 1:
        return matches[0]
    known = sorted({s.table for s in config.streams} | {DEAD_LETTERS})
    if matches:
        raise QueryError(f"table {name!r} is ambiguous: {', '.join(matches)}; qualify it")
    raise QueryError(f"unknown table {name!r}: use namespace.table or a stream name "
                     f"(known tables: {', '.join(known)})")


def plan(sql: str, config: Config, as_of: AsOf | None = None, dialect: str = "spark"
         ) -> Plan:
    """Parse ``sql`` (in ``dialect``), resolve and pin every table; the rewritten SQL reads
    only temp views."""
    dialect = check_dialect(dialect)
    tree = parse(sql, dialect)
    ctes = cte_names(tree, dialect)
    named = [t for t in tree.find_all(exp.Table) if t.name]
    for ref in named:
        check_clauses(ref, ctes)
    references = [t for t in named if not is_cte(t, ctes)]
    if not references:
        return _finish(tree, dialect, {}, Plan("", {}, {}))
    views: dict[str, str] = {}
    snapshots: dict[str, int | None] = {}
    identifiers: dict[str, str] = {}
    loaded: dict[str, Table | LocalTable] = {}
    travels: list[tuple[exp.Table, str, AsOf | None]] = []
    for ref in references:
        identifier = resolve_name(ref, config)
        travels.append((ref, identifier, time_travel(ref)))
        if identifier not in loaded:
            loaded[identifier] = load_table_to_query(config.catalog, identifier)
    versions = catalog_versions(config, loaded.values(), [c for _, _, c in travels]
                                + [as_of])
    for ref, identifier, clause in travels:
        key = identifier
        if clause is not None:
            key = f"{identifier}@{pin(loaded[identifier], identifier, clause, versions)}"
            identifiers[key] = identifier
        if key not in views:
            snapshots[key] = pin(loaded[identifier], identifier, clause or as_of, versions)
            views[key] = f"__icefloe_{len(views)}_{identifier.replace('.', '_')}"
        point_at(ref, views[key])
    types = {key: column_types_at(loaded[identifiers.get(key, key)], snapshots[key])
             for key in views}
    uuids = {key: frozenset(n for n, kind in columns.items() if kind == "uuid")
             for key, columns in types.items()}
    normalize_uuid_literals(tree, types.values())

    schema = {views[key]: sql_types(columns) for key, columns in types.items()}
    return _finish(tree, dialect, schema, Plan(
        "", views, snapshots, identifiers, loaded,
        {key: names for key, names in uuids.items() if names}))


def catalog_versions(config: Config, tables: Iterable[Table | LocalTable],
                     clauses: Iterable[AsOf | None]) -> CatalogVersions | None:
    """What the query's tables (and the version counter) say about catalog versions, when
    a clause reads one (None otherwise: nothing to read)."""
    if not any(c is not None and c.version is not None for c in clauses):
        return None

    return CatalogVersions(list(tables), claimed_version(config))


def _finish(tree: exp.Expr, dialect: str, schema: Mapping[str, Mapping[str, str]],
            partial: Plan) -> Plan:
    """``partial`` with the rewritten statement as Spark SQL, and for a DuckDB-dialect
    query also as DuckDB SQL: there a construct Spark would answer differently is kept as
    the reason Spark may not answer (the embedded engine still runs it as written); in any
    other dialect it is refused now."""
    if dialect != "duckdb":
        return dataclasses.replace(partial, sql=spark_sql(tree, dialect, schema),
                                   dialect=dialect)
    try:
        text, refusal = spark_sql(tree, dialect, schema), None
    except QueryError as exc:
        text, refusal = "", f"{exc} (run it with --engine duckdb, which answers by " \
                            "DuckDB's rules)"
    return dataclasses.replace(partial, sql=text, dialect=dialect, spark_refusal=refusal,
                               native=tree.sql(dialect="duckdb"))


def column_types_at(table: Table | LocalTable, snapshot_id: int | None) -> dict[str, str]:
    """Top-level column name -> Iceberg type name (``uuid``, ``long``, ``list<...>``) in
    the schema a scan of ``snapshot_id`` projects."""
    if isinstance(table, LocalTable):
        try:
            return {f.name: f.field_type for f in table.schema_at(snapshot_id).fields}
        except Unusual:
            table = as_pyiceberg(table)
    schema = table.scan(snapshot_id=snapshot_id).projection()
    return {f.name: str(f.field_type) for f in schema.fields}


def normalize_uuid_literals(tree: exp.Expr,
                            tables: Iterable[Mapping[str, str]]) -> None:
    """Write every string literal compared with a uuid column (``=``, ``<>``, ``<``...,
    ``IN``, ``BETWEEN``) in the canonical form both engines read a uuid as.

    A column counts as uuid when every table of the query that has a column of that name
    (case-insensitive) has it as uuid; a literal that is no uuid is a :class:`QueryError`.
    """
    kinds: dict[str, set[str]] = {}
    for columns in tables:
        for name, kind in columns.items():
            kinds.setdefault(name.lower(), set()).add(kind)
    uuid_names = {name for name, found in kinds.items() if found == {"uuid"}}
    if not uuid_names:
        return
    for node in list(tree.walk()):
        if isinstance(node, exp.EQ | exp.NEQ | exp.NullSafeEQ | exp.NullSafeNEQ | exp.GT
                      | exp.GTE | exp.LT | exp.LTE):
            pairs = [(node.this, node.expression), (node.expression, node.this)]
        elif isinstance(node, exp.In):
            pairs = [(node.this, value) for value in node.expressions]
        elif isinstance(node, exp.Between):
            pairs = [(node.this, node.args["low"]), (node.this, node.args["high"])]
        else:
            continue
        for column, value in pairs:
            if isinstance(column, exp.Column) and column.name.lower() in uuid_names and \
                    isinstance(value, exp.Literal) and value.is_string:
                value.replace(exp.Literal.string(_canonical_uuid(value.this, column.name)))


def _canonical_uuid(text: str, column: str) -> str:
    try:
        return str(uuid.UUID(text.strip()))
    except ValueError:
        raise QueryError(f"{text!r} is not a uuid (column {column!r} is of type uuid; "
                         "write it as 8-4-4-4-12 hex digits)") from None


def cte_names(tree: exp.Expr, dialect: str = "spark") -> frozenset[str]:
    """Lower-case names of the CTEs ``tree`` defines, to match references against with
    :func:`is_cte`.

    Why lower-case: SQL matches an unquoted identifier case-insensitively (``WITH Recent AS
    (...) SELECT * FROM recent`` reads the CTE), and Spark, which runs the statement, and
    DuckDB match quoted ones so too. Postgres keeps a quoted name's case: a reference that
    matches a CTE only case-insensitively there (``WITH "Recent" ... FROM recent``) is a
    table to Postgres and the CTE to Spark, so it is refused."""
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    if dialect == "postgres" and ctes:
        exact = {_postgres_name(cte.args["alias"].this) for cte in tree.find_all(exp.CTE)}
        for ref in tree.find_all(exp.Table):
            if is_cte(ref, ctes) and _postgres_name(ref.this) not in exact:
                raise QueryError(f"{ref.this.sql(dialect='postgres')} matches a CTE only "
                                 "ignoring case: Postgres would read another table, Spark "
                                 "the CTE; spell the CTE and its references alike")
    return frozenset(ctes)


def _postgres_name(identifier: exp.Expr) -> str:
    """The name Postgres resolves: a quoted identifier as written, else lower-cased."""
    quoted = isinstance(identifier, exp.Identifier) and identifier.quoted
    return identifier.name if quoted else identifier.name.lower()


def is_cte(ref: exp.Table, ctes: set[str] | frozenset[str]) -> bool:
    """Whether ``ref`` names one of ``ctes`` (from :func:`cte_names`)."""
    return not ref.db and ref.name.lower() in ctes


def point_at(ref: exp.Table, view: str) -> None:
    """Make ``ref`` read ``view`` in place, keeping its alias (the table name when it had
    none, so ``orders.id`` still resolves), joins, sample and pivots as written."""
    if not ref.alias:
        ref.set("alias", exp.TableAlias(this=exp.to_identifier(ref.name)))
    ref.set("this", exp.to_identifier(view))
    ref.set("db", None)
    ref.set("catalog", None)


def spark_sql(tree: exp.Expr, dialect: str = "spark",
              schema: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """The tree (parsed in ``dialect``) as Spark SQL; a construct Spark's dialect cannot
    express, or would answer by other rules than ``dialect``'s
    (:func:`icefloe.streams.divergent.refuse_divergent`; ``schema``: view -> column -> SQL
    type, to tell integers from fractions), is an error naming it, never silently left out
    or changed (sqlglot would warn and drop it, or keep text that means something else)."""
    refuse_lost_meaning(tree, dialect)
    try:
        refuse_divergent(tree, dialect, schema)
    except Divergent as exc:
        raise QueryError(f"cannot run this {dialect} SQL on Spark exactly: {exc}") from None
    tree = exact_percentiles(tree)
    try:
        return tree.sql(dialect="spark", unsupported_level=ErrorLevel.RAISE)
    except UnsupportedError as exc:
        reason = " ".join(str(exc).split())[:300]
        raise QueryError(f"cannot run this on Spark: {reason}") from None


def exact_percentiles(tree: exp.Expr) -> exp.Expr:
    """``tree``, or a copy of it in which ``percentile_cont``/``percentile_disc(q) WITHIN
    GROUP (ORDER BY x)`` is Spark's own function of that name.

    Why: sqlglot writes them for Spark as ``percentile_approx(x, q)``, an approximation that
    also drops a ``DESC``, without a warning; Spark 4 has both exactly (interpolated and
    discrete, as DuckDB's and Postgres': ``tests/pipeline/test_query_dialects.py``)."""
    if not any(isinstance(w.this, exp.PERCENTILES) for w in tree.find_all(exp.WithinGroup)):
        return tree
    tree = tree.copy()
    for within in tree.find_all(exp.WithinGroup):
        call = within.this
        if not isinstance(call, exp.PERCENTILES):
            continue
        if any(value is not None for key, value in call.args.items() if key != "this"):
            raise QueryError(f"{within.sql()}: this form of {call.sql_name()} has no "
                             "exact Spark spelling")
        name = "PERCENTILE_CONT" if isinstance(call, exp.PercentileCont) else "PERCENTILE_DISC"
        within.set("this", exp.Anonymous(this=name, expressions=[call.this]))
    return tree


def refuse_lost_meaning(tree: exp.Expr, dialect: str = "spark") -> None:
    """Constructs sqlglot turns into Spark SQL that means something else, without a warning:
    ``FETCH ... WITH TIES`` / ``PERCENT`` become a plain ``LIMIT``, and an ``ORDER BY`` inside
    an aggregate Spark cannot order (``array_agg(x ORDER BY y)``) is dropped."""
    for fetch in tree.find_all(exp.Fetch):
        options = fetch.args.get("limit_options")
        for flag, words in (("with_ties", "WITH TIES"), ("percent", "PERCENT")):
            if options is not None and options.args.get(flag):
                raise QueryError(f"{fetch.sql(dialect=dialect)}: FETCH ... {words} has no "
                                 "Spark equivalent (it would become a plain LIMIT)")
    for order in tree.find_all(exp.Order):
        call = order.parent
        if isinstance(call, exp.AggFunc) and "ORDER BY" not in call.sql(dialect="spark"):
            raise QueryError(f"{call.sql()}: Spark cannot order inside this "
                             "aggregate (the ORDER BY would be dropped); sort the result "
                             "instead, e.g. array_sort(collect_list(...))")


# Arguments of a sqlglot ``Table`` node the rewrite keeps as written (Spark honours them on
# the temp view just as on a table) or turns into a pinned snapshot. Any other argument (a
# T-SQL hint, Snowflake's CHANGES, Postgres' ONLY, MySQL's PARTITION, ...) is refused: the
# Spark SQL generated from the tree would drop it or mean something else.
KEPT = frozenset({"this", "db", "catalog", "alias", "joins", "laterals", "pivots", "sample"})
TIME_TRAVEL = frozenset({"version", "when"})
_CLAUSE_NAMES = {"hints": "table hint", "changes": "CHANGES clause", "only": "ONLY",
                 "partition": "PARTITION selection", "indexed": "INDEXED BY",
                 "system_time": "FOR SYSTEM_TIME", "format": "FILE_FORMAT", "pattern": "PATTERN",
                 "ordinality": "WITH ORDINALITY", "rows_from": "ROWS FROM"}


def check_clauses(ref: exp.Table, ctes: set[str] | frozenset[str] = frozenset()) -> None:
    """Refuse, naming it, any clause on a table reference the rewrite cannot honour."""
    name = ".".join(p for p in (ref.catalog, ref.db, ref.name) if p) or "table function"
    for key, value in ref.args.items():
        if key in KEPT or key in TIME_TRAVEL or value in (None, False, []):
            continue
        label = _CLAUSE_NAMES.get(key, key.upper())
        shown = _clause_text(key, value)
        raise QueryError(f"{name}: {label}{' ' + shown if shown else ''} is not supported "
                         "here (icefloe reads tables through Spark, which cannot honour it); "
                         "remove it")
    clauses = [key for key in TIME_TRAVEL if ref.args.get(key) is not None]
    if len(clauses) > 1:
        raise QueryError(f"{name}: two time-travel clauses on one table; keep one")
    if clauses and is_cte(ref, ctes):
        raise QueryError(f"{ref.name!r} is a CTE: only tables have versions to travel to")


def _clause_text(key: str, value: object) -> str:
    """The clause as its dialect would write it, for the error message."""
    if isinstance(value, list):
        return " ".join(_clause_text(key, v) for v in value)
    if key == "hints" and isinstance(value, exp.Expression):
        return f"WITH ({', '.join(e.sql() for e in value.expressions)})"
    if isinstance(value, exp.Expression):
        return value.sql()
    return ""


def time_travel(ref: exp.Table) -> AsOf | None:
    """The reference's time-travel clause as an :class:`AsOf`, removed from the tree (Spark
    reads a temp view, which has no versions of its own).

    DuckLake's ``AT (VERSION => n)`` reads catalog version ``n`` (as ``icefloe tables
    history`` shows it); Spark's ``FOR VERSION AS OF id`` reads snapshot ``id`` of this
    table, as Spark reads an Iceberg table; ``AT (TIMESTAMP => t)`` and ``FOR TIMESTAMP AS
    OF t`` mean the same: ``t`` is a quoted ISO 8601 time, UTC unless it says otherwise.
    """
    check_clauses(ref)
    version, when = ref.args.get("version"), ref.args.get("when")
    if version is None and when is None:
        return None
    ref.set("version", None)
    ref.set("when", None)
    if when is not None:
        kind = str(when.args.get("kind", "")).upper()
        where = f"{ref.sql(dialect='spark')} {when.sql(dialect='spark')}"
        if str(when.this).upper() != "AT" or kind not in ("VERSION", "TIMESTAMP"):
            raise QueryError(f"{where}: not supported; write AT (VERSION => n) or "
                             "AT (TIMESTAMP => '<ISO 8601 time>')")
        return _travel_to(kind, when.expression, where)
    assert version is not None  # one of the two is set (checked above)
    kind = str(version.this).upper()
    value = version.expression
    where = f"{ref.sql(dialect='spark')} FOR {kind} {version.text('kind')}"
    if str(version.args.get("kind", "")).upper() != "AS OF" or not isinstance(value,
                                                                             exp.Literal):
        raise QueryError(f"{where}: write FOR VERSION AS OF <version> or FOR TIMESTAMP "
                         "AS OF '<ISO 8601 time>'")
    where = f"{where} {value.sql(dialect='spark')}"
    travel = _travel_to(kind, value, where, spark=True)
    if travel.version is not None:  # Spark's (and Iceberg's) FOR VERSION AS OF: a snapshot id
        return AsOf(snapshot_id=travel.version, spelled=where)
    return travel


def _travel_to(kind: str, value: exp.Expr, where: str, spark: bool = False) -> AsOf:
    """``VERSION``/``TIMESTAMP`` and its value as an :class:`AsOf`; ``where`` names the
    clause, ``spark``: Spark's ``FOR ... AS OF`` (its version is a snapshot id)."""
    if isinstance(value, exp.Cast) and kind == "TIMESTAMP" and value.to.is_type(
            *exp.DataType.TEMPORAL_TYPES):
        value = value.this  # TIMESTAMP '2026-11-23 17:00:00'
    if not isinstance(value, exp.Literal):
        raise QueryError(f"{where}: give a literal {kind.lower()}, such as "
                         + ("a snapshot id (see `icefloe tables history`)" if spark
                            and kind == "VERSION" else
                            "3 (see `icefloe tables history`)" if kind == "VERSION" else
                            "'2026-11-23T17:00:00Z'"))
    text = value.this.strip()
    if kind == "VERSION":
        if value.is_string or not text.isdigit():
            raise QueryError(f"{where}: " + (
                "Spark's FOR VERSION AS OF takes a snapshot id (digits); for a catalog "
                "version write AT (VERSION => n)" if spark else
                "a version is a number: the catalog version (1, 2, 3 ...), see `icefloe "
                "tables history`; for a snapshot id write FOR VERSION AS OF <id>"))
        return AsOf(version=int(text))
    if not value.is_string:
        raise QueryError(f"{where}: a timestamp is quoted ISO 8601, such as "
                         "'2026-11-23T17:00:00Z'")
    try:
        # digits alone would be a snapshot id to --as-of; in a TIMESTAMP clause they are not
        # a time, and reading them as an id would answer from another snapshot
        if text.isdigit():
            raise QueryError(text)
        return AsOf.parse(text)
    except QueryError:
        raise QueryError(f"{where}: not an ISO 8601 time (such as "
                         "'2026-11-23T17:00:00Z')") from None


def pin(table: Table | LocalTable, identifier: str, as_of: AsOf | None,
        versions: CatalogVersions | None = None) -> int | None:
    """The snapshot to read: current, the given snapshot id, the state at a catalog version,
    or the one current at the given time (``table``: pyiceberg's, or a :class:`LocalTable`,
    which answers the same questions the same way). ``versions``: what the query's tables
    say about catalog versions (default: this table alone)."""
    if as_of is not None and as_of.version is not None:
        try:
            return at_version(table, identifier, as_of.version,
                              versions or CatalogVersions([table]))
        except CatalogError as exc:
            raise QueryError(str(exc)) from None
    if as_of is None:
        return resolve_snapshot(table, identifier, None)
    if as_of.snapshot_id is not None:
        if as_of.spelled is not None and table.snapshot_by_id(as_of.snapshot_id) is None:
            number = as_of.snapshot_id
            kept = expired_before(table)
            expired = ""
            if kept is not None:  # maybe one of the expired snapshots: said, not guessed
                since = dt.datetime.fromtimestamp(kept.timestamp_ms / 1000, dt.UTC).isoformat(
                    timespec="milliseconds")
                gone = (f"its snapshots before {kept.snapshot_id} (committed at {since}) were "
                        f"expired ({EXPIRY})")
                if not (versions or CatalogVersions([table])).exists(number):
                    raise QueryError(
                        f"{as_of.spelled}: table {identifier!r} has no snapshot {number}: if "
                        f"it was one of its snapshots, it was expired and can no longer be "
                        f"read: {gone}; read a snapshot it keeps, or keep snapshots longer to "
                        f"travel further back (see `icefloe tables history {identifier}`)")
                expired = f"; if {number} was a snapshot of it, it was expired: {gone}"
            raise QueryError(
                f"{as_of.spelled}: Spark's FOR VERSION AS OF takes a snapshot id of the table "
                f"(as Spark reads Iceberg), and {identifier!r} has no snapshot "
                f"{number}; for catalog version {number} write AT (VERSION => {number})"
                f"{expired} (see `icefloe tables history {identifier}`)")
        snapshot_id = resolve_snapshot(table, identifier, as_of.snapshot_id)
        try:
            refuse_intermediate(table, identifier, as_of.snapshot_id,
                                f"snapshot {as_of.snapshot_id}")
        except CatalogError as exc:
            raise QueryError(str(exc)) from None
        return snapshot_id
    assert as_of.timestamp_ms is not None
    # At a moment inside an older icefloe's multi-snapshot commit: the state before it.
    snapshot = complete_snapshot(table, table.snapshot_as_of_timestamp(as_of.timestamp_ms))
    if snapshot is None:
        when = _iso(as_of.timestamp_ms)
        kept = expired_before(table)
        if kept is not None:
            since = dt.datetime.fromtimestamp(kept.timestamp_ms / 1000, dt.UTC).isoformat(
                timespec="milliseconds")
            raise QueryError(
                f"table {identifier!r} can no longer be read at {when}: the snapshots "
                f"before its oldest kept one (committed at {since}) were "
                f"expired ({EXPIRY}); read it at that time or later, or keep snapshots "
                f"longer to travel further back (see `icefloe tables history {identifier}`)")
        first = min((s.timestamp_ms for s in table.snapshots()), default=None)
        since = f"its first commit is at {_iso(first)}" if first else "it has no commits yet"
        raise QueryError(f"table {identifier!r} had no snapshot at {when}; {since}")
    return snapshot.snapshot_id


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def run_query(spark: SparkSession, config: Config, sql: str, *, as_of: AsOf | None = None,
              limit: int | None = None, pinned: Plan | None = None, dialect: str = "spark"
              ) -> tuple[pa.Table, bool, Plan]:
    """Run ``sql``; the result (at most ``limit`` rows), whether more rows were cut off,
    and the plan (which snapshot each table was read at). ``pinned``: a plan of ``sql``
    made earlier (the CLI plans once, then picks the engine), so both read the same
    snapshots. ``dialect``: the one ``sql`` is written in (see the module docstring)."""
    from pipeline.read.iceberg_source import read_table  # lazy: pyspark

    pinned = pinned or plan(sql, config, as_of, dialect)
    spark_text = pinned.spark()  # refused before any table is read
    for key, view in pinned.tables.items():
        frame = read_table(spark, config.catalog, pinned.identifiers.get(key, key),
                           snapshot_id=pinned.snapshots[key])
        uuids = pinned.uuids.get(key)
        if uuids:  # 16 bytes -> the canonical text (see the module docstring)
            frame = frame.withColumns({name: uuid_text(frame[name]) for name in uuids})
        frame.createOrReplaceTempView(view)
    try:
        frame = spark.sql(spark_text)
        if limit is not None:
            frame = frame.limit(limit + 1)
        result = frame.toArrow()
    except Exception as exc:
        raise QueryError(spark_error(exc, pinned.tables)) from exc
    truncated = limit is not None and result.num_rows > limit
    return (result.slice(0, limit) if truncated else result), truncated, pinned


def uuid_text(column: Any) -> Any:
    """A Spark column of 16-byte uuids as canonical text (lower-case 8-4-4-4-12 hex)."""
    from pyspark.sql import functions as F  # lazy: pyspark

    return F.lower(F.regexp_replace(F.hex(column), "^(.{8})(.{4})(.{4})(.{4})(.{12})$",
                                    "$1-$2-$3-$4-$5"))


def spark_error(exc: BaseException, views: dict[str, str]) -> str:
    """Spark's message in one line, with our view names turned back into table names."""
    text = " ".join(str(getattr(exc, "getMessage", lambda: exc)()).split()) or repr(exc)
    text = text.split(" JVM stacktrace:")[0].split("SQLSTATE:")[0].strip()
    for identifier, view in views.items():
        text = text.replace(f"`{view}`", identifier).replace(view, identifier)
    return text[:500]
