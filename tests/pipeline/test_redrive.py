"""Dead-letter redrive: a config fix lands dead-lettered rows in their tables exactly once.

The dead letters are made the way production makes them: batch files published to a real
local store and consumed by the collector (on the Spark-free ``LocalEngine``) whose config
lags — a stream it does not know yet, and an ``int`` column that a payload overflows.
Then the config is fixed (the stream added, the column widened to ``long``) and
``icefloe deadletters redrive`` runs: every row lands once, a rerun lands nothing, and a
redrive that crashed between its table append and its ledger write does not append twice.
"""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from collector_support import BASE_MS, CLICKS, collector_config, drain, publish_sync, start
from process_support import write_config

from icefloe.config import Column, StreamConfig
from icefloe_app.cli import main
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import committed_state
from pipeline.redrive import Filters, pending, redrive

VISITS_V1 = StreamConfig(name="visits", table="web.visits", columns=(
    Column("user_id", "string", required=True), Column("pages", "int")))
VISITS_V2 = msgspec.structs.replace(VISITS_V1, columns=(
    Column("user_id", "string", required=True), Column("pages", "long")))
LATE = StreamConfig(name="late", table="web.late", columns=(Column("k", "string"),))


def visit(i: int, pages: int) -> tuple[str, str, int, bytes]:
    return ("visits", f"v{i}", BASE_MS + i,
            msgspec.json.encode({"user_id": f"u{i}", "pages": pages}))


def late(i: int) -> tuple[str, str, int, bytes]:
    return ("late", f"l{i}", BASE_MS + i, msgspec.json.encode({"k": f"x{i}"}))


@pytest.fixture
def lake(tmp_path):
    """Dead letters from a lagging collector: 3 overflowing ``int`` rows, 4 unknown-stream
    rows, next to 5 rows that fit."""
    from pipeline.load.run import LocalEngine

    old = collector_config(tmp_path, streams=(CLICKS, VISITS_V1))
    publish_sync(old, [[visit(i, 3) for i in range(5)] + [visit(100 + i, 2**40)
                                                         for i in range(3)],
                       [late(i) for i in range(4)]])

    async def consume() -> None:
        collector = await start(old, LocalEngine())
        try:
            await drain(collector)
        finally:
            await collector.store.close()

    asyncio.run(consume())
    fixed = collector_config(tmp_path, streams=(CLICKS, VISITS_V2, LATE))
    return old, fixed


def _rows(config, name):
    return open_catalog(config.catalog).load_table(name).scan().to_arrow()


