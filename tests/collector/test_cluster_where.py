"""Routing by content on the cluster output path (#28): the executors evaluate each sink's
``where`` with the embedded path's evaluator, so both paths put the same rows in the same
tables — NULLs included (a NULL predicate takes nothing) — count the same unrouted events
and write the same dead letters for them; each entry is judged by the predicate of its own
registry version, and a replay after a crash routes as the first attempt did. Every run
stays on the cluster path (the engine refuses the embedded fallback). Real Spark (local
mode: executors are real Python workers), real local store, real SQLite catalog.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from collector_support import (
    BASE_MS,
    CLICKS,
    Crash,
    assert_exact,
    collector_config,
    crash_at,
    read_table,
    start,
)

from collector.routing import Routes
from icefloe.config import Column, Config
from icefloe.registry import RegistryStore, ops
from icefloe.registry.model import Conditions
from pipeline.load.run import SparkClusterEngine, SparkEngine
from tests.collector.test_cluster_routing import Spy, change, cluster_only, collector_for, queue

BIG = ops.SinkSpec(name="big", table="web.big", columns=CLICKS.columns, where="n >= 5")
SMALL = ops.SinkSpec(name="small", table="web.small",
                     columns=(Column("user_id", "string"), Column("n", "long")),
                     where="n < 3 AND user_id <> 'nobody'")
ODD = ops.SinkSpec(name="odd", table="web.odd",
                   columns=(Column("url", "string"), Column("n", "long"),
                            Column("ts", "timestamp")),
                   where="n IS NULL OR url LIKE '/p/1%' OR ts > '2026-11-23T12:00:00'")
ALL = ops.SinkSpec(name="all", table="web.all", columns=CLICKS.columns)
TABLES = ("web.big", "web.small", "web.odd")
Event = tuple[str, str, int, bytes]


def event(key: int, prefix: str, *, n: bool = True, user: str | None = None,
          ts: str | None = "2026-11-23T10:00:00Z") -> Event:
    """A clicks event with ``n = key`` (absent when not ``n``: NULL), its user, its ts."""
    body: dict[str, object] = {"user_id": user or f"u{key}", "url": f"/p/{key}"}
    if n:
        body["n"] = key
    if ts is not None:
        body["ts"] = ts
    return ("clicks", f"{prefix}{key}", BASE_MS + key, msgspec.json.encode(body))


def mixed(prefix: str) -> list[Event]:
    """0..7 with n = key; 8, 9 without n; 10 'nobody'; 11 late; 12 without n and ts."""
    return [*(event(k, prefix) for k in range(8)), event(8, prefix, n=False),
            event(9, prefix, n=False), event(1, f"{prefix}x", user="nobody"),
            event(4, f"{prefix}late", ts="2026-11-23T13:00:00Z"),
            event(12, prefix, n=False, ts=None)]


def ids(prefix: str, keys: list[int]) -> set[str]:
    return {f"{prefix}{k}" for k in keys}


def unrouted(collector: Any) -> float:
    return collector.metrics.unrouted.labels("clicks")._value.get()


def rows_of(config: Config, table: str) -> list[tuple[Any, ...]]:
    """A table's rows without the shard column, sorted: what both paths must agree on."""
    rows = read_table(config, table)
    names = [n for n in rows.column_names if n != "_shard"]
    return sorted(tuple(row[n] for n in names) for row in rows.select(names).to_pylist())


def dead_of(config: Config) -> list[tuple[Any, ...]]:
    rows = read_table(config, "icefloe.dead_letters")
    keep = ["stream", "sequence", "event_id", "reason", "message", "raw", "received_at"]
    return sorted(tuple(r[n] for n in keep) for r in rows.select(keep).to_pylist())


async def drained(config: Config, engine: Any) -> Any:
    collector = await collector_for(config, engine)
    while (await collector.run_once()).entries:
        pass
    return collector


