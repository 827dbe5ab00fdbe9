"""``icefloe replay``: kept batch files run again into one sink, exactly once, and every
refusal (retention off, unknown sink, expired range, live sink, rows without --truncate).
No Spark here (LocalEngine; the Spark run is tests/collector/test_replay_spark.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import msgspec
import pytest
from collector_support import (
    BASE_MS,
    BUYS,
    CLICKS,
    buy,
    change_registry,
    click,
    collector_config,
    commit_routed,
    drain,
    ids,
    open_store_of,
    publish,
    read_table,
    start,
)
from process_support import child_env, run_cli, write_config

from collector.gc import collect_garbage
from collector.replay import Replay
from collector.replay_plan import plan
from collector.replay_range import ReplayConflict, ReplayRefused, parse_bound
from icefloe.config import load_config
from icefloe.manifest import ManifestConsumer
from icefloe.registry import ops
from pipeline.iceberg.catalog import open_catalog
from pipeline.load.run import LocalEngine

KEEP = 3600.0


async def ingest_and_commit(config: Any, batches: list[list[Any]]) -> None:
    store = open_store_of(config)
    try:
        await publish(store, batches)
    finally:
        await store.close()
    collector = await start(config, LocalEngine())
    try:
        await drain(collector)
        await collector.dequeue()
        await collector.consumer.release_lease()  # a clean stop: the lease is free
    finally:
        await collector.store.close()


def clicks_batches(count: int, per: int = 4, prefix: str = "c") -> list[list[Any]]:
    return [[click(b * per + i, prefix) for i in range(per)] for b in range(count)]


async def planned(config: Any, sink: str, start_: str, end: str) -> Any:
    store = open_store_of(config)
    try:
        return await plan(config, store, sink, parse_bound(start_, "--from"),
                          parse_bound(end, "--to"))
    finally:
        await store.close()


def replay(config: Any, sink: str, start_: str, end: str, *, truncate: bool = False,
           hook: Any = None) -> Any:
    p = asyncio.run(planned(config, sink, start_, end))
    r = Replay(config, open_catalog(config.catalog), LocalEngine(), p.target, p.entries,
               hook=hook)
    r.start(truncate=truncate)
    return r.run()


def rows_of(config: Any, table: str) -> list[dict[str, Any]]:
    return read_table(config, table).sort_by("_event_id").to_pylist()


def config_of(tmp_path: Any, **collector: Any) -> Any:
    """Two streams; runs (and replay chunks) of two batch files."""
    return collector_config(tmp_path, (CLICKS, BUYS), keep_batches_s=KEEP,
                            max_run_entries=2, **collector)


def drop(config: Any, table: str) -> None:
    open_catalog(config.catalog).drop_table(table)


def test_replay_fills_a_lost_table_with_the_original_rows_and_leaves_others(tmp_path):
    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, [*clicks_batches(5), [buy(1), buy(2)]]))
    original = rows_of(config, "web.clicks")
    buys_before = read_table(config, "shop.buys").num_rows
    buys_snapshot = open_catalog(config.catalog).load_table("shop.buys").current_snapshot()
    drop(config, "web.clicks")
    done = replay(config, "clicks", "0", "5")
    assert done.rows == 20
    assert done.entries_done == 6
    assert rows_of(config, "web.clicks") == original
    # no other sink touched
    assert read_table(config, "shop.buys").num_rows == buys_before
    assert open_catalog(config.catalog).load_table("shop.buys").current_snapshot() \
        == buys_snapshot


def test_truncate_replays_into_the_emptied_table_and_a_rerun_adds_nothing(tmp_path):
    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, clicks_batches(4)))
    original = rows_of(config, "web.clicks")
    with pytest.raises(ReplayRefused, match=r"holds 16 rows.*--truncate"):
        replay(config, "web.clicks", "0", "3")
    replay(config, "web.clicks", "0", "3", truncate=True)
    assert rows_of(config, "web.clicks") == original
    again = replay(config, "web.clicks", "0", "3")  # same range: its marker, a resume
    assert again.rows == 0
    assert again.skipped_entries == 4
    assert rows_of(config, "web.clicks") == original


def test_a_partial_range_by_sequence_and_by_time(tmp_path):
    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, clicks_batches(4)))
    drop(config, "web.clicks")
    replay(config, "clicks", "1", "2")
    assert set(read_table(config, "web.clicks").column("_event_id").to_pylist()) == \
        {f"c{i}" for i in range(4, 12)}
    drop(config, "web.clicks")
    replay(config, "clicks", "2000-01-01T00:00:00Z", "2999-01-01T00:00:00")
    assert read_table(config, "web.clicks").num_rows == 16


class Crash(Exception):
    pass


def test_an_interrupted_replay_resumes_exactly_once(tmp_path):
    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, clicks_batches(6)))
    original = rows_of(config, "web.clicks")
    drop(config, "web.clicks")
    chunks = []

    def die_after_second(stage: str) -> None:
        if stage == "after_chunk":
            chunks.append(stage)
            if len(chunks) == 2:
                raise Crash(stage)

    with pytest.raises(Crash):
        replay(config, "clicks", "0", "5", hook=die_after_second)
    assert read_table(config, "web.clicks").num_rows == 16  # two chunks of 2 files landed
    resumed = replay(config, "clicks", "0", "5")
    assert resumed.skipped_entries == 4
    assert resumed.rows == 8
    assert rows_of(config, "web.clicks") == original


def test_a_commit_by_someone_else_during_the_replay_stops_it(tmp_path):
    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, clicks_batches(4)))
    drop(config, "web.clicks")

    def collector_commits(stage: str) -> None:
        if stage == "after_chunk":
            from pipeline.iceberg.commit import summary_props
            table = open_catalog(config.catalog).load_table("web.clicks")
            table.append(table.schema().as_arrow().empty_table(),
                         snapshot_properties=summary_props(99, 1))

    with pytest.raises(ReplayConflict, match=r"was committed to by something else"):
        replay(config, "clicks", "0", "3", hook=collector_commits)


def test_refusals_change_nothing(tmp_path):
    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, clicks_batches(4)))
    with pytest.raises(ReplayRefused, match=r"unknown sink 'nope'.*clicks/clicks"):
        asyncio.run(planned(config, "nope", "0", "3"))
    with pytest.raises(ReplayRefused, match=r"sequence 9 is not in the retention index"):
        asyncio.run(planned(config, "clicks", "0", "9"))
    off = msgspec.structs.replace(config, collector=msgspec.structs.replace(
        config.collector, keep_batches_s=0.0))
    with pytest.raises(ReplayRefused, match=r"retention is off"):
        asyncio.run(planned(off, "clicks", "0", "3"))
    with pytest.raises(ReplayRefused, match=r"neither a manifest sequence"):
        parse_bound("yesterday", "--from")


def test_an_expired_range_is_refused_naming_the_first_missing_sequence(tmp_path):
    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, clicks_batches(2)))

    async def expire_all() -> None:
        store = open_store_of(config)
        try:
            await collect_garbage(store, config.manifest.key, grace_s=0.0, keep_s=1e-6)
        finally:
            await store.close()
    asyncio.run(expire_all())
    asyncio.run(ingest_and_commit(config, clicks_batches(2, prefix="d")))
    with pytest.raises(ReplayRefused, match=r"sequence 0 is no longer kept.*oldest kept is 2"):
        asyncio.run(planned(config, "clicks", "0", "3"))
    with pytest.raises(ReplayRefused, match=r"before the oldest kept batch file.*sequence 1 "
                                            r"and older"):
        asyncio.run(planned(config, "clicks", "2000-01-01T00:00:00Z", "2999-01-01T00:00:00Z"))
    assert len(asyncio.run(planned(config, "clicks", "2", "3")).entries) == 2


def test_a_file_gone_from_the_store_is_refused_by_sequence(tmp_path):
    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, clicks_batches(3)))
    p = asyncio.run(planned(config, "clicks", "0", "2"))
    (tmp_path / "store" / p.entries[1].entry.location).unlink()  # a lifecycle rule did it
    with pytest.raises(ReplayRefused, match=r"sequence 1 .* is in the retention index but its "
                                            r"batch file .* is gone"):
        asyncio.run(planned(config, "clicks", "0", "2"))


def test_a_live_sink_is_refused_while_a_collector_holds_the_lease(tmp_path):
    base = config_of(tmp_path)
    config = msgspec.structs.replace(base, manifest=msgspec.structs.replace(
        base.manifest, lease_s=120.0))
    asyncio.run(ingest_and_commit(config, clicks_batches(2)))

    async def hold() -> None:
        store = open_store_of(config)
        try:
            await ManifestConsumer(store, config.manifest.build(),
                                   holder="collector-live").initialize()
        finally:
            await store.close()
    asyncio.run(hold())
    with pytest.raises(ReplayRefused, match=r"sink clicks/clicks is live: collector "
                                            r"'collector-live'.*stop the collector"):
        asyncio.run(planned(config, "clicks", "0", "1"))


def test_the_cli_refuses_with_one_line_and_exit_2(tmp_path):
    path = write_config(tmp_path, keep_batches_s=KEEP)
    config = load_config(path)
    asyncio.run(ingest_and_commit(config, clicks_batches(2)))
    unknown = run_cli(["replay", "--config", str(path), "--from", "0", "--to", "1",
                       "--sink", "nope"], tmp_path)
    assert unknown.returncode == 2, unknown.stderr
    assert unknown.stderr.strip().splitlines() == [
        "replay refused: unknown sink 'nope': no live sink has that name or table (known: "
        "clicks/clicks)"]
    ahead = run_cli(["replay", "--config", str(path), "--from", "0", "--to", "7",
                     "--sink", "clicks"], tmp_path)
    assert ahead.returncode == 2
    assert "sequence 7 is not in the retention index" in ahead.stderr
    helped = run_cli(["replay", "--help"], tmp_path)
    assert helped.returncode == 0
    assert "--truncate" in helped.stdout
    assert "exactly once" in helped.stdout.lower()


KILLED_REPLAY = textwrap.dedent("""
    import asyncio, sys, threading
    from icefloe.config import load_config
    from collector.replay import Replay
    from collector.replay_plan import plan
    from collector.replay_range import parse_bound
    from collector_support import open_store_of
    from pipeline.iceberg.catalog import open_catalog
    from pipeline.load.run import LocalEngine

    config = load_config(sys.argv[1])
    async def planned():
        store = open_store_of(config)
        try:
            return await plan(config, store, "clicks", parse_bound("0", "--from"),
                              parse_bound(sys.argv[2], "--to"))
        finally:
            await store.close()
    p = asyncio.run(planned())
    chunks = []
    def hook(stage):
        if stage == "after_chunk":
            chunks.append(stage)
            print("chunk", len(chunks), flush=True)
            if sys.argv[3] == "hang" and len(chunks) == 2:
                threading.Event().wait()  # the parent kills us here
    r = Replay(config, open_catalog(config.catalog), LocalEngine(), p.target, p.entries,
               hook=hook)
    r.start(truncate=False)
    print("done", r.run().rows, flush=True)
