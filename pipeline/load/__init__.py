"""Batch files into Arrow tables and Spark frames: what a collector run reads and writes.

Bottom to top, each module importing only modules listed before it: ``spec`` (a run as
plain data: its files, streams, mapping columns) · ``frame`` (the wide frame's column
names and schema) · ``split`` (the columnar envelope split) · ``mapped`` (mapping columns)
· ``decode`` (one batch file → tables and dead letters) · ``fetch`` (read, verify,
quarantine) · ``packed`` (the packed Spark rows) · ``source`` (the ``icefloe`` Spark data
source) · the cluster output path, by where its code runs: ``wheres`` (each sink's
``where`` per batch, on the executors), ``named`` (each table template's table per row,
on the executors), ``sink`` (the ``icefloe-parquet`` data source
writer, on the executors), ``plans`` (each table's write planned against the catalog, on
the driver), ``cluster`` (the run on the Spark session, on the driver) · ``run`` (a run's
result, locally or on Spark).

The face: what :mod:`collector` uses is listed in ``__all__`` and imported from here
(``from pipeline.load import RunOutput``); each name is loaded on first use, so importing
the package loads no Spark.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.faces import lazy_face

if TYPE_CHECKING:
    from pipeline.load.cluster import ClusterRunOutput, Written
    from pipeline.load.decode import DeadLetters
    from pipeline.load.extras import AS_IS, column_of
    from pipeline.load.frame import KEY_COLUMNS, ROW
    from pipeline.load.mapped import check_on_spark, sequence_ranges
    from pipeline.load.plans import UpsertPlan, WritePlan, plan_upsert, plan_write
    from pipeline.load.run import LocalEngine, RunOutput, SparkClusterEngine, SparkEngine
    from pipeline.load.spec import (
        EntryFile,
        RunSpec,
        SqlCase,
        TableSpec,
        TemplateCase,
        WhereCase,
        WhereSpec,
        run_spec,
        with_avro_writers,
        with_key_columns,
        with_sql_cases,
        with_tables,
        with_template_cases,
        with_wheres,
    )
    from pipeline.spark import get_spark
    from pipeline.table_names import Named, table_names
    from pipeline.where import judge, where_error_messages

_HOME = {
    "AS_IS": "pipeline.load.extras",
    "ClusterRunOutput": "pipeline.load.cluster",
    "DeadLetters": "pipeline.load.decode",
    "EntryFile": "pipeline.load.spec",
    "KEY_COLUMNS": "pipeline.load.frame",
    "LocalEngine": "pipeline.load.run",
    "Named": "pipeline.table_names",
    "ROW": "pipeline.load.frame",
    "RunOutput": "pipeline.load.run",
    "RunSpec": "pipeline.load.spec",
    "SparkClusterEngine": "pipeline.load.run",
    "SparkEngine": "pipeline.load.run",
    "SqlCase": "pipeline.load.spec",
    "TableSpec": "pipeline.load.spec",
    "TemplateCase": "pipeline.load.spec",
    "UpsertPlan": "pipeline.load.plans",
    "WhereCase": "pipeline.load.spec",
    "WhereSpec": "pipeline.load.spec",
    "WritePlan": "pipeline.load.plans",
    "Written": "pipeline.load.cluster",
    "check_on_spark": "pipeline.load.mapped",
    "column_of": "pipeline.load.extras",
    "get_spark": "pipeline.spark",
    "judge": "pipeline.where",
    "plan_upsert": "pipeline.load.plans",
    "plan_write": "pipeline.load.plans",
    "run_spec": "pipeline.load.spec",
    "table_names": "pipeline.table_names",
    "with_avro_writers": "pipeline.load.spec",
    "sequence_ranges": "pipeline.load.mapped",
    "where_error_messages": "pipeline.where",
    "with_key_columns": "pipeline.load.spec",
    "with_sql_cases": "pipeline.load.spec",
    "with_tables": "pipeline.load.spec",
    "with_template_cases": "pipeline.load.spec",
    "with_wheres": "pipeline.load.spec",
}
"""Where each public name lives: imported on first use (PEP 562), so importing one module of
the package — or the face itself — loads nothing it does not need."""

__all__ = [
    "AS_IS",
    "KEY_COLUMNS",
    "ROW",
    "ClusterRunOutput",
    "DeadLetters",
    "EntryFile",
    "LocalEngine",
    "Named",
    "RunOutput",
    "RunSpec",
    "SparkClusterEngine",
    "SparkEngine",
    "SqlCase",
    "TableSpec",
    "TemplateCase",
    "UpsertPlan",
    "WhereCase",
    "WhereSpec",
    "WritePlan",
    "Written",
    "check_on_spark",
    "column_of",
    "get_spark",
    "judge",
    "plan_upsert",
    "plan_write",
    "run_spec",
    "sequence_ranges",
    "table_names",
    "where_error_messages",
    "with_avro_writers",
    "with_key_columns",
    "with_sql_cases",
    "with_tables",
    "with_template_cases",
    "with_wheres",
]


__getattr__, __dir__ = lazy_face(__name__, _HOME, __all__)
