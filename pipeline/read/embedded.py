"""``icefloe query``'s embedded engine: DuckDB over the pinned snapshots, in this process.

Why: Spark costs 10-25 s of JVM and Python-worker start for every ``icefloe query``, while
most questions ("how many rows today?") touch a few megabytes. This engine answers them in
about a second. It runs *after* :func:`pipeline.read.query.plan`, so names, snapshots and
time travel are resolved exactly once, the same way for both engines:

* **Reading.** The files of each pinned snapshot are planned from the table's metadata
  and manifests directly for a plain local table (:mod:`pipeline.read.local_table`: no
  pyiceberg import), else by pyiceberg. When they are all local
  Parquet files without delete files, every one maps its columns by Iceberg field id, and
  every column is of a plain type (:data:`DUCKDB_TYPES`), DuckDB reads them itself
  (``read_parquet`` with a field-id ``schema`` map: renamed columns keep their data, added
  ones read NULL) under the plan's view name: no pyarrow dataset module, no pandas, which
  cost a cold process ~0.7 s. Otherwise (S3, positional deletes, nested or other types, a
  file without field ids) pyarrow reads them through the table's FileIO (S3 with the
  catalog's ``s3.*`` properties), projecting by field id to the columns the query names and
  applying positional delete files, and the Arrow table is registered instead. A snapshot
  with equality delete files is refused (pyiceberg cannot apply them).
* **Translating.** The plan's Spark SQL goes through ``sqlglot`` (spark → duckdb). A
  translation is used only when it is *exact*, which here means all of: every node of the
  statement is on an allow-list of constructs whose semantics are known to agree between
  Spark 4 (ANSI mode, session time zone UTC) and DuckDB (time zone UTC); sqlglot raises no
  "unsupported" error; and the DuckDB text translates back to the same Spark SQL
  (round trip). Anything else is refused with the construct named: ``/`` (division by zero is
  an error in Spark, NULL in DuckDB), ``CAST`` (DuckDB rounds ``1.5`` to an integer, Spark
  truncates), window functions, string functions with different indexing, a string literal
  compared with a numeric column (implicit casts differ), backslashes in string literals
  (escapes differ), every function not listed in :data:`FUNCTIONS`, ``lower``/``upper``
  of anything but ASCII (Unicode case rules differ) and ``avg`` of a decimal (a decimal in
  Spark, a double in DuckDB).
* **Results.** DuckDB's ``sum`` of integers is a 128-bit integer; it comes back as
  ``int64``, as Spark's ``sum`` of a ``long`` does (an overflow is an error on both).
  Unaliased expressions are named by DuckDB (``count_star()``), not as Spark names them
  (``count(1)``): alias them when the column name matters.
* **DuckDB's dialect.** A query written in DuckDB's dialect (``icefloe sql``, or
  ``--dialect duckdb``) is run here as written, with no allow-list: DuckDB's rules are the
  ones it was written for. Spark answers it only when it is too big for this engine (or
  ``--engine spark``), transpiled, and never when it holds a construct Spark would answer
  differently (:mod:`icefloe.streams.divergent`): that is refused naming the construct.

``duckdb`` is imported only when this engine runs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError

from icefloe.config import Config
from pipeline.iceberg.pyiceberg_fixes import install
from pipeline.read.local_table import DECIMAL as _DECIMAL
from pipeline.read.local_table import DUCKDB_TYPES, LocalTable, Unusual
from pipeline.read.paths import local_path
from pipeline.read.query import Plan, QueryError
from pipeline.read.tables import as_pyiceberg, load_table_to_query

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.schema import Schema
    from pyiceberg.table import FileScanTask, Table
    from sqlglot import exp

    from pipeline.read import local_table

ENGINES = ("auto", "duckdb", "spark")

FUNCTIONS = frozenset({"COUNT", "SUM", "MIN", "MAX", "AVG", "COALESCE", "LOWER", "UPPER",
                       "ABS", "LENGTH"})
"""Functions whose results agree on both engines for icefloe's column types; ``lower``/
``upper`` and ``avg`` only where :func:`_check_argument` finds they do."""

_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|\+00:?00)?)?")
_NUMBER_TYPES = ("int", "long", "float", "double", "decimal")
_TIME_TYPES = ("date", "timestamp", "timestamptz")


class Untranslatable(QueryError):
    """The statement holds a construct the embedded engine does not run exactly."""

    def __init__(self, construct: str, reason: str) -> None:
        super().__init__(f"{construct}: {reason}")
        self.construct = construct
        self.reason = reason


def _structural() -> tuple[type[exp.Expr], ...]:
    """Nodes that only shape the query (no values of their own to disagree on)."""
    return (exp.Select, exp.From, exp.Join, exp.Where, exp.Group, exp.Having, exp.Order,
            exp.Ordered, exp.Limit, exp.Offset, exp.With, exp.CTE, exp.TableAlias,
            exp.Subquery, exp.Union, exp.Except, exp.Intersect, exp.Table, exp.Identifier,
            exp.Column, exp.Star, exp.Alias, exp.Paren, exp.Distinct, exp.Tuple,
            exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or, exp.Not,
            exp.Is, exp.Null, exp.Boolean, exp.In, exp.Between, exp.Like, exp.Literal,
            exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Case, exp.If, exp.Filter)


def check_exact(tree: exp.Expr, columns: Mapping[str, str]) -> None:
    """Raise :class:`Untranslatable` naming the first construct not on the allow-list.

    ``columns``: lower-case column name -> Iceberg type name (``long``, ``string``, ...), or
    ``"?"`` where tables disagree; used to refuse implicit casts between strings and numbers.
    """
    allowed = _structural()
    # a name the statement gives another value (``x * 1.5 AS n``) is no longer the column's
    renamed = {a.alias.lower() for a in tree.find_all(exp.Alias)
               if not (isinstance(a.this, exp.Column) and a.this.name.lower() == a.alias.lower())}
    renamed |= {c.name.lower() for t in tree.find_all(exp.TableAlias) for c in t.columns}
    typed = {name: kind for name, kind in columns.items() if name not in renamed}
    for node in tree.walk():
        if not isinstance(node, allowed):
            _check_function(node)
            _check_argument(node, typed)
            continue
        if isinstance(node, exp.Literal) and node.is_string and "\\" in node.this:
            raise Untranslatable(f"'{node.this}'", "backslash escapes differ between the "
                                 "engines")
        if isinstance(node, exp.Like) and node.args.get("escape") is not None:
            raise Untranslatable("LIKE ... ESCAPE", "escapes differ between the engines")
        if isinstance(node, exp.Join) and (node.args.get("method") or "").upper() in (
                "NATURAL", "ASOF"):
            raise Untranslatable(f"{node.args['method'].upper()} JOIN", "not run embedded")
        if isinstance(node, exp.EQ | exp.NEQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
            _check_comparison(node.this, node.expression, columns)
        elif isinstance(node, exp.In):
            for value in node.expressions:
                _check_comparison(node.this, value, columns)
        elif isinstance(node, exp.Between):
            _check_comparison(node.this, node.args["low"], columns)
            _check_comparison(node.this, node.args["high"], columns)


def _check_function(node: exp.Expr) -> None:
    """A node off the structural list passes only as a function of :data:`FUNCTIONS`."""
    names = {exp.Div: "/ (division)", exp.IntDiv: "DIV", exp.Mod: "% (modulo)",
             exp.Window: "OVER (window function)", exp.Cast: "CAST",
             exp.TryCast: "TRY_CAST", exp.Lateral: "LATERAL VIEW",
             exp.TableSample: "TABLESAMPLE", exp.Pivot: "PIVOT", exp.Lambda: "lambda"}
    for kind, name in names.items():
        if isinstance(node, kind):
            raise Untranslatable(name, "not known to give the same answers in DuckDB and "
                                 "Spark")
    if not isinstance(node, exp.Func):
        raise Untranslatable(node.key.upper(), "not known to give the same answers in DuckDB "
                             "and Spark")
    label = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).upper()
    if label not in FUNCTIONS:
        raise Untranslatable(label, "function not known to give the same answers in DuckDB "
                             "and Spark")


def _check_argument(node: exp.Expr, columns: Mapping[str, str]) -> None:
    """Refuse an allowed function whose answer still depends on the engine for its argument.

    ``lower``/``upper`` map case by other Unicode rules (Spark Java's, DuckDB its own:
    ``upper('straße')`` is ``'STRASSE'`` in Spark, ``'STRAẞE'`` in DuckDB; ``lower('İ')``
    two characters vs one): passed only for ASCII, a uuid column (canonical hex text) or an
    ASCII literal. ``avg`` of a decimal is a decimal (scale + 4) in Spark, a double in
    DuckDB: passed only for integer and floating-point arguments."""
    if isinstance(node, exp.Upper | exp.Lower):
        argument = node.this
        ascii_text = (isinstance(argument, exp.Literal) and argument.is_string
                      and argument.this.isascii()) or (
            isinstance(argument, exp.Column) and columns.get(argument.name.lower()) == "uuid")
        if not ascii_text:
            raise Untranslatable(node.sql(dialect="spark"), "DuckDB and Spark map case by "
                                 "different Unicode rules (upper('straße'): 'STRAẞE' vs "
                                 "'STRASSE')")
    elif isinstance(node, exp.Avg):
        argument = node.this
        if isinstance(argument, exp.Distinct) and len(argument.expressions) == 1:
            argument = argument.expressions[0]
        if _numeric(argument, columns) not in ("integer", "float"):
            raise Untranslatable(node.sql(dialect="spark"), "avg of a decimal (or of a value "
                                 "of unknown type) is a decimal in Spark, a double in DuckDB")


def _numeric(node: exp.Expr, columns: Mapping[str, str]) -> str | None:
    """``integer``, ``float`` or ``decimal`` when known from the node (a column's Iceberg
    type, a literal, ``+ - *`` of those), else None. A literal with a point is a decimal in
    Spark."""
    if isinstance(node, exp.Paren | exp.Neg):
        return _numeric(node.this, columns)
    if isinstance(node, exp.Literal) and not node.is_string:
        return "integer" if node.this.isdigit() else None
    if isinstance(node, exp.Column):
        iceberg = columns.get(node.name.lower(), "?")
        if iceberg in ("int", "long"):
            return "integer"
        if iceberg in ("float", "double"):
            return "float"
        return "decimal" if iceberg.startswith("decimal") else None
    if isinstance(node, exp.Add | exp.Sub | exp.Mul):
        kinds = {_numeric(node.this, columns), _numeric(node.expression, columns)}
        if kinds == {"integer"}:
            return "integer"
        return "float" if kinds <= {"integer", "float"} else None
    return None


def _kind(node: exp.Expr, columns: Mapping[str, str]) -> str | None:
    """``string``, ``number``, ``time`` or ``boolean`` when known from the node, else None."""
    if isinstance(node, exp.Paren):
        return _kind(node.this, columns)
    if isinstance(node, exp.Literal):
        return "string" if node.is_string else "number"
    if isinstance(node, exp.Boolean):
        return "boolean"
    if isinstance(node, exp.Column):
        iceberg = columns.get(node.name.lower())
        if iceberg is None:
            return None
        if iceberg == "string":
            return "string"
        if iceberg.startswith(_NUMBER_TYPES):
            return "number"
        if iceberg in _TIME_TYPES:
            return "time"
        if iceberg == "boolean":
            return "boolean"
        if iceberg == "uuid":  # text on both engines (pipeline.read.query)
            return "string"
        return "?"
    return None


def _check_comparison(left: exp.Expr, right: exp.Expr,
                      columns: Mapping[str, str]) -> None:
    """Refuse comparisons whose implicit cast differs (or may differ) between the engines."""
    kinds = {kind for kind in (_kind(left, columns), _kind(right, columns)) if kind is not None}
    if len(kinds) <= 1:
        return
    text = f"{left.sql(dialect='spark')} vs {right.sql(dialect='spark')}"
    if kinds == {"time", "string"}:
        literal = right if isinstance(right, exp.Literal) else left
        if isinstance(literal, exp.Literal) and _ISO_TIME.fullmatch(literal.this.strip()):
            return  # both read ISO 8601 in the session zone, UTC on both engines
        raise Untranslatable(text, "a time compared with a string that is not plain ISO "
                             "8601 (YYYY-MM-DD[ HH:MM[:SS[.ffffff]]][Z])")
    raise Untranslatable(text, f"compares {' and '.join(sorted(kinds))}: implicit casts "
                         "differ between the engines")


def translate(spark_sql: str, columns: Mapping[str, str] | None = None) -> str:
    """The DuckDB SQL for ``spark_sql``, or :class:`Untranslatable` (see the module doc)."""
    tree = sqlglot.parse_one(spark_sql, read="spark")
    check_exact(tree, columns or {})
    try:
        duck = tree.sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)
        back = sqlglot.transpile(duck, read="duckdb", write="spark",
                                 unsupported_level=ErrorLevel.RAISE)[0]
    except SqlglotError as exc:
        raise Untranslatable("statement", f"sqlglot cannot translate it: "
                             f"{str(exc).splitlines()[0]}") from None
    if back != tree.sql(dialect="spark"):
        raise Untranslatable("statement", f"the DuckDB translation does not read back as "
                             f"the same Spark SQL ({back[:200]})")
    return duck


# ------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Pinned:
    """One pinned table reference, planned: what it reads and how big it is. A plain
    local table is planned without pyiceberg (:mod:`pipeline.read.local_table`: its own
    table, schema and task types, with the fields read here)."""

    view: str
    table: Table | local_table.LocalTable
    schema: Schema | local_table.Schema
    tasks: tuple[FileScanTask | local_table.Task, ...]
    snapshot_id: int | None = None

    @property
    def bytes(self) -> int:
        return sum(t.file.file_size_in_bytes + sum(d.file_size_in_bytes
                                                   for d in t.delete_files)
                   for t in self.tasks)


def referenced_columns(sql: str, dialect: str = "spark") -> set[str]:
    """Lower-case names of every column the statement names; ``{"*"}`` if it has a star.
    Every part of a dotted reference counts (``addr.city`` reads the struct column
    ``addr``; a table alias among them names no column and is left out by the reader), and
    so do a join's ``USING`` columns, which are identifiers, not column nodes."""
    tree = sqlglot.parse_one(sql, read=dialect)
    names = {part.name.lower() for c in tree.find_all(exp.Column) for part in c.parts}
    for join in tree.find_all(exp.Join):
        names |= {i.name.lower() for i in join.args.get("using") or ()}
    if any(True for _ in tree.find_all(exp.Star)) and not all(
            isinstance(s.parent, exp.Count) for s in tree.find_all(exp.Star)):
        names.add("*")
    return names


