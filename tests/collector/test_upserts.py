"""Upserts through the collector on real Spark and a real SQLite catalog: updates replace,
tombstones delete, a row without a key value is a dead letter, and a crash between the
commit and the ack replays exactly."""

from __future__ import annotations

from pathlib import Path

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

from icefloe.config import Column, StreamConfig
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import committed_state
from pipeline.load.run import SparkEngine
from pipeline.read.iceberg_source import read_table as spark_read_table

USERS = StreamConfig(name="users", table="app.users", columns=(
    Column("user_id", "string", required=True), Column("name", "string"),
    Column("deleted", "boolean")), primary_key=("user_id",), tombstone_field="deleted")


@pytest.fixture
def config(tmp_path: Path):
    return collector_config(tmp_path, streams=(USERS,), dequeue_every=1)


@pytest.fixture
def engine(spark):
    return SparkEngine(spark, 2)


_ids = iter(range(10**6))


def user(uid: str | None, name: str, deleted: bool | None = None):
    body = {"name": name, "deleted": deleted}
    if uid is not None:
        body["user_id"] = uid
    n = next(_ids)
    return ("users", f"ev{n}", BASE_MS + n, msgspec.json.encode(body))


def table_state(config) -> dict[str, str]:
    rows = read_table(config, "app.users").to_pylist()
    keys = [r["user_id"] for r in rows]
    assert len(keys) == len(set(keys)), "a key is in the table twice"
    return {r["user_id"]: r["name"] for r in rows}


async def test_updates_replace_and_tombstones_delete_across_runs(config, engine, spark):
    publish_sync(config, [[user(f"u{i}", "v1") for i in range(10)],
                          [user("u0", "v2"), user("u1", "v2"), user("u2", "", True),
                           user("u0", "v3")]])
    collector = await start(config, engine)
    await drain(collector)
    expected = {f"u{i}": "v1" for i in range(3, 10)} | {"u0": "v3", "u1": "v2"}
    assert table_state(config) == expected
    publish_sync(config, [[user("u2", "back"), user("u3", "", True), user("u4", "v4")]])
    await drain(collector)
    del expected["u3"]
    expected |= {"u2": "back", "u4": "v4"}
    assert table_state(config) == expected
    through_spark = spark_read_table(spark, config.catalog, "app.users").collect()
    assert {r["user_id"]: r["name"] for r in through_spark} == expected
    assert len(through_spark) == len(expected)
    await collector.store.close()


async def test_a_row_without_its_key_is_a_dead_letter(config, engine):
    publish_sync(config, [[user("u0", "v1"), user(None, "nobody"), user("u1", "v1")]])
    collector = await start(config, engine)
    await drain(collector)
    assert table_state(config) == {"u0": "v1", "u1": "v1"}
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    assert [(d["stream"], d["reason"]) for d in dead] == [("users", "missing_key:user_id")]
    assert msgspec.json.decode(dead[0]["raw"])["name"] == "nobody"
    assert dead[0]["location"]  # the batch file of its entry
    await collector.store.close()


@pytest.mark.parametrize("stage", ["after_commit:app.users", "after_commits", "after_ack"])
async def test_a_crash_between_commit_and_ack_replays_exactly(config, engine, stage):
    publish_sync(config, [[user(f"u{i}", "v1") for i in range(5)],
                          [user("u0", "v2"), user("u1", "", True)]])
    crashing = await start(config, engine, hook=crash_at(stage))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    table = open_catalog(config.catalog).load_table("app.users")
    snapshots = len(table.snapshots())
    publish_sync(config, [[user("u1", "again"), user("u2", "v3")]])
    restarted = await start(config, engine)
    await drain(restarted)
    table = open_catalog(config.catalog).load_table("app.users")
    assert table_state(config) == {"u0": "v2", "u1": "again", "u2": "v3", "u3": "v1",
                                   "u4": "v1"}
    assert committed_state(table).sequence == 2
    # the replayed entries were dropped, not applied again: one fence and one commit more
    assert len(table.snapshots()) == snapshots + 2
    await restarted.store.close()


