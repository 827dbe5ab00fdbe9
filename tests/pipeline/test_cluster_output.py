"""The cluster output path: executors write Parquet files, the driver commits them with one
``add_files`` per table — and the result is exactly what the embedded path commits.

Every collector test ends with ``count(*) == count(distinct _event_id) == events sent`` and
with no data file on disk that neither a table references nor anyone will clean up.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from collector_support import (
    BUYS,
    CLICKS,
    Crash,
    assert_exact,
    buy,
    click,
    collector_config,
    drain,
    publish_sync,
    read_table,
    start,
)

from collector.service import Fenced
from icefloe.errors import ConfigError
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import EPOCH_PROP, SEQUENCE_PROP, commit_rows, committed_state
from pipeline.iceberg.data_files import AddFiles
from pipeline.iceberg.maintenance import delete_unreachable_files
from pipeline.load.cluster import ClusterRunOutput
from pipeline.load.plans import plan_write
from pipeline.load.run import LocalEngine, SparkClusterEngine, SparkEngine
from pipeline.load.spec import run_spec

DAY_MS = 86_400_000
# Clicks partitioned by day, buys unpartitioned: both add_files layouts in every test.
STREAMS = (CLICKS, msgspec.structs.replace(BUYS, partition="none"))



def make_config(root: Path, **collector):
    root.mkdir(parents=True, exist_ok=True)
    return collector_config(root, STREAMS, dequeue_every=1, **collector)


@pytest.fixture
def config(tmp_path: Path):
    return make_config(tmp_path / "cluster", output="cluster")


@pytest.fixture
def engine(spark):
    return SparkClusterEngine(spark, 2)





def parquet_on_disk(config) -> set[str]:
    root = Path(config.catalog.warehouse.removeprefix("file://"))
    return {str(p) for p in root.rglob("*.parquet")}


def referenced(config) -> set[str]:
    catalog = open_catalog(config.catalog)
    paths: set[str] = set()
    for name in ("web.clicks", "shop.buys", "icefloe.dead_letters"):
        table = catalog.load_table(name)
        snapshot = table.current_snapshot()
        if snapshot is None or not snapshot.manifests(table.io):
            continue  # no data yet (a takeover's fence): pyiceberg's files() cannot say so
        files = table.inspect.files()
        paths |= {p.removeprefix("file://") for p in files.column("file_path").to_pylist()}
    return paths


def aged(event: tuple[str, str, int, bytes], days: int) -> tuple[str, str, int, bytes]:
    stream, event_id, received_ms, payload = event
    return stream, event_id, received_ms - days * DAY_MS, payload


def workload() -> list[list[tuple[str, str, int, bytes]]]:
    """Three days of clicks, buys, a retried request inside the run, and a dead letter."""
    first = [click(i) for i in range(40)] + [aged(click(i), 1) for i in range(40, 60)]
    second = [aged(click(i), 2) for i in range(60, 70)] + [buy(i) for i in range(15)]
    # A client retry within the same run: same ids, a later receive time. Both paths must
    # keep the first copy (entry 0's rows), not the retry.
    retry = [(s, e, ms + 5000, p) for s, e, ms, p in first[:5]] + [buy(100)]
    bad = [("clicks", "bad1", click(0)[2], b'{"user_id":"u","n":"not a number"}')]
    return [first, second, retry, bad]


def sent(batches, stream: str) -> set[str]:
    return {e[1] for batch in batches for e in batch if e[0] == stream} - {"bad1"}


async def test_cluster_path_commits_exactly_what_the_embedded_path_commits(
        tmp_path, spark, config, engine):
    embedded = make_config(tmp_path / "embedded")
    batches = workload()
    for cfg in (embedded, config):
        publish_sync(cfg, batches)
    clustered = await start(config, engine)
    assert await drain(clustered) == 1
    reference = await start(embedded, SparkEngine(spark, 2))
    await drain(reference)

    for name in ("web.clicks", "shop.buys", "icefloe.dead_letters"):
        ours, theirs = read_table(config, name), read_table(embedded, name)
        assert ours.schema.equals(theirs.schema)
        if name == "icefloe.dead_letters":  # batch file names differ between the stores
            ours, theirs = ours.drop_columns(["location"]), theirs.drop_columns(["location"])
        key = "_event_id" if name != "icefloe.dead_letters" else "event_id"
        assert sorted(ours.to_pylist(), key=lambda r: r[key]) == \
            sorted(theirs.to_pylist(), key=lambda r: r[key])
    assert_exact(config, "web.clicks", sent(batches, "clicks"))
    assert_exact(config, "shop.buys", sent(batches, "buys"))
    retried = {r["_event_id"]: r["_sequence"] for r in read_table(config, "web.clicks").to_pylist()}
    assert all(retried[f"c{i}"] == 0 for i in range(5))  # the first copy was kept
    assert clustered.metrics.duplicates.labels("clicks")._value.get() == 5

    catalog = open_catalog(config.catalog)
    clicks = catalog.load_table("web.clicks")
    summary = clicks.current_snapshot().summary
    assert summary.additional_properties[SEQUENCE_PROP] == "3"
    assert summary.additional_properties[EPOCH_PROP] == str(clustered.epoch)
    assert summary.operation.value == "append"
    files = clicks.inspect.files().to_pylist()
    # add_files derives each file's partition from its bounds: every file holds one day.
    for f in files:
        days = pq.read_table(f["file_path"].removeprefix("file://")).column("_received_at")
        days = pc.unique(days.cast(pa.date32())).to_pylist()
        assert days == [f["partition"]["_received_at_day"]]
    assert len({f["partition"]["_received_at_day"] for f in files}) == 3
    assert all(f["file_path"].startswith(clicks.location() + "/data/") for f in files)
    assert catalog.load_table("shop.buys").spec().is_unpartitioned()
    assert parquet_on_disk(config) == referenced(config)
    assert (await clustered.consumer.snapshot())[0].consumer.acked_through == 3
    await clustered.store.close()
    await reference.store.close()


@pytest.mark.parametrize("stage", ["after_job", "after_write", "after_commit:web.clicks",
                                   "after_commits", "after_ack"])
async def test_a_crash_at_any_point_then_restart_is_exact(config, engine, stage):
    first = workload()[:2]
    publish_sync(config, first)
    on_disk_at_crash: list[set[str]] = []

    def crash(seen: str) -> None:
        if seen == stage:
            on_disk_at_crash.append(parquet_on_disk(config))
            raise Crash(stage)

    crashing = await start(config, engine, hook=crash)
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    assert engine.spark._jsparkSession.sharedState().cacheManager().isEmpty()  # released
    # Whatever was written but not committed was deleted by the failed attempt's cleanup.
    assert parquet_on_disk(config) == referenced(config)
    if stage == "after_write":
        assert on_disk_at_crash[0], "the executors wrote files before the crash"
        assert committed_state(crashing.catalog.load_table("web.clicks")).sequence == -1

    more = [[click(1000 + i) for i in range(30)] + [buy(1000 + i) for i in range(5)]]
    publish_sync(config, more)
    restarted = await start(config, engine)
    await drain(restarted)
    assert_exact(config, "web.clicks", sent(first + more, "clicks"))
    assert_exact(config, "shop.buys", sent(first + more, "buys"))
    assert parquet_on_disk(config) == referenced(config)
    await restarted.store.close()


async def test_files_left_by_a_hard_crash_stay_out_of_the_table_until_swept(config, engine):
    batches = workload()[:2]
    publish_sync(config, batches)
    # The dying collector: runs the job and writes every table's files, then the process
    # is gone — no commit, no cleanup.
    dying = await start(config, engine)
    spec = run_spec(config, [e.entry for e in await dying.consumer.read()], partitions=2)
    output = await asyncio.to_thread(engine.run, spec)
    assert isinstance(output, ClusterRunOutput)
    plans = [plan_write(dying.catalog, s.table, s.name, output.keys[s.name],
                        output.keys[s.name], sequences={0: spec.batches[-1][0]},
                        epoch=dying.epoch)
             for s in STREAMS]
    written = output.write([p for p in plans if p is not None])
    output.release()
    leftovers = {p.removeprefix("file://") for files in written.values() for p in files.paths}
    assert leftovers
    assert leftovers <= parquet_on_disk(config)
    await dying.store.close()

    restarted = await start(config, engine)
    await drain(restarted)
    assert_exact(config, "web.clicks", sent(batches, "clicks"))
    assert_exact(config, "shop.buys", sent(batches, "buys"))
    assert not leftovers & referenced(config)
    catalog = open_catalog(config.catalog)
    for name in ("web.clicks", "shop.buys"):  # young orphans are kept (may be in flight) ...
        delete_unreachable_files(catalog.load_table(name), older_than_s=3600)
    assert leftovers <= parquet_on_disk(config)
    for name in ("web.clicks", "shop.buys"):  # ... and removed once old enough
        delete_unreachable_files(catalog.load_table(name), older_than_s=3600,
                                 now_s=time.time() + 7200)
    assert parquet_on_disk(config) == referenced(config)
    assert not leftovers & parquet_on_disk(config)
    assert_exact(config, "web.clicks", sent(batches, "clicks"))
    await restarted.store.close()


async def test_retried_ids_are_dropped_on_the_cluster_path(config, engine):
    batch = [click(i) for i in range(40)]
    publish_sync(config, [batch])
    collector = await start(config, engine)
    await drain(collector)
    publish_sync(config, [[*batch[:10], click(100)], batch[10:20]])  # retried requests
    await drain(collector)
    assert_exact(config, "web.clicks", {e[1] for e in batch} | {"c100"})
    assert collector.metrics.duplicates.labels("clicks")._value.get() == 20
    publish_sync(config, [batch[20:30]])  # only duplicates: nothing to write, nothing left
    await drain(collector)
    await collector.store.close()
    publish_sync(config, [batch[30:]])
    restarted = await start(config, engine)  # the window is rebuilt from the table
    assert len(restarted.windows["web.clicks"]) == 41
    await drain(restarted)
    assert_exact(config, "web.clicks", {e[1] for e in batch} | {"c100"})
    assert parquet_on_disk(config) == referenced(config)
    await restarted.store.close()


async def test_a_fenced_commit_is_refused_and_its_files_are_deleted(tmp_path, engine):
    """The fenced table's commit is refused and the run stops there: with the tables one
    after another (``commit_workers = 1``) the other table's files are never committed."""
    config = make_config(tmp_path / "cluster", output="cluster", commit_workers=1)
    batches = workload()[:2]
    publish_sync(config, batches)
    written: list[set[str]] = []
    newer: dict[str, object] = {}

    def newer_collector_commits_first(stage: str) -> None:
        """Between our write and our commit, a collector with a newer epoch commits."""
        if stage != "after_write":
            return
        written.append(parquet_on_disk(config))
        entries = newer["entries"]
        rows = LocalEngine().run(run_spec(config, entries)).tables["clicks"]
        commit_rows(open_catalog(config.catalog), "web.clicks", rows,
                    sequence=entries[-1].sequence, epoch=newer["epoch"])

    old = await start(config, engine, hook=newer_collector_commits_first)
    newer.update(entries=[e.entry for e in await old.consumer.read()], epoch=old.epoch + 1)
    with pytest.raises(Fenced, match="fenced"):
        await old.run_once()
    assert written[0]
    on_disk = parquet_on_disk(config)
    assert not written[0] & on_disk  # ours (both tables) are gone ...
    assert on_disk == referenced(config)  # ... the newer collector's file stays
    assert_exact(config, "web.clicks", sent(batches, "clicks"))
    assert read_table(config, "shop.buys").num_rows == 0
    assert committed_state(old.catalog.load_table("web.clicks")).epoch == old.epoch + 1
    await old.store.close()


