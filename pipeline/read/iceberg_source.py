"""``icefloe-iceberg``: read icefloe's Iceberg tables into Spark without JVM Iceberg packages.

Why this exists: Spark here cannot load ``iceberg-spark-runtime`` (no Maven), yet SQL models
and ad-hoc queries want Spark over the committed tables. pyiceberg already knows the table
format (snapshots, manifests, schema evolution by field id, positional deletes), so it does
the Iceberg part and Spark does the compute:

* **Planning** (a Spark planner Python worker, on the driver host): open the catalog, load
  the table, pin a snapshot, derive the Spark schema from that snapshot's Iceberg schema,
  ``plan_files()`` (pruned by the ``filter`` option), and group the ``FileScanTask``\\ s into a
  few size-balanced partitions (2-8: one task per file would pay ~35 ms of worker overhead
  per file). Each partition carries its tasks plus a slimmed copy of the table metadata and
  the FileIO properties, so executors never talk to the catalog.
* **Reading** (executors' Python workers): pyiceberg's ``ArrowScan`` reads each task's
  Parquet files, projecting by field id (renamed/added columns come out right, added columns
  read as null in old files) and applying positional deletes; every batch is cast to exactly
  ``to_arrow_schema(spark_schema, timezone="UTC")`` (``string`` not ``large_string``, ``us``
  timestamps), which Spark requires of Arrow batches.

Use::

    spark.read.format("icefloe-iceberg")
        .option("table", "web.clicks")
        .option("catalog", catalog_option(config.catalog))   # JSON of CatalogSection
        .option("snapshot_id", "123")                         # optional: time travel
        .load()

or :func:`read_table` / :func:`register_views`. Other options: ``filter`` (a pyiceberg row
filter such as ``n > 10 and user_id = 'u1'``: part of the DataFrame's definition, used to
prune files *and* rows), ``partitions`` (upper bound on Spark partitions, default 8) and
``pushdown`` (``true`` to prune files with Spark's pushed filters; see below).

Snapshot pinning: a loaded DataFrame (and a view made from it) reads the snapshot that was
current when it was loaded, so its schema and data always agree and repeated queries are
consistent. Load it again (or call :func:`register_views` again) to see newer commits.

Filter pushdown is **off by default** because of a Spark 4.3.0 bug, not a design choice: with
``pushdown=true`` (and ``spark.sql.python.filterPushdown.enabled=true``), simple comparisons,
``IN``, ``IS [NOT] NULL`` and ``LIKE 'x%'`` on top-level columns become a pyiceberg
``row_filter`` used only to prune files, and every filter is still handed back to Spark to
evaluate on the rows. But Spark 4.3.0 stores the partitions planned during pushdown on the
data source *provider*, which every later scan of the same DataFrame or temp view reuses: after
``SELECT ... FROM v WHERE n > 10``, a plain ``SELECT count(*) FROM v`` reads only the pruned
files and returns too few rows (measured here; newer Spark keeps that state per scan). So
enable it only for a DataFrame queried once, and use the ``filter`` option (or
``read_table(..., row_filter=...)``) for pruning that is always safe.

Naming: :func:`register_views` names a temp view after the table with dots replaced by
underscores (``web.clicks`` → ``web_clicks``), so SQL needs no backticks. A Spark temp view
cannot carry a two-part name, and ``web.clicks`` unquoted would mean "table clicks in
database web" of Spark's own (empty) catalog.

Security note: the ``catalog`` option holds the catalog section as given, including any
password in ``uri`` or secret ``properties``, and Spark may show data source options in
query plans. Prefer credentials from the environment (IAM roles, ``PGPASSWORD``).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import msgspec
import pyarrow as pa
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    LessThanOrEqual,
    NotNull,
    StartsWith,
)
from pyiceberg.expressions.parser import parse
from pyiceberg.expressions.visitors import bind
from pyiceberg.io import load_file_io
from pyiceberg.io.pyarrow import ArrowScan, schema_to_pyarrow
from pyiceberg.schema import Schema
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.datasource import EqualTo as SparkEqualTo
from pyspark.sql.datasource import Filter as SparkFilter
from pyspark.sql.datasource import GreaterThan as SparkGreaterThan
from pyspark.sql.datasource import GreaterThanOrEqual as SparkGreaterThanOrEqual
from pyspark.sql.datasource import In as SparkIn
from pyspark.sql.datasource import IsNotNull as SparkIsNotNull
from pyspark.sql.datasource import IsNull as SparkIsNull
from pyspark.sql.datasource import LessThan as SparkLessThan
from pyspark.sql.datasource import LessThanOrEqual as SparkLessThanOrEqual
from pyspark.sql.datasource import StringStartsWith as SparkStringStartsWith
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from icefloe.config import CatalogSection
from icefloe.errors import CatalogError
from pipeline.iceberg.pyiceberg_fixes import install as _install_fixes
from pipeline.read.inline_scan import INLINE_MAX_BYTES, conform, inline_frame, task_size
from pipeline.read.tables import load_table, resolve_snapshot

_install_fixes()  # executors scan with pyiceberg too: keep null lists of structs null

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask
    from pyiceberg.table.metadata import TableMetadata
    from pyspark.sql import DataFrame, SparkSession

FORMAT = "icefloe-iceberg"
DEFAULT_MAX_PARTITIONS = 8
MIN_PARTITIONS = 2  # both local cores busy even for small tables
TARGET_PARTITION_BYTES = 64 * 1024 * 1024  # beyond 2 partitions, add one per ~64 MiB

_PLAIN_VALUES = (bool, int, float, str, Decimal, dt.date)  # dt.datetime is a dt.date


# --------------------------------------------------------------------------- public helpers


def catalog_option(section: CatalogSection) -> str:
    """The ``catalog`` option value: the section's fields as JSON."""
    return msgspec.json.encode(section).decode()


