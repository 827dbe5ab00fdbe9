"""A run's rows split by partition value without copying them: the embedded and cluster
writers' one-file-per-partition step (:class:`pipeline.iceberg.data_files.TableFiles`).

Why not pyiceberg's ``_determine_partitions``: it groups the partition values, then filters
(and so copies) the whole table once per value. For a table partitioned by day and a bucket
of the service name (the OTLP tables), a run spans a few buckets, and each filter copies the
nested columns (attribute maps, lists of event structs) again: ~1 µs of the collector's CPU
per span, a quarter of its write. Rows of one partition usually come in long runs (an
exporter's request holds one resource's records together, a batch file holds requests), so
here each partition's table is a list of zero-copy slices of the rows, in their order; only
when the values alternate too often (``MAX_RUNS``) are the rows reordered once, by a stable
sort on the partition value, and sliced. Either way a partition's rows keep their relative
order, as pyiceberg's filters keep it, and the Parquet writer cuts row groups by row count
across slices, so the files hold the same rows in the same order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.partitioning import PartitionFieldValue, PartitionKey

MAX_RUNS = 1024
"""Runs of equal partition values beyond which one stable sort and ``take`` (a single copy)
is cheaper than writing the rows as that many slices."""


def split_partitions(spec: Any, schema: Any, rows: pa.Table
                     ) -> list[tuple[PartitionKey, pa.Table]] | None:
    """``(partition key, its rows)`` per partition value of ``rows`` under ``spec``, in the
    order each value first appears (sorted by value after a reorder); None when a partition
    source is not a top-level column of ``rows`` (the caller uses pyiceberg's split)."""
    keys: list[pa.Array] = []
    for part in spec.fields:
        name = schema.find_column_name(part.source_id)
        if name is None or name not in rows.column_names:
            return None
        transform = part.transform.pyarrow_transform(schema.find_field(part.source_id).field_type)
        keys.append(_contiguous(transform(rows.column(name))))
    if rows.num_rows == 0:
        return []
    codes = _codes(keys)
    starts, ends = _runs(codes)
    if len(starts) > MAX_RUNS:
        order = np.argsort(codes, kind="stable")
        taken = pa.array(order)
        rows = rows.take(taken)
        keys = [key.take(taken) for key in keys]
        codes = codes[order]
        starts, ends = _runs(codes)
    groups: dict[int, list[tuple[int, int]]] = {}
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        groups.setdefault(int(codes[start]), []).append((start, end))
    out = []
    for spans in groups.values():
        first = spans[0][0]
        key = PartitionKey(field_values=[PartitionFieldValue(field=part, value=key[first].as_py())
                                         for part, key in zip(spec.fields, keys, strict=True)],
                           partition_spec=spec, schema=schema)
        slices = [rows.slice(start, end - start) for start, end in spans]
        out.append((key, slices[0] if len(slices) == 1 else pa.concat_tables(slices)))
    return out


def _contiguous(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A transform's result as one array (the partition values are small ints or strings)."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _codes(keys: list[pa.Array]) -> np.ndarray:
    """One int64 per row, equal for two rows exactly when all their partition values are
    equal (nulls equal to each other, as pyiceberg groups them)."""
    codes = np.zeros(len(keys[0]), np.int64)
    for key in keys:
        encoded = pc.dictionary_encode(key, null_encoding="encode")
        indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        width = max(1, len(encoded.dictionary))
        if (int(codes.max()) + 1) * width >= 1 << 62:  # renumber densely: no overflow
            codes = np.unique(codes, return_inverse=True)[1].astype(np.int64)
        codes = codes * width + indices
    return codes


def _runs(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive) of each run of equal codes."""
    changes = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    return np.concatenate(([0], changes)), np.concatenate((changes, [len(codes)]))
