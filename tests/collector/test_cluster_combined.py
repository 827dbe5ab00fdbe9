"""One sink with every table feature at once on both output paths (#28: "both outputs
accept the same configurations"): a primary key with a tombstone, schema evolution from
the data and a ``where`` — the cluster output path must build the embedded path's table.

Each feature has its own equality test (test_cluster_upserts, test_cluster_evolve,
test_cluster_where); this one holds their interplay. With evolution, the cluster engine
hands the runs to the embedded shape (#36: quotas and ``_overflow`` need the rows on the
driver); without it, keys and ``where`` meet in one cluster plan: the ``where`` flag
filters the upsert's write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from collector_support import BASE_MS, collector_config, drain, publish_sync, read_table, start

from icefloe.config import Column, Config, StreamConfig
from icefloe.streams.evolution import EXTRA_FIELD
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import SparkClusterEngine, SparkEngine

USERS = StreamConfig(name="users", table="app.users", columns=(
    Column("user_id", "string", required=True), Column("name", "string"),
    Column("deleted", "boolean")), primary_key=("user_id",), tombstone_field="deleted",
    unknown_fields="evolve", where="name IS NULL OR name <> 'skip'")


def user(n: int, uid: str | None, name: str | None, deleted: bool | None = None,
         **extra: Any) -> tuple[str, str, int, bytes]:
    """An event as an evolving stream's ingestor keeps it (undeclared fields as JSON)."""
    body: dict[str, Any] = {"name": name, "deleted": deleted}
    if extra:
        body[EXTRA_FIELD] = msgspec.json.encode(extra).decode()
    if uid is not None:
        body["user_id"] = uid
    return ("users", f"ev{n}", BASE_MS + n, msgspec.json.encode(body))


ROUNDS = [
    [[user(i, f"u{i}", "v1", age=20 + i) for i in range(6)]],
    [[user(10, "u0", "v2", age=30, city="Oslo"), user(11, "u1", "skip", age=99),
      user(12, "u2", None, True), user(13, None, "nobody", age=1),
      user(14, "u3", "v2", age="old")],  # a string into the long column: dead letter
     [user(15, "u4", "v2", score=1.5), user(16, "u0", "v3", city="Bergen")]],
    [[user(20, "u2", "back", age=7), user(21, "u5", "skip", city="x"),
      user(22, "u9", "new", score=2)]],
]


def config_for(root: Path, output: str) -> Config:
    root.mkdir(parents=True, exist_ok=True)
    return collector_config(root, streams=(USERS,), dequeue_every=1, output=output)


async def apply(config: Config, engine: Any) -> Any:
    collector = await start(config, engine)
    for entries in ROUNDS:
        publish_sync(config, entries)
        await drain(collector)
    await collector.store.close()
    return collector


def table_of(config: Config) -> tuple[list[str], list[dict[str, Any]]]:
    table = open_catalog(config.catalog).load_table("app.users")
    rows = sorted(read_table(config, "app.users").to_pylist(), key=lambda r: r["user_id"])
    return [f"{f.name}:{f.field_type}" for f in table.schema().fields], rows


def dead_of(config: Config) -> list[tuple[str, str]]:
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    return sorted((d["event_id"], d["reason"].split(":", 1)[0]) for d in dead)


async def test_keys_evolution_and_where_together_give_the_embedded_table(tmp_path,
                                                                          spark) -> None:
    embedded = config_for(tmp_path / "embedded", "embedded")
    cluster = config_for(tmp_path / "cluster", "cluster")
    await apply(embedded, SparkEngine(spark, 2))
    collector = await apply(cluster, SparkClusterEngine(spark, 2))
    handed = collector.metrics.embedded_runs.labels("evolve")._value.get()
    assert handed == len(ROUNDS)  # each run holds the evolving sink: the embedded shape
    schema, rows = table_of(cluster)
    assert (schema, rows) == table_of(embedded)
    assert {"age:long", "city:string", "score:double"} <= set(schema)
    by_key = {r["user_id"]: r for r in rows}
    assert sorted(by_key) == ["u0", "u1", "u2", "u3", "u4", "u5", "u9"]
    assert (by_key["u3"]["name"], by_key["u3"]["age"]) == ("v1", 23)  # its update refused
    assert (by_key["u0"]["name"], by_key["u0"]["city"], by_key["u0"]["age"]) == (
        "v3", "Bergen", None)  # the latest row wins whole, evolved columns included
    assert by_key["u1"]["name"] == by_key["u5"]["name"] == "v1"  # 'skip': not routed
    assert by_key["u2"]["name"] == "back"  # deleted, then re-inserted
    assert by_key["u4"]["score"] == 1.5
    assert dead_of(cluster) == dead_of(embedded)
    assert [event for event, _ in dead_of(cluster)] == ["ev13", "ev14"]


async def test_keys_and_where_together_on_the_cluster_path_give_the_embedded_table(
        tmp_path, spark) -> None:
    """The same sink without evolution: every run stays on the cluster path."""
    fixed = msgspec.structs.replace(USERS, unknown_fields="ignore")
    configs = []
    for output, engine in (("embedded", SparkEngine(spark, 2)),
                           ("cluster", SparkClusterEngine(spark, 2))):
        (tmp_path / output).mkdir()
        config = collector_config(tmp_path / output, streams=(fixed,), dequeue_every=1,
                                  output=output)
        collector = await apply(config, engine)
        assert not collector.metrics.embedded_runs.collect()[0].samples
        configs.append(config)
    embedded, cluster = configs
    schema, rows = table_of(cluster)
    assert (schema, rows) == table_of(embedded)
    assert not {"age:long", "city:string"} & set(schema)  # undeclared fields ignored
    by_key = {r["user_id"]: r for r in rows}
    assert sorted(by_key) == ["u0", "u1", "u2", "u3", "u4", "u5", "u9"]
    assert (by_key["u0"]["name"], by_key["u3"]["name"]) == ("v3", "v2")
    assert by_key["u1"]["name"] == by_key["u5"]["name"] == "v1"  # 'skip': not routed
    assert by_key["u2"]["name"] == "back"
    assert dead_of(cluster) == dead_of(embedded) == [("ev13", "missing_key")]
