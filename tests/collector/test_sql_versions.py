"""A ``sql`` column changed by a sink PATCH reaches only the events accepted from then on:
entries queued before the PATCH keep the expression of the registry version they were
accepted under, on both output paths (README: "Each entry is projected with the mappings
of the registry version it was accepted under"). Real Spark (local mode), real local
store, real SQLite catalog; the registry is changed as the admin API changes it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from collector_support import (
    CLICKS,
    assert_exact,
    change_registry,
    click,
    collector_config,
    ids,
    open_store_of,
    output_engine,
    publish,
    read_table,
    start,
)

from collector.routing import Routes
from icefloe.config import Column, Config
from icefloe.registry import Registry, RegistryStore, ops


def columns(sql: str) -> tuple[Column, ...]:
    return (*CLICKS.columns, Column("loud", "string", sql=sql))


async def queue(config: Config, registry: Registry, prefix: str) -> None:
    """One batch file of 3 clicks, accepted under ``registry``'s version."""
    store = open_store_of(config)
    try:
        await publish(store, [[click(i, prefix) for i in range(3)]],
                      registry_version=registry.version)
    finally:
        await store.close()


@pytest.mark.parametrize("output", ["embedded", "cluster"])
async def test_a_patched_sql_expression_reaches_only_later_events(tmp_path: Path, spark: Any,
                                                                  output: str) -> None:
    config = collector_config(tmp_path, (CLICKS,), output=output, dequeue_every=1)
    first = await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(ops.SinkSpec(name="clicks", table="web.clicks",
                                         columns=columns("upper(url)")),))))
    await queue(config, first, "a")
    second = await change_registry(config, lambda r: ops.update_sink(
        r, "clicks", "clicks", ops.SinkPatch(columns=columns("lower(url)"))))
    await queue(config, second, "b")

    collector = await start(config, output_engine(spark, output))
    try:
        collector.routes = Routes(await RegistryStore(
            collector.store, config.admin.registry_key).read())
        await asyncio.to_thread(collector.prepare_tables)
        while (await collector.run_once()).entries:
            pass
    finally:
        await collector.store.close()

    assert_exact(config, "web.clicks", ids("a", 3) | ids("b", 3))
    rows = {r["_event_id"]: r["loud"] for r in read_table(config, "web.clicks").to_pylist()}
    assert rows == {"a0": "/P/0", "a1": "/P/1", "a2": "/P/2",  # accepted under upper(url)
                    "b0": "/p/0", "b1": "/p/1", "b2": "/p/2"}  # accepted after the PATCH


def test_an_old_sql_expression_whose_column_is_gone_leaves_only_its_entries_null(
        caplog: pytest.LogCaptureFixture) -> None:
    """A sink PATCH removes ``url`` and changes the ``sql`` that read it: the entries
    queued before would get ``upper(url)``, which Spark cannot resolve any more (no sink
    of the source declares ``url``), failing the run's job and, in the per-column
    fallback, the column's values of the later entries too. That version's expression
    is left out instead (its entries get null, with a warning naming the column); the
    later entries keep theirs."""
    registry = ops.create_source(Registry(), ops.SourceSpec(id="clicks", sinks=(
        ops.SinkSpec(name="clicks", table="web.clicks", columns=columns("upper(url)")),)))
    kept = tuple(c for c in CLICKS.columns if c.name != "url")
    registry = ops.update_sink(registry, "clicks", "clicks", ops.SinkPatch(
        columns=(*kept, Column("loud", "string", sql="upper(user_id)"))))
    with caplog.at_level("WARNING", logger="icefloe.collector"):
        cases = Routes(registry).sql_cases({"clicks": {10: 1, 11: 2, 12: 2}})
    [case] = cases["clicks"]["loud"]
    assert (case.sql, case.ranges) == ("upper(user_id)", ((11, 12),))
    assert "reads 'url', which no sink of the source declares" in caplog.text
