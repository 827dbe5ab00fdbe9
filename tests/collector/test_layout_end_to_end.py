"""A partitioned, sorted table end to end: events sent over HTTP and gRPC ingest land in a
table partitioned by ``day(ts)``, ``bucket(4, user_id)`` and ``truncate(2, url)`` and sorted
by ``n desc`` (real Spark), and read back through Spark with icefloe's reader
(``pipeline.read``) with exact counts, a partition filter that prunes files, and a Spark
filter on a bucketed column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
from collector_support import collect_all, collector_config
from ingest_support import grpc_serving, http_serving, running

from icefloe.config import Column, StreamConfig
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import SparkEngine
from pipeline.read.iceberg_source import read_table as spark_read_table
from tests.pipeline.test_layout import assert_files_hold_their_partition, read

VISITS = StreamConfig(name="visits", table="web.visits", columns=(
    Column("user_id", "string", required=True), Column("url", "string"),
    Column("n", "long"), Column("ts", "timestamp")),
    partition_by=("day(ts)", "bucket(4, user_id)", "truncate(2, url)"), sort_by=("n desc",))
DAY_TWO = "2026-11-24T00:00:00+00:00"


def visit(i: int) -> dict[str, Any]:
    """Visits 0..39 on 23 November, 40..59 on the 24th; urls under /a and /b."""
    day = 23 if i < 40 else 24
    return {"user_id": f"u{i % 7}", "url": f"/{'ab'[i % 2]}/{i}", "n": i,
            "ts": f"2026-11-{day}T10:00:{i % 60:02d}Z"}


async def ingest(config: Any) -> None:
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        sent = await client.post("/v1/streams/visits/events", json=[visit(i) for i in range(30)])
        assert sent.status_code == 202, sent.text
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        request = ingest_pb2.PublishRequest(stream="visits", events=[
            ingest_pb2.Event(json=msgspec.json.encode(visit(i))) for i in range(30, 60)])
        assert (await ingest_pb2_grpc.IngestStub(channel).Publish(request)).accepted == 30


async def test_a_laid_out_table_fills_over_http_and_grpc_and_reads_back_in_spark(
        tmp_path: Path, spark) -> None:
    config = collector_config(tmp_path, (VISITS,))
    await ingest(config)
    await collect_all(config, SparkEngine(spark, 2))
    table = open_catalog(config.catalog).load_table("web.visits")
    assert [str(f.transform) for f in table.spec().fields] == ["day", "bucket[4]",
                                                                "truncate[2]"]
    files = assert_files_hold_their_partition(table)
    assert files >= 8  # two days x two url prefixes, several buckets each
    for task in table.scan().plan_files():
        n = read(table, task.file.file_path).column("n").to_pylist()
        assert n == sorted(n, reverse=True)

    frame = spark_read_table(spark, config.catalog, "web.visits")
    assert frame.count() == 60
    assert frame.select("_event_id").distinct().count() == 60
    assert sorted(r["n"] for r in frame.select("n").collect()) == list(range(60))
    day_two = spark_read_table(spark, config.catalog, "web.visits",
                               row_filter=f"ts >= '{DAY_TWO}'")
    assert sorted(r["n"] for r in day_two.select("n").collect()) == list(range(40, 60))
    pruned = len(list(table.scan(row_filter=f"ts >= '{DAY_TWO}'").plan_files()))
    assert 0 < pruned < files  # the day partition ruled out the 23rd's files
    b_urls = spark_read_table(spark, config.catalog, "web.visits",
                              row_filter="url = '/b/41'")
    assert [r["n"] for r in b_urls.collect()] == [41]
    u3 = frame.where("user_id = 'u3'").select("n").collect()
    assert sorted(r["n"] for r in u3) == [i for i in range(60) if i % 7 == 3]
