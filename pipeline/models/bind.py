"""Turn one model into Spark SQL over snapshot-pinned temp views, in two variants.

Why two variants: an incremental model needs its SELECT over *new* source rows (``_sequence``
above the model's watermark for that source) and, for ``merge``, also over *all* rows of the
same pinned snapshots (to recompute the keys the new rows touched). ``full`` reads every
pinned source whole; ``new`` reads each source that has a ``_sequence`` column filtered by
its watermark (a source without one, such as a dimension table, is read whole in both).

Every source table is pinned once per model run: the same snapshot in both variants and in
every upstream view, so a run reads one consistent state. A ``view`` model upstream is not
stored: its SQL is rewritten the same way and registered as a temp view per variant. A
stored model upstream is read from its target table, as committed (it ran earlier in this
run when it was selected). ``AT (VERSION|TIMESTAMP => ...)`` or ``FOR VERSION|TIMESTAMP AS
OF`` pins one reference to an older snapshot; such a reference is never filtered by a
watermark.

Temp views are per SparkSession and replaced on every model run: not thread-safe, one run
at a time per session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from icefloe.config import Config
from pipeline.models.dag import Project, Resolver, references
from pipeline.models.spec import Model, ModelError
from pipeline.read.query import (
    AsOf,
    QueryError,
    catalog_versions,
    pin,
    point_at,
    spark_sql,
    time_travel,
)

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

SEQUENCE = "_sequence"
SHARD = "_shard"
FULL, NEW = "full", "new"


def watermark_key(identifier: str, shard: int) -> str:
    """Key of a source's watermark for one manifest shard: ``_sequence`` is ordered only
    within a shard, so an incremental model keeps one watermark per ``(source, shard)``.
    Shard 0's key is the identifier itself, as watermarks of older runs are."""
    return identifier if shard == 0 else f"{identifier}#{shard}"


def shard_watermarks(watermarks: dict[str, int], identifier: str) -> dict[int, int]:
    """The watermarks of ``identifier`` per shard."""
    prefix = f"{identifier}#"
    marks = {int(k[len(prefix):]): v for k, v in watermarks.items() if k.startswith(prefix)}
    if identifier in watermarks:
        marks[0] = watermarks[identifier]
    return marks


def new_rows_filter(marks: dict[int, int], has_shard: bool) -> str:
    """The rows past the watermarks, shard by shard (pyiceberg filter syntax). Rows without
    ``_shard`` (null, or no such column) are shard 0's; a shard without a watermark is new
    whole."""
    if not has_shard:
        return f"{SEQUENCE} > {int(marks.get(0, -1))}"
    terms = []
    for shard, mark in sorted(marks.items()):
        which = f"({SHARD} IS NULL OR {SHARD} = 0)" if shard == 0 else f"{SHARD} = {shard}"
        terms.append(f"({which} AND {SEQUENCE} > {int(mark)})")
    listed = ", ".join(str(shard) for shard in sorted(marks))
    terms.append(f"({SHARD} IS NOT NULL AND {SHARD} NOT IN ({listed}))")
    if 0 not in marks:
        terms.append(f"{SHARD} IS NULL")
    return " OR ".join(terms)


@dataclass
class Pin:
    """One source table at one snapshot, with its views."""

    identifier: str
    snapshot_id: int | None
    full_view: str
    table: Table
    new_view: str | None = None  # None: no _sequence column or time-travelled: read whole


@dataclass
class Binding:
    """Spark SQL of the model per variant, and what it read."""

    sql: dict[str, str]
    pins: dict[str, Pin] = field(default_factory=dict)

    @property
    def sources(self) -> dict[str, int | None]:
        """``{source key: snapshot id}``: what change detection compares."""
        return {key: p.snapshot_id for key, p in sorted(self.pins.items())}

    def incremental(self) -> dict[str, Pin]:
        """Sources the watermarks apply to (``_sequence``, not time-travelled)."""
        return {p.identifier: p for p in self.pins.values() if p.new_view is not None}


