"""The zero-copy split of a run's rows by partition value gives each partition exactly the
rows, in the order, pyiceberg's own split (``_determine_partitions``) gives it: for runs of
values, alternating values (the sorted fallback), nulls, several transforms, nested
columns (the OTLP shape), and no rows."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.io.pyarrow import _determine_partitions
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform
from pyiceberg.types import (
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from pipeline.iceberg import partition_split
from pipeline.iceberg.partition_split import split_partitions

SCHEMA = Schema(
    NestedField(1, "service", StringType(), required=False),
    NestedField(2, "at", TimestamptzType(), required=False),
    NestedField(3, "n", LongType(), required=False),
    NestedField(4, "attributes", MapType(5, StringType(), 6, StringType(), value_required=False),
                required=False),
    NestedField(7, "events", ListType(8, StructType(
        NestedField(9, "name", StringType(), required=False),
        NestedField(10, "code", IntegerType(), required=False)), element_required=False),
        required=False),
)
ARROW = pa.schema([
    pa.field("service", pa.string()), pa.field("at", pa.timestamp("us", "UTC")),
    pa.field("n", pa.int64()), pa.field("attributes", pa.map_(pa.string(), pa.string())),
    pa.field("events", pa.list_(pa.struct([pa.field("name", pa.string()),
                                          pa.field("code", pa.int32())])))])
DAY_AND_BUCKET = PartitionSpec(
    PartitionField(2, 1000, DayTransform(), "at_day"),
    PartitionField(1, 1001, BucketTransform(16), "service_bucket"))
T0 = dt.datetime(2026, 11, 30, 23, 59, tzinfo=dt.UTC)


def rows(services: Sequence[str | None], minutes: Sequence[int] | None = None) -> pa.Table:
    minutes = minutes or [0] * len(services)
    return pa.Table.from_pylist([
        {"service": s, "at": T0 + dt.timedelta(minutes=m), "n": i,
         "attributes": [("k", f"v{i}"), ("svc", s or "")],
         "events": [{"name": f"e{i}", "code": i}] if i % 2 else []}
        for i, (s, m) in enumerate(zip(services, minutes, strict=True))], schema=ARROW)


def pyiceberg_split(spec: PartitionSpec, table: pa.Table) -> dict[str, list[dict[str, Any]]]:
    """Rows per partition (by its path, e.g. ``at_day=2026-11-30/service_bucket=3``)."""
    return {part.partition_key.to_path(): part.arrow_table_partition.to_pylist()
            for part in _determine_partitions(spec, SCHEMA, table)}


def ours(spec: PartitionSpec, table: pa.Table) -> dict[str, list[dict[str, Any]]]:
    parts = split_partitions(spec, SCHEMA, table)
    assert parts is not None
    out = {key.to_path(): part.to_pylist() for key, part in parts}
    assert len(out) == len(parts)  # one entry per partition value
    return out


@pytest.mark.parametrize("services", [
    ["checkout"] * 5,  # one partition: the whole table, no copy
    ["checkout"] * 3 + ["payments"] * 4 + ["search"] * 2 + ["checkout"] * 2,  # runs
    ["a", "b", None, "b", None, "a", "c"],  # nulls group together
])
def test_same_rows_per_partition_as_pyiceberg(services):
    table = rows(services, [i * 7 for i in range(len(services))])  # crosses midnight
    assert ours(DAY_AND_BUCKET, table) == pyiceberg_split(DAY_AND_BUCKET, table)


def test_alternating_values_are_sorted_once_and_keep_their_order(monkeypatch):
    monkeypatch.setattr(partition_split, "MAX_RUNS", 3)
    table = rows([f"s{i % 5}" for i in range(40)])
    spec = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "service"))
    got = split_partitions(spec, SCHEMA, table)
    assert got is not None
    assert [key.to_path() for key, _ in got] == [f"service=s{i}" for i in range(5)]
    assert ours(spec, table) == pyiceberg_split(spec, table)


def test_runs_are_slices_of_the_rows_not_copies():
    table = rows(["a"] * 4 + ["b"] * 4 + ["a"] * 4)
    spec = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "service"))
    got = split_partitions(spec, SCHEMA, table)
    assert got is not None
    (_, first), (_, second) = got
    source = table.column("attributes").chunk(0).values.field(1).buffers()[2].address
    for part in (first, second):
        for chunk in part.column("attributes").chunks:
            assert chunk.values.field(1).buffers()[2].address == source
    assert first.column("n").to_pylist() == [0, 1, 2, 3, 8, 9, 10, 11]


def test_no_rows_and_unknown_sources():
    assert split_partitions(DAY_AND_BUCKET, SCHEMA, rows([])) == []
    spec = PartitionSpec(PartitionField(9, 1000, IdentityTransform(), "event_name"))
    assert split_partitions(spec, SCHEMA, rows(["a"])) is None  # nested: pyiceberg's split


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d", None]),
                          st.integers(0, 3000)), max_size=60),
       st.integers(1, 8))
def test_any_rows_any_run_limit(values, max_runs):
    partition_split.MAX_RUNS, saved = max_runs, partition_split.MAX_RUNS
    try:
        table = rows([s for s, _ in values], [m for _, m in values])
        assert ours(DAY_AND_BUCKET, table) == (pyiceberg_split(DAY_AND_BUCKET, table)
                                               if values else {})
    finally:
        partition_split.MAX_RUNS = saved