def view_name(identifier: str) -> str:
    """Temp view name for a table: ``web.clicks`` → ``web_clicks`` (no backticks needed)."""
    return identifier.replace(".", "_")


def register(spark: SparkSession) -> None:
    """Register the data source as ``icefloe-iceberg`` on this session.

    Session settings are left alone: opting into ``pushdown=true`` also needs
    ``spark.sql.python.filterPushdown.enabled=true`` (Spark's error names it).
    """
    spark.dataSource.register(IcebergDataSource)


def read_table(spark: SparkSession, catalog: CatalogSection, identifier: str,
               snapshot_id: int | None = None, row_filter: str | None = None, *,
               inline_max_bytes: int = INLINE_MAX_BYTES) -> DataFrame:
    """The table (at ``snapshot_id``, else its current snapshot) as a Spark DataFrame.

    ``row_filter`` (pyiceberg syntax, e.g. ``"n > 10"``) keeps only matching rows and skips
    files that cannot hold any: the safe way to prune (see the module docstring).

    A snapshot whose files add up to at most ``inline_max_bytes`` is read here on the
    driver and handed to Spark as rows (:mod:`pipeline.read.inline_scan`: the same rows,
    without the data source's Python workers); 0 always uses the data source.

    The table and snapshot are checked here first, so a wrong name raises a one-line
    :class:`CatalogError` instead of a Spark analysis error wrapping a Python traceback.
    The resolved snapshot is passed on, so the DataFrame reads exactly what was checked.
    """
    table = load_table(catalog, identifier)
    resolved = resolve_snapshot(table, identifier, snapshot_id)
    projected = table.scan(snapshot_id=resolved).projection()
    if row_filter:
        check_filter(projected, identifier, row_filter)
    schema = spark_schema(projected)
    if inline_max_bytes > 0:
        frame = inline_frame(spark, table, resolved, schema, row_filter, inline_max_bytes)
        if frame is not None:
            return frame
    # The schema is known here: handing it over spares the Python worker Spark would start
    # to ask IcebergDataSource.schema() (a catalog load and metadata read, ~0.1 s a view).
    reader = (spark.read.format(FORMAT).option("table", identifier)
              .option("catalog", catalog_option(catalog)).schema(schema))
    reader = reader.option("snapshot_id", "none" if resolved is None else str(resolved))
    if row_filter:
        reader = reader.option("filter", row_filter)
    return reader.load()


