"""Run models in DAG order on Spark and commit each result through pyiceberg.

Why each model decides alone whether to run: a rerun with the same SQL (hash) over the same
source snapshots would write the same rows, so it does nothing and says "up to date".
Otherwise, by materialization:

* ``view``: registered as a temp view for later models of the same run; nothing is stored.
* ``table``: the SELECT over all source rows replaces the table.
* ``append``: the SELECT over the *new* rows (``_sequence`` above the recorded watermark of
  each source) is appended.
* ``merge``: the keys (``unique_key``) the new rows produce are found, those keys are
  recomputed from all rows of the same pinned snapshots, and upserted. Recomputing keeps
  aggregates right (a count for a day is the count over the whole day, not over the last
  increment) at the price of scanning the pinned sources, of which Spark keeps only the
  rows of touched keys after the semi-join.

The first run of an incremental model, any ``--full-refresh``, and a run after a dead-letter
redrive into a source (redriven rows keep their old ``_sequence``, below the watermark)
compute everything and replace the table. The watermark and source snapshot ids commit with the rows
(:mod:`pipeline.models.state`), so a crash before the commit is simply recomputed.

Before the commit, the model's ``-- @audit:`` queries check the rows
(:mod:`pipeline.models.audit`); a failing audit stops the model like any error. The table's
schema follows the SQL in the same commit as the rows (:mod:`pipeline.iceberg.evolution`):
an output column whose expression stayed but whose name changed since the last run is a
rename (its data stays), not a drop plus an add.
A model fails alone: later models that read it are skipped, the others still run.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefloe.catalog_version import VERSION_PROP, claim_version_sync
from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.errors import IcefloeError
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import SEQUENCE_PROP
from pipeline.iceberg.evolution import EvolutionError
from pipeline.models.audit import run_audits
from pipeline.models.bind import (
    FULL,
    NEW,
    SEQUENCE,
    SHARD,
    Binding,
    bind_model,
    watermark_key,
)
from pipeline.models.dag import Project, check_tables, plan_project
from pipeline.models.spec import Model, ModelError, load_models
from pipeline.models.state import RunState, last_run, redriven_since
from pipeline.models.watermarks import shard_maxima
from pipeline.models.write import WriteFence, load_target, write_result
from pipeline.read.query import spark_error

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

Writer = Callable[..., None]
"""Same signature as :func:`pipeline.models.write.write_result`: the seam tests use to
inject a crash between computing a result and committing it."""


class RunVersion:
    """One model run's catalog version (:mod:`icefloe.catalog_version`), claimed at its
    first commit: every target the pass writes records the same one, a pass that commits
    nothing claims none. Inside a collector the claim is fenced by its epoch."""

    def __init__(self, config: Config, fence: WriteFence | None,
                 clock: Clock = SYSTEM) -> None:
        self.config = config
        self.clock = clock
        self.epoch = fence.epoch if fence is not None else None
        self.version: int | None = None

    def __call__(self) -> int:
        if self.version is None:
            from icefloe.store import open_store, options_for  # lazy: icefloe.store

            section = self.config.store
            store = open_store(section.control_url or section.url,
                               options_for(section.endpoint_url, section.region))
            try:
                self.version = claim_version_sync(store, epoch=self.epoch, clock=self.clock)
            finally:
                store.close()
        return self.version


@dataclass(frozen=True)
class Outcome:
    """What happened to one model: ``state`` is ran, up to date, view, failed or skipped;
    ``reason`` says why it failed or was skipped, or notes how it ran."""

    name: str
    state: str
    rows: int | None
    seconds: float
    reason: str = ""


def prepare(folder: Path, config: Config) -> Project:
    """Load, resolve, order and check every model: all errors before anything runs."""
    project = plan_project(load_models(folder), config)
    check_tables(project, config)
    return project


def model_hash(project: Project, model: Model) -> str:
    """The model's SQL hash, folded with those of the views it reads (their SQL is part of
    its result; a stored upstream shows up through its snapshot id instead)."""
    views = [project.models[u] for u in sorted(project.upstream(model.name))
             if not project.models[u].stored]
    if not views:
        return model.sql_hash
    parts = [model.sql_hash, *(model_hash(project, v) for v in views)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def last_runs(config: Config, models: Sequence[Model]) -> dict[str, RunState | None]:
    """Each stored model's last committed run (None: never ran, or a view)."""
    catalog = open_catalog(config.catalog)
    states: dict[str, RunState | None] = {}
    for model in models:
        table = load_target(catalog, model.target) if model.stored else None
        states[model.name] = last_run(table) if table is not None else None
    return states


