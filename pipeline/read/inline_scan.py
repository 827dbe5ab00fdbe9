"""Small tables into Spark without the Python data source: read on the driver, hand Spark
the rows.

Why: every scan through ``icefloe-iceberg`` pays Spark's Python data-source machinery: a
planner worker that opens the catalog and plans the files, then executor Python workers
that read them, about 0.25 s per scan even for a table of a few rows (measured with a data
source yielding one row: 0.24 s against 0.1 s for ``spark.range``). A model run scans each
source twice (all rows, and the new ones) and ``icefloe run`` answers only after every
model ran, so on the small tables of a first project these fixed costs are most of the
wait. The driver has already loaded the table and can plan its files in milliseconds; when
the pinned snapshot's files are small, reading them right there with the same pyiceberg
scan and handing Spark the Arrow table (a local relation) gives the same rows with no
Python worker at all. Larger tables keep the data source: their rows belong on the
executors, not in the driver's memory.

Same rows, same types: the files are read by the same ``ArrowScan`` (field-id projection,
positional deletes, the ``filter`` applied to rows) and cast to the same Arrow schema
(:func:`conform`, shared with the data source) the data source hands Spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.expressions.parser import parse
from pyiceberg.io.pyarrow import ArrowScan
from pyspark.sql.pandas.types import to_arrow_schema

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask, Table
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

INLINE_MAX_BYTES = 8 * 1024 * 1024
"""Read on the driver when the pinned snapshot's data and delete files (after the
``filter``'s pruning) add up to at most this many bytes (Parquet; a few times that in
memory)."""


def inline_frame(spark: SparkSession, table: Table, snapshot_id: int | None,
                 schema: StructType, row_filter: str | None,
                 max_bytes: int = INLINE_MAX_BYTES) -> DataFrame | None:
    """The snapshot's rows as a DataFrame read on the driver, or None when its files are
    more than ``max_bytes`` (or when the Spark schema has no Arrow form to cast to)."""
    rows = parse(row_filter) if row_filter else AlwaysTrue()
    try:
        target = to_arrow_schema(schema, timezone="UTC")
    except (TypeError, NotImplementedError):
        return None
    if snapshot_id is None:
        return spark.createDataFrame(target.empty_table(), schema=schema)
    scan = table.scan(snapshot_id=snapshot_id, row_filter=rows)
    tasks = list(scan.plan_files())
    if sum(task_size(t) for t in tasks) > max_bytes:
        return None
    reader = ArrowScan(table.metadata, table.io, scan.projection(), rows)
    batches = [conform(b, target) for b in reader.to_record_batches(tasks) if b.num_rows]
    arrow = pa.Table.from_batches(batches, schema=target)
    return spark.createDataFrame(arrow, schema=schema)


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """Reorder/cast a batch to exactly ``target`` (Spark rejects any other Arrow schema)."""
    if batch.schema.equals(target):
        return batch
    return batch.select(target.names).cast(target)


def task_size(task: FileScanTask) -> int:
    """Bytes a task reads: its data file plus its delete files."""
    return task.file.file_size_in_bytes + sum(d.file_size_in_bytes for d in task.delete_files)