def register_views(spark: SparkSession, catalog: CatalogSection, identifiers: Iterable[str]
                   ) -> dict[str, str]:
    """Create (or replace) one temp view per table; return ``{identifier: view name}``.

    Each view is pinned to the table's snapshot at the time of this call (see the module
    docstring); call again to move the views to the latest commits.
    """
    views: dict[str, str] = {}
    for identifier in identifiers:
        name = view_name(identifier)
        read_table(spark, catalog, identifier).createOrReplaceTempView(name)
        views[identifier] = name
    return views


# ------------------------------------------------------------------------- catalog + schema


def check_filter(schema: Schema, identifier: str, row_filter: str) -> None:
    """Fail early, in one line, on a ``filter`` that does not parse or names no column."""
    try:
        bind(schema, parse(row_filter), case_sensitive=True)
    except Exception as exc:  # pyparsing and binding errors alike
        reason = " ".join(str(exc).split())[:300]
        raise ValueError(f"filter {row_filter!r} does not fit table {identifier!r}: "
                         f"{reason}") from exc


def arrow_schema(schema: Schema) -> pa.Schema:
    """The Iceberg schema as Arrow, with extension types (``uuid``) reduced to storage."""
    arrow = schema_to_pyarrow(schema, include_field_ids=False)
    return pa.schema([_plain_field(f) for f in arrow])


def spark_schema(schema: Schema) -> StructType:
    """The Spark schema of an Iceberg schema.

    ``timestamptz`` → ``TimestampType`` (an instant); Iceberg ``timestamp`` without zone →
    ``TimestampNTZType``, as Iceberg's own Spark connector maps it, so wall-clock values do
    not shift with the session time zone. ``string`` → ``StringType`` (never large). Iceberg
    ``required`` becomes ``nullable=False``.
    """
    arrow = arrow_schema(schema)
    try:
        return from_arrow_schema(arrow, prefer_timestamp_ntz=True)
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise TypeError(f"cannot map Iceberg schema to Spark: {exc}") from exc


def _plain_field(field: pa.Field) -> pa.Field:
    return field.with_type(_plain_type(field.type))