def plan_files(config: Config, pinned: Plan) -> dict[str, Pinned]:
    """Per plan key: the pinned snapshot's schema and files (nothing read yet)."""
    out: dict[str, Pinned] = {}
    tables: dict[str, Table | LocalTable] = dict(pinned.loaded)
    for key, view in pinned.tables.items():
        identifier = pinned.identifiers.get(key, key)
        if identifier not in tables:
            tables[identifier] = load_table_to_query(config.catalog, identifier)
        table = tables[identifier]
        snapshot = pinned.snapshots[key]
        if isinstance(table, LocalTable):
            try:
                tasks = table.plan_files(snapshot) if snapshot is not None else ()
                out[key] = Pinned(view, table, table.schema_at(snapshot), tasks, snapshot)
                continue
            except Unusual:  # deletes, a codec, ...: pyiceberg plans it, same metadata file
                table = tables[identifier] = as_pyiceberg(table)
        out[key] = _plan_with_pyiceberg(view, table, snapshot)
    return out


def _plan_with_pyiceberg(view: str, table: Table, snapshot: int | None) -> Pinned:
    """``snapshot``'s schema and files as pyiceberg's scan plans them."""
    scan = table.scan(snapshot_id=snapshot)
    tasks = tuple(scan.plan_files()) if snapshot is not None else ()
    return Pinned(view, table, scan.projection(), tasks, snapshot)


