"""The collector on real Spark and a real SQLite Iceberg catalog: exactly once, always.

Every test ends with the invariant that matters: ``count(*) == count(distinct _event_id) ==
events sent`` per table.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from collector_support import (
    Crash,
    assert_exact,
    buy,
    click,
    collector_config,
    crash_at,
    drain,
    publish,
    publish_sync,
    read_table,
    start,
)

from collector.service import Collector, Fenced
from icefloe.errors import FencedError, TableFencedError
from icefloe.store import open_async_store
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import EPOCH_PROP, SEQUENCE_PROP, commit_rows, committed_state
from pipeline.load.run import SparkEngine


@pytest.fixture
def config(tmp_path: Path):
    return collector_config(tmp_path, dequeue_every=1)


@pytest.fixture
def engine(spark):
    return SparkEngine(spark, 2)





def workload(batches: int = 4, per: int = 50):
    return [[click(b * per + i) for i in range(per)] + [buy(b * per + i) for i in range(per // 5)]
            for b in range(batches)]


def ids(batches, stream: str) -> set[str]:
    return {e[1] for batch in batches for e in batch if e[0] == stream}


async def test_end_to_end_rows_types_and_summary(config, engine):
    batches = workload()
    publish_sync(config, batches)
    collector = await start(config, engine)
    assert await drain(collector) == 1
    assert_exact(config, "web.clicks", ids(batches, "clicks"))
    assert_exact(config, "shop.buys", ids(batches, "buys"))
    table = open_catalog(config.catalog).load_table("web.clicks")
    summary = table.current_snapshot().summary.additional_properties
    assert summary[SEQUENCE_PROP] == "3"
    assert summary[EPOCH_PROP] == str(collector.epoch)
    assert table.properties["commit.retry.num-retries"] == "0"
    row = next(r for r in read_table(config, "web.clicks").to_pylist() if r["_event_id"] == "c5")
    assert (row["n"], row["url"], row["_sequence"]) == (5, "/p/5", 0)
    manifest = (await collector.consumer.snapshot())[0]
    assert manifest.consumer.acked_through == 3
    assert manifest.entry_count == 0  # dequeued
    assert collector.metrics.rows.labels("web.clicks")._value.get() == 200
    assert collector.metrics.queue_length._value.get() == 0  # the last, empty read
    await collector.store.close()


@pytest.mark.parametrize("stage", ["after_job", "after_commit:web.clicks", "after_commits",
                                   "after_ack", "before_dequeue"])
async def test_crash_at_any_point_then_restart_is_exact(config, engine, stage):
    first = workload(3)
    publish_sync(config, first)
    crashing = await start(config, engine, hook=crash_at(stage))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    more = [[click(1000 + i) for i in range(30)] + [buy(1000 + i) for i in range(5)]]
    publish_sync(config, more)
    restarted = await start(config, engine)
    await drain(restarted)
    assert_exact(config, "web.clicks", ids(first + more, "clicks"))
    assert_exact(config, "shop.buys", ids(first + more, "buys"))
    assert committed_state(open_catalog(config.catalog).load_table("shop.buys")).sequence == 3
    await restarted.store.close()


async def test_client_retries_with_the_same_ids_do_not_duplicate(config, engine):
    batch = [click(i) for i in range(40)]
    publish_sync(config, [batch])
    collector = await start(config, engine)
    await drain(collector)
    publish_sync(config, [[*batch[:10], click(100)], batch[10:20]])  # retried requests
    await drain(collector)
    assert_exact(config, "web.clicks", {e[1] for e in batch} | {"c100"})
    assert collector.metrics.duplicates.labels("clicks")._value.get() == 20
    await collector.store.close()
    # A restarted collector rebuilds its window from the table and still drops retries.
    publish_sync(config, [batch[30:]])
    restarted = await start(config, engine)
    assert len(restarted.windows["web.clicks"]) == 41
    await drain(restarted)
    assert_exact(config, "web.clicks", {e[1] for e in batch} | {"c100"})
    await restarted.store.close()


async def test_standby_takes_over_after_the_lease_lapses_and_fences_the_old(config, engine):
    publish_sync(config, [[click(i) for i in range(10)]])
    active = await start(config, engine, takeover=False)
    await drain(active)
    await active.consumer.renew_lease()  # (the Runner renews every lease_s / 3)
    standby_store = open_async_store(config.store.url)
    standby = Collector(config, standby_store, open_catalog(config.catalog), engine)
    waiting = asyncio.create_task(standby.acquire())
    await asyncio.sleep(0.5)
    await active.consumer.renew_lease()  # the active one is alive: standby keeps waiting
    await asyncio.sleep(0.5)
    assert not waiting.done()
    # The active collector stops renewing (it hangs): the lease (2 s) lapses.
    epoch = await asyncio.wait_for(waiting, timeout=10)
    assert epoch == active.epoch + 1
    await asyncio.to_thread(standby.prepare_tables)
    publish_sync(config, [[click(i) for i in range(10, 20)]])
    with pytest.raises(Fenced, match="another collector took over"):
        await active.run_once()
    with pytest.raises(FencedError):
        await active.consumer.ack({0: 0})
    with pytest.raises(FencedError):
        await active.consumer.renew_lease()
    await drain(standby)
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(20)})
    await active.store.close()
    await standby_store.close()


async def test_takeover_fences_at_once_and_old_epoch_commits_are_refused(config, engine):
    publish_sync(config, [[click(i) for i in range(10)]])
    old = await start(config, engine)
    new = await start(config, engine, takeover=True)
    assert new.epoch == old.epoch + 1
    await drain(new)
    with pytest.raises(Fenced):
        await old.run_once()
    # Even a commit attempted straight at the table is refused: the table records epoch 2.
    rows = read_table(config, "web.clicks")
    with pytest.raises(TableFencedError):
        commit_rows(open_catalog(config.catalog), "web.clicks", rows, sequence=99,
                    epoch=old.epoch)
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(10)})
    await old.store.close()
    await new.store.close()


async def test_a_missing_batch_file_stops_the_run_until_it_is_back(config, engine, tmp_path):
    import os
    import shutil

    from icefloe.store import local_path

    publish_sync(config, [[click(i) for i in range(5)], [click(i) for i in range(5, 10)]])
    collector = await start(config, engine)
    entries = [e.entry for e in await collector.consumer.read()]
    path = Path(local_path(config.store.url)) / entries[1].location
    shutil.move(path, tmp_path / "away")
    with pytest.raises(Exception, match=r"NotFound|not found|No such"):
        await collector.run_once()
    assert (await collector.consumer.snapshot())[0].consumer.acked_through == -1
    assert collector.metrics.queue_length._value.get() == 2  # from the run's own read
    assert collector.metrics.lag_seconds._value.get() >= 0
    shutil.move(tmp_path / "away", path)
    os.sync()
    await drain(collector)
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(10)})
    await collector.store.close()


async def test_manifest_store_faults_are_retried_and_the_result_is_exact(config, engine):
    from icefloe.store.faults import FaultRule, FaultyAsyncStore
    from icefloe.store.retry import RetryingAsyncStore, RetryPolicy

    batches = workload(3, 20)
    publish_sync(config, batches)
    faulty = FaultyAsyncStore(open_async_store(config.store.url), [
        FaultRule("slowdown", ops=frozenset({"get"}), times=2),
        FaultRule("lose_response", ops=frozenset({"put"}), skip=2, times=2),
        FaultRule("fail", ops=frozenset({"put"}), skip=5, times=1)], seed=3)
    store = RetryingAsyncStore(faulty, RetryPolicy(max_attempts=6, base_delay_s=0.01,
                                                   max_delay_s=0.05, budget_s=10))
    collector = Collector(config, store, open_catalog(config.catalog), engine)
    await collector.acquire(takeover=True)
    await asyncio.to_thread(collector.prepare_tables)
    await drain(collector)
    publish_sync(config, [[click(500)]])
    await drain(collector)
    assert sum(faulty.injected.values()) >= 3
    assert_exact(config, "web.clicks", ids(batches, "clicks") | {"c500"})
    assert_exact(config, "shop.buys", ids(batches, "buys"))
    await store.close()


async def test_an_unknown_commit_outcome_is_rechecked_not_blindly_retried(config, engine):
    publish_sync(config, [[click(i) for i in range(10)]])
    collector = await start(config, engine)
    output = await asyncio.to_thread(
        engine.run, __import__("pipeline.load.spec", fromlist=["run_spec"]).run_spec(
            config, [e.entry for e in await collector.consumer.read()]))
    rows = output.tables["clicks"]
    calls = []

    def append_then_time_out(table, data, props):
        calls.append(data.num_rows)
        table.append(data, snapshot_properties=props)
        raise TimeoutError("catalog did not answer")  # the commit landed anyway

    result = commit_rows(collector.catalog, "web.clicks", rows, sequence=0,
                         epoch=collector.epoch, append=append_then_time_out)
    assert calls == [10]  # re-checked and found landed: appended once
    assert result.sequence == 0
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(10)})
    await collector.store.close()


async def test_publish_helper_round_trip(config):
    store = open_async_store(config.store.url)
    assert await publish(store, [[click(1)], [click(2)]]) == [0, 1]
    await store.close()


@pytest.mark.s3
async def test_on_s3_with_throttling_and_5xx_on_reads_and_writes(tmp_path, s3_bucket, s3_faults,
                                                                  engine):
    """Spark workers read batch files from S3 (moto) while the server throttles and fails
    requests; the collector's manifest writes fail too. Retries make the result exact."""
    from collector_support import open_store_of

    config = collector_config(tmp_path, store={"url": s3_bucket.url,
                                               "endpoint_url": s3_bucket.endpoint_url,
                                               "region": "us-east-1"})
    batches = workload(3, 20)
    publish_sync(config, batches)
    reads = s3_faults.add("GET", "/batches/", 503, "SlowDown", times=3)
    errors = s3_faults.add("GET", "/batches/", 500, "InternalError", times=2)
    writes = s3_faults.add("PUT", "/manifest/", 503, "SlowDown", times=2)
    store = open_store_of(config)
    collector = Collector(config, store, open_catalog(config.catalog), engine)
    await collector.acquire(takeover=True)
    await asyncio.to_thread(collector.prepare_tables)
    await drain(collector)
    assert (reads.fired, errors.fired, writes.fired) == (3, 2, 2)
    assert_exact(config, "web.clicks", ids(batches, "clicks"))
    assert_exact(config, "shop.buys", ids(batches, "buys"))
    await store.close()