async def test_staged_rows_of_a_keyed_sink_commit_as_upserts(tmp_path):
    """A sink with import conditions and a key: staged runs land as one copy-on-write
    commit, the latest row per key across the staged entries (in-process decode)."""
    from collector.routing import Routes
    from icefloe.registry import Conditions, RegistryStore, ops
    from pipeline.load.run import LocalEngine
    from tests.collector_support import CLICKS, click, open_store_of, publish

    config = collector_config(tmp_path, (CLICKS,))
    store = open_store_of(config)
    sink = ops.SinkSpec(name="clicks", table="web.clicks", columns=CLICKS.columns,
                        primary_key=("user_id",),
                        conditions=Conditions(max_age_s=3600, max_events=25))
    await RegistryStore(store, config.admin.registry_key).update(
        lambda r: ops.create_source(r, ops.SourceSpec(id="clicks", sinks=(sink,))))
    collector = await start(config, LocalEngine())
    collector.routes = Routes(await RegistryStore(store, config.admin.registry_key).read())
    for prefix in ("a", "b", "c"):  # 10 events each over keys u0..u6; staged until 30
        await publish(store, [[click(i, prefix) for i in range(10)]], registry_version=1)
        await collector.run_once()
    rows = read_table(config, "web.clicks").to_pylist()
    assert sorted((r["user_id"], r["_event_id"]) for r in rows) == sorted(
        (f"u{i % 7}", f"c{i}") for i in range(3, 10))
    await store.close()
    await collector.store.close()


async def test_a_restart_rebuilds_the_window_from_upsert_commits(config):
    """Upsert commits that replace rows are overwrite snapshots, not appends: a collector
    restarted after them rebuilds its dedup window from them too, keyed by their source,
    and drops a client's retry of an event an overwrite committed (the row keeps its
    original sequence). In-process decode (no Spark)."""
    from pipeline.load.run import LocalEngine

    publish_sync(config, [[user(f"u{i}", "v1") for i in range(5)]])
    first = await start(config, LocalEngine())
    await drain(first)
    update = user("u0", "v2")
    publish_sync(config, [[update, user("u1", "", True)]])
    await drain(first)
    await first.store.close()
    table = open_catalog(config.catalog).load_table("app.users")
    assert table.current_snapshot().summary.operation.value == "overwrite"
    restarted = await start(config, LocalEngine())
    window = restarted.windows["app.users"]
    assert update[1] in window.ids("users")  # the overwrite's ids, under their own source
    publish_sync(config, [[update]])  # the client retries the update (same event id)
    await drain(restarted)
    rows = {r["user_id"]: r for r in read_table(config, "app.users").to_pylist()}
    assert {k: r["name"] for k, r in rows.items()} == {"u0": "v2", "u2": "v1", "u3": "v1",
                                                       "u4": "v1"}
    assert rows["u0"]["_sequence"] == 1  # the retry (sequence 2) was dropped
    assert restarted.metrics.duplicates.labels("users")._value.get() == 1
    await restarted.store.close()


async def test_a_retry_of_a_replaced_row_is_dropped_after_a_restart(config):
    """u0 is written, then replaced by a later update; the collector restarts and the
    first write's client retries it (same event id). The rebuilt window holds the replaced
    row's id (read from the file the upsert removed), so the stale retry is dropped and
    does not win over the update, as it would not without the restart."""
    from pipeline.load.run import LocalEngine

    original = user("u0", "v1")
    publish_sync(config, [[original, user("u1", "v1")]])
    first = await start(config, LocalEngine())
    await drain(first)
    publish_sync(config, [[user("u0", "v2")]])
    await drain(first)
    await first.store.close()
    restarted = await start(config, LocalEngine())
    assert original[1] in restarted.windows["app.users"].ids("users")
    publish_sync(config, [[original]])
    await drain(restarted)
    assert table_state(config) == {"u0": "v2", "u1": "v1"}
    await restarted.store.close()
