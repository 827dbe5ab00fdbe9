"""The collector over several manifest shards, on real Spark and a real SQLite catalog.

Each test ends with the invariant: ``count(*) == count(distinct _event_id) == events
sent`` per table; the tables record every shard's sequence (``icefloe.sequences``) and
each row says which shard its entry came from (``_shard``).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from collector_support import (
    CLICKS,
    Crash,
    assert_exact,
    buy,
    click,
    collector_config,
    crash_at,
    drain,
    open_store_of,
    publish,
    read_table,
    start,
)
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from collector.service import Fenced
from icefloe.config import Config
from icefloe.manifest import ShardedProducer, grow_shards
from icefloe.manifest.shards import read_shard_count
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import (
    EPOCH_PROP,
    SEQUENCE_PROP,
    committed_state,
)
from pipeline.load.run import SparkEngine

Event = tuple[str, str, int, bytes]
SEQUENCES_PROP = "icefloe.sequences"  # spelled out: the tests run against older code too


def sharded(config: Config, shards: int) -> Config:
    return msgspec.structs.replace(
        config, manifest=msgspec.structs.replace(config.manifest, shards=shards))


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return sharded(collector_config(tmp_path, dequeue_every=1), 3)


@pytest.fixture
def engine(spark: Any) -> SparkEngine:
    return SparkEngine(spark, 2)


async def publish_on(config: Config, shard: int, batches: list[list[Event]]) -> list[int]:
    """Append ``batches`` to ``shard`` (one producer pinned to it); their sequences."""
    store = open_store_of(config)
    try:
        if shard + 1 > await read_shard_count(store, config.manifest.key):
            await grow_shards(store, config.manifest.key, shard + 1,
                              backoff=config.manifest.build().conflict_backoff)
        producer = ShardedProducer(store, config.manifest.build(), shard=shard)
        try:
            return await publish(store, batches, producer)  # type: ignore[arg-type]
        finally:
            await producer.close()
    finally:
        await store.close()


def clicks(prefix: str, n: int) -> list[Event]:
    return [click(i, prefix) for i in range(n)]


def shard_of(config: Config, table: str) -> dict[str, tuple[int, int]]:
    rows = read_table(config, table)
    return {r["_event_id"]: (r["_shard"], r["_sequence"]) for r in rows.to_pylist()}


async def test_three_shards_commit_every_entry_once_and_record_each_shard(config, engine):
    await publish_on(config, 0, [clicks("a", 5), [buy(0, "x")]])
    await publish_on(config, 1, [clicks("b", 4)])
    # the same event (a client retry) reached shard 2 too: dedup keeps one copy
    await publish_on(config, 2, [clicks("c", 3), [*clicks("c", 2), click(0, "a")]])
    collector = await start(config, engine)
    try:
        assert await drain(collector) == 1
        acked = {n: m.consumer.acked_through
                 for n, m in (await collector.consumer.snapshot()).items()}
    finally:
        await collector.store.close()
    assert acked == {0: 1, 1: 0, 2: 1}
    assert_exact(config, "web.clicks", {f"a{i}" for i in range(5)} | {f"b{i}" for i in
                                        range(4)} | {f"c{i}" for i in range(3)})
    assert_exact(config, "shop.buys", {"x0"})
    table = open_catalog(config.catalog).load_table("web.clicks")
    props = table.current_snapshot().summary.additional_properties
    assert props[SEQUENCES_PROP] == "0:1,1:0,2:1"
    assert props[SEQUENCE_PROP] == "1"  # shard 0's, for readers that know no shards
    assert committed_state(table).sequences == {0: 1, 1: 0, 2: 1}
    where = shard_of(config, "web.clicks")
    assert where["a3"] == (0, 0)
    assert where["b1"] == (1, 0)
    assert where["c2"] == (2, 0)
    assert where["a0"] == (0, 0)  # the first copy in shard 0 won, shard 2's was dropped
    assert [f.name for f in table.schema().fields][-3:] == ["_received_at", "_sequence",
                                                             "_shard"]


async def test_a_crash_between_tables_replays_nothing_twice_per_shard(tmp_path, engine):
    """Crash after one table committed, before the ack: the replay (which now also holds
    newer entries of one shard) drops exactly what each table holds, shard by shard. The
    tables commit one after another (``commit_workers = 1``), so the crash finds the other
    uncommitted (several at once: tests/collector/test_commit_workers.py)."""
    config = sharded(collector_config(tmp_path, dequeue_every=1, commit_workers=1), 3)
    await publish_on(config, 0, [[*clicks("a", 4), buy(0, "x")]])
    await publish_on(config, 1, [[*clicks("b", 4), buy(1, "y")]])
    await publish_on(config, 2, [clicks("c", 4)])
    first = await start(config, engine, hook=crash_at("after_commit:web.clicks"))
    with pytest.raises(Crash):
        await first.run_once()
    await first.store.close()
    assert read_table(config, "web.clicks").num_rows == 12
    assert read_table(config, "shop.buys").num_rows == 0
    await publish_on(config, 1, [[*clicks("d", 3), buy(2, "z")]])

    second = await start(config, engine)
    try:
        await drain(second)
        result_sequences = dict(second.table_sequences["web.clicks"])
    finally:
        await second.store.close()
    assert_exact(config, "web.clicks", {f"{p}{i}" for p in "abc" for i in range(4)}
                 | {f"d{i}" for i in range(3)})
    assert_exact(config, "shop.buys", {"x0", "y1", "z2"})
    assert result_sequences == {0: 0, 1: 1, 2: 0}
    assert shard_of(config, "web.clicks")["d2"] == (1, 1)


class SparkGate:
    """A Spark engine whose job waits until the test lets it go."""

    name = "gate"
    partitions = 2

    def __init__(self, inner: SparkEngine) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.go = threading.Event()

    def run(self, spec: Any) -> Any:
        self.entered.set()
        assert self.go.wait(60), "the test never released the job"
        return self.inner.run(spec)


async def test_a_takeover_mid_run_fences_every_shard_and_table(config, engine):
    for shard in range(3):
        await publish_on(config, shard, [clicks(f"s{shard}-", 5)])
    gate = SparkGate(engine)
    old = await start(config, gate)
    running = asyncio.create_task(old.run_once())
    assert await asyncio.to_thread(gate.entered.wait, 30)
    new = await start(config, engine)
    gate.go.set()
    with pytest.raises(Fenced):
        await running
    assert read_table(config, "web.clicks").num_rows == 0
    with pytest.raises(Fenced):  # nor can it ack on any shard
        await old.run_once()
    epochs = {n: m.epoch for n, m in (await new.consumer.snapshot()).items()}
    assert epochs == {0: new.epoch, 1: new.epoch, 2: new.epoch}
    await drain(new)
    assert_exact(config, "web.clicks", {f"s{s}-{i}" for s in range(3) for i in range(5)})
    await old.store.close()
    await new.store.close()


async def test_growing_from_one_to_three_shards_while_the_collector_runs(tmp_path, engine):
    config = collector_config(tmp_path, dequeue_every=1)  # manifest.shards = 1
    await publish_on(config, 0, [clicks("a", 3)])
    collector = await start(config, engine)
    try:
        assert await drain(collector) == 1
        await publish_on(config, 2, [clicks("c", 3)])  # grows the store to 3 shards
        await publish_on(config, 1, [clicks("b", 3)])
        await publish_on(config, 0, [clicks("d", 3)])
        assert await drain(collector) == 1
        assert collector.consumer.shard_count == 3
        epochs = {n: m.epoch for n, m in (await collector.consumer.snapshot()).items()}
    finally:
        await collector.store.close()
    assert epochs == {0: collector.epoch, 1: collector.epoch, 2: collector.epoch}
    assert_exact(config, "web.clicks", {f"{p}{i}" for p in "abcd" for i in range(3)})
    assert committed_state(open_catalog(config.catalog).load_table("web.clicks")
                           ).sequences == {0: 1, 1: 0, 2: 0}


async def test_a_table_from_before_shards_gains_the_column_and_reads_as_shard_0(
        config, engine):
    """A table written before ``_shard`` existed: evolved, its rows read as shard 0 (null),
    and its ``icefloe.sequence`` counts as shard 0's offset (entry 0 is not replayed)."""
    catalog = open_catalog(config.catalog)
    catalog.create_namespace_if_not_exists("web")
    old = Schema(*(NestedField(i, name, kind, required=False) for i, (name, kind) in
                   enumerate([("user_id", StringType()), ("url", StringType()),
                              ("n", LongType()), ("ts", TimestamptzType()),
                              ("_event_id", StringType()),
                              ("_received_at", TimestamptzType()),
                              ("_sequence", LongType())], start=1)))
    table = catalog.create_table("web.clicks", old,
                                 properties={"commit.retry.num-retries": "0"})
    await publish_on(config, 0, [clicks("a", 3), clicks("b", 3)])
    rows = pa.table({"user_id": ["u0", "u1", "u2"], "url": ["/", "/", "/"],
                     "n": pa.array([0, 1, 2], pa.int64()),
                     "ts": pa.array([None] * 3, pa.timestamp("us", tz="UTC")),
                     "_event_id": ["a0", "a1", "a2"],
                     "_received_at": pa.array([0, 0, 0], pa.timestamp("us", tz="UTC")),
                     "_sequence": pa.array([0, 0, 0], pa.int64())})
    table.append(rows, snapshot_properties={SEQUENCE_PROP: "0", EPOCH_PROP: "0"})
    await publish_on(config, 1, [clicks("c", 3)])
    assert CLICKS.table == "web.clicks"

    collector = await start(config, engine)
    try:
        await drain(collector)
    finally:
        await collector.store.close()
    assert_exact(config, "web.clicks", {f"{p}{i}" for p in "abc" for i in range(3)})
    where = shard_of(config, "web.clicks")
    assert where["a0"] == (None, 0)  # an old row: null means shard 0
    assert where["b0"] == (0, 1)
    assert where["c0"] == (1, 0)
    state = committed_state(catalog.load_table("web.clicks"))
    assert state.sequences == {0: 1, 1: 0}


