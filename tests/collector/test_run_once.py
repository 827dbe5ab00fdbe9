"""``run_collector(once=True)``, the loop behind ``icefloe run``: it commits what is queued
and stops, and never waits as a standby (issue #26). No Spark: the in-process LocalEngine."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from collector_support import click, publish_sync
from process_support import table_rows, write_config

from collector.runner import run_collector
from icefloe.config import load_config
from icefloe.errors import LeaseHeldError
from icefloe.manifest import ManifestConsumer
from icefloe.store import open_async_store
from pipeline.load.run import LocalEngine


def test_once_commits_the_queue_and_returns(tmp_path):
    config = load_config(write_config(tmp_path))
    publish_sync(config, [[click(i) for i in range(10)], [click(i) for i in range(10, 25)]])
    code = asyncio.run(run_collector(config, once=True, serve_metrics=False,
                                     engine=LocalEngine()))
    assert code == 0
    assert table_rows(config, "web.clicks") == 25


def test_once_refuses_a_live_lease_instead_of_waiting(tmp_path):
    # a lease that outlives a loaded machine: with the suite's 2 s it expired before the
    # run opened its catalog in one CI run, and `run` rightly took over a dead lease
    base = load_config(write_config(tmp_path))
    config = msgspec.structs.replace(base, manifest=msgspec.structs.replace(
        base.manifest, lease_s=120.0))
    publish_sync(config, [[click(1)]])

    async def other_then_once() -> int:
        store = open_async_store(config.store.url)
        try:
            await ManifestConsumer(store, config.manifest.build(),
                                   holder="collector-elsewhere").initialize()
        finally:
            await store.close()
        return await run_collector(config, once=True, serve_metrics=False,
                                   engine=LocalEngine())

    with pytest.raises(LeaseHeldError) as error:
        asyncio.run(other_then_once())
    assert error.value.holder == "collector-elsewhere"
    assert table_rows(config, "web.clicks") <= 0  # nothing committed


def test_a_clean_stop_hands_the_lease_back_at_once(tmp_path):
    """A standby must not wait out ``lease_s`` after the active collector stopped cleanly
    (issue #28): the stop ends the lease, keeping the epoch."""
    config = load_config(write_config(tmp_path))
    publish_sync(config, [[click(1)]])

    async def once_then_look() -> tuple[str, float, float, int]:
        assert await run_collector(config, once=True, serve_metrics=False,
                                   engine=LocalEngine()) == 0
        store = open_async_store(config.store.url)
        try:
            consumer = ManifestConsumer(store, config.manifest.build(), holder="standby")
            holder, expires, now = await consumer.lease()
            epoch = await consumer.initialize(respect_lease=True)  # no LeaseHeldError
        finally:
            await store.close()
        return holder, expires, now, epoch

    _, expires, now, epoch = asyncio.run(once_then_look())
    assert expires <= now < expires + config.manifest.lease_s
    assert epoch >= 2