def test_should_land_fixed_rows_once_and_nothing_on_a_rerun(lake, capsys, tmp_path):
    _, fixed = lake
    catalog = open_catalog(fixed.catalog)
    assert pending(catalog, Filters()).num_rows == 7
    sequence_before = committed_state(catalog.load_table("web.visits")).sequence

    dry = redrive(fixed, catalog, Filters(), dry_run=True)
    assert dict(dry.landed) == {"web.visits": 3, "web.late": 4}
    assert _rows(fixed, "web.visits").num_rows == 5  # a dry run writes nothing

    done = redrive(fixed, catalog, Filters())
    assert dict(done.landed) == {"web.visits": 3, "web.late": 4}
    visits = _rows(fixed, "web.visits")
    assert sorted(visits.column("_event_id").to_pylist()) == sorted(
        [f"v{i}" for i in range(5)] + [f"v{100 + i}" for i in range(3)])
    assert sorted(r["pages"] for r in visits.to_pylist())[-1] == 2**40
    assert sorted(_rows(fixed, "web.late").column("k").to_pylist()) == [f"x{i}" for i in
                                                                         range(4)]
    # the collector's offset is untouched: a redrive commit carries no sequence
    assert committed_state(catalog.load_table("web.visits")).sequence == sequence_before
    assert pending(catalog, Filters()).num_rows == 0

    again = redrive(fixed, catalog, Filters())
    assert again.selected == 0
    assert _rows(fixed, "web.visits").num_rows == 8

    path = write_config(tmp_path, (CLICKS, VISITS_V2, LATE))  # the same lake, as a file
    assert main(["deadletters", "list", "--config", str(path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {(x["stream"], x["reason"], x["redriven"], x["rows"]) for x in listed} == {
        ("visits", "payload_mismatch", True, 3), ("late", "unknown_stream", True, 4)}


def test_should_not_append_twice_after_a_crash_before_the_ledger(lake, monkeypatch):
    _, fixed = lake
    catalog = open_catalog(fixed.catalog)
    import pipeline.redrive as module

    def crash(*args, **kwargs):
        raise RuntimeError("killed between the table append and the ledger write")

    monkeypatch.setattr(module, "_record", crash)
    with pytest.raises(RuntimeError):
        redrive(fixed, catalog, Filters(stream="visits"))
    assert _rows(fixed, "web.visits").num_rows == 8  # landed, but not recorded
    monkeypatch.undo()
    report = redrive(fixed, catalog, Filters(stream="visits"))
    assert dict(report.recovered) == {"web.visits": 3}
    assert report.landed["web.visits"] == 0
    assert _rows(fixed, "web.visits").num_rows == 8
    assert pending(catalog, Filters(stream="visits")).num_rows == 0


def test_should_leave_rows_that_still_do_not_fit_pending(lake):
    old, _ = lake
    catalog = open_catalog(old.catalog)
    report = redrive(old, catalog, Filters())  # nothing fixed yet
    assert dict(report.still_bad) == {"visits": 3}
    assert dict(report.unknown_stream) == {"late": 4}
    assert not any(report.landed.values())
    assert pending(catalog, Filters()).num_rows == 7
    assert report.samples[0]["event_id"].startswith("v10")


def test_should_filter_and_print_in_one_line_errors(lake, capsys, tmp_path):
    path = str(write_config(tmp_path, (CLICKS, VISITS_V2, LATE)))
    assert main(["deadletters", "redrive", "--config", path, "--stream", "late",
                 "--dry-run"]) == 0
    assert "would land 4 rows in web.late" in capsys.readouterr().out
    assert main(["deadletters", "show", "--config", path, "--reason",
                 "payload_mismatch"]) == 0
    shown = capsys.readouterr().out
    assert shown.count("payload_mismatch") == 3
    assert '"pages":1099511627776' in shown
    assert main(["deadletters", "list", "--config", path, "--since", "yesterday"]) == 2
    assert "--since 'yesterday': not an ISO 8601 time" in capsys.readouterr().err


def test_should_restore_id_and_datetime_mappings_of_redriven_rows(lake, tmp_path):
    _, fixed = lake
    mapped = StreamConfig(name="late", table="web.late", columns=(
        Column("k", "string"), Column("eid", "string", source="id"),
        Column("at", "timestamp", source="datetime"), Column("ip", "string", source="ip")))
    config = msgspec.structs.replace(fixed, streams=(CLICKS, VISITS_V2, mapped))
    redrive(config, open_catalog(config.catalog), Filters())
    rows = _rows(config, "web.late").to_pylist()
    assert sorted(r["k"] for r in rows) == [f"x{i}" for i in range(4)]
    assert all(r["eid"] == r["_event_id"] and r["at"] == r["_received_at"] for r in rows)
    assert {r["ip"] for r in rows} == {None}  # not kept with the dead letter


def test_should_keep_the_manifest_shard_of_redriven_rows(tmp_path):
    """Dead letters of manifest shard 1 record it (``shard``), and redriven rows land with
    their ``(_shard, _sequence)``; a rerun, keyed by both, lands nothing."""
    from collector_support import open_store_of, publish

    from icefloe.manifest import ShardedProducer, grow_shards
    from pipeline.load.run import LocalEngine

    old = collector_config(tmp_path, streams=(CLICKS, VISITS_V1))
    old = msgspec.structs.replace(old, manifest=msgspec.structs.replace(old.manifest,
                                                                        shards=2))

    async def consume() -> None:
        store = open_store_of(old)
        await grow_shards(store, old.manifest.key, 2,
                          backoff=old.manifest.build().conflict_backoff)
        producer = ShardedProducer(store, old.manifest.build(), shard=1)
        await publish(store, [[visit(i, 3) for i in range(2)] + [visit(100, 2**40)]],
                      producer)  # type: ignore[arg-type]
        await producer.close()
        await store.close()
        collector = await start(old, LocalEngine())
        try:
            await drain(collector)
        finally:
            await collector.store.close()

    asyncio.run(consume())
    fixed = collector_config(tmp_path, streams=(CLICKS, VISITS_V2))
    catalog = open_catalog(fixed.catalog)
    dead = pending(catalog, Filters())
    assert dead.column("shard").to_pylist() == [1]
    assert dict(redrive(fixed, catalog, Filters()).landed) == {"web.visits": 1}
    rows = {r["_event_id"]: (r["_shard"], r["_sequence"])
            for r in _rows(fixed, "web.visits").to_pylist()}
    assert rows == {"v0": (1, 0), "v1": (1, 0), "v100": (1, 0)}
    assert redrive(fixed, catalog, Filters()).selected == 0
