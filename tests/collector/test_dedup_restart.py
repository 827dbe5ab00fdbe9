"""Exactly once across collector restarts (#36): the dedup window a restarted collector
rebuilds holds every id committed within ``dedup_window_s`` — a tombstone's (which writes
no row), an update's whatever its copy-on-write commits copied, and those of commits whose
snapshots another tool expired. Real Spark (embedded output), real SQLite catalog, a local
store; the collector is stopped and started again between the original and its retry."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest
from collector_support import (
    BASE_MS,
    CLICKS,
    assert_exact,
    click,
    collector_config,
    drain,
    ids,
    open_store_of,
    publish_sync,
    read_table,
    start,
)

from icefloe.config import Column, StreamConfig
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import committed_state
from pipeline.load.run import SparkEngine

USERS = StreamConfig(name="users", table="app.users", columns=(
    Column("user_id", "string", required=True), Column("name", "string"),
    Column("deleted", "boolean")), primary_key=("user_id",), tombstone_field="deleted")

_n = iter(range(10**6))


def user(uid: str, name: str, deleted: bool | None = None) -> tuple[str, str, int, bytes]:
    n = next(_n)
    body = {"user_id": uid, "name": name, "deleted": deleted}
    return ("users", f"ev{n}", BASE_MS + n, msgspec.json.encode(body))


def state(config) -> dict[str, str]:
    rows = read_table(config, "app.users").to_pylist()
    keys = [r["user_id"] for r in rows]
    assert len(keys) == len(set(keys)), "a key is in the table twice"
    return {r["user_id"]: r["name"] for r in rows}


@pytest.fixture
def engine(spark):
    return SparkEngine(spark, 2)


async def commit_each(collector, config, batches) -> None:
    """Publish each batch as one entry and commit it before the next (one commit each)."""
    for batch in batches:
        publish_sync(config, [batch])
        await drain(collector)


async def restart(config, engine, old):
    await old.store.close()
    return await start(config, engine)


async def test_a_retried_tombstone_does_not_delete_the_key_recreated_since(tmp_path: Path,
                                                                          engine):
    """u0 is deleted by a tombstone, then created again; after a restart the client
    retries the tombstone (same event id). It was committed within the window: dropped,
    and u0 stays. Before #36 the rebuilt window had no trace of a tombstone (it writes no
    row) and the retry deleted u0 again."""
    config = collector_config(tmp_path, streams=(USERS,), dequeue_every=1)
    tombstone = user("u0", "", True)
    first = await start(config, engine)
    await commit_each(first, config, [[user("u0", "v1"), user("u1", "v1")], [tombstone],
                                      [user("u0", "back")]])
    assert state(config) == {"u0": "back", "u1": "v1"}
    restarted = await restart(config, engine, first)
    publish_sync(config, [[tombstone]])
    await drain(restarted)
    assert state(config) == {"u0": "back", "u1": "v1"}
    assert restarted.metrics.duplicates.labels("users")._value.get() == 1
    await restarted.store.close()


async def test_copied_rows_do_not_cut_the_window_of_an_upsert_table(tmp_path: Path, engine):
    """40 keys, then updates of single keys: each copy-on-write commit copies the other
    rows of the file it rewrites, up to 39. ``dedup_max_ids = 50`` holds every *event* of
    the window (44), so after a restart a stale retry of the first update of u0 must lose
    to the newer one. Before #36 the rebuild counted copied rows against the bound and
    stopped before that update."""
    config = collector_config(tmp_path, streams=(USERS,), dequeue_every=1,
                              dedup_max_ids=50)
    stale = user("u0", "v2")
    first = await start(config, engine)
    await commit_each(first, config, [[user(f"u{i}", "v1") for i in range(40)], [stale],
                                      [user("u1", "x")], [user("u2", "x")],
                                      [user("u0", "v3")]])
    restarted = await restart(config, engine, first)
    publish_sync(config, [[stale]])
    await drain(restarted)
    assert state(config)["u0"] == "v3"
    window = restarted.windows["app.users"]
    assert len(window) == 44  # every event, no copy
    assert window.effective_s() == config.collector.dedup_window_s
    await restarted.store.close()


async def test_snapshots_expired_by_another_tool_do_not_shrink_the_window(tmp_path: Path,
                                                                        engine):
    """Three commits, then another tool expires every snapshot but the current one. A
    restarted collector still drops the retry of the first commit's events (minutes old,
    inside the window): the ids are read from the dedup journal beside the table, not
    from the snapshots. Before #36 the window was rebuilt from what was left, without a
    word, and the retries landed twice."""
    config = collector_config(tmp_path, streams=(CLICKS,), dequeue_every=1)
    first_batch = [click(i, "a") for i in range(5)]
    first = await start(config, engine)
    await commit_each(first, config, [first_batch, [click(i, "b") for i in range(5)],
                                      [click(i, "c") for i in range(5)]])
    table = open_catalog(config.catalog).load_table("web.clicks")
    current = table.current_snapshot().snapshot_id
    old = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
    table.maintenance.expire_snapshots().by_ids(old).commit()  # another tool's expiry
    table = open_catalog(config.catalog).load_table("web.clicks")
    assert [s.snapshot_id for s in table.snapshots()] == [current]
    assert committed_state(table).sequence == 2
    restarted = await restart(config, engine, first)
    publish_sync(config, [first_batch])  # the client retries its first request
    await drain(restarted)
    assert_exact(config, "web.clicks", ids("a", 5) | ids("b", 5) | ids("c", 5))
    await restarted.store.close()


async def test_a_record_of_a_commit_that_never_landed_does_not_count(tmp_path: Path,
                                                                     engine):
    """A crash after the journal record, before the commit: the record names sequences
    the table has not committed, so the restarted collector must not drop the replayed
    rows as copies (that would lose them); they land once."""
    from collector_support import Crash, crash_at

    from collector.journal import PREFIX, SUFFIX

    config = collector_config(tmp_path, streams=(CLICKS,), dequeue_every=1)
    publish_sync(config, [[click(i, "a") for i in range(5)]])
    crashing = await start(config, engine, hook=crash_at("after_journal:web.clicks"))
    with pytest.raises(Crash):
        await drain(crashing)
    listed = await crashing.store.list(PREFIX + "/web.clicks/")
    assert [o.key for o in listed.objects if o.key.endswith(SUFFIX)]
    restarted = await restart(config, engine, crashing)
    assert restarted.windows["web.clicks"].ids("clicks") == set()
    await drain(restarted)
    assert_exact(config, "web.clicks", ids("a", 5))
    await restarted.store.close()


async def test_a_log_cut_before_the_journal_began_is_reported(tmp_path: Path, engine,
                                                              caplog):
    """A table committed by an icefloe without the journal (simulated: its journal is
    removed), whose older snapshots another tool expired: the collector cannot know the
    ids of the expired commits, says so and reports the window it has (not silently)."""
    from collector.journal import PREFIX

    config = collector_config(tmp_path, streams=(CLICKS,), dequeue_every=1)
    first = await start(config, engine)
    await commit_each(first, config, [[click(i, "a") for i in range(3)],
                                      [click(i, "b") for i in range(3)]])
    store = open_store_of(config)
    for obj in (await store.list(PREFIX + "/")).objects:  # as before the journal existed
        await store.delete(obj.key)
    await store.close()
    table = open_catalog(config.catalog).load_table("web.clicks")
    current = table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]).commit()
    with caplog.at_level(logging.WARNING, logger="icefloe.collector"):
        restarted = await restart(config, engine, first)
    assert "expired outside icefloe" in caplog.text
    window = restarted.windows["web.clicks"]
    assert window.effective_s() < config.collector.dedup_window_s
    assert window.ids("clicks") == ids("b", 3)
    await restarted.store.close()