def column_types(pinned: Iterable[Pinned]) -> dict[str, str]:
    """Column name -> Iceberg type over all tables (``"?"`` where they disagree)."""
    types: dict[str, str] = {}
    for entry in pinned:
        for field in entry.schema.fields:
            kind = str(field.field_type)
            name = field.name.lower()
            types[name] = kind if types.get(name, kind) == kind else "?"
    return types


def read_pinned(entry: Pinned, columns: set[str]) -> pa.Table:
    """The pinned files as one Arrow table, projected to ``columns`` (at least one)."""
    import pyarrow as pa  # lazy: pyarrow
    from pyiceberg.expressions import AlwaysTrue  # lazy: pyiceberg
    from pyiceberg.io.pyarrow import ArrowScan, PyArrowFileIO, schema_to_pyarrow  # lazy: pandas

    install()  # a null list of structs stays NULL (pyiceberg's projection makes it [])
    if isinstance(entry.table, LocalTable):  # pyiceberg reads: plan it with pyiceberg
        entry = _plan_with_pyiceberg(entry.view, as_pyiceberg(entry.table), entry.snapshot_id)
    _refuse_equality_deletes([entry])
    names = [f.name for f in entry.schema.fields]
    if "*" not in columns:
        wanted = [n for n in names if n.lower() in columns]
        names = wanted or names[:1]  # count(*): one column carries the row count
    # planned by pyiceberg (above): its schema and file tasks
    schema = cast("Schema", entry.schema).select(*names)
    if not entry.tasks:
        return uuids_as_spark_reads_them(pa.Table.from_batches(
            [], schema=schema_to_pyarrow(schema, include_field_ids=False)))
    assert not isinstance(entry.table, LocalTable)
    io = entry.table.io
    if not isinstance(io, PyArrowFileIO):  # the light local IO of a query's table
        io = PyArrowFileIO(io.properties)
    scan = ArrowScan(entry.table.metadata, io, schema, AlwaysTrue())
    return uuids_as_spark_reads_them(scan.to_table(cast("tuple[FileScanTask, ...]",
                                                        entry.tasks)))