""")


def test_a_killed_replay_process_resumed_lands_exactly_once(tmp_path):
    path = write_config(tmp_path, keep_batches_s=KEEP, max_run_entries=2)
    config = load_config(path)
    asyncio.run(ingest_and_commit(config, clicks_batches(6)))
    original = rows_of(config, "web.clicks")
    drop(config, "web.clicks")
    script = tmp_path / "replay_child.py"
    script.write_text(KILLED_REPLAY)
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(__file__)),
                                         env.get("PYTHONPATH", "")])
    child = subprocess.Popen([sys.executable, str(script), str(path), "5", "hang"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip() == "chunk 2":
            break
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert read_table(config, "web.clicks").num_rows == 16
    again = subprocess.run([sys.executable, str(script), str(path), "5", "run"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120, check=True)
    assert again.stdout.strip().splitlines()[-1] == "done 8"
    assert rows_of(config, "web.clicks") == original
    assert set(read_table(config, "web.clicks").column("_event_id").to_pylist()) == \
        ids("c", 24)


@pytest.mark.s3
def test_on_s3_a_replay_failed_by_the_store_resumes_exactly_once(tmp_path, s3_bucket,
                                                                   s3_faults):
    """Fault at the object-store boundary: after the first chunk, moto refuses the batch
    files' GETs (403, not retried); the replay fails, and the same replay afterwards
    lands every row once. Retention, the index and the refusals on a real S3 API."""
    config = collector_config(tmp_path, (CLICKS,), keep_batches_s=KEEP, max_run_entries=2,
                              store={"url": s3_bucket.url,
                                     "endpoint_url": s3_bucket.endpoint_url,
                                     "region": "us-east-1"})
    asyncio.run(ingest_and_commit(config, clicks_batches(6)))

    async def gc() -> Any:
        store = open_store_of(config)
        try:
            return await collect_garbage(store, config.manifest.key, grace_s=0.0, keep_s=KEEP)
        finally:
            await store.close()
    kept = asyncio.run(gc())
    assert (kept.deleted, kept.retained) == (0, 6)  # dequeued, unreferenced, but kept
    original = rows_of(config, "web.clicks")
    drop(config, "web.clicks")

    def refuse_reads(stage: str) -> None:
        if stage == "after_chunk" and not s3_faults.rules:
            s3_faults.add("GET", "/batches/", 403, "AccessDenied", times=1000)

    with pytest.raises(Exception, match=r"(?i)denied|403"):
        replay(config, "clicks", "0", "5", hook=refuse_reads)
    assert read_table(config, "web.clicks").num_rows == 8  # the first chunk only
    s3_faults.clear()
    resumed = replay(config, "clicks", "0", "5")
    assert resumed.skipped_entries == 2
    assert rows_of(config, "web.clicks") == original


# -- the sink as it is now, and what the pipeline refuses ----------------------------------

async def commit_through_registry(config: Any, sink: Any, batches: list[list[Any]]) -> None:
    """A registry source ``clicks`` with ``sink``, its events committed and dequeued."""
    await change_registry(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(sink,))))
    store = open_store_of(config)
    try:
        await publish(store, batches, registry_version=1)
    finally:
        await store.close()
    await commit_routed(config, LocalEngine())


def test_a_replay_routes_every_event_through_the_sinks_where_as_it_is_now(tmp_path):
    """A ``where`` fixed by a PATCH, then a replay with ``--truncate``: the table holds what
    the fixed predicate takes, not what the sink's first predicate took."""
    config = config_of(tmp_path)
    sink = ops.SinkSpec(name="clicks", table="web.clicks", columns=CLICKS.columns,
                        where="n < 4")
    asyncio.run(commit_through_registry(config, sink, clicks_batches(2)))
    assert sorted(r["n"] for r in rows_of(config, "web.clicks")) == [0, 1, 2, 3]
    asyncio.run(change_registry(config, lambda r: ops.update_sink(
        r, "clicks", "clicks", ops.SinkPatch(where="n >= 4"))))
    asyncio.run(change_registry(config, lambda r: ops.set_sink_enabled(
        r, "clicks", "clicks", False)))
    done = replay(config, "clicks/clicks", "0", "1", truncate=True)
    assert sorted(r["n"] for r in rows_of(config, "web.clicks")) == [4, 5, 6, 7]
    assert (done.rows, done.refused) == (4, {})


