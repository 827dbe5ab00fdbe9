"""The collector routes by the registry version each manifest entry was accepted under:
fan-out to several tables, a sink created at version N gets exactly the entries of versions
>= N, a disabled sink misses what came while it was off, a deleted source's queued events
are still delivered, an entry from a registry version the collector has not seen makes it
read the registry first, and one from a version the store does not have is never routed.
Real local store, real SQLite catalog, the in-process decode (LocalEngine)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.routing import Routes
from icefloe.config import Column, Config
from icefloe.errors import RegistryBehindError
from icefloe.registry import Registry, RegistryStore, ops
from tests.collector_support import (
    CLICKS,
    assert_exact,
    change_registry,
    click,
    collector_config,
    drain,
    ids,
    open_store_of,
    publish,
    read_table,
    start,
)

SLIM = ops.SinkSpec(name="slim", table="web.slim", columns=(Column("user_id", "string"),))
CLICKS_SINK = ops.SinkSpec(name="clicks", table="web.clicks", columns=CLICKS.columns)


def batch(prefix: str, count: int) -> list[tuple[str, str, int, bytes]]:
    return [click(i, prefix) for i in range(count)]


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, (CLICKS,))


async def collector_for(config: Config) -> Any:
    from pipeline.load.run import LocalEngine

    collector = await start(config, LocalEngine())
    registry = await RegistryStore(collector.store, config.admin.registry_key).read()
    if registry.version:
        collector.routes = Routes(registry)
        await asyncio.to_thread(collector.prepare_tables)
    return collector


async def test_should_fan_out_and_route_each_entry_by_its_version(config: Config) -> None:
    v1 = await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK,))))
    assert v1.version == 1
    store = open_store_of(config)
    await publish(store, [batch("a", 10)], registry_version=1)      # before the slim sink
    v2 = await change_registry(config, lambda r: ops.create_sink(r, "clicks", SLIM))
    await publish(store, [batch("b", 10)], registry_version=2)      # both sinks
    await change_registry(config, lambda r: ops.set_sink_enabled(r, "clicks", "slim", False))
    await publish(store, [batch("c", 10)], registry_version=3)      # slim is off
    await change_registry(config, lambda r: ops.set_sink_enabled(r, "clicks", "slim", True))
    await publish(store, [batch("d", 10)], registry_version=4)      # slim is back
    await store.close()
    assert v2.version == 2

    collector = await collector_for(config)
    await drain(collector)
    assert_exact(config, "web.clicks", ids("a", 10) | ids("b", 10) | ids("c", 10) | ids("d", 10))
    assert_exact(config, "web.slim", ids("b", 10) | ids("d", 10))
    slim = read_table(config, "web.slim")
    assert slim.column_names == ["user_id", "_event_id", "_received_at", "_sequence", "_shard"]
    await collector.store.close()


async def test_should_read_a_newer_registry_before_routing(config: Config) -> None:
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK,))))
    collector = await collector_for(config)  # knows version 1
    await change_registry(config, lambda r: ops.create_sink(r, "clicks", SLIM))
    store = open_store_of(config)
    await publish(store, [batch("n", 5)], registry_version=2)
    await store.close()
    await drain(collector)  # the entry needs version 2: the collector reads it first
    assert collector.routes.version == 2
    assert_exact(config, "web.slim", ids("n", 5))
    assert_exact(config, "web.clicks", ids("n", 5))
    await collector.store.close()


async def test_should_not_route_an_entry_from_an_unknown_registry_version(config: Config
                                                                         ) -> None:
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK,))))
    store = open_store_of(config)
    await publish(store, [batch("x", 3)], registry_version=7)
    await store.close()
    collector = await collector_for(config)
    with pytest.raises(RegistryBehindError, match="registry version 7"):
        await collector.run_once()
    # nothing was acknowledged: the entry is still there for when the registry is back
    pending = await collector.consumer.read(max_entries=10)
    assert [e.entry.registry_version for e in pending] == [7]
    await collector.store.close()


async def test_should_deliver_a_deleted_sources_queued_events(config: Config) -> None:
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(CLICKS_SINK, SLIM))))
    store = open_store_of(config)
    await publish(store, [batch("q", 8)], registry_version=1)
    await store.close()
    await change_registry(config, lambda r: ops.delete_source(r, "clicks"))
    collector = await collector_for(config)
    assert collector.routes.version == 2
    await drain(collector)
    assert_exact(config, "web.clicks", ids("q", 8))
    assert_exact(config, "web.slim", ids("q", 8))
    await collector.store.close()


async def test_should_take_config_era_entries_into_the_seeded_sinks(config: Config) -> None:
    store = open_store_of(config)
    await publish(store, [batch("old", 4)], registry_version=0)  # before any registry
    registry = RegistryStore(store, config.admin.registry_key)
    await registry.seed(config.streams, config.source)
    await registry.update(lambda r: ops.create_sink(r, "clicks", SLIM))
    await publish(store, [batch("new", 4)], registry_version=2)
    await store.close()
    collector = await collector_for(config)
    await drain(collector)
    assert_exact(config, "web.clicks", ids("old", 4) | ids("new", 4))
    assert_exact(config, "web.slim", ids("new", 4))
    await collector.store.close()


def test_should_know_when_the_cluster_path_can_route(config: Config) -> None:
    reg = ops.create_source(Registry(), ops.SourceSpec(id="clicks", sinks=(CLICKS_SINK,)))
    routes = Routes(reg)
    assert routes.single_target("clicks", {5: 1, 6: 1}) is not None
    reg = ops.create_sink(reg, "clicks", SLIM)
    routes = Routes(reg)
    assert routes.single_target("clicks", {5: 1}) is not None  # slim came at version 2
    assert routes.single_target("clicks", {5: 1, 6: 2}) is None  # fan-out at version 2


async def test_should_commit_a_table_once_when_two_sink_records_share_it(config: Config
                                                                         ) -> None:
    """Sink ``a`` writes web.clicks and is deleted; sink ``b`` takes the same table over.
    A run holding entries of both versions must commit every row, in one commit."""
    renamed = ops.SinkSpec(name="b", table="web.clicks", columns=CLICKS.columns)
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(msgspec.structs.replace(CLICKS_SINK, name="a"),))))
    await change_registry(config, lambda r: ops.delete_sink(r, "clicks", "a"))      # v2
    await change_registry(config, lambda r: ops.create_sink(r, "clicks", renamed))  # v3
    store = open_store_of(config)
    await publish(store, [batch("old", 6)], registry_version=1)
    await publish(store, [batch("new", 6)], registry_version=3)
    await store.close()
    collector = await collector_for(config)
    result = await collector.run_once()
    assert result.entries == 2  # one run, both versions
    assert_exact(config, "web.clicks", ids("old", 6) | ids("new", 6))
    await collector.store.close()


async def test_should_route_queued_events_of_a_re_created_source(config: Config) -> None:
    """The old record's sink had a column the new record's sinks lack: its queued events
    still decode and land in the old table, the new events in the new one."""
    old = ops.SinkSpec(name="old", table="web.old", columns=(
        Column("user_id", "string", required=True), Column("n", "long")))
    new = ops.SinkSpec(name="new", table="web.new", columns=(
        Column("user_id", "string", required=True), Column("url", "string")))
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(id="clicks",
                                                                       sinks=(old,))))
    store = open_store_of(config)
    await publish(store, [batch("o", 5)], registry_version=1)
    await change_registry(config, lambda r: ops.delete_source(r, "clicks"))              # v2
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(new,))))                                            # v3
    await publish(store, [batch("n", 5)], registry_version=3)
    await store.close()
    collector = await collector_for(config)
    await drain(collector)
    assert_exact(config, "web.old", ids("o", 5))
    assert_exact(config, "web.new", ids("n", 5))
    assert sorted(read_table(config, "web.old").column("n").to_pylist()) == list(range(5))
    assert read_table(config, "web.new").column("url").null_count == 0
    await collector.store.close()
