"""The ``icefloe-parquet`` Spark data source: code shipped to the executors.

A cluster-path write job (:meth:`pipeline.load.cluster.ClusterRunOutput.write_all`) hands
each task a :class:`SinkJob` (plain, msgspec-encoded data: which target tables, which
staging area, which files to rewrite); :class:`ParquetSinkWriter` runs in the executors'
Python workers and writes each row to its table's data files (or its sink's staged file,
or a rewritten file of an upsert), and returns the file list as its commit message. Only
the writer's ``commit()``/``abort()`` run on the driver: they gather the messages, or
delete every task's files of a failed job.
"""


from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import load_file_io
from pyiceberg.table.metadata import TableMetadataUtil
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from icefloe.staging import StagedFile, data_key
from icefloe.store.base import ObjectStore
from pipeline.columns import ARROW_TYPES, ENVELOPE
from pipeline.iceberg.commit import SHARD_BITS
from pipeline.iceberg.data_files import (
    DataFileRef,
    TableFiles,
    TableTarget,
    delete_files,
)
from pipeline.iceberg.upsert import without_keys

if TYPE_CHECKING:
    pass

_LOCAL = (1 << SHARD_BITS) - 1


SINK_FORMAT = "icefloe-parquet"
TARGET = "_target"
"""The target (table) a row of the write job goes to."""
SOURCE = "_source"
"""The source of a staged row: what :mod:`collector.dedup` keys staged rows by."""
REWRITE_TASK = "__icefloe_rewrite_task"
REWRITE_KEYS = "__icefloe_rewrite_keys"
"""Columns of the rows of an upsert's rewrite part of a write job: one row per existing
file to rewrite (its pickled scan task, and the keys it holds as Arrow IPC)."""


def rewrite_target(target: str) -> str:
    """The name the rewritten files of ``target``'s table travel under in a write job."""
    return f"{target}#rewrite"


# --------------------------------------------------------------------------- plain data


@dataclass(slots=True)
class WrittenFiles(WriterCommitMessage):
    """A task's commit message: the files it wrote (pickled back to the driver): table
    data files, and staged files by staged table."""

    files: list[DataFileRef] = field(default_factory=list)
    staged: list[tuple[str, StagedFile]] = field(default_factory=list)


class StageTarget(msgspec.Struct, frozen=True):
    """What an executor needs to stage one sink's rows (see :mod:`icefloe.staging`).

    ``columns`` are (wide-frame column or "" for a column the source does not decode, sink
    column, declared type): the staged file holds exactly what the embedded path stages —
    the sink's columns in their declared Arrow types, the envelope and ``_source``.
    """

    table: str
    source: str
    columns: tuple[tuple[str, str, str], ...]