class Binder:
    """Registers views and rewrites SQL for one model run (see the module docstring)."""

    def __init__(self, spark: SparkSession, project: Project, config: Config,
                 watermarks: dict[str, int] | None) -> None:
        self.spark = spark
        self.project = project
        self.config = config
        self.watermarks = watermarks  # None: no incremental filtering at all
        self.resolver = Resolver(project.models.values(), config)
        self.pins: dict[str, Pin] = {}
        self._views: dict[tuple[str, str], str] = {}
        self._tables: dict[str, Table] = {}

    def bind(self, model: Model) -> Binding:
        variants = (FULL, NEW) if self.watermarks is not None else (FULL,)
        sql = {variant: self.rewrite(model, variant) for variant in variants}
        return Binding(sql, dict(self.pins))

    def rewrite(self, model: Model, variant: str) -> str:
        """The model's SELECT in Spark SQL, reading only this run's temp views."""
        tree = model.tree.copy()
        for node in references(tree):
            ref = self.resolver.resolve(model, node)
            clause = time_travel(node)
            upstream = self.project.models.get(ref.name) if ref.kind == "model" else None
            if upstream is not None and not upstream.stored:
                view = self._model_view(upstream, variant)
            else:
                identifier = upstream.target if upstream is not None else ref.name
                source = self._pin(identifier, clause)
                view = source.full_view
                if variant == NEW and source.new_view is not None:
                    view = source.new_view
            point_at(node, view)
        try:
            return spark_sql(tree, model.dialect)
        except QueryError as exc:
            raise ModelError(f"model {model.name}: {exc}") from None

    def _model_view(self, model: Model, variant: str) -> str:
        key = (model.name, variant)
        if key not in self._views:
            name = f"__model_{variant}_{model.name.replace('.', '__')}"
            self.spark.sql(self.rewrite(model, variant)).createOrReplaceTempView(name)
            self._views[key] = name
        return self._views[key]

    def _pin(self, identifier: str, clause: AsOf | None) -> Pin:
        from pipeline.read.iceberg_source import load_table, read_table  # lazy: pyspark

        if clause is None and identifier in self.pins:
            return self.pins[identifier]
        if identifier not in self._tables:
            self._tables[identifier] = load_table(self.config.catalog, identifier)
        table = self._tables[identifier]
        snapshot = pin(table, identifier, clause,
                       catalog_versions(self.config, self._tables.values(), [clause]))
        key = identifier if clause is None else f"{identifier}@{snapshot}"
        if key in self.pins:
            return self.pins[key]
        full = f"__src_{len(self.pins)}_{identifier.replace('.', '_')}"
        read_table(self.spark, self.config.catalog, identifier,
                   snapshot_id=snapshot).createOrReplaceTempView(full)
        source = Pin(identifier, snapshot, full, table)
        has_sequence = SEQUENCE in table.schema().column_names
        if self.watermarks is not None and clause is None and has_sequence:
            marks = shard_watermarks(self.watermarks, identifier)
            source.new_view = full
            if marks:
                source.new_view = f"{full}_new"
                has_shard = SHARD in table.schema().column_names
                read_table(self.spark, self.config.catalog, identifier, snapshot_id=snapshot,
                           row_filter=new_rows_filter(marks, has_shard)
                           ).createOrReplaceTempView(source.new_view)
        self.pins[key] = source
        return source


def bind_model(spark: SparkSession, project: Project, config: Config, model: Model,
               watermarks: dict[str, int] | None) -> Binding:
    """Register ``model``'s views; ``watermarks`` None for a model that is not incremental.

    Raises:
        ModelError: an incremental model reads no source with a ``_sequence`` column.
    """
    binding = Binder(spark, project, config, watermarks).bind(model)
    if watermarks is not None and not binding.incremental():
        raise ModelError(f"model {model.name} is {model.materialized} but reads no table "
                         f"with a {SEQUENCE} column to take new rows from")
    return binding