async def test_the_dedup_window_is_rebuilt_from_every_shard_after_a_restart(config, engine):
    """Ids committed from shards 1 and 2 by an earlier collector are remembered by the
    next one (rebuilt from ``_shard``, ``_sequence`` and each commit's per-shard offsets):
    client retries that arrive on other shards afterwards are dropped."""
    await publish_on(config, 0, [clicks("z", 1)])
    await publish_on(config, 1, [clicks("a", 3)])
    await publish_on(config, 2, [clicks("b", 3)])
    first = await start(config, engine)
    await drain(first)
    await first.store.close()
    second = await start(config, engine)
    try:
        assert {len(second.windows["web.clicks"].ids(s)) for s in ("clicks",)} == {7}
        await publish_on(config, 0, [[click(1, "a"), click(2, "b"), click(5, "n")]])
        await publish_on(config, 2, [[click(0, "a")]])
        await drain(second)
    finally:
        await second.store.close()
    assert_exact(config, "web.clicks", {"z0", "n5"} | {f"{p}{i}" for p in "ab"
                                                       for i in range(3)})


async def test_a_store_grown_under_a_cluster_output_collector_stays_on_the_cluster_path(
        tmp_path, spark):
    """The store grows past one shard while a cluster-output collector runs: its runs stay
    on the cluster path, which writes each row with its own shard and sequence (before:
    they took the embedded path, counted as ``embedded_runs{reason="shards"}``)."""
    from pipeline.load.run import SparkClusterEngine

    config = collector_config(tmp_path, dequeue_every=1, output="cluster")
    await publish_on(config, 0, [clicks("a", 3)])
    collector = await start(config, SparkClusterEngine(spark, 2))
    try:
        await drain(collector)
        await publish_on(config, 1, [clicks("b", 3)])
        await publish_on(config, 0, [clicks("c", 3)])
        await drain(collector)
        fallbacks = collector.metrics.embedded_runs.labels("shards")._value.get()
    finally:
        await collector.store.close()
    assert fallbacks == 0
    assert_exact(config, "web.clicks", {f"{p}{i}" for p in "abc" for i in range(3)})
    where = shard_of(config, "web.clicks")
    assert (where["a0"], where["b0"], where["c0"]) == ((0, 0), (1, 0), (0, 1))