def uuids_as_spark_reads_them(table: pa.Table) -> pa.Table:
    """A top-level uuid column as its canonical text (``VARCHAR`` in DuckDB), as the Spark
    engine's view shows it (:mod:`pipeline.read.query`), so comparisons, ``LIKE`` and
    string functions mean the same on both engines (DuckDB's ``UUID`` has no string
    functions); a uuid inside a struct, list or map as its 16 bytes, as Spark's reader
    hands it over."""
    import pyarrow as pa  # lazy: pyarrow

    def plain(kind: pa.DataType) -> pa.DataType:
        if isinstance(kind, pa.BaseExtensionType):
            return plain(kind.storage_type)
        if pa.types.is_struct(kind):
            return pa.struct([kind.field(i).with_type(plain(kind.field(i).type))
                              for i in range(kind.num_fields)])
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            element = kind.value_field
            wrap = pa.large_list if pa.types.is_large_list(kind) else pa.list_
            return wrap(element.with_type(plain(element.type)))
        if pa.types.is_map(kind):
            return pa.map_(kind.key_field.with_type(plain(kind.key_field.type)),
                           kind.item_field.with_type(plain(kind.item_field.type)))
        return kind

    columns, fields = [], []
    for field, column in zip(table.schema, table.columns, strict=True):
        if isinstance(field.type, pa.BaseExtensionType) and \
                field.type.extension_name == "arrow.uuid":
            column = uuid_text(column)
        elif plain(field.type) != field.type:
            column = column.cast(plain(field.type))
        columns.append(column)
        fields.append(field.with_type(column.type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields,
                                                          metadata=table.schema.metadata))


