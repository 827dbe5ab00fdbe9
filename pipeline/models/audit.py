"""Run a model's ``-- @audit:`` queries over the rows it is about to commit.

Why before the commit and over the result itself: an audit guards what lands in the table,
so it must see exactly those rows (``this``: the rows this run writes — all of them for a
``table`` model or a full refresh, the new rows for an ``append``, the recomputed keys for a
``merge``) and must be able to stop them. A failed audit raises, so the runner never calls
the writer: nothing is committed and the model's watermark stays where it was, and the
next run computes the same rows again.

The rows are handed to Spark as an Arrow table (no second evaluation of the model's SQL),
under a temporary view that replaces ``this`` in each audit's tree. An audit is written in
the model's dialect and goes to Spark SQL the way the model does
(:func:`pipeline.read.query.spark_sql`): a construct Spark would answer by other rules is
refused naming it (before Spark starts, by :func:`pipeline.models.dag.check_model_sql`),
never checked by Spark's rules.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from pipeline.models.spec import THIS, Audit, Model, ModelError
from pipeline.read.query import QueryError, spark_sql

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

SHOWN_ROWS = 5
"""How many failing rows an audit error shows."""


def run_audits(spark: SparkSession, model: Model, result: pa.Table,
               shown: int = SHOWN_ROWS) -> None:
    """Raise :class:`ModelError` at the first audit that returns rows (the message has the
    audit's SQL, how many rows it returned and up to ``shown`` of them)."""
    if not model.audits:
        return
    view = f"__icefloe_this_{uuid.uuid4().hex[:12]}"
    spark.createDataFrame(result).createOrReplaceTempView(view)
    try:
        for audit in model.audits:
            _check(spark, model, audit, view, shown)
    finally:
        spark.catalog.dropTempView(view)


def audit_sql(audit: Audit, view: str, dialect: str = "spark") -> str:
    """The audit (parsed in ``dialect``, its model's) as Spark SQL, reading ``view``
    wherever it reads ``this`` (still callable ``this`` in column references: the view is
    aliased so when the audit gave no alias); a :class:`ModelError` names a construct
    Spark cannot express or would answer by other rules than ``dialect``'s."""
    tree = audit.tree.copy()
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        if table.name.lower() == THIS and not table.db and THIS not in ctes:
            if not table.alias:
                table.set("alias", exp.TableAlias(this=exp.to_identifier(THIS)))
            table.set("this", exp.to_identifier(view))
    try:
        return spark_sql(tree, dialect)
    except QueryError as exc:
        raise ModelError(f"audit `{audit.sql}` (line {audit.line}): {exc}") from None


def _check(spark: SparkSession, model: Model, audit: Audit, view: str, shown: int) -> None:
    try:
        sql = audit_sql(audit, view, model.dialect)
    except ModelError as exc:
        raise ModelError(f"model {model.name}: {exc}") from None
    frame = spark.sql(sql)
    rows = frame.limit(shown + 1).collect()
    if not rows:
        return
    count = len(rows) if len(rows) <= shown else frame.count()
    sample = ", ".join(_row(row) for row in rows[:shown])
    more = f" (first {shown} shown)" if count > shown else ""
    raise ModelError(f"model {model.name}: audit failed, nothing committed: `{audit.sql}` "
                     f"(line {audit.line}) returned {count} row(s){more}: {sample}")


def _row(row: Any) -> str:
    """One Spark row as compact JSON (non-JSON values as their text)."""
    return json.dumps(row.asDict(recursive=True), default=str, separators=(",", ":"))
