"""Change streams (#42) on the cluster output path: the executors write each key's change
that applies and rewrite the files holding the keys it replaces, the driver judging each
change by its source position against the positions the table holds, as the embedded path
does (:mod:`pipeline.iceberg.cdc_apply`). Debezium's PostgreSQL and MySQL shapes, out of
order, re-delivered, deletes of unknown keys, a key update, ``deletes = "keep"``: both
paths give the same tables, row for row, and count the same no-ops; a crash after the
write or after the commit replays exactly. Real Spark, real SQLite catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from collector_support import (
    Crash,
    collector_config,
    crash_at,
    drain,
    output_engine,
    publish_sync,
    read_table,
    start,
)

from icefloe.config import Config, StreamConfig
from icefloe.streams.cdc import with_cdc_columns
from icefloe.streams.model import CdcConfig
from tests.collector.test_cdc_collector import (
    FIRST,
    MYSQL,
    ORDERS,
    PG,
    SECOND,
    door,
    pg,
    state,
)

KEPT = with_cdc_columns([msgspec.structs.replace(
    PG, name="kept", table="shop.kept", cdc=CdcConfig(deletes="keep"), columns=PG.columns[:2],
    tombstone_field=None)], "test")[0]
TABLES = {"shop.customers": "id", "shop.orders": "order_id", "shop.kept": "id"}


def rounds() -> list[list[list[tuple[str, str, int, bytes]]]]:
    """Three rounds: snapshot reads and changes out of order; a key update, a late change
    and a re-delivery; the kept stream's late change older than its kept delete."""
    return [[door(PG, FIRST), door(MYSQL, ORDERS), door(KEPT, FIRST)],
            [door(PG, SECOND), door(PG, FIRST[:4]), door(KEPT, SECOND)],
            [door(KEPT, [pg("c", 2, "b@late", 105), FIRST[0]])]]  # older than 2's
    # kept delete (lsn 140): stale; FIRST[0] again: a duplicate


def tables_of(config: Config) -> dict[str, list[dict[str, Any]]]:
    return {name: sorted(read_table(config, name).to_pylist(), key=lambda r: r[key])
            for name, key in TABLES.items()}


def noops_of(collector: Any) -> dict[tuple[str, ...], float]:
    return {tuple(s.labels.values()): s.value
            for s in collector.metrics.cdc_noops.collect()[0].samples
            if s.name.endswith("_total")}


async def test_cluster_path_applies_changes_as_the_embedded_path(tmp_path: Path,
                                                                 spark: Any) -> None:
    got: dict[str, Any] = {}
    sent = rounds()  # once: the door stamps each event's receive time
    for output in ("embedded", "cluster"):
        streams: tuple[StreamConfig, ...] = (PG, MYSQL, KEPT)
        (tmp_path / output).mkdir()
        config = collector_config(tmp_path / output, streams, dequeue_every=1, output=output)
        collector = await start(config, output_engine(spark, output))
        for batch in sent:
            publish_sync(config, batch)
            await drain(collector)
        await collector.store.close()
        got[output] = (tables_of(config), noops_of(collector))
        samples = collector.metrics.embedded_runs.collect()[0].samples
        assert not samples or output == "embedded", samples  # no fallback: its own path
        if output == "cluster":
            assert state(config, "shop.customers", "id", "email") == {1: "a@3", 4: "c@snap"}
            assert state(config, "shop.orders", "order_id", "status") == {7: "shipped",
                                                                           8: "x"}
            kept = {r["id"]: (r["_cdc_deleted"], r["email"])
                    for r in read_table(config, "shop.kept").to_pylist()}
            # 9: a delete of a key never created, kept as its deleted row (deletes = keep)
            assert kept == {1: (False, "a@3"), 2: (True, None), 3: (True, None),
                            4: (False, "c@snap"), 9: (True, None)}
    diff = {(table, i, k): (row[k], other.get(k))
            for table, rows in got["cluster"][0].items()
            for i, (row, other) in enumerate(zip(rows, got["embedded"][0][table], strict=True))
            for k in row if row[k] != other.get(k)}
    assert not diff, diff
    assert got["cluster"][0] == got["embedded"][0]  # every column, envelope included
    assert got["cluster"][1] == got["embedded"][1]
    assert got["cluster"][1][("shop.customers", "stale")] == 1
    assert got["cluster"][1][("shop.customers", "unknown_delete")] == 1
    assert got["cluster"][1][("shop.kept", "stale")] == 2  # lsn 125 and the late create


@pytest.mark.parametrize("stage", ["after_write", "after_commit:shop.customers"])
async def test_a_crash_replays_the_changes_exactly_on_the_cluster_path(
        tmp_path: Path, spark: Any, stage: str) -> None:
    config = collector_config(tmp_path, (PG,), dequeue_every=1, output="cluster")
    engine = output_engine(spark, "cluster")
    publish_sync(config, [door(PG, FIRST)])
    first = await start(config, engine)
    await drain(first)  # the table has files to rewrite
    await first.store.close()
    publish_sync(config, [door(PG, SECOND)])
    crashing = await start(config, engine, hook=crash_at(stage))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    restarted = await start(config, engine)
    await drain(restarted)
    await restarted.store.close()
    assert state(config, "shop.customers", "id", "email") == {1: "a@3", 4: "c@snap"}
    stale = restarted.metrics.cdc_noops.labels("shop.customers", "stale")._value.get()
    assert stale == (1 if stage == "after_write" else 0)  # judged where it committed