async def test_maintenance_between_runs_keeps_the_table_exact_even_if_it_crashes(
        config, engine, monkeypatch):
    """Compaction crashing after writing its files, then GC of batch files and a clean
    maintenance pass, all between runs: no loss, no duplicate, sequence carried forward."""
    import pipeline.iceberg.maintenance as maintenance
    from collector.gc import collect_garbage
    from collector.runner import Runner

    collector = await start(config, engine)
    sent: set[str] = set()
    for round_ in range(9):  # 9 runs → 9 small files per partition
        batch = [click(round_ * 10 + i) for i in range(10)]
        publish_sync(config, [batch])
        sent |= {e[1] for e in batch}
        await drain(collector)
    settings = maintenance.MaintenanceSettings(min_input_files=4, max_snapshot_age_s=0,
                                               keep_last=1, orphan_age_s=3600)
    monkeypatch.setattr("collector.runner.maintenance_settings", lambda _config: settings)
    original = maintenance._rewrite_group

    def crash_after_writing(*args, **kwargs):
        original(*args, **kwargs)
        raise Crash("during compaction")

    monkeypatch.setattr(maintenance, "_rewrite_group", crash_after_writing)
    runner = Runner(collector, asyncio.Event())
    await asyncio.to_thread(runner.maintain)  # logs the failure, changes nothing
    assert collector.metrics.maintenance.labels("web.clicks", "error")._value.get() == 1
    assert_exact(config, "web.clicks", sent)
    monkeypatch.setattr(maintenance, "_rewrite_group", original)
    files_before = len(list(open_catalog(config.catalog).load_table("web.clicks")
                            .scan().plan_files()))
    await asyncio.to_thread(runner.maintain)
    table = open_catalog(config.catalog).load_table("web.clicks")
    assert len(list(table.scan().plan_files())) < files_before
    assert committed_state(table).sequence == 8
    assert_exact(config, "web.clicks", sent)
    gc = await collect_garbage(collector.store, collector.consumer.config.key, grace_s=0)
    assert gc.deleted == 9  # every batch file was consumed and dequeued
    publish_sync(config, [[click(500)]])
    await drain(collector)
    assert_exact(config, "web.clicks", sent | {"c500"})
    await collector.store.close()