def test_events_the_sinks_pipeline_refuses_now_are_counted_by_reason(tmp_path):
    """A new sink whose ``where`` raises on every row (a division by zero), and an event
    whose payload no sink's types fit: neither is in the table; the replay counts both by
    reason and the CLI's summary names them."""
    from icefloe_app.cli.replay_cmd import refused_note

    config = config_of(tmp_path)
    bad = ("clicks", "bad0", BASE_MS, msgspec.json.encode({"user_id": "u", "n": "many"}))
    asyncio.run(commit_through_registry(config, ops.SinkSpec(
        name="clicks", table="web.clicks", columns=CLICKS.columns),
        [*clicks_batches(2), [bad]]))
    assert len(rows_of(config, "web.clicks")) == 8  # the bad event was dead-lettered
    for name, where in (("erring", "10 / (n - n) > 1"), ("plain", None)):
        asyncio.run(change_registry(config, lambda r, n=name, w=where: ops.create_sink(
            r, "clicks", ops.SinkSpec(name=n, table=f"web.{n}", columns=CLICKS.columns,
                                      where=w))))
        asyncio.run(change_registry(config, lambda r, n=name: ops.set_sink_enabled(
            r, "clicks", n, False)))
    erring = replay(config, "clicks/erring", "0", "2")
    assert erring.rows == 0
    assert erring.refused == {"where_error": 8, "payload_mismatch": 1}
    plain = replay(config, "clicks/plain", "0", "2")
    assert (plain.rows, plain.refused) == (8, {"payload_mismatch": 1})
    note = refused_note(erring.refused)
    assert "9 events refused by the sink (payload_mismatch 1, where_error 8)" in note
    assert "not dead-lettered" in note
    assert refused_note({}) == ""


