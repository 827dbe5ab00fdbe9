"""Schema evolution from the data with ``output = "cluster"`` (#28 item 3, #27 item 1).

Since #36 a run with an evolving sink takes the embedded shape on the cluster engine's
session (``embedded_fallback_runs{reason="evolve"}``: the quotas and ``_overflow`` need
the rows on the driver; ``test_cluster_bulkheads.py`` has the quota cases), while runs of
streams that do not evolve stay on the cluster path. The same batches go through the
embedded path and through ``output = "cluster"`` (real Spark in local mode); the tables
must come out the same — schema, rows and dead letters — including the cases where the
order of the rows decides (a type conflict followed by a widening value, case twins),
widenings of an ``int``/``float`` column an older config left, and a crash between the
schema commit and the data. Real local store, real SQLite catalog.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from collector_support import Crash, collector_config, crash_at, drain, publish_sync, start

from icefloe.config import Column, Config, StreamConfig
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import LocalEngine, SparkClusterEngine

PAGES = StreamConfig(name="pages", table="web.pages", unknown_fields="evolve",
                     columns=(Column("user_id", "string", required=True),))
OLDER = msgspec.structs.replace(PAGES, unknown_fields="ignore", columns=(
    *PAGES.columns, Column("qty", "int"), Column("ratio", "float")))
BASE_MS = 1_790_000_000_000


def event(eid: str, user: str, **extra: Any) -> tuple[str, str, int, bytes]:
    """An event as an evolving stream's ingestor keeps it (undeclared fields as JSON)."""
    payload: dict[str, Any] = {"user_id": user}
    if extra:
        payload["_icefloe_extra"] = msgspec.json.encode(extra).decode()
    return ("pages", eid, BASE_MS + int(eid[1:]), msgspec.json.encode(payload))


FIRST = [
    [event("e1", "u1", n=5, price=2, plan="pro", geo={"city": "Oslo", "zip": 150},
           tags=["a", "b"], blank=None, m=1),
     event("e2", "u2", n=6, price=2.5, misc=[1, "x"])],
    [event("e3", "u3", m="s", big=2**64, Plan="free"),  # conflict, beyond long, case twin
     event("e4", "u4", deep=[[[[[[[[[1]]]]]]]]])],  # nested beyond the depth limit
    [event("e14", "u14", m="s"),  # m: long, then a string (refused), then a fraction:
     event("e5", "u5", m=2.5, n=7), event("e12", "u12"),  # the column is double
     event("e6", "u6", geo={"city": "Rome"}, tags=["c"])],
    [event("e7", "u7", misc={"any": "thing"}, n="seven"),  # a string into a long column
     event("e8", "u8", n=8, plan="free")],
]
SECOND = [
    [event("e9", "u9", qty=2**40, ratio=1e300, n=9)],  # widen int → long, float → double
    [event("e10", "u10", qty="x"), event("e11", "u11", ratio=0.5, extra_col=True),
     event("e13", "u13", geo={"city": 5})],  # a wrong member type
]


def table_of(config: Config) -> tuple[list[Any], list[dict[str, Any]]]:
    table = open_catalog(config.catalog).load_table("web.pages")
    schema = [(f.name, str(f.field_type), f.doc) for f in table.schema().fields]
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["_event_id"])
    return schema, rows


def dead_of(config: Config) -> list[tuple[Any, ...]]:
    table = open_catalog(config.catalog).load_table("icefloe.dead_letters")
    return sorted((r["stream"], r["event_id"], r["reason"], r["message"], r["raw"],
                   r["sequence"], r["location"]) for r in table.scan().to_arrow().to_pylist())


async def collect(config: Config, engine: Any, hook: Any = None) -> None:
    """Drain the queue; on the cluster engine, every run of an evolving stream takes the
    embedded shape and every other run the cluster path."""
    collector = await start(config, engine, hook=hook)
    try:
        runs = await drain(collector)
        evolving = config.streams[0].unknown_fields == "evolve"
        if isinstance(engine, SparkClusterEngine) and evolving:
            assert embedded_runs(collector) == {"evolve": runs}
        else:
            assert embedded_runs(collector) == {}
    finally:
        await collector.store.close()


def embedded_runs(collector: Any) -> dict[str, float]:
    """Runs the cluster engine handed to the embedded shape, by reason."""
    return {s.labels["reason"]: s.value for m in collector.metrics.embedded_runs.collect()
            for s in m.samples if s.name.endswith("_total")}