def run_models(spark: SparkSession, project: Project, config: Config,
               names: Sequence[str] = (), *, full_refresh: bool = False,
               write: Writer = write_result, fence: WriteFence | None = None,
               run_id: str | None = None, clock: Clock = SYSTEM) -> list[Outcome]:
    """Run the named models (all when empty) in DAG order; one outcome per model.

    ``fence``: the collector's epoch; each write is refused once a newer collector took
    over (the outcome is ``failed`` with the reason). ``run_id``: recorded on every commit
    of this call (default: a fresh random one), so one pass's commits can be found
    together."""
    catalog = open_catalog(config.catalog)
    run_id = run_id or uuid.uuid4().hex[:16]
    failed: set[str] = set()
    outcomes: list[Outcome] = []
    version = RunVersion(config, fence, clock)
    for model in project.select(names):
        started = clock.monotonic()
        broken = [u for u in project.upstream(model.name) if u in failed]
        if broken:
            failed.add(model.name)
            outcomes.append(Outcome(model.name, "skipped", None, 0.0,
                                    f"upstream model {broken[0]} failed"))
            continue
        try:
            state, rows, reason = _run_one(spark, project, config, catalog, model,
                                           full_refresh=full_refresh, run_id=run_id,
                                           write=write, fence=fence, clock=clock,
                                           version=version)
        except IcefloeError as exc:
            failed.add(model.name)
            state, rows, reason = "failed", None, str(exc).splitlines()[0]
        except Exception as exc:  # Spark analysis/runtime errors: one line, like `query`
            failed.add(model.name)
            state, rows, reason = "failed", None, spark_error(exc, {})
        outcomes.append(Outcome(model.name, state, rows, clock.monotonic() - started, reason))
    return outcomes


def _run_one(spark: SparkSession, project: Project, config: Config, catalog: Catalog,
             model: Model, *, full_refresh: bool, run_id: str, write: Writer,
             fence: WriteFence | None = None, clock: Clock = SYSTEM,
             version: Callable[[], int] | None = None) -> tuple[str, int | None, str]:
    """Run one model: ``(state, rows, note)``; ``version`` claims the pass's catalog
    version (recorded on the commit)."""
    started = clock.monotonic()
    if not model.stored:
        binding = bind_model(spark, project, config, model, None)
        spark.sql(binding.sql[FULL])  # spark.sql analyses at once: a bad column fails here
        return "view", None, ""
    target = load_target(catalog, model.target)
    current = target.current_snapshot() if target is not None else None
    previous = last_run(target) if target is not None else None
    fresh = previous is None or full_refresh
    marks = None if not model.incremental else {} if fresh or previous is None \
        else dict(previous.watermarks)
    binding = bind_model(spark, project, config, model, marks)
    note = ""
    if marks and previous is not None and _redriven(binding, previous):
        # Redriven rows sit below the watermarks: only a full recompute includes them.
        marks, fresh, note = {}, True, "recomputed in full after a dead-letter redrive"
        binding = bind_model(spark, project, config, model, marks)
    elif marks and previous is not None:
        why = _not_incremental(project, model, binding, previous)
        if why:
            marks, fresh, note = {}, True, f"recomputed in full: {why}"
            binding = bind_model(spark, project, config, model, marks)
    digest = model_hash(project, model)
    if (not full_refresh and previous is not None and previous.sql_hash == digest
            and previous.sources == binding.sources):
        return "up to date", None, ""
    result, mode = _compute(spark, model, binding, incremental=not fresh)
    run_audits(spark, model, result)
    if marks is not None:
        marks = _watermarks(spark, binding, marks)
    select = model.select_items()
    properties = RunState(model.name, digest, result.num_rows, run_id, binding.sources,
                          marks or {}, kind=model.materialized, sql_sha256=model.sql_sha256,
                          duration_ms=round((clock.monotonic() - started) * 1000),
                          select=select).properties()
    if version is not None:
        properties[VERSION_PROP] = str(version())
    try:
        write(catalog, model.target, result, mode=mode, unique_key=model.unique_key,
              properties=properties,
              expected_snapshot_id=current.snapshot_id if current else None, fence=fence,
              renames=renamed_columns(previous.select if previous else {}, select))
    except EvolutionError as exc:
        raise ModelError(f"model {model.name}: {exc}; nothing committed. Give the new "
                         "values a new column name, or drop the table and run again") from exc
    return "ran", result.num_rows, note