@pytest.mark.parametrize("stage", ["after_write", "after_commit:web.clicks",
                                   "after_commits"])
async def test_the_cluster_output_path_commits_every_shard_exactly_once(tmp_path, spark,
                                                                        stage):
    """``collector.output = "cluster"`` on three shards: the executors write each row with
    its shard and the shard's own sequence, each table records every shard, and a crash
    between the write, the commits and the ack replays exactly per shard."""
    from pipeline.load.run import SparkClusterEngine

    config = sharded(collector_config(tmp_path, dequeue_every=1, output="cluster"), 3)
    engine = SparkClusterEngine(spark, 2)
    await publish_on(config, 0, [clicks("a", 5), [buy(0, "x")]])
    await publish_on(config, 1, [clicks("b", 4)])
    await publish_on(config, 2, [clicks("c", 3), [*clicks("c", 2), click(0, "a")]])
    first = await start(config, engine, hook=crash_at(stage))
    with pytest.raises(Crash):
        await first.run_once()
    await first.store.close()
    await publish_on(config, 1, [clicks("d", 2)])
    second = await start(config, engine)
    try:
        await drain(second)
        embedded = sum(sample.value for metric in second.metrics.embedded_runs.collect()
                       for sample in metric.samples if sample.name.endswith("_total"))
    finally:
        await second.store.close()
    assert embedded == 0  # every run took the cluster path
    assert_exact(config, "web.clicks", {f"a{i}" for i in range(5)} | {f"b{i}" for i in
                                        range(4)} | {f"c{i}" for i in range(3)} | {"d0", "d1"})
    assert_exact(config, "shop.buys", {"x0"})
    placed = shard_of(config, "web.clicks")
    assert (placed["a0"], placed["b0"], placed["c0"], placed["d0"]) == \
        ((0, 0), (1, 0), (2, 0), (1, 1))
    table = open_catalog(config.catalog).load_table("web.clicks")
    props = table.current_snapshot().summary.additional_properties
    assert props[SEQUENCES_PROP] == "0:1,1:1,2:1"


async def test_a_replacement_collector_with_the_old_shard_count_takes_the_stores(
        config, engine, caplog):
    """Shards grown online (3 -> 4) while the collector ran; its replacement still has
    ``manifest.shards = 3``: it used to refuse to start (#36). The store's count wins,
    the warning names both numbers, and shard 3's entries are committed."""
    await publish_on(config, 0, [clicks("a", 3)])
    await publish_on(config, 3, [clicks("d", 4)])  # grows the store to 4 shards
    with caplog.at_level("WARNING", logger="icefloe.manifest"):
        collector = await start(config, engine)
    try:
        assert collector.consumer.shard_count == 4
        await drain(collector)
        acked = {n: m.consumer.acked_through
                 for n, m in (await collector.consumer.snapshot()).items()}
    finally:
        await collector.store.close()
    assert "manifest.shards = 3 is below the store's shard count 4" in caplog.text
    assert acked[3] == 0
    assert_exact(config, "web.clicks", {f"a{i}" for i in range(3)} | {f"d{i}" for i in
                                        range(4)})
    assert shard_of(config, "web.clicks")["d1"] == (3, 0)
