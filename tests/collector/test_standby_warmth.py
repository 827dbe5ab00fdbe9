"""A standby warms Spark and the catalog while it waits, and only while it waits.

Real local store, real SQLite catalog, two real collectors (decode in-process; the dry
job on the shared SparkSession): the Spark part of the warming is timed by
``tests/collector/test_standby.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from collector.runner import DRY_RUN_BYTES, DRY_RUN_ENTRIES, WARM_EVERY_S, StandbyWarmth
from collector.service import Collector
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import LocalEngine, SparkEngine
from tests.collector_support import click, collector_config, open_store_of, publish_sync


async def test_should_warm_while_on_standby_and_not_when_taking_the_queue(tmp_path: Path):
    config = collector_config(tmp_path, dedup_window_s=0)
    catalog = open_catalog(config.catalog)

    def build() -> tuple[Collector, StandbyWarmth]:
        engine = LocalEngine()
        return (Collector(config, open_store_of(config), catalog, engine),
                StandbyWarmth(config, engine, catalog, offload=asyncio.to_thread))

    active, idle = build()
    await active.acquire(on_standby=idle.start)  # the queue is free: no wait, no warming
    await asyncio.to_thread(active.prepare_tables)
    await asyncio.sleep(0)  # a warming task, had one been started, would run now
    assert not idle.warmed.is_set()
    standby, warmth = build()
    stop = asyncio.Event()
    waiting = asyncio.create_task(standby.acquire(stop=stop, on_standby=warmth.start))
    try:
        await asyncio.wait_for(warmth.warmed.wait(), 30)
        assert warmth.tables == 2  # web.clicks and shop.buys, created by the active one
        assert not waiting.done()
        assert standby.metrics.health.role == "standby"
    finally:
        stop.set()
        await asyncio.gather(waiting, return_exceptions=True)
        await warmth.stop()
        for collector in (active, standby):
            await collector.store.close()


async def test_should_run_a_dry_job_on_the_queue_head_and_commit_nothing(tmp_path: Path,
                                                                        spark: Any):
    """The standby's dry job (issue #43: its first run after a takeover took 20 s in the
    chaos run, the next ones 2-5 s): a real Spark run of a few queued entries whose rows
    are dropped. It reads the manifest without the lease, and nothing is committed, acked
    or dequeued."""
    config = collector_config(tmp_path, dedup_window_s=0)
    catalog = open_catalog(config.catalog)
    active = Collector(config, open_store_of(config), catalog, LocalEngine())
    await active.acquire()
    await asyncio.to_thread(active.prepare_tables)
    standby = Collector(config, open_store_of(config), catalog, SparkEngine(spark, 2))
    warmth = StandbyWarmth(config, standby.engine, catalog, offload=asyncio.to_thread,
                           sample=lambda: standby.queue_sample(DRY_RUN_ENTRIES,
                                                               DRY_RUN_BYTES))
    try:
        warmth.start()  # on an empty queue: warm, no dry job yet
        await asyncio.wait_for(warmth.warmed.wait(), 120)
        assert warmth.dry_runs == 0
        publish_sync(config, [[click(i) for i in range(k, k + 5)] for k in range(0, 20, 5)])
        before = catalog.load_table("web.clicks").current_snapshot()
        sample = await standby.queue_sample(DRY_RUN_ENTRIES, DRY_RUN_BYTES)
        assert [e.sequence for e in sample] == [0, 1]  # the head, capped
        # the queue is looked at every DRY_RUN_POLL_S until the first dry job, not every
        # WARM_EVERY_S: it runs well before the next full pass
        await asyncio.wait_for(warmth.dried.wait(), WARM_EVERY_S)
        assert warmth.dry_runs == 1
        assert catalog.load_table("web.clicks").current_snapshot() == before
        heads = await standby.queue_heads()
        assert heads[0] == (4, -1)  # nothing acknowledged
    finally:
        await warmth.stop()
        for collector in (active, standby):
            await collector.store.close()