def renamed_columns(before: dict[str, str], now: dict[str, str]) -> dict[str, str]:
    """``{old name: new name}`` for output columns whose expression is unchanged while
    their name changed: the old name is gone from ``now``, the new one was not in
    ``before``, and exactly one such pair has that expression (else it is ambiguous and
    treated as a drop plus an add)."""
    gone = {name: expr for name, expr in before.items() if name not in now}
    new = {name: expr for name, expr in now.items() if name not in before}
    renames: dict[str, str] = {}
    for old, expr in gone.items():
        olds = [o for o, e in gone.items() if e == expr]
        news = [n for n, e in new.items() if e == expr]
        if len(olds) == 1 and len(news) == 1:
            renames[old] = news[0]
    return renames


def _compute(spark: SparkSession, model: Model, binding: Binding, *, incremental: bool
             ) -> tuple[pa.Table, str]:
    """The rows to write and how: ``overwrite``, ``append`` or ``merge``."""
    if model.materialized == "merge":
        sql = binding.sql[FULL]
        if incremental:
            sql = affected_keys_sql(binding.sql[FULL], binding.sql[NEW], model.unique_key)
        frame = spark.sql(sql)
        missing = [k for k in model.unique_key if k not in frame.columns]
        if missing:
            raise ModelError(f"model {model.name}: unique_key column(s) {', '.join(missing)} "
                             f"are not in its result ({', '.join(frame.columns)})")
        result = frame.toArrow()
        check_unique_key(model, result)
        return result, "merge" if incremental else "overwrite"
    if model.materialized == "append" and incremental:
        return spark.sql(binding.sql[NEW]).toArrow(), "append"
    return spark.sql(binding.sql[FULL]).toArrow(), "overwrite"


def check_unique_key(model: Model, result: pa.Table) -> None:
    """A merge result has one row per key and no null key (an upsert cannot match null),
    checked on every run so the first full run cannot store what later upserts refuse."""
    import pyarrow.compute as pc  # lazy: pyarrow.compute

    key = list(model.unique_key)
    for column in key:
        nulls = result[column].null_count
        if nulls:
            raise ModelError(f"model {model.name}: unique_key column {column} is null in "
                             f"{nulls} row(s); filter or coalesce them")
    counts = result.select(key).group_by(key).aggregate([([], "count_all")])
    duplicated = counts.filter(pc.greater(counts["count_all"], 1))
    if duplicated.num_rows:
        example = {k: v for k, v in duplicated.to_pylist()[0].items() if k != "count_all"}
        raise ModelError(f"model {model.name}: {duplicated.num_rows} unique_key value(s) "
                         f"occur more than once, e.g. {example}")


def _not_incremental(project: Project, model: Model, binding: Binding,
                     previous: RunState) -> str:
    """Why this run of an incremental model must recompute in full, or "" when the rows
    past the watermarks are all it needs to read. Why each:

    * a source read whole (no ``_sequence``: a lookup table) changed: the rows already
      written were computed from its old contents;
    * an incremental source had rows replaced or deleted since the previous run (a keyed
      table's upsert, a change stream's update or delete, a truncate): the new rows do not
      show what left, and a replaced row's new version is a new row;
    * a ``merge`` whose result for a key can depend on rows the new ones do not reach:
      ``HAVING``, ``QUALIFY``, a window, ``LIMIT``, or a join of two incremental sources
      (a new row of one meets old rows of the other, which the new rows alone never join).
    """
    for key, pin in binding.pins.items():
        if key != pin.identifier:
            continue  # time-travelled: pinned by the SQL itself
        before = previous.sources.get(key)
        if pin.new_view is None and before is not None and pin.snapshot_id != before:
            return f"{pin.identifier} is read whole (no _sequence) and changed"
        if pin.new_view is not None and rows_replaced_since(pin.table, before):
            return (f"{pin.identifier} had rows replaced or deleted since the last run (an "
                    "upsert, a change stream's update or delete, a truncate)")
    if model.materialized == "merge":
        incremental = sorted(binding.incremental())
        if len(incremental) > 1:
            return (f"a merge reading {len(incremental)} incremental sources "
                    f"({', '.join(incremental)}) recomputes in full: a new row of one "
                    "meets old rows of the others")
        shape = key_dependent_shape(project, model)
        if shape:
            return (f"a merge with {shape} recomputes in full: a key's result can depend "
                    "on rows the new ones do not reach")
    return ""


