"""``icefloe up``'s collector commits while its SparkSession starts (collector/spark_bridge.py).

The first answer after ``make up`` used to wait for the JVM. Here a real collector (real
local store, SQLite catalog) on a :class:`SparkBridge` whose Spark start is held back by the
test: its runs are decoded in-process and committed exactly; once the start returns (a real
SparkSession), every later run goes to Spark; a start that fails stops the run loop with
the reason instead of retrying. Which configurations may bridge is checked by name."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.runner import Runner, _spark_of
from collector.spark_bridge import SparkBridge, SparkStartError, bridgeable
from icefloe.config import Column, Config
from pipeline.load import RunSpec, SparkEngine
from tests.collector_support import (
    CLICKS,
    assert_exact,
    click,
    collector_config,
    drain,
    publish_sync,
    start,
)


class CountingSpark(SparkEngine):
    """The real Spark engine, counting the runs it is given."""

    runs = 0

    def run(self, spec: RunSpec) -> Any:
        self.runs += 1
        return super().run(spec)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, (CLICKS,), dedup_window_s=0, dequeue_every=1)


async def test_runs_commit_in_process_until_spark_is_up_then_go_to_spark(
        config: Config, spark: Any) -> None:
    release = threading.Event()
    engine = CountingSpark(spark, 2)
    ready = threading.Event()

    def slow_start() -> SparkEngine:
        release.wait(60)
        return engine

    bridge = SparkBridge(slow_start, on_ready=ready.set)
    collector = await start(config, bridge)
    publish_sync(config, [[click(i) for i in range(5)]])
    assert await drain(collector) == 1
    assert_exact(config, "web.clicks", {click(i)[1] for i in range(5)})
    assert (engine.runs, bridge.spark, bridge.partitions) == (0, None, 1)  # in-process

    release.set()
    assert await asyncio.to_thread(ready.wait, 60)
    assert (bridge.spark, bridge.partitions) == (spark, 2)
    assert _spark_of(bridge, config)() is spark  # the models get the session
    publish_sync(config, [[click(i) for i in range(5, 9)]])
    assert await drain(collector) == 1
    assert engine.runs == 1
    assert_exact(config, "web.clicks", {click(i)[1] for i in range(9)})
    await collector.store.close()


async def test_a_spark_that_fails_to_start_stops_the_run_loop_with_the_reason(
        config: Config) -> None:
    def no_java() -> SparkEngine:
        raise RuntimeError("Java gateway process exited before sending its port number")

    bridge = SparkBridge(no_java)
    await asyncio.to_thread(bridge._ready.wait, 60)
    collector = await start(config, bridge)
    publish_sync(config, [[click(1)]])
    with pytest.raises(SparkStartError, match="did not start: Java gateway process exited"):
        await Runner(collector, asyncio.Event()).run()
    with pytest.raises(SparkStartError, match="check Java"):
        _spark_of(bridge, config)()
    await collector.store.close()


def test_only_configurations_decoded_in_process_as_on_spark_may_bridge(
        config: Config) -> None:
    assert bridgeable(config)
    cfg = config.collector
    assert not bridgeable(msgspec.structs.replace(
        config, collector=msgspec.structs.replace(cfg, output="cluster")))
    assert not bridgeable(msgspec.structs.replace(
        config, collector=msgspec.structs.replace(cfg, spark_master="spark://host:7077")))
    mapped = msgspec.structs.replace(CLICKS, columns=(
        *CLICKS.columns, Column("host", "string", sql="parse_url(url, 'HOST')")))
    assert not bridgeable(msgspec.structs.replace(config, streams=(mapped,)))
