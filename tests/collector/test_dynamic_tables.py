"""Tables named by the data (#42): a stream whose table is a template writes each event
to the table its value names, created on first use with the stream's columns and layout;
rows that break a rule go to the dead letters with ``dynamic_table:<rule>``; a crash
between two tables' commits replays exactly once per table; one failing table parks only
itself. Real local store, real SQLite catalog, in-process decode (the Spark run is in
``test_dynamic_tables_spark.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pyarrow.compute as pc
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
    open_store_of,
    publish,
    read_table,
    start,
)

TENANTS = StreamConfig(
    name="events", table="tenants.events_{tenant}", columns=(
        Column("tenant", "string"), Column("n", "long"), Column("url", "string")),
    partition_by=("bucket(4, n)",), sort_by=("n",),
    table_properties={"write.parquet.compression-codec": "zstd"},
    dynamic_tables=DynamicTables(max_tables=3, max_name_length=20))


def event(key: int, tenant: str | None, prefix: str = "e", n: int | None = None
          ) -> tuple[str, str, int, bytes]:
    body: dict[str, Any] = {"n": key if n is None else n, "url": f"/p/{key}"}
    if tenant is not None:
        body["tenant"] = tenant
    return ("events", f"{prefix}{key}", BASE_MS + key, msgspec.json.encode(body))


def _engine() -> Any:
    from pipeline.load.run import LocalEngine  # why: Spark-free tests stay import-light

    return LocalEngine()


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, (TENANTS,))


def tables_of(config: Config, namespace: str) -> list[str]:
    from pipeline.iceberg.catalog import open_catalog  # why: keeps collection light

    return sorted(".".join(t) for t in open_catalog(config.catalog).list_tables(namespace))


def dead_letters(config: Config) -> dict[str, tuple[str, str]]:
    dead = read_table(config, "icefloe.dead_letters")
    return {e: (r, m) for e, r, m in zip(dead.column("event_id").to_pylist(),
                                         dead.column("reason").to_pylist(),
                                         dead.column("message").to_pylist(), strict=True)}


async def test_should_create_each_named_table_with_the_streams_layout(config: Config) -> None:
    store = open_store_of(config)
    await publish(store, [[event(0, "acme"), event(1, "Globex"), event(2, "acme")],
                          [event(3, "globex"), event(4, "ACME")]])
    await store.close()
    collector = await start(config, _engine())
    await drain(collector)
    assert tables_of(config, "tenants") == ["tenants.events_acme", "tenants.events_globex"]
    assert_exact(config, "tenants.events_acme", {"e0", "e2", "e4"})
    assert_exact(config, "tenants.events_globex", {"e1", "e3"})
    from pipeline.iceberg.catalog import open_catalog  # why: keeps collection light

    table = open_catalog(config.catalog).load_table("tenants.events_acme")
    assert [f.name for f in table.schema().fields][:3] == ["tenant", "n", "url"]
    assert str(table.spec().fields[0].transform) == "bucket[4]"
    assert table.sort_order().fields[0].source_id == table.schema().find_field("n").field_id
    assert table.properties["write.parquet.compression-codec"] == "zstd"
    assert table.current_snapshot().summary["icefloe.sequence"] == "1"
    await collector.store.close()


async def test_should_dead_letter_each_broken_rule_and_affect_nothing_else(
        config: Config) -> None:
    """null value, empty value, a name past max_name_length (20), a table past
    max_tables (3), an expression error: each row to the dead letters naming its rule."""
    store = open_store_of(config)
    await publish(store, [[event(0, "a"), event(1, None), event(2, ""),
                           event(3, "x" * 30), event(4, "b"), event(5, "c"),
                           event(6, "d"), event(7, "a"), event(8, "--")]])
    await store.close()
    collector = await start(config, _engine())
    await drain(collector)
    # new tables are admitted in the order of their first row: a, b, c (max_tables 3)
    assert tables_of(config, "tenants") == [
        "tenants.events_a", "tenants.events_b", "tenants.events_c"]
    assert_exact(config, "tenants.events_a", {"e0", "e7"})
    dead = dead_letters(config)
    assert {e: r for e, (r, _) in dead.items()} == {
        "e1": "dynamic_table:null_value", "e2": "dynamic_table:empty_value",
        "e3": "dynamic_table:name_too_long", "e6": "dynamic_table:max_tables",
        "e8": "dynamic_table:max_tables"}  # '--' would be events___: one table too many
    assert "max_tables (3)" in dead["e6"][1]
    assert "max_name_length (20)" in dead["e3"][1]
    assert collector.metrics.dead_letters.labels("dynamic_table")._value.get() == 5
    await collector.store.close()


async def test_should_dead_letter_an_expression_error(tmp_path: Path) -> None:
    stream = msgspec.structs.replace(TENANTS, table="tenants.n_{n * 4}",
                                     dynamic_tables=None, partition_by=None, sort_by=())
    config = collector_config(tmp_path, (stream,))
    store = open_store_of(config)
    await publish(store, [[event(0, "a", n=1), event(1, "a", n=2 ** 62)]])
    await store.close()
    collector = await start(config, _engine())
    await drain(collector)
    assert_exact(config, "tenants.n_4", {"e0"})
    reason, message = dead_letters(config)["e1"]
    assert reason == "dynamic_table:expression_error"
    assert "integer overflow in 'n * 4'" in message
    await collector.store.close()


async def test_should_keep_the_table_limit_across_a_restart(config: Config) -> None:
    store = open_store_of(config)
    await publish(store, [[event(0, "a"), event(1, "b")]])
    collector = await start(config, _engine())
    await drain(collector)
    await collector.store.close()
    await publish(store, [[event(2, "c"), event(3, "d"), event(4, "a")]])
    await store.close()
    restarted = await start(config, _engine())
    await drain(restarted)
    assert tables_of(config, "tenants") == [
        "tenants.events_a", "tenants.events_b", "tenants.events_c"]
    assert_exact(config, "tenants.events_a", {"e0", "e4"})
    assert dead_letters(config)["e3"][0] == "dynamic_table:max_tables"
    await restarted.store.close()


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("stage", ["after_commit:tenants.events_b",
                                   "after_commit:tenants.events_c",
                                   "after_journal:tenants.events_a",
                                   "after_commit:icefloe.dead_letters"])
async def test_should_commit_exactly_once_per_table_across_a_crash_between_commits(
        tmp_path: Path, stage: str, workers: int) -> None:
    """A crash after any table's step of a run over several tables (one after the other,
    or three at once: ``commit_workers``), then a restart: every table holds its rows
    once, and the refused rows are dead-lettered once."""
    config = collector_config(tmp_path, (TENANTS,), commit_workers=workers)
    store = open_store_of(config)
    await publish(store, [[event(k, "abcd"[k % 4]) for k in range(12)]])
    await store.close()
    crashing = await start(config, _engine(), hook=crash_at(stage))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    restarted = await start(config, _engine())
    await drain(restarted)
    for i, tenant in enumerate("abc"):
        assert_exact(config, f"tenants.events_{tenant}", {f"e{k}" for k in range(i, 12, 4)})
    dead = dead_letters(config)
    assert sorted(dead) == ["e11", "e3", "e7"]  # 'd': past max_tables, once each
    await restarted.store.close()


async def test_should_park_only_the_failing_table(tmp_path: Path) -> None:
    """One dynamic table whose metadata is lost (another tool, a bad restore) fails its
    commits and is parked after park_after_failures attempts, its rows staged; the other
    tables of the template keep committing; restored, its staged rows land once."""
    from testing.catalog_pointer import lost, metadata_pointer  # why: test-only helper

    config = collector_config(tmp_path, (TENANTS,), park_after_failures=2,
                              park_retry_s=3600)
    store = open_store_of(config)
    await publish(store, [[event(0, "a"), event(1, "b")]])
    collector = await start(config, _engine())
    assert (await collector.run_once()).entries == 1
    good = metadata_pointer(config.catalog.uri, "tenants.events_b", None)
    assert good is not None
    metadata_pointer(config.catalog.uri, "tenants.events_b", lost(good))
    for attempt in range(2):
        await publish(store, [[event(10 + attempt, "a"), event(20 + attempt, "b")]])
        with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the table fails with
            await collector.run_once()
    assert collector.bulkheads.is_parked("tenants.events_b")
    assert not collector.bulkheads.is_parked("tenants.events_a")
    await publish(store, [[event(12, "a"), event(22, "b")]])
    await drain(collector)  # parked: staged; the others commit; the queue moves on
    assert_exact(config, "tenants.events_a", {"e0", "e10", "e11", "e12"})
    assert collector.staging.states["tenants.events_b"].rows == 3
    metadata_pointer(config.catalog.uri, "tenants.events_b", good)
    collector.bulkheads.retry_all_now()
    done = await collector.offload(collector.commit_due_staged)
    assert done == {"tenants.events_b": 3}
    assert_exact(config, "tenants.events_b", {"e1", "e20", "e21", "e22"})
    assert not collector.bulkheads.is_parked("tenants.events_b")
    await store.close()
    await collector.store.close()


def test_should_route_no_row_by_a_value_into_another_namespace() -> None:
    """A value can never choose the namespace nor inject a dot."""
    import pyarrow as pa

    from pipeline.table_names import table_names

    rows = pa.table({"tenant": ["other.secret", "../x", "A B"], "n": [1, 2, 3],
                     "url": ["", "", ""]})
    named = table_names(TENANTS.table, TENANTS.columns, DynamicTables(), rows)
    assert named.tables.to_pylist() == ["tenants.events_other_secret",
                                        "tenants.events____x", "tenants.events_a_b"]
    assert pc.all(pc.starts_with(named.tables, "tenants.")).as_py()


async def test_should_import_a_parked_tables_staged_rows_after_a_restart(
        tmp_path: Path) -> None:
    """A dynamic table parked with staged rows, then the collector restarts: the new one
    finds the table by its staging area (no row of the run names it yet) and imports."""
    from testing.catalog_pointer import lost, metadata_pointer  # why: test-only helper

    config = collector_config(tmp_path, (TENANTS,), park_after_failures=1,
                              park_retry_s=3600)
    store = open_store_of(config)
    await publish(store, [[event(0, "a"), event(1, "b")]])
    collector = await start(config, _engine())
    await drain(collector)
    good = metadata_pointer(config.catalog.uri, "tenants.events_b", None)
    assert good is not None
    metadata_pointer(config.catalog.uri, "tenants.events_b", lost(good))
    await publish(store, [[event(2, "a"), event(3, "b")]])
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the table fails with
        await collector.run_once()
    await drain(collector)
    assert collector.staging.states["tenants.events_b"].rows == 1
    await collector.store.close()
    metadata_pointer(config.catalog.uri, "tenants.events_b", good)
    restarted = await start(config, _engine())
    assert "tenants.events_b" in restarted.routes.tables()
    done = await restarted.offload(restarted.commit_due_staged)
    assert done == {"tenants.events_b": 1}
    assert_exact(config, "tenants.events_b", {"e1", "e3"})
    assert_exact(config, "tenants.events_a", {"e0", "e2"})
    await store.close()
    await restarted.store.close()


async def test_should_add_a_new_column_to_a_table_when_it_next_takes_rows(
        tmp_path: Path) -> None:
    config = collector_config(tmp_path, (TENANTS,))
    store = open_store_of(config)
    await publish(store, [[event(0, "a"), event(1, "b")]])
    collector = await start(config, _engine())
    await drain(collector)
    await collector.store.close()
    wider = msgspec.structs.replace(TENANTS, columns=(*TENANTS.columns, Column("v", "long")))
    config = collector_config(tmp_path, (wider,))
    await publish(store, [[("events", "e2", BASE_MS + 2, msgspec.json.encode(
        {"tenant": "a", "n": 2, "v": 7}))]])
    await store.close()
    restarted = await start(config, _engine())
    await drain(restarted)
    rows = read_table(config, "tenants.events_a").sort_by("n")
    assert rows.column("v").to_pylist() == [None, 7]
    assert "v" not in read_table(config, "tenants.events_b").column_names  # no rows yet
    await restarted.store.close()


async def test_should_list_a_templates_tables_in_icefloe_tables(config: Config) -> None:
    from icefloe_app.cli.tables_cmd import list_statuses  # why: the CLI's own listing
    from pipeline.iceberg.catalog import open_catalog  # why: keeps collection light

    catalog = open_catalog(config.catalog)
    assert [s.table for s in list_statuses(config, catalog)] == [TENANTS.table]
    store = open_store_of(config)
    await publish(store, [[event(0, "a"), event(1, "b"), event(2, None)]])
    await store.close()
    collector = await start(config, _engine())
    await drain(collector)
    statuses = list_statuses(config, catalog)
    assert [(s.table, s.stream, s.rows) for s in statuses] == [
        ("tenants.events_a", "events", 1), ("tenants.events_b", "events", 1),
        ("icefloe.dead_letters", None, 1)]
    await collector.store.close()


def test_should_admit_new_tables_in_the_order_of_their_first_event_in_the_manifest(
        tmp_path: Path) -> None:
    """Rows come in the engine's partition order, not the manifest's: with room for one
    more table, the table whose first event came first in the manifest is admitted (as the
    cluster path, which orders keys by sequence, admits it), whatever the rows' order."""
    import pyarrow as pa

    from collector.dynamic import DynamicTables as Tables
    from collector.routing import Target
    from icefloe.registry.model import Sink, Source
    from pipeline.table_names import table_names

    limits = DynamicTables(max_tables=1, max_name_length=20)
    sink = Sink(name="events", table=TENANTS.table, columns=TENANTS.columns,
                dynamic_tables=limits)
    target = Target(Source(id="events", sinks=(sink,)), sink)
    rows = pa.table({"tenant": ["late", "early", "late"], "n": [1, 2, 3],
                     "url": ["", "", ""], "_sequence": [9, 4, 10]})
    tables = Tables(lambda: None)  # type: ignore[arg-type,return-value]
    tables.existing["tenants"] = set()
    named = table_names(TENANTS.table, TENANTS.columns, limits, rows)
    parts, refused = tables.admit(target, rows, named)
    assert [name for name, _ in parts] == ["tenants.events_early"]
    assert [r[0].column("n").to_pylist() for r in refused] == [[1, 3]]