async def test_an_unknown_add_files_outcome_keeps_files_that_landed(config, engine):
    publish_sync(config, [[click(i) for i in range(10)]])
    collector = await start(config, engine)
    spec = run_spec(config, [e.entry for e in await collector.consumer.read()],
                    partitions=2)
    output = await asyncio.to_thread(engine.run, spec)
    keys = output.keys["clicks"]
    plan = plan_write(collector.catalog, "web.clicks", "clicks", keys, keys, sequences={0: 0},
                      epoch=collector.epoch)
    files = output.write([plan])["clicks"]
    output.release()

    class TimesOut(AddFiles):
        def __call__(self, table, rows, props):
            super().__call__(table, rows, props)
            self.landed = False
            self.uncertain = True
            raise TimeoutError("catalog did not answer")  # the commit landed anyway

    add = TimesOut(files)
    result = commit_rows(collector.catalog, "web.clicks", keys, sequence=0,
                         epoch=collector.epoch, append=add)
    assert result.sequence == 0
    assert add.cleanup(collector.catalog, "web.clicks", sequence=0, epoch=collector.epoch) == 0
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(10)})
    assert parquet_on_disk(config) == referenced(config)
    await collector.store.close()


def test_output_path_is_configured_and_validated(tmp_path, spark, monkeypatch):
    from collector import runner

    assert collector_config(tmp_path).collector.output == "embedded"
    with pytest.raises(ConfigError, match=r"collector\.output"):
        collector_config(tmp_path, output="executors")
    monkeypatch.setattr(runner, "get_spark", lambda *a, **k: spark)
    engine = runner.default_engine(collector_config(tmp_path, output="cluster"))
    assert isinstance(engine, SparkClusterEngine)


