"""Replay on Spark: a sink created (and paused) after its source's events were committed
and dequeued is filled from the kept batch files with exactly the original table's rows,
and the original table is not touched. Real Spark, local store, SQLite catalog."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from collector_support import (
    CLICKS,
    change_registry,
    click,
    collector_config,
    commit_routed,
    open_store_of,
    output_engine,
    publish,
    read_table,
)

from collector.replay import Replay
from collector.replay_plan import plan
from collector.replay_range import parse_bound
from icefloe.config import Config
from icefloe.registry import ops
from pipeline.iceberg.catalog import open_catalog

ORIGINAL = ops.SinkSpec(name="clicks", table="web.clicks", columns=CLICKS.columns)
COPY = ops.SinkSpec(name="copy", table="web.clicks_copy", columns=CLICKS.columns)


async def commit_with_registry(config: Config, engine: Any) -> None:
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(ORIGINAL,))))
    store = open_store_of(config)
    try:
        await publish(store, [[click(b * 50 + i) for i in range(50)] for b in range(6)],
                      registry_version=1)
    finally:
        await store.close()
    await commit_routed(config, engine)
    # the new sink, created after the events, paused while it is filled
    await change_registry(config, lambda r: ops.create_sink(r, "clicks", COPY))
    await change_registry(config, lambda r: ops.set_sink_enabled(r, "clicks", "copy", False))


def test_replay_into_a_new_sink_on_spark_matches_the_original_table(tmp_path: Path,
                                                                     spark: Any) -> None:
    config = collector_config(tmp_path, (CLICKS,), keep_batches_s=3600.0, max_run_entries=4)
    engine = output_engine(spark, "embedded")
    asyncio.run(commit_with_registry(config, engine))
    before = open_catalog(config.catalog).load_table("web.clicks").current_snapshot()

    async def planned() -> Any:
        store = open_store_of(config)
        try:
            return await plan(config, store, "clicks/copy", parse_bound("0", "--from"),
                              parse_bound("5", "--to"))
        finally:
            await store.close()

    p = asyncio.run(planned())
    replay = Replay(config, open_catalog(config.catalog), engine, p.target, p.entries)
    replay.start(truncate=False)
    done = replay.run()
    assert (done.rows, done.entries_done, len(done.chunks)) == (300, 6, 2)
    original = read_table(config, "web.clicks").sort_by("_event_id")
    copy = read_table(config, "web.clicks_copy").sort_by("_event_id")
    assert copy.num_rows == original.num_rows == 300
    assert copy.to_pylist() == original.to_pylist()
    assert open_catalog(config.catalog).load_table("web.clicks").current_snapshot() == before
