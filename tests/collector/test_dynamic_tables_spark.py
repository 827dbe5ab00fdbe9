"""Tables named by the data (#42) on Spark, both output paths: one stream's events routed
into a table per tenant by a field, and by a ``sql`` mapping column computed on Spark
(the mapping allow-list); the cluster path hands such runs to the embedded path on the
same session (``reason="dynamic-table"``) and gives the same tables and dead letters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from icefloe.config import Column, StreamConfig
from tests.collector_support import (
    BASE_MS,
    assert_exact,
    collect_all,
    collector_config,
    output_engine,
    publish_sync,
    read_table,
)

STREAM = StreamConfig(
    name="events", table="tenants.t_{region}_{lower(tenant)}", columns=(
        Column("tenant", "string"), Column("n", "long"),
        Column("region", "string", sql="upper(substr(tenant, 1, 2))")),
    partition_by=("bucket(2, n)",))


def event(key: int, tenant: str | None) -> tuple[str, str, int, bytes]:
    body: dict[str, Any] = {"n": key}
    if tenant is not None:
        body["tenant"] = tenant
    return ("events", f"e{key}", BASE_MS + key, msgspec.json.encode(body))


@pytest.mark.parametrize("output", ["embedded", "cluster"])
async def test_should_route_events_into_a_table_per_value(tmp_path: Path, spark: Any,
                                                          output: str) -> None:
    config = collector_config(tmp_path, (STREAM,), output=output)
    tenants = ["Acme", "globex", "acme", "Initech", None]
    publish_sync(config, [[event(k, tenants[k % 5]) for k in range(10)],
                          [event(k, tenants[k % 5]) for k in range(10, 20)]])
    collector = await collect_all(config, output_engine(spark, output))
    from pipeline.iceberg.catalog import open_catalog  # why: keeps collection light

    listed = sorted(".".join(t) for t in open_catalog(config.catalog).list_tables("tenants"))
    assert listed == ["tenants.t_ac_acme", "tenants.t_gl_globex", "tenants.t_in_initech"]
    assert_exact(config, "tenants.t_ac_acme",
                 {f"e{k}" for k in range(20) if k % 5 in (0, 2)})
    assert_exact(config, "tenants.t_gl_globex", {f"e{k}" for k in range(20) if k % 5 == 1})
    assert_exact(config, "tenants.t_in_initech", {f"e{k}" for k in range(20) if k % 5 == 3})
    rows = read_table(config, "tenants.t_ac_acme")
    assert set(rows.column("region").to_pylist()) == {"AC"}
    dead = read_table(config, "icefloe.dead_letters")
    assert sorted(dead.column("event_id").to_pylist()) == ["e14", "e19", "e4", "e9"]
    assert set(dead.column("reason").to_pylist()) == {"dynamic_table:null_value"}
    fallback = collector.metrics.embedded_runs.labels("dynamic-table")._value.get()
    assert (fallback > 0) == (output == "cluster")  # one run, or one per entry
