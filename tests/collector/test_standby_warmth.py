"""A standby warms Spark and the catalog while it waits, and only while it waits.

Real local store, real SQLite catalog, two real collectors (decode in-process, no Spark):
the Spark part of the warming is timed by ``tests/collector/test_standby.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from collector.runner import StandbyWarmth
from collector.service import Collector
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import LocalEngine
from tests.collector_support import collector_config, open_store_of


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