async def test_where_sinks_write_what_the_embedded_path_writes(tmp_path: Path,
                                                               spark: Any) -> None:
    """Same registry, same events, once through each output path: every table holds the
    same rows, the same events are unrouted and dead-lettered identically."""
    results = {}
    for output in ("cluster", "embedded"):
        (tmp_path / output).mkdir()
        config = collector_config(tmp_path / output, (CLICKS,), output=output,
                                  dequeue_every=1)
        version = (await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
            id="clicks", sinks=(BIG, SMALL, ODD), unrouted="dead_letter"))))
        await queue(config, version, mixed("a"), mixed("b"))
        engine = Spy(SparkClusterEngine(spark, 2)) if output == "cluster" else \
            SparkEngine(spark, 2)
        collector = await drained(config, engine)
        results[output] = (config, collector)
        await collector.store.close()
    cluster, embedded = results["cluster"], results["embedded"]
    cluster_only(cluster[1])
    assert cluster[0].collector.output == "cluster"
    for table in TABLES:
        assert rows_of(cluster[0], table) == rows_of(embedded[0], table), table
    # not vacuous: what each predicate takes, NULLs taking nothing
    config = cluster[0]
    assert_exact(config, "web.big", ids("a", [5, 6, 7]) | ids("b", [5, 6, 7]))
    assert_exact(config, "web.small", ids("a", [0, 1, 2]) | ids("b", [0, 1, 2]))
    assert_exact(config, "web.odd", {f"{p}{k}" for p in ("a", "b")
                                     for k in ("1", "8", "9", "12", "x1", "late4")})
    # no predicate takes 3 and 4 (x1, from 'nobody', is taken by odd for its url)
    assert unrouted(cluster[1]) == unrouted(embedded[1]) == 4
    assert dead_of(cluster[0]) == dead_of(embedded[0])
    dead = read_table(config, "icefloe.dead_letters")
    assert sorted(dead.column("event_id").to_pylist()) == sorted(
        ids("a", [3, 4]) | ids("b", [3, 4]))
    assert set(dead.column("reason").to_pylist()) == {"unrouted"}
    raw = [msgspec.json.decode(r) for r in dead.column("raw").to_pylist()]
    assert {(r["user_id"], r["n"]) for r in raw} == {("u3", 3), ("u4", 4)}


async def test_where_errors_are_dead_lettered_as_on_the_embedded_path(
        tmp_path: Path, spark: Any) -> None:
    """#36: on the executors too, an integer overflow or a division by zero in a
    ``where`` is an error for that event (dead-lettered ``where_error``, counted), not a
    routing decision; both paths write the same tables and dead letters."""
    from tests.collector.test_where_routing import (
        GUARDED,
        SHARE,
        TIMES,
        overflowing,
        where_error_count,
    )

    results = {}
    for output in ("cluster", "embedded"):
        (tmp_path / output).mkdir()
        config = collector_config(tmp_path / output, (CLICKS,), output=output,
                                  dequeue_every=1)
        version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
            id="clicks", sinks=(TIMES, SHARE, GUARDED), unrouted="dead_letter")))
        await queue(config, version, overflowing("o"))
        engine = Spy(SparkClusterEngine(spark, 2)) if output == "cluster" else \
            SparkEngine(spark, 2)
        collector = await drained(config, engine)
        results[output] = (config, collector)
        await collector.store.close()
    cluster, embedded = results["cluster"], results["embedded"]
    cluster_only(cluster[1])
    for table in ("web.times", "web.share", "web.guarded"):
        assert rows_of(cluster[0], table) == rows_of(embedded[0], table), table
    assert_exact(cluster[0], "web.times", ids("o", [6, 7]))
    assert_exact(cluster[0], "web.share", ids("o", [1, 2, 3]))
    assert dead_of(cluster[0]) == dead_of(embedded[0])
    dead = read_table(cluster[0], "icefloe.dead_letters")
    errors = {e: m for e, r, m in zip(dead.column("event_id").to_pylist(),
                                      dead.column("reason").to_pylist(),
                                      dead.column("message").to_pylist(), strict=True)
              if r == "where_error"}
    assert sorted(errors) == ["o0", "o8"]
    assert "division by zero in '100 / n'" in errors["o0"]
    assert "integer overflow in 'n * 4'" in errors["o8"]
    assert where_error_count(cluster[1], "clicks") == 2
    assert unrouted(cluster[1]) == unrouted(embedded[1]) == 3