class StoreRef(msgspec.Struct, frozen=True):
    """The object store of the staging area, as the run's spec names it."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None


class RewriteTarget(msgspec.Struct, frozen=True):
    """What an executor needs to rewrite files of one upsert table without some keys.

    The table's metadata (as Iceberg JSON) lets the executor read an older file exactly
    as a scan of the table does — projected to the current schema by field ids, minus the
    rows other engines' position deletes removed; ``key`` names the primary-key columns.
    The rewritten rows are written through the :class:`TableTarget` of the same name.
    """

    target: str
    metadata_json: str
    key: tuple[str, ...]


class SinkJob(msgspec.Struct, frozen=True):
    """The ``job`` option of one write: a unique attempt id, targets, and the receipt path.

    ``receipt`` is a local file the driver-side ``commit()`` writes the file list to: that
    method runs in a Python worker the Spark driver starts on the driver host, not in the
    collector's own interpreter, so a file is the way back.
    """

    attempt: str
    receipt: str
    targets: tuple[TableTarget, ...]
    staged: tuple[StageTarget, ...] = ()
    store: StoreRef | None = None
    rewrites: tuple[RewriteTarget, ...] = ()

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, text: str) -> SinkJob:
        return msgspec.json.decode(text, type=cls)


# --------------------------------------------------------------------------- executor side


class ParquetSinkWriter(DataSourceArrowWriter):
    """Writes wide-frame rows as Parquet files of their target's table (or staging area);
    commits nothing.

    Each row carries its target in :data:`TARGET` (a table name; a row of a source with
    several sinks arrives once per sink). The Iceberg commit and the staging-state write
    are the collector's: this writer only reports the files (``commit`` writes the receipt)
    and deletes them when the job fails (``abort``).
    """

    def __init__(self, job: SinkJob) -> None:
        self.job = job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WrittenFiles:
        ctx = TaskContext.get()
        task = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx else "00000-0"
        tables = {t.stream: TableFiles(t, self.job.attempt, task) for t in self.job.targets}
        staged = {t.table: StagedRows(t, f"{self.job.attempt}-{task}")
                  for t in self.job.staged}
        written: list[tuple[str, StagedFile]] = []
        rewrites = {r.target: r for r in self.job.rewrites}
        try:
            for batch in iterator:
                if batch.num_rows == 0:
                    continue
                rows = pa.Table.from_batches([batch])
                if rewrites and REWRITE_TASK in rows.column_names:
                    rows = _rewrite_files(rows, rewrites, tables)
                    if rows.num_rows == 0:
                        continue
                keys = rows.column(TARGET)
                single = len(tables) + len(staged) == 1
                sinks: list[tuple[str, TableFiles | StagedRows]] = [*tables.items(),
                                                                    *staged.items()]
                for name, sink in sinks:
                    part = rows if single else rows.filter(pc.equal(keys, name))
                    if part.num_rows:
                        sink.add(part)
            if staged:
                store = _open_store(self.job)
                try:
                    for name, rows_of in staged.items():
                        done = rows_of.put(store)
                        if done is not None:
                            written.append((name, done))
                finally:
                    store.close()
            return WrittenFiles([ref for files in tables.values() for ref in files.close()],
                                written)
        except BaseException:
            for files in tables.values():
                files.discard()
            if written:
                delete_staged(self.job, [key for _, key in written])
            raise

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, WrittenFiles)]
        body = json.dumps({
            "files": [r.to_json() for m in done for r in m.files],
            "staged": [[table, msgspec.to_builtins(f)] for m in done for table, f in m.staged],
        })
        tmp = f"{self.job.receipt}.tmp"
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(body)
        os.replace(tmp, self.job.receipt)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, WrittenFiles)]
        delete_refs(self.job, [ref for m in done for ref in m.files])
        delete_staged(self.job, [f for m in done for _, f in m.staged])


def _rewrite_files(rows: pa.Table, rewrites: Mapping[str, RewriteTarget],
                   tables: Mapping[str, TableFiles]) -> pa.Table:
    """Rewrite the existing files named by ``rows``' rewrite rows (each: read the file as
    the table's scan would, drop the rows whose key the upsert replaces or deletes, write
    the rest through the table's writer); returns the other rows, the run's own."""
    todo = pc.is_valid(rows.column(REWRITE_TASK))
    if not pc.any(todo).as_py():
        return rows

    from pyiceberg.io.pyarrow import ArrowScan  # lazy: pandas

    for item in rows.filter(todo).select([TARGET, REWRITE_TASK, REWRITE_KEYS]).to_pylist():
        target = rewrites[item[TARGET]]
        files = tables[item[TARGET]]
        metadata = TableMetadataUtil.parse_raw(target.metadata_json)
        task = pickle.loads(item[REWRITE_TASK])  # written by this job's driver
        keys = pa.ipc.open_stream(item[REWRITE_KEYS]).read_all()
        scan = ArrowScan(metadata, files.io, metadata.schema(), AlwaysTrue())
        kept = without_keys(scan.to_table([task]), keys, target.key)
        if kept.num_rows:  # a file left empty is only removed
            files.add(kept)
    return rows.filter(pc.invert(todo))


class StagedRows:
    """One task's rows of one staged sink: written as one staged Parquet file at the end.

    Why one file per task and not per run: the rows never meet on one machine. The files
    of one run overlap in sequences; the state records them together and the import never
    splits overlapping files (:func:`collector.staged_path.chunk_of`).
    """

    def __init__(self, target: StageTarget, unique: str) -> None:
        self.target = target
        self.unique = unique
        self.types = [ARROW_TYPES[kind] for _, _, kind in target.columns]
        self.parts: list[pa.Table] = []

    def add(self, rows: pa.Table) -> None:
        arrays, names = [], []
        for (src, name, _), kind in zip(self.target.columns, self.types, strict=True):
            if src and src in rows.column_names:
                column = rows.column(src)
                arrays.append(column if column.type == kind else column.cast(kind))
            else:  # a column this source does not decode: nulls, as the embedded path
                arrays.append(pa.nulls(rows.num_rows, kind))
            names.append(name)
        for name, kind in ENVELOPE:
            column = rows.column(name)
            arrays.append(column if column.type == kind else column.cast(kind))
            names.append(name)
        arrays.append(pa.array([self.target.source] * rows.num_rows, pa.string()))
        names.append(SOURCE)
        self.parts.append(pa.Table.from_arrays(arrays, names=names))

    def put(self, store: ObjectStore) -> StagedFile | None:
        """Write the staged file (None when this task had no rows for the sink)."""
        if not self.parts:
            return None

        import pyarrow.parquet as pq  # lazy: pyarrow.parquet

        rows = pa.concat_tables(self.parts)
        sequences = rows.column("_sequence")
        first, last = pc.min(sequences).as_py(), pc.max(sequences).as_py()
        oldest = pc.min(rows.column("_received_at")).cast(pa.int64()).as_py() // 1000
        sink = io.BytesIO()
        pq.write_table(rows, sink, compression="zstd")
        data = sink.getvalue()
        key = data_key(self.target.table, first, last, self.unique)
        store.put(key, data)
        lasts = _last_per_shard(sequences)
        return StagedFile(key, first, last, rows.num_rows, len(data), oldest,
                          sequences=lasts if any(lasts) else {})


def _last_per_shard(positions: pa.ChunkedArray) -> dict[int, int]:
    """Per shard, the last sequence among run ``positions`` (a staged file's ``through``)."""
    pos = positions.combine_chunks().to_numpy(zero_copy_only=False)
    shards = pos >> SHARD_BITS
    return {int(shard): int((pos[shards == shard] & _LOCAL).max())
            for shard in np.unique(shards)}


def _open_store(job: SinkJob) -> ObjectStore:
    from pipeline.load.fetch import open_run_store  # lazy: pyarrow

    assert job.store is not None, "a job with staged targets names its store"
    return open_run_store(job.store.url, job.store.endpoint_url, job.store.region)


def delete_staged(job: SinkJob, files: Sequence[StagedFile]) -> None:
    """Best effort: staged files no state will reference (the sweep gets the rest)."""
    if not files:
        return
    store = _open_store(job)
    try:
        for staged in files:
            with contextlib.suppress(Exception):
                store.delete(staged.key)
    finally:
        store.close()


class ParquetSink(DataSource):
    """``df.write.format("icefloe-parquet").option("job", SinkJob.encode()).save()``."""

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.job = SinkJob.decode(options["job"])

    @classmethod
    def name(cls) -> str:
        return SINK_FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError(f"{SINK_FORMAT} only appends files; use mode('append')")
        return ParquetSinkWriter(self.job)


def delete_refs(job: SinkJob, refs: Sequence[DataFileRef]) -> None:
    for target in job.targets:
        paths = [r.path for r in refs if r.stream == target.stream]
        if paths:
            delete_files(load_file_io(target.io_properties, target.location), paths)


def read_receipt(path: str) -> tuple[list[DataFileRef], list[tuple[str, StagedFile]]]:
    with open(path, encoding="utf-8") as f:
        body = json.load(f)
    refs = [DataFileRef.from_json(item) for item in body["files"]]
    # strict=False: JSON object keys are strings; a file's per-shard ``sequences`` has ints
    staged = [(table, msgspec.convert(f, StagedFile, strict=False))
              for table, f in body["staged"]]
    return refs, staged
