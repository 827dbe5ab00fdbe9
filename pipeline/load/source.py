"""The ``icefloe`` Spark Python data source: batch files in, Arrow record batches out.

Why a Python data source: Spark cannot load JVM packages here (no Maven), and the batch
format is ours anyway. Each Spark task opens the object store in its Python worker, fetches
a group of batch files, decodes them with :mod:`pipeline.load.decode`, and yields
``pyarrow.RecordBatch``es already in the final schema, so the JVM only moves columns. With a
cluster ``spark.master`` the same tasks run on executors.

The rows come in the one wide schema of :mod:`pipeline.load.frame` (every stream of the
run side by side); the driver splits the result per stream with Arrow (or Spark applies
per-stream SQL).

With the option ``packed`` the source yields :mod:`pipeline.load.packed` rows instead — one
compressed Arrow IPC value per file and stream — for runs where Spark computes nothing per
row (no ``sql`` columns).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from pipeline.columns import ENVELOPE
from pipeline.load.decode import Decoded
from pipeline.load.fetch import decode_refs, open_run_store
from pipeline.load.frame import FORMAT, wide_arrow_schema
from pipeline.load.packed import PACKED_ARROW_SCHEMA, pack
from pipeline.load.spec import EntryFile, RunSpec, StreamSpec, group_refs


def spark_schema(streams: tuple[StreamSpec, ...]) -> StructType:
    return from_arrow_schema(wide_arrow_schema(streams), prefer_timestamp_ntz=False)


class _Partition(InputPartition):
    def __init__(self, refs: list[EntryFile]) -> None:
        super().__init__(refs)
        self.refs = refs


def wide_batches(decoded: Decoded, streams: tuple[StreamSpec, ...], target: pa.Schema
                 ) -> Iterator[pa.RecordBatch]:
    """Turn one decoded file into wide-schema record batches (one per stream present).

    Columns are flat (``s<i>__<column>``), not structs: nested types cost several times
    more in Spark's Arrow-to-row conversion and back.
    """
    widths = [len(s.columns) for s in streams]
    offsets = [4 + sum(widths[:i]) for i in range(len(streams))]
    dead_at = 4 + sum(widths)
    types = [f.type for f in target]
    for i, spec in enumerate(streams):
        table = decoded.tables.get(spec.name)
        if table is None or table.num_rows == 0:
            continue
        n = table.num_rows
        columns: list[pa.Array] = [pa.nulls(n, kind) for kind in types]
        columns[0] = pa.repeat(pa.scalar(spec.name, pa.string()), n)
        for k, (name, _) in enumerate(ENVELOPE, start=1):
            columns[k] = table.column(name).combine_chunks()
        for k, (name, _) in enumerate(spec.columns):
            column = table.column(name).combine_chunks()
            kind = types[offsets[i] + k]  # Spark's: uuid → binary, time → time64[ns]
            columns[offsets[i] + k] = column if column.type == kind else column.cast(kind)
        yield pa.RecordBatch.from_arrays(columns, schema=target)
    if len(decoded.dead):
        rows = decoded.dead.encode_rows()
        columns = [pa.nulls(len(rows), kind) for kind in types]
        columns[dead_at] = pa.array(rows, pa.binary())
        yield pa.RecordBatch.from_arrays(columns, schema=target)


class IcefloeReader(DataSourceReader):
    def __init__(self, spec: RunSpec, schema: StructType, packed: bool = False) -> None:
        self.spec = spec
        self.schema = schema
        self.packed = packed

    def partitions(self) -> list[InputPartition]:
        groups = group_refs(self.spec.refs(), self.spec.partitions)
        # No files still needs one (empty) partition: Spark substitutes a bare one otherwise.
        return [_Partition(group) for group in groups] or [_Partition([])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        spec = self.spec
        schemas = {s.name: s.plan() for s in spec.streams}
        store = open_run_store(spec.store_url, spec.endpoint_url, spec.region)
        try:
            assert isinstance(partition, _Partition)  # ours, back from the driver (pickled)
            files = decode_refs(store, partition.refs, schemas)
            if self.packed:
                yield from pack(decoded for _, decoded in files)
                return
            target = to_arrow_schema(self.schema, timezone="UTC")
            for _, decoded in files:
                yield from wide_batches(decoded, spec.streams, target)
        finally:
            store.close()


class IcefloeDataSource(DataSource):
    """``spark.read.format("icefloe").option("spec", RunSpec.encode()).load()``; add
    ``.option("packed", "true")`` for the packed rows of :mod:`pipeline.load.packed`."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.spec = RunSpec.decode(options["spec"])
        self.packed = str(options.get("packed", "false")).lower() == "true"

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        if self.packed:
            return from_arrow_schema(PACKED_ARROW_SCHEMA)
        return spark_schema(self.spec.streams)

    def reader(self, schema: StructType) -> DataSourceReader:
        return IcefloeReader(self.spec, schema, self.packed)
