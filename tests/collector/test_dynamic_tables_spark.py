"""Tables named by the data (#42) on Spark, both output paths: one stream's events routed
into a table per tenant by a field, and by a ``sql`` mapping column computed on Spark
(the mapping allow-list). The cluster path names each row's table on the executors, writes
every table's files in the run's one write job and commits the tables two at a time
(``commit_workers``); it gives the embedded path's tables and dead letters, row for row,
through a crash between two of a run's table commits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from icefloe.config import Column, Config, StreamConfig
from icefloe.streams.model import DynamicTables
from tests.collector_support import (
    BASE_MS,
    Crash,
    assert_exact,
    collector_config,
    crash_at,
    drain,
    output_engine,
    publish_sync,
    read_table,
    start,
)

STREAM = StreamConfig(
    name="events", table="tenants.t_{region}_{lower(tenant)}", columns=(
        Column("tenant", "string"), Column("n", "long"),
        Column("region", "string", sql="upper(substr(tenant, 1, 2))")),
    partition_by=("bucket(2, n)",), dynamic_tables=DynamicTables(max_tables=3))
TENANTS = ["Acme", "globex", "acme", "Initech", None, "Hooli"]


def event(key: int, tenant: str | None) -> tuple[str, str, int, bytes]:
    body: dict[str, Any] = {"n": key}
    if tenant is not None:
        body["tenant"] = tenant
    return ("events", f"e{key}", BASE_MS + key, msgspec.json.encode(body))


def batches() -> list[list[tuple[str, str, int, bytes]]]:
    """Two entries over six tenant values (one null, one past ``max_tables`` = 3: Hooli
    comes after the three others), then an entry with re-sent events (duplicates)."""
    return [[event(k, TENANTS[k % 6]) for k in range(12)],
            [event(k, TENANTS[k % 6]) for k in range(12, 24)],
            [event(k, TENANTS[k % 6]) for k in (1, 2, 24, 25)]]


def tables_of(config: Config) -> dict[str, list[dict[str, Any]]]:
    """Every template table's rows, and the dead letters, sorted: what must not differ."""
    from pipeline.iceberg.catalog import open_catalog  # why: keeps collection light

    names = sorted(".".join(t) for t in open_catalog(config.catalog).list_tables("tenants"))
    out = {name: sorted(read_table(config, name).to_pylist(), key=lambda r: r["_event_id"])
           for name in names}
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    out["dead"] = sorted(({k: d[k] for k in ("stream", "event_id", "reason", "message", "raw",
                                             "sequence")} for d in dead),
                         key=lambda d: d["event_id"])
    return out


async def test_cluster_path_writes_the_embedded_path_s_tables(tmp_path: Path,
                                                              spark: Any) -> None:
    got = {}
    for output in ("embedded", "cluster"):
        (tmp_path / output).mkdir()
        config = collector_config(tmp_path / output, (STREAM,), output=output,
                                  commit_workers=2, dequeue_every=1)
        publish_sync(config, batches())
        collector = await start(config, output_engine(spark, output))
        await drain(collector)
        await collector.store.close()
        got[output] = tables_of(config)
        samples = collector.metrics.embedded_runs.collect()[0].samples
        assert not samples or output == "embedded", samples  # no fallback: its own path
    assert got["cluster"] == got["embedded"]
    tables = got["cluster"]
    assert sorted(tables) == ["dead", "tenants.t_ac_acme", "tenants.t_gl_globex",
                              "tenants.t_in_initech"]
    assert [r["_event_id"] for r in tables["tenants.t_gl_globex"]] == ["e1", "e13", "e19",
                                                                       "e25", "e7"]
    assert {r["region"] for r in tables["tenants.t_ac_acme"]} == {"AC"}
    reasons = {d["event_id"]: d["reason"] for d in tables["dead"]}
    assert reasons == {**{f"e{k}": "dynamic_table:null_value" for k in (4, 10, 16, 22)},
                       **{f"e{k}": "dynamic_table:max_tables" for k in (5, 11, 17, 23)}}


@pytest.mark.parametrize("stage", ["after_write", "after_commit:tenants.t_gl_globex"])
async def test_a_crash_between_table_commits_replays_exactly_on_the_cluster_path(
        tmp_path: Path, spark: Any, stage: str) -> None:
    """The first run dies after the write, or after one of its tables committed; the
    restarted collector finds its tables made already and commits exactly what each
    lacks."""
    config = collector_config(tmp_path, (STREAM,), output="cluster", dequeue_every=1)
    publish_sync(config, batches()[:1])
    engine = output_engine(spark, "cluster")
    crashing = await start(config, engine, hook=crash_at(stage))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    publish_sync(config, batches()[1:])
    restarted = await start(config, engine)
    await drain(restarted)
    await restarted.store.close()
    assert_exact(config, "tenants.t_ac_acme", {f"e{k}" for k in range(26) if k % 6 in (0, 2)})
    assert_exact(config, "tenants.t_gl_globex", {f"e{k}" for k in range(26) if k % 6 == 1})
    assert_exact(config, "tenants.t_in_initech", {f"e{k}" for k in range(24) if k % 6 == 3})
    dead = read_table(config, "icefloe.dead_letters").column("event_id").to_pylist()
    assert sorted(dead) == sorted(f"e{k}" for k in range(24) if k % 6 in (4, 5))