@pytest.mark.parametrize("mode", ["drop", "dead_letter"])
async def test_unrouted_events_are_counted_and_dropped_or_dead_lettered(
        tmp_path: Path, spark: Any, mode: str) -> None:
    """``unrouted`` of the entry's own version: the first batch is accepted under ``drop``,
    the second under ``mode``; one run holds both (the sinks are the same)."""
    config = collector_config(tmp_path, (CLICKS,), output="cluster", dequeue_every=1)
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(BIG,))))
    await queue(config, version, [event(k, "a") for k in range(7)])
    version = await change(config, lambda r: ops.update_source(
        r, "clicks", ops.SourcePatch(unrouted=mode)))
    await queue(config, version, [event(k, "b") for k in range(7)] + [
        event(9, "b", n=False)])
    spy = Spy(SparkClusterEngine(spark, 2))
    collector = await collector_for(config, spy)
    result = await collector.run_once()
    assert result.entries == 2
    assert spy.cluster_runs == 1
    assert_exact(config, "web.big", ids("a", [5, 6]) | ids("b", [5, 6]))
    assert unrouted(collector) == 5 + 6
    from pipeline.iceberg.catalog import open_catalog

    catalog = open_catalog(config.catalog)
    dead = read_table(config, "icefloe.dead_letters") if catalog.table_exists(
        "icefloe.dead_letters") else pa.table({"event_id": pa.array([], pa.string())})
    if mode == "drop":
        assert dead.num_rows == 0
    else:
        assert sorted(dead.column("event_id").to_pylist()) == sorted(ids("b", [0, 1, 2, 3,
                                                                               4, 9]))
        assert result.dead_letters == 6
        raw = {msgspec.json.decode(r)["url"] for r in dead.column("raw").to_pylist()}
        assert raw == {f"/p/{k}" for k in (0, 1, 2, 3, 4, 9)}
    cluster_only(collector)
    await collector.store.close()


@pytest.mark.parametrize("stage", ["after_write", "after_commit:web.big"])
async def test_a_where_change_applies_from_its_version_on_and_replays_exactly(
        tmp_path: Path, spark: Any, stage: str) -> None:
    """Two entries, two predicates of one sink (one run); a crash after the executors
    wrote (or after the first table's commit): the replay routes each entry by its own
    version's predicate again, and each table holds each row once."""
    config = collector_config(tmp_path, (CLICKS,), output="cluster", dequeue_every=1)
    every = msgspec.structs.replace(ALL, columns=SMALL.columns)
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(BIG, every))))
    await queue(config, version, [event(k, "a") for k in range(8)])
    version = await change(config, lambda r: ops.update_sink(r, "clicks", "big",
                                                             ops.SinkPatch(where="n >= 2")))
    await queue(config, version, [event(k, "b") for k in range(8)])
    spy = Spy(SparkClusterEngine(spark, 2))
    crashing = await start(config, spy, hook=crash_at(stage))
    crashing.routes = Routes(await RegistryStore(crashing.store,
                                                 config.admin.registry_key).read())
    await asyncio.to_thread(crashing.prepare_tables)
    with pytest.raises(Crash):
        await crashing.run_once()
    await crashing.store.close()
    restarted = await drained(config, spy)
    assert spy.cluster_runs == 2
    assert_exact(config, "web.big", ids("a", [5, 6, 7]) | ids("b", [2, 3, 4, 5, 6, 7]))
    assert_exact(config, "web.all", ids("a", list(range(8))) | ids("b", list(range(8))))
    cluster_only(restarted)
    await restarted.store.close()


async def test_a_staged_sink_stages_only_the_rows_its_where_takes(tmp_path: Path,
                                                                  spark: Any) -> None:
    """Import conditions and a ``where``: the executors stage only the sink's rows, and
    the import commits them once the count is reached."""
    config = collector_config(tmp_path, (CLICKS,), output="cluster", dequeue_every=1)
    staged = msgspec.structs.replace(BIG, conditions=Conditions(max_age_s=3600,
                                                                max_events=4))
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(staged, ALL))))
    await queue(config, version, [event(k, "a") for k in range(8)])
    spy = Spy(SparkClusterEngine(spark, 2))
    collector = await collector_for(config, spy)
    assert (await collector.run_once()).staged == {"web.big": 3}  # 5, 6, 7: not due
    assert read_table(config, "web.big").num_rows == 0
    await queue(config, version, [event(k, "b") for k in range(8)])
    assert (await collector.run_once()).staged == {"web.big": 3}  # 6 staged: imported
    assert_exact(config, "web.big", ids("a", [5, 6, 7]) | ids("b", [5, 6, 7]))
    assert_exact(config, "web.all", ids("a", list(range(8))) | ids("b", list(range(8))))
    assert unrouted(collector) == 0  # ALL takes every event
    cluster_only(collector)
    await collector.store.close()