async def test_retries_of_a_backlog_received_long_ago_are_still_caught_after_restart(
        config, engine):
    """The window counts from commit time: events received two hours ago but committed
    now must still absorb a retry after a restart."""
    old_ms = int((time.time() - 7200) * 1000)
    batch = [(s, i, old_ms, p) for s, i, _, p in (click(n) for n in range(20))]
    publish_sync(config, [batch])
    first = await start(config, engine)
    await drain(first)
    await first.store.close()
    publish_sync(config, [batch[:10]])  # the client retries after the restart
    restarted = await start(config, engine)
    assert len(restarted.windows["web.clicks"]) == 20
    await drain(restarted)
    assert_exact(config, "web.clicks", {e[1] for e in batch})
    await restarted.store.close()


async def test_a_retried_copy_in_a_later_entry_loses_to_the_original_on_replay(config, engine):
    """Crash after committing, then a replay run that also holds a retried copy: sequence
    order (not Spark's partition order) decides which copy dedup keeps."""
    original = [click(i) for i in range(5)]
    publish_sync(config, [original])
    crashing = await start(config, engine, hook=crash_at("after_commits"))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    # A big later entry (so it is grouped first) that repeats c3.
    publish_sync(config, [[click(3)] + [click(100 + i) for i in range(300)]])
    restarted = await start(config, engine)
    restarted.windows["web.clicks"].seen.clear()  # as if the window had forgotten c3
    restarted.windows["web.clicks"].chunks.clear()
    await drain(restarted)
    assert_exact(config, "web.clicks", {e[1] for e in original} | {f"c{100 + i}"
                                                                    for i in range(300)})
    await restarted.store.close()


async def test_a_reset_manifest_is_refused_instead_of_skipping_data(config, engine, tmp_path):
    from icefloe.errors import ManifestMismatchError
    from icefloe.store import local_path

    publish_sync(config, [[click(i) for i in range(5)] for _ in range(3)])
    collector = await start(config, engine)
    await drain(collector)
    await collector.store.close()
    manifest = Path(local_path(config.store.url)) / "manifest" / "queue"
    manifest.unlink()  # an operator "cleans up" the queue
    publish_sync(config, [[click(50)]])
    fresh = await start(config, engine)
    with pytest.raises(ManifestMismatchError, match="reset"):
        await fresh.verify_offsets()
    await fresh.store.close()


async def test_a_standby_cannot_fence_a_collector_that_renewed_in_between(config, engine):
    from icefloe.errors import LeaseHeldError

    active = await start(config, engine, takeover=False)
    other = Collector(config, open_async_store(config.store.url),
                      open_catalog(config.catalog), engine)
    await active.consumer.renew_lease()
    with pytest.raises(LeaseHeldError):
        await other.consumer.initialize(respect_lease=True)
    assert (await active.consumer.snapshot())[0].epoch == active.epoch
    await active.store.close()
    await other.store.close()
