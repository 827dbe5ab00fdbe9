"""Table layout through the collector (real Spark), on both output paths: a table
partitioned by ``day(_received_at)`` and ``bucket(4, user_id)`` and sorted by ``n desc``
gets files that each hold one partition, in order, with every event exactly once."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from collector_support import (
    BUYS,
    CLICKS,
    assert_exact,
    click,
    collector_config,
    drain,
    publish_sync,
    start,
)

from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import SparkClusterEngine, SparkEngine
from tests.pipeline.test_layout import assert_files_hold_their_partition, read

DAY_MS = 86_400_000
LAID = msgspec.structs.replace(CLICKS, partition_by=("day(_received_at)",
                                                     "bucket(4, user_id)"),
                               sort_by=("n desc",))


@pytest.mark.parametrize("output", ["embedded", "cluster"])
async def test_the_collector_writes_partitioned_sorted_files(tmp_path: Path, spark,
                                                             output: str) -> None:
    config = collector_config(tmp_path, (LAID, BUYS), dequeue_every=1, output=output)
    batches = [[click(i) for i in range(60)],
               [(s, e, ms - DAY_MS, p) for s, e, ms, p in (click(i) for i in range(60, 90))]]
    publish_sync(config, batches)
    engine = SparkClusterEngine(spark, 2) if output == "cluster" else SparkEngine(spark, 2)
    collector = await start(config, engine)
    await drain(collector)
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(90)})
    table = open_catalog(config.catalog).load_table("web.clicks")
    assert [f.name for f in table.spec().fields] == ["_received_at_day", "user_id_bucket"]
    files = assert_files_hold_their_partition(table)
    assert files >= 5  # two days, up to four buckets each
    for task in table.scan().plan_files():
        n = read(table, task.file.file_path).column("n").to_pylist()
        assert n == sorted(n, reverse=True)
