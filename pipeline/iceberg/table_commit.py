"""One table's rows of a collector run, committed in one call.

The collector decides *what* a table gets (routing, dedup, staging, quotas); this module
does everything Iceberg-side of committing it, so a run's rows cross from ``collector/``
into ``pipeline/`` once per table: the write is chosen (copy-on-write for a keyed stream,
write-then-``add_files`` for the embedded path's rows, the executors' files on the cluster
path, ``Table.append`` for the dead letters), the summary records the rows' sources
(:data:`~pipeline.iceberg.commit.SOURCES_PROP`), :func:`~pipeline.iceberg.commit.commit_rows`
commits exactly once, and the files of attempts that did not land are deleted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from icefloe.clock import Clock
from pipeline.iceberg.commit import (
    SOURCES_PROP,
    CommitResult,
    SourceRun,
    commit_rows,
    encode_sources,
)
from pipeline.iceberg.data_files import AddFiles, ReplaceFiles
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.upsert import CopyOnWrite, upsert_hook

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog

    from icefloe.streams.model import StreamConfig

Append = AddFiles | WriteThenAdd | CopyOnWrite
"""The ``append`` hooks a run's commit uses (each with a ``cleanup``)."""


def commit_table(catalog: Catalog, identifier: str, rows: pa.Table, *, sequence: int,
                 epoch: int, clock: Clock, version: int | Callable[[], int] | None,
                 sequences: Mapping[int, int] | None = None,
                 sources: Sequence[SourceRun] = (), stream: StreamConfig | None = None,
                 writer: str | None = None, files: AddFiles | None = None) -> CommitResult:
    """Commit ``rows`` (as committed: no ``_source`` column) to ``identifier`` exactly once.

    The write: ``files`` (already written by the executors: added, or replacing what a
    :class:`~pipeline.iceberg.data_files.ReplaceFiles` names), else copy-on-write when
    ``stream`` has a primary key, else written here and added when ``writer`` (the source
    id the files are named by) is given, else ``Table.append``. ``sources``: the rows'
    ``(source, first, last)`` runs, recorded so a restarted dedup window keys them by
    source. ``version`` as in :func:`~pipeline.iceberg.commit.commit_rows`.
    """
    append = _append_of(stream, writer, files)
    props = {SOURCES_PROP: encode_sources(sources)} if sources else {}
    try:
        result = commit_rows(catalog, identifier, rows, sequence=sequence, epoch=epoch,
                             append=append, props=props, clock=clock, sequences=sequences,
                             version=version)
        if isinstance(append, (CopyOnWrite, ReplaceFiles)) and append.noops and result.rows:
            result = dataclasses.replace(result, noops=tuple(append.noops.items()))
        return result
    finally:
        if append is not None:  # files of attempts that certainly did not land
            append.cleanup(catalog, identifier, sequence=sequence, epoch=epoch)


def _append_of(stream: StreamConfig | None, writer: str | None,
               files: AddFiles | None) -> Append | None:
    if files is not None:
        return files
    upsert = upsert_hook(stream) if stream is not None else None
    if upsert is not None:
        return upsert
    return WriteThenAdd(writer) if writer is not None else None
