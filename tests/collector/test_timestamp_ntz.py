"""``timestamp_ntz``: a wall-clock date and time without a zone (Avro's local timestamps),
from JSON ingest to an Iceberg ``timestamp`` (no zone) column, read back unchanged by
pyiceberg and Spark; text with an offset is refused naming the column."""

from __future__ import annotations

import datetime as dt

import httpx
import msgspec
import pytest
from collector_support import collect_all, collector_config, output_engine, read_table
from ingest_support import http_serving, running

from icefloe.config import Column, StreamConfig
from pipeline.read.iceberg_source import read_table as spark_read_table

LOCAL = StreamConfig(name="shifts", table="shop.shifts", columns=(
    Column("shift_id", "string", required=True),
    Column("starts", "timestamp_ntz"),
    Column("items", "list<struct<at: timestamp_ntz>>"),
))
WALL = dt.datetime(2026, 1, 2, 3, 4, 5, 123456)
WITH_SQL = msgspec.structs.replace(LOCAL, columns=(
    *LOCAL.columns, Column("item_count", "int", sql="size(items)")))
"""A sql column puts the run on Spark's row path, where Spark itself holds the values."""


@pytest.mark.parametrize(("stream", "output"), [(LOCAL, "embedded"), (WITH_SQL, "embedded"),
                                              (LOCAL, "cluster")],
                         ids=["packed", "rows", "cluster"])
async def test_a_timestamp_ntz_column_lands_as_iceberg_timestamp_and_reads_back(
        tmp_path, spark, stream, output):
    config = collector_config(tmp_path, streams=(stream,), output=output)
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        ok = await client.post("/v1/streams/shifts/events", json=[
            {"shift_id": "s1", "starts": "2026-01-02T03:04:05.123456",
             "items": [{"at": "2026-01-02T03:04:05.123456"}]},
            {"shift_id": "s2"}])
        assert ok.status_code == 202, ok.text
        bad = await client.post("/v1/streams/shifts/events",
                                json={"shift_id": "s3", "starts": "2026-01-02T03:04:05+01:00"})
        assert bad.status_code == 400, bad.text
        [detail] = bad.json()["details"]
        assert detail["field"] == "starts"
        assert "timezone" in detail["reason"]
    await collect_all(config, output_engine(spark, output))
    from pipeline.iceberg.catalog import open_catalog

    schema = open_catalog(config.catalog).load_table("shop.shifts").schema()
    kinds = {f.name: str(f.field_type) for f in schema.fields}
    assert kinds["starts"] == "timestamp"
    assert kinds["_received_at"] == "timestamptz"
    rows = {r["shift_id"]: r for r in read_table(config, "shop.shifts").to_pylist()}
    assert rows["s1"]["starts"] == WALL
    assert rows["s1"]["items"] == [{"at": WALL}]
    assert rows["s2"]["starts"] is None
    frame = spark_read_table(spark, config.catalog, "shop.shifts")
    assert dict(frame.dtypes)["starts"] == "timestamp_ntz"
    spark_rows = {r["shift_id"]: r.asDict(recursive=True) for r in frame.collect()}
    assert spark_rows["s1"]["starts"] == WALL
