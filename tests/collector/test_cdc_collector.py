"""Change streams (#42) through the door and the collector on real Spark and a real SQLite
catalog: Debezium's PostgreSQL and MySQL change events (snapshot reads, updates out of
order, a key update, deletes, a delete of an unknown key, a change without a key, a column
added at the source into an evolving stream) land as the source table's state; a
re-delivery after a connector restart applies nothing; the table reads the same through
pyiceberg, Spark and DuckDB (its data files); on the cluster output path a run with an
evolving change stream takes the embedded path and gives the same table (a change stream
that does not evolve is written by the cluster path itself: test_cluster_cdc.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from collector_support import BASE_MS, collector_config, drain, publish_sync, read_table, start

from icefloe.config import Column, StreamConfig
from icefloe.streams.cdc import with_cdc_columns
from icefloe.streams.model import CdcConfig
from ingestor.validate import CompiledStream
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import SparkClusterEngine, SparkEngine
from pipeline.read.iceberg_source import read_table as spark_read_table

PG = with_cdc_columns([StreamConfig(
    name="pg", table="shop.customers", primary_key=("id",),
    columns=(Column("id", "long", required=True), Column("email", "string")),
    cdc=CdcConfig(before_columns=("email",)))], "test")[0]
PEOPLE = with_cdc_columns([StreamConfig(
    name="people", table="shop.people", primary_key=("id",), unknown_fields="evolve",
    columns=(Column("id", "long", required=True), Column("name", "string")),
    cdc=CdcConfig())], "test")[0]
MYSQL = with_cdc_columns([StreamConfig(
    name="my", table="shop.orders", primary_key=("order_id",),
    columns=(Column("order_id", "long", required=True), Column("status", "string")),
    cdc=CdcConfig(position="mysql"))], "test")[0]


def pg(op: str, key: int | None, email: str | None, lsn: int,
       before: str | None = None) -> dict[str, Any]:
    after = None if op == "d" else ({"id": key, "email": email} if key is not None
                                    else {"email": email})
    old = {"id": key, "email": before} if op in ("u", "d") and key is not None else None
    return {"schema": {"type": "struct", "optional": False, "name": "pg.public.customers."
                       "Envelope"},
            "payload": {"before": old, "after": after, "op": op, "ts_ms": 1700000000000,
                        "source": {"version": "2.7.0.Final", "connector": "postgresql",
                                   "name": "pg", "ts_ms": 1700000000000,
                                   "snapshot": "true" if op == "r" else "false",
                                   "db": "shop", "schema": "public", "table": "customers",
                                   "txId": 500 + lsn, "lsn": lsn, "xmin": None}}}


def mysql(op: str, key: int, status: str | None, file: int, pos: int, row: int = 0
          ) -> dict[str, Any]:
    return {"before": {"order_id": key, "status": "x"} if op in ("u", "d") else None,
            "after": None if op == "d" else {"order_id": key, "status": status},
            "op": op, "ts_ms": 1700000000000,
            "source": {"version": "2.7.0.Final", "connector": "mysql", "name": "my",
                       "ts_ms": 1700000000000, "snapshot": "false", "db": "shop",
                       "table": "orders", "server_id": 223344, "gtid": None,
                       "file": f"mysql-bin.{file:06d}", "pos": pos, "row": row,
                       "thread": 7, "query": None}}


_at = iter(range(10**6))


def door(stream: StreamConfig, events: list[dict[str, Any]]) -> list[tuple[str, str, int, bytes]]:
    """The events as an ingestor accepts them: flattened, validated, ids from positions."""
    canonical = CompiledStream(stream).from_json(json.dumps(events).encode())
    assert canonical.body_ids is not None
    return [(stream.name, event_id or "", BASE_MS + next(_at), payload)
            for event_id, payload in zip(canonical.body_ids, canonical.payloads, strict=True)]


def state(config, table: str, key: str, value: str) -> dict[int, Any]:
    rows = read_table(config, table).to_pylist()
    assert len(rows) == len({r[key] for r in rows}), "a key is in the table twice"
    return {r[key]: r[value] for r in rows}


FIRST = [pg("r", 1, "a@snap", 100), pg("r", 2, "b@snap", 100), pg("r", 3, "c@snap", 100),
         pg("u", 1, "a@3", 130, "a@2"), pg("u", 1, "a@2", 120, "a@snap"),  # out of order
         pg("d", 2, None, 140, "b@snap"), pg("d", 9, None, 141),  # 9: never seen
         pg("c", None, "keyless", 142)]
SECOND = [pg("d", 3, None, 150, "c@snap"), pg("c", 4, "c@snap", 150),  # key 3 -> 4
          pg("u", 1, "a@late", 125, "a@2")]  # older than the stored 130
ORDERS = [mysql("c", 7, "new", 3, 900), mysql("u", 7, "paid", 4, 12),
          mysql("u", 7, "shipped", 4, 12, row=1), mysql("u", 8, "x", 3, 950),
          mysql("c", 8, "y", 3, 940)]


@pytest.mark.parametrize("output", ["embedded", "cluster"])
async def test_debezium_changes_land_as_the_source_tables_state(tmp_path: Path, spark, output):
    engine = SparkEngine(spark, 2) if output == "embedded" else SparkClusterEngine(spark, 2)
    config = collector_config(tmp_path, streams=(PG, MYSQL, PEOPLE), dequeue_every=1,
                              output=output)
    people = [pg("c", 1, None, 1), pg("u", 1, None, 2)]  # a column added at the source:
    people[0]["payload"]["after"] = {"id": 1, "name": "a"}
    people[1]["payload"]["after"] = {"id": 1, "name": "b", "city": "Oslo"}
    publish_sync(config, [door(PG, FIRST), door(MYSQL, ORDERS), door(PEOPLE, people)])
    collector = await start(config, engine)
    await drain(collector)
    assert state(config, "shop.customers", "id", "email") == {1: "a@3", 3: "c@snap"}
    assert state(config, "shop.orders", "order_id", "status") == {7: "shipped", 8: "x"}
    assert state(config, "shop.people", "id", "city") == {1: "Oslo"}  # evolved
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    assert [(d["stream"], d["reason"]) for d in dead] == [("pg", "missing_key:id")]
    noops = collector.metrics.cdc_noops
    assert noops.labels("shop.customers", "unknown_delete")._value.get() == 1

    publish_sync(config, [door(PG, SECOND), door(PG, FIRST[:4])])  # + a re-delivery
    await drain(collector)
    assert state(config, "shop.customers", "id", "email") == {1: "a@3", 4: "c@snap"}
    assert noops.labels("shop.customers", "stale")._value.get() == 1
    assert collector.metrics.duplicates.labels("pg")._value.get() == 4
    row = {r["id"]: r for r in read_table(config, "shop.customers").to_pylist()}[1]
    assert (row["before_email"], row["_cdc_op"], row["_cdc_deleted"]) == ("a@2", "u", False)
    if output == "cluster":  # the evolving stream's runs (the others: test_cluster_cdc.py)
        assert collector.metrics.embedded_runs.labels("evolve")._value.get() >= 1
    await collector.store.close()

    expected = {(1, "a@3"), (4, "c@snap")}
    through_spark = spark_read_table(spark, config.catalog, "shop.customers").collect()
    assert {(r["id"], r["email"]) for r in through_spark} == expected
    table = open_catalog(config.catalog).load_table("shop.customers")
    files = [task.file.file_path.removeprefix("file://")
             for task in table.scan().plan_files()]
    assert all(not task.delete_files for task in table.scan().plan_files())
    got = duckdb.sql(f"SELECT id, email FROM read_parquet({files!r})").fetchall()
    assert set(got) == expected
    assert len(got) == 2