def test_a_table_template_sink_is_refused_naming_it(tmp_path):
    from test_dynamic_tables import TENANTS, event

    config = collector_config(tmp_path, (TENANTS,), keep_batches_s=KEEP)
    asyncio.run(ingest_and_commit(config, [[event(1, "acme"), event(2, "globex")]]))
    with pytest.raises(ReplayRefused, match=r"a table template \(tenants.events_\{tenant\}\), "
                                            r"which replay does not support yet"):
        asyncio.run(planned(config, "events", "0", "0"))
    catalog = open_catalog(config.catalog)
    assert "events_{tenant}" not in {t[-1] for t in catalog.list_tables("tenants")}


def test_a_fence_or_a_compaction_during_a_paused_replay_does_not_stop_it(tmp_path):
    """Commits that change no rows carry the replay's marker as they carry the offset: a
    collector starting up fences every table, and maintenance compacts the replay's small
    files; neither is a commit by someone else."""
    from pipeline.iceberg.fence import fence_table
    from pipeline.iceberg.maintenance import compact

    config = config_of(tmp_path)
    asyncio.run(ingest_and_commit(config, clicks_batches(6)))
    original = rows_of(config, "web.clicks")
    drop(config, "web.clicks")
    catalog = open_catalog(config.catalog)

    def meddle(stage: str) -> None:
        if stage == "after_chunk":
            fence_table(catalog, "web.clicks", 99, offsets=True)
            compact(catalog.load_table("web.clicks"), epoch=99, min_input_files=2)

    done = replay(config, "clicks", "0", "5", hook=meddle)
    assert done.rows == 24
    assert rows_of(config, "web.clicks") == original


