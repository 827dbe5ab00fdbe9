"""The ``icefloe`` Spark Python data source: batch files in, Arrow record batches out.

Why a Python data source: Spark cannot load JVM packages here (no Maven), and the batch
format is ours anyway. Each Spark task opens the object store in its Python worker, fetches
a group of batch files, decodes them with :mod:`pipeline.decode`, and yields
``pyarrow.RecordBatch``es already in the final schema, so the JVM only moves columns. With a
cluster ``spark.master`` the same tasks run on executors.

Why one wide schema: a run covers every stream, and a data source has one schema. Each row
carries ``_stream`` and the envelope columns, the payload of stream *i* in struct column
``s<i>`` (null for other streams), and dead letters in ``_dead`` (with ``_stream`` null).
The driver splits the result per stream with Arrow (or Spark applies per-stream SQL).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from pipeline.decode import BatchRef, Decoded
from pipeline.schema import TIMESTAMP, dead_letter_arrow_schema
from pipeline.spec import RunSpec, StreamSpec, group_refs

FORMAT = "icefloe"
DEAD = "_dead"
STREAM = "_stream"
ENVELOPE = (("_event_id", pa.string()), ("_received_at", TIMESTAMP), ("_sequence", pa.int64()))


def struct_column(index: int) -> str:
    return f"s{index}"


def wide_arrow_schema(streams: tuple[StreamSpec, ...]) -> pa.Schema:
    """``_stream``, envelope columns, one struct per stream, ``_dead``."""
    fields = [pa.field(STREAM, pa.string())]
    fields += [pa.field(name, kind) for name, kind in ENVELOPE]
    fields += [pa.field(struct_column(i), pa.struct(list(s.payload_schema())))
               for i, s in enumerate(streams)]
    fields.append(pa.field(DEAD, pa.struct(list(dead_letter_arrow_schema()))))
    return pa.schema(fields)


def spark_schema(streams: tuple[StreamSpec, ...]) -> StructType:
    return from_arrow_schema(wide_arrow_schema(streams), prefer_timestamp_ntz=False)


class _Partition(InputPartition):
    def __init__(self, refs: list[BatchRef]) -> None:
        super().__init__(refs)
        self.refs = refs


def wide_batches(decoded: Decoded, streams: tuple[StreamSpec, ...], target: pa.Schema
                 ) -> Iterator[pa.RecordBatch]:
    """Turn one decoded file into wide-schema record batches (one per stream present)."""
    struct_types = [target.field(struct_column(i)).type for i in range(len(streams))]
    dead_type = target.field(DEAD).type
    for i, spec in enumerate(streams):
        table = decoded.tables.get(spec.name)
        if table is None or table.num_rows == 0:
            continue
        n = table.num_rows
        payload = table.select([name for name, _ in spec.columns]).combine_chunks()
        columns: list[pa.Array] = [pa.repeat(pa.scalar(spec.name, pa.string()), n)]
        columns += [table.column(name).combine_chunks() for name, _ in ENVELOPE]
        for j, kind in enumerate(struct_types):
            if j == i:
                columns.append(pa.StructArray.from_arrays(
                    [payload.column(k).combine_chunks() for k in range(payload.num_columns)],
                    fields=list(kind)))
            else:
                columns.append(pa.nulls(n, kind))
        columns.append(pa.nulls(n, dead_type))
        yield pa.RecordBatch.from_arrays(columns, schema=target)
    if len(decoded.dead):
        dead = decoded.dead.to_arrow()
        n = dead.num_rows
        columns = [pa.nulls(n, pa.string())]
        columns += [pa.nulls(n, kind) for _, kind in ENVELOPE]
        columns += [pa.nulls(n, kind) for kind in struct_types]
        columns.append(pa.StructArray.from_arrays(
            [c.combine_chunks() for c in dead.columns], fields=list(dead_type)))
        yield pa.RecordBatch.from_arrays(columns, schema=target)


class IcefloeReader(DataSourceReader):
    def __init__(self, spec: RunSpec, schema: StructType) -> None:
        self.spec = spec
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        return [_Partition(group) for group in group_refs(self.spec.refs(),
                                                          self.spec.partitions)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pipeline.fetch import decode_refs, open_run_store

        spec = self.spec
        target = to_arrow_schema(self.schema, timezone="UTC")
        schemas = {s.name: s.payload_schema() for s in spec.streams}
        store = open_run_store(spec.store_url, spec.endpoint_url, spec.region)
        try:
            for _, decoded in decode_refs(store, partition.refs, schemas):  # type: ignore[attr-defined]
                yield from wide_batches(decoded, spec.streams, target)
        finally:
            store.close()


class IcefloeDataSource(DataSource):
    """``spark.read.format("icefloe").option("spec", RunSpec.encode()).load()``."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.spec = RunSpec.decode(options["spec"])

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return spark_schema(self.spec.streams)

    def reader(self, schema: StructType) -> DataSourceReader:
        return IcefloeReader(self.spec, schema)