def _plain_type(kind: pa.DataType) -> pa.DataType:
    if isinstance(kind, pa.BaseExtensionType):  # uuid is a canonical (built-in) one
        return _plain_type(kind.storage_type)
    if pa.types.is_struct(kind):
        return pa.struct([_plain_field(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_large_list(kind) or pa.types.is_list(kind):
        return pa.list_(_plain_field(kind.value_field))
    if pa.types.is_map(kind):
        return pa.map_(_plain_field(kind.key_field), _plain_field(kind.item_field))
    return kind


# --------------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class _ReadContext:
    """What an executor needs besides its tasks: no catalog, no snapshot list."""

    metadata: TableMetadata
    io_properties: dict[str, str]
    projected: Schema
    row_filter: str | None  # the ``filter`` option: applied to rows, not only to files


class _Partition(InputPartition):
    def __init__(self, tasks: list[FileScanTask], context: _ReadContext | None) -> None:
        super().__init__(len(tasks))
        self.tasks = tasks
        self.context = context


def group_tasks(tasks: Sequence[FileScanTask], max_partitions: int = DEFAULT_MAX_PARTITIONS
                ) -> list[list[FileScanTask]]:
    """Size-balanced groups: at least 2 (both cores), one more per 64 MiB, at most ``max``.

    Why not one per file: each Spark task costs ~35 ms of Python worker overhead.
    """
    if not tasks:
        return []
    total = sum(task_size(t) for t in tasks)
    wanted = max(MIN_PARTITIONS, math.ceil(total / TARGET_PARTITION_BYTES))
    count = max(1, min(len(tasks), max_partitions, wanted))
    groups: list[list[FileScanTask]] = [[] for _ in range(count)]
    sizes = [0] * count
    for task in sorted(tasks, key=lambda t: -task_size(t)):
        smallest = sizes.index(min(sizes))
        groups[smallest].append(task)
        sizes[smallest] += task_size(task)
    return [g for g in groups if g]


def _slim(metadata: TableMetadata) -> TableMetadata:
    """Metadata without the snapshot history (it grows ~0.8 KB per commit).

    ``ArrowScan`` needs only schemas, partition specs, properties (name mapping) and the
    format version; the copy is pickled once per partition.
    """
    return metadata.model_copy(update={"snapshots": [], "snapshot_log": [], "metadata_log": [],
                                       "refs": {}, "current_snapshot_id": None})


class _Unset:
    """Marks "no snapshot pinned yet" (``None`` already means "empty table")."""


_UNSET = _Unset()


# ----------------------------------------------------------------------- the data source


class IcebergReader(DataSourceReader):
    """Plans on the driver side, reads on executors; no filter pushdown."""

    def __init__(self, catalog: CatalogSection, identifier: str,
                 snapshot_id: int | _Unset | None, schema: StructType,
                 max_partitions: int, row_filter: str | None = None) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self.snapshot_id = snapshot_id
        self.schema = schema
        self.max_partitions = max_partitions
        self.row_filter = row_filter
        self.pushed: list[BooleanExpression] = []  # from Spark: prune files only

    def partitions(self) -> list[InputPartition]:
        table = load_table(self.catalog, self.identifier)
        snapshot_id = (resolve_snapshot(table, self.identifier, None)
                       if isinstance(self.snapshot_id, _Unset) else self.snapshot_id)
        if snapshot_id is None:
            return [_Partition([], None)]
        if table.snapshot_by_id(snapshot_id) is None:
            raise CatalogError(f"snapshot {snapshot_id} of table {self.identifier!r} no longer "
                               "exists (expired since the DataFrame was loaded); load it again")
        scan = table.scan(snapshot_id=snapshot_id, row_filter=self.row_filter or AlwaysTrue())
        projected = scan.projection()
        pruning = And(scan.row_filter, self._pushed_filter(projected))
        tasks = list(scan.update(row_filter=pruning).plan_files())
        context = _ReadContext(_slim(table.metadata), dict(table.io.properties), projected,
                               self.row_filter)
        groups = group_tasks(tasks, self.max_partitions)
        return [_Partition(g, context) for g in groups] or [_Partition([], None)]

    def _pushed_filter(self, schema: Schema) -> BooleanExpression:
        """AND of the pushed expressions that bind to the schema; the rest are dropped.

        Dropping is safe: Spark re-applies every filter to the rows.
        """
        result: BooleanExpression = AlwaysTrue()
        for expression in self.pushed:
            try:
                bind(schema, expression, case_sensitive=True)
            except Exception:  # wrong type or unknown column: prune nothing with it
                continue
            result = And(result, expression)
        return result

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        tasks: list[FileScanTask] = getattr(partition, "tasks", [])
        context: _ReadContext | None = getattr(partition, "context", None)
        if not tasks or context is None:
            return
        target = to_arrow_schema(self.schema, timezone="UTC")
        io = load_file_io(context.io_properties, context.metadata.location)
        rows = parse(context.row_filter) if context.row_filter else AlwaysTrue()
        scan = ArrowScan(context.metadata, io, context.projected, rows)
        for batch in scan.to_record_batches(tasks):
            if batch.num_rows:
                yield conform(batch, target)


class PushdownIcebergReader(IcebergReader):
    """:class:`IcebergReader` that also prunes files with Spark's pushed filters.

    Opt-in (``pushdown=true``) because of the Spark 4.3.0 reuse bug in the module docstring.
    """

    def pushFilters(self, filters: list[SparkFilter]) -> Iterable[SparkFilter]:
        """Keep an Iceberg version of each filter we understand; hand all back to Spark."""
        for spark_filter in filters:
            expression = to_iceberg_filter(spark_filter)
            if expression is not None:
                self.pushed.append(expression)
        return filters


def to_iceberg_filter(spark_filter: SparkFilter) -> BooleanExpression | None:
    """The pyiceberg expression for a simple Spark filter on a top-level column, else None.

    ``Not``, ``EqualNullSafe``, nested columns, and values pyiceberg has no literal for are
    not translated (``None``): the read is then just less pruned.
    """
    attribute: tuple[str, ...] = getattr(spark_filter, "attribute", ())
    if len(attribute) != 1:
        return None
    name = attribute[0]
    if isinstance(spark_filter, SparkIsNull):
        return IsNull(name)
    if isinstance(spark_filter, SparkIsNotNull):
        return NotNull(name)
    if isinstance(spark_filter, SparkIn):
        values = tuple(spark_filter.value)
        if not values or not all(_literal_ok(v) for v in values):
            return None
        return In(name, values)
    if isinstance(spark_filter, SparkStringStartsWith):
        return StartsWith(name, spark_filter.value) if spark_filter.value else None
    comparisons: Mapping[type, Any] = {
        SparkEqualTo: EqualTo, SparkGreaterThan: GreaterThan,
        SparkGreaterThanOrEqual: GreaterThanOrEqual, SparkLessThan: LessThan,
        SparkLessThanOrEqual: LessThanOrEqual,
    }
    build = comparisons.get(type(spark_filter))
    value = getattr(spark_filter, "value", None)
    if build is None or not _literal_ok(value):
        return None
    return build(name, value)


def _literal_ok(value: object) -> bool:
    """Values pyiceberg turns into the same literal Spark compared with.

    A naive ``datetime`` is refused: whether it means UTC or the session's zone depends on
    the column type, and guessing wrong would prune files that hold matching rows.
    """
    if isinstance(value, dt.datetime):
        return value.tzinfo is not None
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, _PLAIN_VALUES)


class IcebergDataSource(DataSource):
    """``spark.read.format("icefloe-iceberg").option("table", ...).option("catalog", ...)``."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        table = options.get("table")
        if not table:
            raise ValueError(f"{FORMAT}: option 'table' (namespace.table) is required")
        self.identifier: str = table
        raw = options.get("catalog")
        try:
            self.catalog = (msgspec.json.decode(raw, type=CatalogSection) if raw
                            else CatalogSection())
        except msgspec.ValidationError as exc:
            raise ValueError(f"{FORMAT}: option 'catalog' is not a JSON catalog section "
                             f"({exc})") from exc
        snapshot = options.get("snapshot_id")
        # "none" pins "empty table" (read_table resolved it); absent means "current".
        self.snapshot_id: int | _Unset | None = (
            _UNSET if snapshot is None or snapshot == "" else
            None if snapshot.lower() == "none" else int(snapshot))
        self.max_partitions = max(1, int(options.get("partitions", DEFAULT_MAX_PARTITIONS)))
        self.pushdown = options.get("pushdown", "false").lower() == "true"
        self.row_filter: str | None = options.get("filter") or None

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        """The pinned snapshot's schema; pins the current snapshot if none was asked for.

        Spark pickles this instance after ``schema()``, so the pin travels with the plan.
        """
        table = load_table(self.catalog, self.identifier)
        if isinstance(self.snapshot_id, _Unset):
            self.snapshot_id = resolve_snapshot(table, self.identifier, None)
        elif self.snapshot_id is not None:
            resolve_snapshot(table, self.identifier, self.snapshot_id)
        projected = table.scan(snapshot_id=self.snapshot_id).projection()
        if self.row_filter:
            check_filter(projected, self.identifier, self.row_filter)
        return spark_schema(projected)

    def reader(self, schema: StructType) -> DataSourceReader:
        kind = PushdownIcebergReader if self.pushdown else IcebergReader
        return kind(self.catalog, self.identifier, self.snapshot_id, schema,
                    self.max_partitions, self.row_filter)