@pytest.mark.parametrize(("apart_s", "rows"), [(10.0, 4), (3600.0, 8)])
def test_the_replays_dedup_window_ages_by_ingest_time(tmp_path, apart_s, rows):
    """The same four event ids in two batch files (a client's retry): within
    ``dedup_window_s`` of ingest time the second copy is dropped; ingested an hour apart
    (a 60 s window) it is kept, as the collector kept it then."""
    config = collector_config(tmp_path, (CLICKS,), keep_batches_s=KEEP, max_run_entries=1,
                              dedup_window_s=60.0)
    asyncio.run(ingest_and_commit(config, [clicks_batches(1)[0], clicks_batches(1)[0]]))
    drop(config, "web.clicks")
    p = asyncio.run(planned(config, "clicks", "0", "1"))
    first = p.entries[0].entry.ingested_at
    entries = [msgspec.structs.replace(item, entry=msgspec.structs.replace(
        item.entry, ingested_at=first + n * apart_s)) for n, item in enumerate(p.entries)]
    r = Replay(config, open_catalog(config.catalog), LocalEngine(), p.target, entries)
    r.start(truncate=False)
    done = r.run()
    assert (done.rows, done.duplicates) == (rows, 8 - rows)
    assert len(rows_of(config, "web.clicks")) == rows