def key_dependent_shape(project: Project, model: Model) -> str:
    """The first construct of ``model`` (or of a view it reads) that makes a key's result
    depend on more than that key's new rows, or ""."""
    from sqlglot import exp  # lazy: only incremental runs

    seen: set[str] = set()
    trees = [model.tree]
    while trees:
        tree = trees.pop()
        for kind, name in ((exp.Having, "HAVING"), (exp.Qualify, "QUALIFY"),
                           (exp.Window, "a window function"), (exp.Limit, "LIMIT"),
                           (exp.Offset, "OFFSET")):
            if tree.find(kind) is not None:
                return name
        for table in tree.find_all(exp.Table):
            name = ".".join(p for p in (table.db, table.name) if p)
            upstream = project.models.get(name)
            if upstream is not None and not upstream.stored and name not in seen:
                seen.add(name)
                trees.append(upstream.tree)
    return ""


def rows_replaced_since(table: Any, snapshot_id: int | None) -> bool:
    """Whether a commit to ``table`` after ``snapshot_id`` replaced or deleted rows: an
    ``overwrite`` or ``delete`` snapshot, except a compaction (same rows, which carries its
    parent's ``icefloe.sequence``). Walks back to ``snapshot_id`` (or where expiry cut the
    log)."""
    snapshot = table.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != snapshot_id:
        summary = snapshot.summary
        operation = str(summary.operation.value) if summary is not None else ""
        parent_id = snapshot.parent_snapshot_id
        parent = table.snapshot_by_id(parent_id) if parent_id is not None else None
        if operation in ("overwrite", "delete"):
            mine = summary.additional_properties.get(SEQUENCE_PROP) if summary else None
            theirs = parent.summary.additional_properties.get(SEQUENCE_PROP) \
                if parent is not None and parent.summary is not None else None
            if mine is None or mine != theirs:
                return True
        snapshot = parent
    return False


def _redriven(binding: Binding, previous: RunState) -> bool:
    """Whether an incremental source got a dead-letter redrive since the previous run."""
    return any(redriven_since(pin.table, previous.sources.get(identifier))
               for identifier, pin in binding.incremental().items())


def affected_keys_sql(full: str, new: str, key: Sequence[str]) -> str:
    """Rows of ``full`` whose key some row of ``new`` has (null-safe key equality)."""
    columns = ", ".join(f"`{k}`" for k in key)
    match = " AND ".join(f"__full.`{k}` <=> __keys.`{k}`" for k in key)
    return (f"SELECT __full.* FROM ({full}) AS __full LEFT SEMI JOIN "
            f"(SELECT DISTINCT {columns} FROM ({new}) AS __new) AS __keys ON {match}")


def _watermarks(spark: SparkSession, binding: Binding, previous: dict[str, int]
                ) -> dict[str, int]:
    """Highest ``_sequence`` per manifest shard of each incremental source's pinned
    snapshot (see :func:`pipeline.models.bind.watermark_key`; kept where no rows): from the
    data files' statistics where they are exact, else a Spark job over the new rows."""
    marks: dict[str, int] = {}
    for identifier, source in binding.incremental().items():
        view = source.new_view
        for key, value in previous.items():
            if key == identifier or key.startswith(f"{identifier}#"):
                marks[key] = value
        maxima = shard_maxima(source.table, source.snapshot_id)
        if maxima is not None:  # the files' bounds: no Spark job (pipeline.models.watermarks)
            for number, highest in maxima.items():
                key = watermark_key(identifier, number)
                marks[key] = max(marks.get(key, highest), highest)
            continue
        shard = f"coalesce({SHARD}, 0)" if SHARD in source.table.schema().column_names \
            else "0"
        rows: Any = spark.sql(f"SELECT {shard} AS s, max({SEQUENCE}) AS m FROM {view} "
                              "GROUP BY 1").collect()
        for row in rows:
            if row[1] is not None:
                marks[watermark_key(identifier, int(row[0]))] = int(row[1])
    return marks