@functools.cache
def _hex_digits() -> Any:
    """Each byte value's two lower-case hex digits (ASCII), as a 256 x 2 uint8 array."""
    import numpy as np  # lazy: numpy

    return np.array([list(f"{i:02x}".encode()) for i in range(256)], np.uint8)


def uuid_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """16-byte uuids (``arrow.uuid``) as canonical lower-case 8-4-4-4-12 text, vectorised:
    ~1 µs a value in Python would be seconds on the byte limit's worth of rows."""
    import numpy as np  # lazy: numpy
    import pyarrow as pa  # lazy: pyarrow

    chunks = []
    for chunk in column.chunks:
        storage = chunk.storage if isinstance(chunk, pa.ExtensionArray) else chunk
        count = len(storage)
        raw = np.frombuffer(storage.buffers()[1], np.uint8, 16 * count,
                            16 * storage.offset).reshape(count, 16)
        hexed = _hex_digits()[raw].reshape(count, 32)
        text = np.full((count, 36), ord("-"), np.uint8)
        for start, end, at in ((0, 8, 0), (8, 12, 9), (12, 16, 14), (16, 20, 19),
                               (20, 32, 24)):
            text[:, at:at + end - start] = hexed[:, start:end]
        offsets = np.arange(0, 36 * (count + 1), 36, dtype=np.int32)
        validity = storage.buffers()[0] if storage.null_count else None
        if validity is not None and storage.offset:
            validity = pa.array(storage.is_valid()).buffers()[1]
        chunks.append(pa.Array.from_buffers(
            pa.string(), count, [validity, pa.py_buffer(offsets), pa.py_buffer(text.tobytes())],
            storage.null_count))
    return pa.chunked_array(chunks, pa.string())


