"""Upserts on the cluster output path (#28): the same table as the embedded path, exactly
once through crashes, and rows without a key value as dead letters.

The driver gets only the keys (with the key and tombstone columns); the executors write the
surviving rows and rewrite the files holding replaced keys, and one overwrite commits both
(:func:`pipeline.load.plans.plan_upsert`). Real Spark (local mode: executors are real
Python workers), real local store, real SQLite catalog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from collector_support import (
    BASE_MS,
    Crash,
    collector_config,
    crash_at,
    drain,
    publish_sync,
    read_table,
    start,
)

from icefloe.config import Column, Config, StreamConfig
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import SEQUENCE_PROP, committed_state
from pipeline.load.run import SparkClusterEngine, SparkEngine

USERS = StreamConfig(name="users", table="app.users", columns=(
    Column("user_id", "string", required=True), Column("name", "string"),
    Column("deleted", "boolean")), primary_key=("user_id",), tombstone_field="deleted")
Event = tuple[str, str, int, bytes]


def user(n: int, uid: str | None, name: str, deleted: bool | None = None) -> Event:
    body: dict[str, Any] = {"name": name, "deleted": deleted}
    if uid is not None:
        body["user_id"] = uid
    return ("users", f"ev{n}", BASE_MS + n, msgspec.json.encode(body))


def rounds() -> list[list[list[Event]]]:
    """Three rounds of entries (each round one or more runs): inserts; updates, a
    tombstone and a key updated twice in one entry; re-inserting a deleted key,
    deleting another, a tombstone for a key never seen, new keys."""
    return [
        [[user(i, f"u{i}", "v1") for i in range(10)]],
        [[user(20, "u0", "v2"), user(21, "u1", "v2"), user(22, "u2", "", True),
          user(23, "u0", "v3")],
         [user(24, "u5", "x"), user(25, "u11", "new")]],
        [[user(30, "u2", "back"), user(31, "u3", "", True), user(32, "u4", "v4"),
          user(33, "u12", "", True), user(34, "u13", "n")]],
    ]


def config_for(root: Path, output: str) -> Config:
    root.mkdir(parents=True, exist_ok=True)
    return collector_config(root, streams=(USERS,), dequeue_every=1, output=output)


def rows_of(config: Config) -> list[dict[str, Any]]:
    rows = read_table(config, "app.users").to_pylist()
    keys = [r["user_id"] for r in rows]
    assert len(keys) == len(set(keys)), "a key is in the table twice"
    return sorted(rows, key=lambda r: r["user_id"])


def names_of(config: Config) -> dict[str, str]:
    return {r["user_id"]: r["name"] for r in rows_of(config)}


async def apply(config: Config, engine: Any) -> Any:
    collector = await start(config, engine)
    for entries in rounds():
        publish_sync(config, entries)
        await drain(collector)
    return collector


async def test_cluster_upserts_give_the_embedded_path_s_table(tmp_path, spark) -> None:
    embedded = config_for(tmp_path / "embedded", "embedded")
    cluster = config_for(tmp_path / "cluster", "cluster")
    done = await apply(embedded, SparkEngine(spark, 2))
    await done.store.close()
    collector = await apply(cluster, SparkClusterEngine(spark, 2))
    assert not collector.metrics.embedded_runs.collect()[0].samples  # all on the cluster path
    await collector.store.close()
    assert rows_of(cluster) == rows_of(embedded)  # every column, envelope included
    assert names_of(cluster) == {"u0": "v3", "u1": "v2", "u2": "back", "u4": "v4",
                                 "u5": "x", "u6": "v1", "u7": "v1", "u8": "v1", "u9": "v1",
                                 "u11": "new", "u13": "n"}
    table = open_catalog(cluster.catalog).load_table("app.users")
    summaries = [s.summary for s in table.snapshots() if s.summary is not None]
    overwrites = [s for s in summaries if s.operation.value == "overwrite"]
    assert overwrites, "replaced keys were committed by an overwrite"
    assert all(SEQUENCE_PROP in s.additional_properties for s in overwrites)
    assert committed_state(table).sequence == committed_state(
        open_catalog(embedded.catalog).load_table("app.users")).sequence


@pytest.mark.parametrize("stage", ["after_write", "after_commit:app.users",
                                   "after_commits", "after_ack"])
async def test_a_crash_after_the_write_or_the_commit_replays_exactly(tmp_path, spark,
                                                                      stage) -> None:
    config = config_for(tmp_path, "cluster")
    engine = SparkClusterEngine(spark, 2)
    publish_sync(config, [[user(i, f"u{i}", "v1") for i in range(5)]])
    first = await start(config, engine)
    await drain(first)  # the table has files to rewrite
    await first.store.close()
    publish_sync(config, [[user(10, "u0", "v2"), user(11, "u1", "", True)],
                          [user(12, "u0", "v3")]])
    crashing = await start(config, engine, hook=crash_at(stage))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    publish_sync(config, [[user(20, "u1", "again"), user(21, "u2", "v4")]])
    restarted = await start(config, engine)
    await drain(restarted)
    await restarted.store.close()
    assert names_of(config) == {"u0": "v3", "u1": "again", "u2": "v4", "u3": "v1",
                                "u4": "v1"}
    table = open_catalog(config.catalog).load_table("app.users")
    assert committed_state(table).sequence == 3
    assert sorted(r["_event_id"] for r in rows_of(config)) == ["ev12", "ev20", "ev21",
                                                                "ev3", "ev4"]


async def test_a_row_without_its_key_is_a_dead_letter_on_the_cluster_path(tmp_path,
                                                                          spark) -> None:
    config = config_for(tmp_path, "cluster")
    publish_sync(config, [[user(0, "u0", "v1"), user(1, None, "nobody"),
                           user(2, "u1", "v1")]])
    collector = await start(config, SparkClusterEngine(spark, 2))
    await drain(collector)
    assert not collector.metrics.embedded_runs.collect()[0].samples
    await collector.store.close()
    assert names_of(config) == {"u0": "v1", "u1": "v1"}
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    assert [(d["stream"], d["reason"], d["event_id"]) for d in dead] == [
        ("users", "missing_key:user_id", "ev1")]
    assert msgspec.json.decode(dead[0]["raw"])["name"] == "nobody"
    assert dead[0]["location"]  # the batch file of its entry


async def test_a_staged_keyed_sink_stages_on_the_executors_and_imports_as_upserts(
        tmp_path, spark) -> None:
    """A sink with import conditions and a key: the executors stage the runs (without
    the row that has no key value, a dead letter), and the import commits the latest row
    per key across the staged entries."""
    from collector.routing import Routes
    from icefloe.registry import Conditions, RegistryStore, ops
    from tests.collector_support import CLICKS, click, open_store_of, publish

    config = collector_config(tmp_path, (CLICKS,), output="cluster", dequeue_every=1)
    store = open_store_of(config)
    sink = ops.SinkSpec(name="clicks", table="web.clicks", columns=CLICKS.columns,
                        primary_key=("user_id",),
                        conditions=Conditions(max_age_s=3600, max_events=25))
    await RegistryStore(store, config.admin.registry_key).update(
        lambda r: ops.create_source(r, ops.SourceSpec(id="clicks", sinks=(sink,))))
    collector = await start(config, SparkClusterEngine(spark, 2))
    collector.routes = Routes(await RegistryStore(store, config.admin.registry_key).read())
    nokey = ("clicks", "nokey", BASE_MS, msgspec.json.encode({"url": "/x", "n": 1}))
    for prefix in ("a", "b", "c"):  # 10 events each over keys u0..u6; staged until 30
        events = [click(i, prefix) for i in range(10)] + ([nokey] if prefix == "a" else [])
        await publish(store, [events], registry_version=1)
        await collector.run_once()
    assert not collector.metrics.embedded_runs.collect()[0].samples
    rows = read_table(config, "web.clicks").to_pylist()
    assert sorted((r["user_id"], r["_event_id"]) for r in rows) == sorted(
        (f"u{i % 7}", f"c{i}") for i in range(3, 10))
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    assert [(d["event_id"], d["reason"]) for d in dead] == [("nokey", "missing_key:user_id")]
    await store.close()
    await collector.store.close()