@pytest.mark.s3
async def test_executors_write_to_an_s3_warehouse(tmp_path, s3_bucket, engine):
    """On a cluster the warehouse is an object store: executors write there through the
    table's FileIO (endpoint and credentials from the catalog's ``s3.*`` properties)."""
    import boto3

    local = make_config(tmp_path / "s3", output="cluster")
    catalog = msgspec.structs.replace(local.catalog, warehouse=s3_bucket.url.rstrip("/"),
                                      properties={"s3.endpoint": s3_bucket.endpoint_url,
                                                  "s3.access-key-id": "testing",
                                                  "s3.secret-access-key": "testing",
                                                  "s3.region": "us-east-1"})
    config = msgspec.structs.replace(local, catalog=catalog)
    batches = workload()[:2]
    publish_sync(config, batches)
    collector = await start(config, engine)
    await drain(collector)
    assert_exact(config, "web.clicks", sent(batches, "clicks"))
    assert_exact(config, "shop.buys", sent(batches, "buys"))
    client = boto3.client("s3", endpoint_url=s3_bucket.endpoint_url, region_name="us-east-1")
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]}
    client.close()
    files = {f"{s3_bucket.bucket}/{k}" for k in keys if k.endswith(".parquet")}
    tables = open_catalog(config.catalog)
    wanted = {p.removeprefix("s3://") for name in ("web.clicks", "shop.buys")
              for p in tables.load_table(name).inspect.files().column("file_path").to_pylist()}
    assert files == wanted
    await collector.store.close()