def parquet_source(entry: Pinned) -> tuple[str, str] | None:
    """The pinned files as a DuckDB list literal, and a ``read_parquet(...)`` that reads
    them as pyiceberg would; None when DuckDB cannot read them alone (see the module
    docstring; field ids are checked apart, by :func:`_all_have_field_ids`)."""
    if not entry.tasks:
        return None
    columns = []
    for field in entry.schema.fields:
        kind = _duckdb_type(str(field.field_type))
        if kind is None or getattr(field, "initial_default", None) is not None:
            return None
        columns.append(f"{field.field_id}: {{name: {_literal(field.name)}, type: '{kind}', "
                       "default_value: NULL}")
    paths = []
    for task in entry.tasks:
        path = local_path(task.file.file_path)
        # pyiceberg's FileFormat is a str enum: equal to its upper-case name
        if task.delete_files or task.file.file_format != "PARQUET" or path is None:
            return None
        paths.append(_literal(path))
    files = f"[{', '.join(paths)}]"
    return files, (f"read_parquet({files}, hive_partitioning = false, union_by_name = false, "
                   f"schema = MAP {{{', '.join(columns)}}})")


def _duckdb_type(iceberg: str) -> str | None:
    """DuckDB's name for a plain Iceberg type; None for any other."""
    decimal = _DECIMAL.fullmatch(iceberg)
    if decimal is not None:
        return f"DECIMAL({decimal.group(1)}, {decimal.group(2)})"
    return DUCKDB_TYPES.get(iceberg)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _all_have_field_ids(connection: Any, files: str) -> bool:
    """Whether every column of every file carries a field id (only each file's root
    element has none): DuckDB's ``schema`` map reads a column without one as NULL, where
    pyiceberg would map it by name or refuse."""
    bad = connection.execute(f"SELECT count(*) FROM (SELECT file_name FROM parquet_schema("
                             f"{files}) GROUP BY file_name HAVING count(*) FILTER (WHERE "
                             "field_id IS NULL) <> 1)").fetchall()
    return bad == [(0,)]


def _register(connection: Any, entry: Pinned, columns: set[str]) -> None:
    """Make ``entry.view`` readable in DuckDB: its own Parquet reader when it can, else
    the Arrow table pyiceberg reads."""
    source = parquet_source(entry)
    if source is not None and _all_have_field_ids(connection, source[0]):
        connection.execute(f'CREATE TEMP VIEW "{entry.view}" AS SELECT * FROM {source[1]}')
    else:
        connection.register(entry.view, read_pinned(entry, columns))


def run_embedded(config: Config, pinned: Plan, duck_sql: str, planned: Mapping[str, Pinned],
                 limit: int | None = None) -> tuple[pa.Table, bool]:
    """Run the translated statement on DuckDB; the result and whether ``limit`` cut it."""
    result, truncated = _run(config, pinned, duck_sql, planned, limit, plain=False)
    assert not isinstance(result, Rows)
    return result, truncated


def run_embedded_plain(config: Config, pinned: Plan, duck_sql: str,
                       planned: Mapping[str, Pinned], limit: int | None = None
                       ) -> tuple[pa.Table | Rows, bool]:
    """:func:`run_embedded` for printing: a result of plain column types comes back as
    :class:`Rows` (no pyarrow import, ~0.2 s of a cold process), any other as Arrow."""
    return _run(config, pinned, duck_sql, planned, limit, plain=True)