async def run_both(root: Path, engine: Any) -> tuple[Config, Config]:
    """The same batches through both paths: an older config leaves ``qty int`` and
    ``ratio float``, then the stream evolves over two runs."""
    configs = []
    for name, output, eng in (("embedded", "embedded", LocalEngine()),
                              ("cluster", "cluster", engine)):
        (root / name).mkdir()
        older = collector_config(root / name, streams=(OLDER,), output=output)
        publish_sync(older, [[event("e0", "u0", qty=3, ratio=1.5)]])
        await collect(older, eng)
        config = collector_config(root / name, streams=(PAGES,), output=output)
        publish_sync(config, FIRST)
        await collect(config, eng)
        publish_sync(config, SECOND)
        await collect(config, eng)
        configs.append(config)
    return configs[0], configs[1]


@pytest.fixture
def engine(spark: Any) -> SparkClusterEngine:
    return SparkClusterEngine(spark, 2)


async def test_cluster_evolve_gives_the_embedded_table(tmp_path, engine) -> None:
    embedded, cluster = await run_both(tmp_path, engine)
    schema, rows = table_of(cluster)
    assert (schema, rows) == table_of(embedded)
    # the same dead letters, each naming its own batch file (keys are unique per store)
    assert [d[:6] for d in dead_of(cluster)] == [d[:6] for d in dead_of(embedded)]
    assert all(d[6].startswith("batches/") for d in dead_of(cluster))
    kinds = {name: kind for name, kind, _ in schema}
    assert kinds["m"] == "double"  # long, then a conflict, then a fraction: in run order
    assert kinds["qty"] == "long"  # widened
    assert kinds["ratio"] == "double"
    assert kinds["misc"] == "string"
    assert kinds["extra_col"] == "boolean"
    assert not {"Plan", "big", "deep"} & set(kinds)
    by_id = {r["_event_id"]: r for r in rows}
    assert set(by_id) == {"e0", "e1", "e2", "e5", "e6", "e8", "e9", "e11", "e12"}
    assert by_id["e9"]["qty"] == 2**40
    assert by_id["e9"]["ratio"] == 1e300
    assert by_id["e1"]["geo"] == {"city": "Oslo", "zip": 150}
    assert by_id["e1"]["m"] == 1.0
    assert by_id["e5"]["m"] == 2.5
    refused = {d[1]: d[3] for d in dead_of(cluster)}
    assert set(refused) == {"e3", "e4", "e7", "e10", "e13", "e14"}
    assert {d[2] for d in dead_of(cluster)} == {"schema_evolution"}
    assert "'geo.city'" in refused["e13"]
    assert "'Plan'" in refused["e3"]  # 'plan' came first
    assert "case" in refused["e3"]
    assert "nests" in refused["e4"]
    assert "does not fit long" in refused["e7"]
    assert "does not fit long" in refused["e10"]


async def test_a_crash_after_the_schema_commit_then_a_re_run(tmp_path, engine) -> None:
    config = collector_config(tmp_path, streams=(PAGES,), output="cluster")
    publish_sync(config, FIRST)
    with pytest.raises(Crash):
        await collect(config, engine, hook=crash_at("after_evolve:web.pages"))
    schema, rows = table_of(config)
    assert "m" in {name for name, _, _ in schema}  # columns, no data
    assert rows == []
    await collect(config, engine)  # a takeover: finds the columns, plans nothing new
    (tmp_path / "ref").mkdir()
    reference = collector_config(tmp_path / "ref", streams=(PAGES,))
    publish_sync(reference, FIRST)
    await collect(reference, LocalEngine())
    assert table_of(config) == table_of(reference)
    assert [d[:6] for d in dead_of(config)] == [d[:6] for d in dead_of(reference)]


async def test_a_staged_evolving_sink_on_the_cluster_path(tmp_path, engine) -> None:
    """Import conditions: the rows are staged with their evolved columns (the embedded
    shape), the import commits them; the table equals the embedded path's without
    staging."""
    from icefloe.registry import ops
    from icefloe.registry.model import Conditions
    from tests.collector.test_cluster_routing import change, collector_for, drain_all

    config = collector_config(tmp_path, streams=(PAGES,), output="cluster")
    sink = ops.SinkSpec(name="pages", table="web.pages", columns=PAGES.columns,
                        unknown_fields="evolve",
                        conditions=Conditions(max_age_s=3600, max_events=4))
    version = await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="pages", sinks=(sink,))))
    publish_sync(config, FIRST, registry_version=version)
    collector = await collector_for(config, engine)
    try:
        await drain_all(collector)
        assert set(embedded_runs(collector)) == {"evolve"}
        assert not collector.staging.states["web.pages"].files  # 6 rows: imported
    finally:
        await collector.store.close()
    (tmp_path / "ref").mkdir()
    reference = collector_config(tmp_path / "ref", streams=(PAGES,))
    publish_sync(reference, FIRST)
    await collect(reference, LocalEngine())
    assert table_of(config) == table_of(reference)
    assert [d[:6] for d in dead_of(config)] == [d[:6] for d in dead_of(reference)]