def _run(config: Config, pinned: Plan, duck_sql: str, planned: Mapping[str, Pinned],
         limit: int | None, *, plain: bool) -> tuple[pa.Table | Rows, bool]:
    import duckdb  # lazy: duckdb

    columns = referenced_columns(pinned.native or pinned.sql,
                                 "duckdb" if pinned.native else "spark")
    connection = duckdb.connect(config=_duckdb_settings())
    try:
        connection.execute("SET TimeZone = 'UTC'")  # needs ICU, loaded after connect
        # DuckDB draws a progress bar on stdout for a query over ~2 s: it would corrupt
        # `icefloe query --format json` on a slow machine
        connection.execute("SET enable_progress_bar = false")
        for entry in planned.values():
            _register(connection, entry, columns)
        try:
            relation = connection.sql(duck_sql)
            if limit is not None:
                relation = relation.limit(limit + 1)
            result = (_plain_rows(relation) if plain else None) or \
                _spark_types(relation.to_arrow_table())
        except duckdb.Error as exc:
            raise QueryError(_duckdb_error(exc, pinned.tables)) from exc
    finally:
        connection.close()
    if limit is not None and result.num_rows > limit:
        return result.slice(0, limit), True
    return result, False


@dataclass(frozen=True)
class Rows:
    """A result of plain column types as DuckDB's Python values, which for these types are
    the values pyarrow's ``to_pylist`` gives (``tests/pipeline/test_embedded_query.py``
    compares them): what ``icefloe query`` prints, without importing pyarrow."""

    column_names: list[str]
    numeric: list[bool]  # right-aligned in a text table
    rows: list[tuple[Any, ...]]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def slice(self, offset: int, length: int) -> Rows:
        return Rows(self.column_names, self.numeric, self.rows[offset:offset + length])

    def to_pylist(self) -> list[dict[str, Any]]:
        return [dict(zip(self.column_names, row, strict=True)) for row in self.rows]


_PLAIN = {"BOOLEAN": False, "TINYINT": True, "SMALLINT": True, "INTEGER": True,
          "BIGINT": True, "FLOAT": True, "DOUBLE": True, "VARCHAR": False, "DATE": False,
          "TIMESTAMP": False, "TIMESTAMP WITH TIME ZONE": False, "BLOB": False}
"""DuckDB result types whose Python values equal pyarrow's, and whether they are numbers."""
_INT64 = range(-2**63, 2**63)


def _plain_rows(relation: Any) -> Rows | None:
    """The relation's rows when every column is of a plain type, else None (read Arrow).

    ``HUGEINT`` and ``DECIMAL(38,0)`` come back as Python ints, as :func:`_spark_types`
    turns them into ``int64``; a value outside ``int64`` also means None, so the Arrow
    cast raises its overflow error."""
    kinds = [str(t) for t in relation.types]
    wide = [k in ("HUGEINT", "DECIMAL(38,0)") for k in kinds]
    if not all(k in _PLAIN or w or _DUCK_DECIMAL.fullmatch(k) for k, w in
               zip(kinds, wide, strict=True)):
        return None
    rows = relation.fetchall()
    if any(wide):
        rows = [tuple(_int64(v) if w else v for v, w in zip(row, wide, strict=True))
                for row in rows]
        if any(v is _OVERFLOW for row in rows for v in row):
            return None
    return Rows(list(relation.columns), [_PLAIN.get(k, True) for k in kinds], rows)


_DUCK_DECIMAL = re.compile(r"DECIMAL\(\d+,\d+\)")
_OVERFLOW = object()


def _int64(value: Any) -> Any:
    """A wide integer as ``int``; :data:`_OVERFLOW` outside ``int64``."""
    if value is None:
        return None
    number = int(value)
    return number if number in _INT64 else _OVERFLOW


def _duckdb_settings() -> dict[str, Any]:
    """No extension downloads; order kept as produced (an ordered result stays ordered)."""
    return {"autoinstall_known_extensions": False,
            "autoload_known_extensions": False, "preserve_insertion_order": True}


def _spark_types(result: pa.Table) -> pa.Table:
    """DuckDB's ``HUGEINT`` (sum of integers) as ``int64``, the type Spark gives."""
    import pyarrow as pa  # lazy: pyarrow

    fields = []
    for field in result.schema:
        kind = field.type
        if pa.types.is_decimal(kind) and kind.precision == 38 and kind.scale == 0:
            kind = pa.int64()
        fields.append(field.with_type(kind))
    target = pa.schema(fields)
    return result if target.equals(result.schema) else result.cast(target)


def _duckdb_error(exc: BaseException, views: Mapping[str, str]) -> str:
    """DuckDB's message in one line, with view names turned back into table names."""
    text = " ".join(str(exc).split())
    for identifier, view in views.items():
        text = text.replace(f'"{view}"', identifier).replace(view, identifier)
    return text[:500]


# ----------------------------------------------------------------------- choosing engines


@dataclass(frozen=True)
class Choice:
    """Which engine answers, and why (said on stderr)."""

    engine: str
    reason: str
    duck_sql: str | None = None
    planned: Mapping[str, Pinned] | None = None


def choose(config: Config, pinned: Plan, requested: str) -> Choice:
    """``spark`` as asked; ``duckdb`` or an :class:`Untranslatable`; ``auto`` by size and
    exactness (see the module docstring and ``query.embedded_max_bytes``)."""
    if pinned.native is not None:
        return _choose_for_duckdb_sql(config, pinned, requested)
    if requested == "spark":
        return Choice("spark", "--engine spark")
    limit = config.query.embedded_max_bytes
    if requested == "auto" and limit == 0:
        return Choice("spark", "query.embedded_max_bytes = 0")
    planned = plan_files(config, pinned)
    size = sum(p.bytes for p in planned.values())
    if requested == "auto" and size > limit:
        return Choice("spark", f"{_mib(size)} of data files > query.embedded_max_bytes "
                               f"({_mib(limit)})")
    try:
        duck_sql = translate(pinned.sql, column_types(planned.values()))
        _refuse_equality_deletes(planned.values())
    except Untranslatable as exc:
        if requested == "duckdb":
            raise QueryError(f"--engine duckdb cannot run this query exactly: {exc}") from None
        return Choice("spark", f"not run embedded: {exc}")
    return Choice("duckdb", f"{_mib(size)} of data files", duck_sql, planned)


def _choose_for_duckdb_sql(config: Config, pinned: Plan, requested: str) -> Choice:
    """:func:`choose` for a query written in DuckDB's dialect: DuckDB runs it as written
    unless it is too big for ``auto`` or Spark is asked for; Spark only when it would
    answer by the same rules (:meth:`Plan.spark` raises otherwise)."""
    assert pinned.native is not None
    limit = config.query.embedded_max_bytes
    if requested == "spark":
        pinned.spark()
        return Choice("spark", "--engine spark")
    if requested == "auto" and limit == 0:
        return _spark_for_duckdb_sql(pinned, "query.embedded_max_bytes = 0")
    planned = plan_files(config, pinned)
    size = sum(p.bytes for p in planned.values())
    if requested == "auto" and size > limit:
        return _spark_for_duckdb_sql(pinned, f"{_mib(size)} of data files > "
                                             f"query.embedded_max_bytes ({_mib(limit)})")
    try:
        _refuse_equality_deletes(planned.values())
    except Untranslatable as exc:
        if requested == "duckdb":
            raise QueryError(f"--engine duckdb cannot run this query: {exc}") from None
        return _spark_for_duckdb_sql(pinned, f"not run embedded: {exc}")
    return Choice("duckdb", f"{_mib(size)} of data files, DuckDB SQL as written",
                  pinned.native, planned)


def _spark_for_duckdb_sql(pinned: Plan, reason: str) -> Choice:
    """Spark for a DuckDB-dialect query, or the one-line reason it would answer otherwise."""
    if pinned.spark_refusal is not None:
        raise QueryError(f"Spark would answer this query ({reason}), but "
                         f"{pinned.spark_refusal}")
    return Choice("spark", reason)


def _refuse_equality_deletes(planned: Iterable[Pinned]) -> None:
    """pyiceberg applies positional deletes but not equality deletes: refuse those."""
    for entry in planned:
        for task in entry.tasks:
            # pyiceberg's DataFileContent is an int enum, EQUALITY_DELETES = 2
            if any(d.content == EQUALITY_DELETES for d in task.delete_files):
                raise Untranslatable("equality deletes", f"{entry.table.name()} has "
                                     "equality delete files, which pyiceberg cannot apply")


EQUALITY_DELETES = 2  # pyiceberg's DataFileContent.EQUALITY_DELETES


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"
