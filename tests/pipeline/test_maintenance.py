"""Table maintenance against a real SQLite catalog and a file warehouse (one test on moto S3).

What matters here is the exactly-once protocol surviving maintenance: compaction keeps every
row and carries ``icefloe.sequence``/``icefloe.epoch`` forward, refuses a newer epoch, and
fails rather than rebases when someone committed in between; expiry never loses the offset;
deletion never touches a referenced file; and a continuously fed table stays bounded.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from icefloe.clock import Clock, ManualClock, StoreClock
from icefloe.errors import TableFencedError
from pipeline.iceberg.commit import committed_state, summary_props
from pipeline.iceberg.maintenance import (
    MaintenanceSettings,
    compact,
    delete_unreachable_files,
    expire_snapshots,
    run_maintenance,
)

DAYS = 3
ROWS = 12
TS = pa.timestamp("us", tz="UTC")
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "payload", StringType(), required=False),
    NestedField(3, "_received_at", TimestamptzType(), required=False),
    NestedField(4, "_sequence", LongType(), required=False),
)
DAY_SPEC = PartitionSpec(PartitionField(3, 1000, DayTransform(), "_received_at_day"))
# Small metadata log so "bounded" is visible within a short test; icefloe's default is 100.
PROPS = {"commit.retry.num-retries": "0", "write.metadata.previous-versions-max": "5"}
TWO_HOURS_AGO = time.time() - 7200


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    cat = SqlCatalog("test", uri=f"sqlite:///{tmp_path}/catalog.db",
                     warehouse=f"file://{tmp_path}/warehouse")
    cat.create_namespace("ns")
    return cat


@pytest.fixture(params=[True, False], ids=["day-partitioned", "unpartitioned"])
def partitioned(request: pytest.FixtureRequest) -> bool:
    return request.param


def make_table(catalog: SqlCatalog, partitioned: bool = True,
               properties: dict[str, str] = PROPS) -> Table:
    spec = DAY_SPEC if partitioned else UNPARTITIONED_PARTITION_SPEC
    return catalog.create_table("ns.events", SCHEMA, partition_spec=spec, properties=properties)


def batch(n: int) -> pa.Table:
    """Rows of manifest sequence ``n``, spread over ``DAYS`` days (one file per day)."""
    ids = [n * ROWS + i for i in range(ROWS)]
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "payload": pa.array([f"event-{i}" for i in ids]),
        "_received_at": pa.array(
            [dt.datetime(2024, 5, 1 + i % DAYS, i, tzinfo=dt.UTC) for i in range(ROWS)], TS),
        "_sequence": pa.array([n] * ROWS, pa.int64()),
    })


def append(table: Table, n: int, epoch: int = 1) -> None:
    table.append(batch(n), snapshot_properties={"icefloe.sequence": str(n),
                                                "icefloe.epoch": str(epoch)})


def feed(table: Table, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        append(table, n)


def contents(table: Table) -> list[dict[str, object]]:
    return table.scan().to_arrow().sort_by("id").to_pylist()


def expected_contents(sequences: range) -> list[dict[str, object]]:
    return pa.concat_tables([batch(n) for n in sequences]).sort_by("id").to_pylist()


def table_dir(table: Table) -> Path:
    return Path(table.location().removeprefix("file://"))


def files_on_disk(table: Table) -> set[Path]:
    return {p for p in table_dir(table).rglob("*") if p.is_file()}


def live_data_files(table: Table) -> list[str]:
    return [task.file.file_path for task in table.scan().plan_files()]


def age_everything(table: Table) -> None:
    for path in files_on_disk(table):
        os.utime(path, (TWO_HOURS_AGO, TWO_HOURS_AGO))


# --------------------------------------------------------------------------- compaction


def test_compaction_rewrites_small_files_keeping_rows_and_offset(catalog, partitioned):
    table = make_table(catalog, partitioned)
    feed(table, 30)
    parts = DAYS if partitioned else 1
    assert len(live_data_files(table)) == 30 * parts
    before = contents(table)

    result = compact(table, epoch=1)

    assert (result.files_removed, result.files_added, result.rows) == (30 * parts, parts, 360)
    assert len(live_data_files(table)) == parts
    assert contents(table) == before == expected_contents(range(30))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.snapshot_id == result.snapshot_id
    assert snapshot.summary is not None
    assert snapshot.summary.operation.value == "overwrite"
    assert snapshot.summary["icefloe.sequence"] == "29"
    assert snapshot.summary["icefloe.epoch"] == "1"
    state = committed_state(catalog.load_table("ns.events"))
    assert (state.sequence, state.epoch, state.snapshot_id) == (29, 1, result.snapshot_id)
    # Nothing left to do: a second pass commits nothing.
    assert compact(table, epoch=1).snapshot_id is None
    assert table.current_snapshot().snapshot_id == result.snapshot_id


def test_compaction_leaves_partitions_below_the_threshold(catalog):
    table = make_table(catalog)
    feed(table, 5)
    assert compact(table, epoch=1, min_input_files=8).snapshot_id is None
    assert compact(table, epoch=1, min_input_files=5).files_added == DAYS


def big_batch(n: int, rows: int) -> pa.Table:
    """``rows`` rows of manifest sequence ``n`` with incompressible payloads, one day."""
    ids = [n * 1_000_000 + i for i in range(rows)]
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "payload": pa.array([os.urandom(48).hex() for _ in ids]),
        "_received_at": pa.array([dt.datetime(2024, 5, 1, tzinfo=dt.UTC)] * rows, TS),
        "_sequence": pa.array([n] * rows, pa.int64()),
    })


def test_a_lightly_fed_partition_keeps_its_compacted_file(catalog):
    """A partition's compacted file is rewritten only once the small files beside it add
    up to half its size: fed a few small files a pass, it is left alone (the small ones
    merge among themselves, in tiers), where it used to be rewritten whole on every pass."""
    table = make_table(catalog, partitioned=False)
    sequence = 0
    for _ in range(8):
        table.append(big_batch(sequence, 2000), snapshot_properties={
            "icefloe.sequence": str(sequence), "icefloe.epoch": "1"})
        sequence += 1
    first = compact(table, epoch=1, min_input_files=4)
    assert (first.files_removed, first.files_added) == (8, 1)
    [big] = live_data_files(table)
    rewritten = 0
    for _ in range(12):
        for _ in range(4):
            table.append(big_batch(sequence, 20), snapshot_properties={
                "icefloe.sequence": str(sequence), "icefloe.epoch": "1"})
            sequence += 1
        result = compact(table, epoch=1, min_input_files=4)
        assert result.files_added <= 1
        rewritten += result.bytes_removed
        assert big in live_data_files(table)  # never part of a rewrite
        assert len(live_data_files(table)) <= 8  # tiers: a handful of files, not 49
    assert rewritten < first.bytes_added  # the old rule rewrote it 12 times: 12 x as much
    loaded = catalog.load_table("ns.events")
    ids = loaded.scan().to_arrow().column("id").to_pylist()
    assert sorted(ids) == sorted(n * 1_000_000 + i for n in range(sequence)
                                 for i in range(2000 if n < 8 else 20))
    assert committed_state(loaded).sequence == sequence - 1


def test_compaction_refuses_a_newer_epoch(catalog):
    table = make_table(catalog)
    feed(table, 10)
    append(table, 10, epoch=2)  # a newer collector took over
    snapshot_id = table.current_snapshot().snapshot_id
    disk = files_on_disk(table)

    with pytest.raises(TableFencedError) as info:
        compact(table, epoch=1)
    assert (info.value.our_epoch, info.value.table_epoch) == (1, 2)

    reloaded = catalog.load_table("ns.events")
    assert reloaded.current_snapshot().snapshot_id == snapshot_id
    assert files_on_disk(reloaded) == disk
    assert compact(reloaded, epoch=2).files_added == DAYS  # the new owner may compact


@pytest.mark.parametrize("retries", ["0", None], ids=["no-retries", "pyiceberg-default"])
def test_compaction_fails_cleanly_when_someone_committed_meanwhile(catalog, retries):
    # With pyiceberg's default retries the rebase is refused by serializable isolation.
    props = {k: v for k, v in PROPS.items() if retries or k != "commit.retry.num-retries"}
    make_table(catalog, properties=props)
    stale = catalog.load_table("ns.events")
    feed(stale, 6)
    other = catalog.load_table("ns.events")
    append(other, 6)  # lands after `stale` was last refreshed
    disk_before = files_on_disk(other)

    with pytest.raises((CommitFailedException, ValidationException)):
        compact(stale, epoch=1, min_input_files=4)

    fresh = catalog.load_table("ns.events")
    assert committed_state(fresh).sequence == 6
    assert contents(fresh) == expected_contents(range(7))  # nothing lost or duplicated
    assert files_on_disk(fresh) == disk_before  # the rewritten files were removed again

    result = compact(fresh, epoch=1, min_input_files=4)  # the retry after a reload succeeds
    assert result.files_removed == 7 * DAYS
    assert committed_state(fresh).sequence == 6
    assert contents(catalog.load_table("ns.events")) == expected_contents(range(7))


# --------------------------------------------------------------------------- expiry


def test_expiry_keeps_current_and_the_chain_to_the_sequence_snapshot(catalog):
    table = make_table(catalog)
    feed(table, 12)
    seq_snapshot = table.current_snapshot().snapshot_id
    table.append(batch(100))  # commits by another tool: no icefloe.sequence
    foreign = table.current_snapshot().snapshot_id
    table.append(batch(101))
    current = table.current_snapshot().snapshot_id
    future = int(time.time() * 1000) + 3_600_000

    assert expire_snapshots(table, keep_last=10, max_age_s=3600) == 0  # all too young
    assert expire_snapshots(table, keep_last=0, max_age_s=60, now_ms=future) == 11

    assert {s.snapshot_id for s in table.metadata.snapshots} == {seq_snapshot, foreign, current}
    for loaded in (table, catalog.load_table("ns.events")):
        state = committed_state(loaded)
        assert (state.sequence, state.snapshot_id) == (11, seq_snapshot)


def test_expiry_and_deletion_bound_the_files(catalog):
    table = make_table(catalog)
    feed(table, 20)
    old_snapshot = table.metadata.snapshots[0].snapshot_id
    old_files = {Path(p.removeprefix("file://")) for p in live_data_files(table)}
    before = table.metadata
    compact(table, epoch=1)
    assert expire_snapshots(table, keep_last=1, max_age_s=0) == 20

    result = delete_unreachable_files(table, older_than_s=3600, previous=before)

    disk = files_on_disk(table)
    data = [p for p in disk if p.suffix == ".parquet"]
    metadata_json = [p for p in disk if p.name.endswith(".metadata.json")]
    assert len(data) == DAYS
    assert len(metadata_json) == int(PROPS["write.metadata.previous-versions-max"]) + 1
    # one manifest list, the compaction's added manifest and its delete manifest
    assert len(disk) - len(data) - len(metadata_json) <= 3
    assert (result.kept_young, result.errors) == (0, 0)
    assert result.deleted >= 20 * DAYS
    assert not old_files & disk
    assert contents(catalog.load_table("ns.events")) == expected_contents(range(20))
    # Time travel to an expired snapshot is gone.
    assert table.snapshot_by_id(old_snapshot) is None
    with pytest.raises(ValueError, match="Snapshot not found"):
        table.scan(snapshot_id=old_snapshot).to_arrow()


# --------------------------------------------------------------------------- deletion


def test_orphans_are_deleted_only_when_old_and_referenced_files_never(catalog):
    table = make_table(catalog)
    feed(table, 10)  # 11 metadata versions: 6 of them fell out of the 5-entry metadata log
    referenced = files_on_disk(table)
    logged = {Path(e.metadata_file.removeprefix("file://")) for e in table.metadata.metadata_log}
    superseded = {p for p in referenced if p.name.endswith(".metadata.json")} - logged - {
        Path(table.metadata_location.removeprefix("file://"))}
    assert len(superseded) == 5
    referenced -= superseded
    age_everything(table)  # referenced files are old too: age alone must not doom them
    data_dir = table_dir(table) / "data"
    young = data_dir / "00000-0-crashed-commit-young.parquet"
    old = data_dir / "00000-0-crashed-commit-old.parquet"
    old_manifest = table_dir(table) / "metadata" / "snap-1-0-crashed.avro"
    for path in (young, old, old_manifest):
        path.write_bytes(b"not referenced")
    for path in (old, old_manifest):
        os.utime(path, (TWO_HOURS_AGO, TWO_HOURS_AGO))

    result = delete_unreachable_files(table, older_than_s=3600)

    disk = files_on_disk(table)
    assert young in disk
    assert not {old, old_manifest} & disk
    assert not superseded & disk  # superseded metadata.json go whatever their age
    assert referenced <= disk
    assert (result.deleted, result.kept_young, result.errors) == (7, 1, 0)
    assert contents(catalog.load_table("ns.events")) == expected_contents(range(10))


def test_the_sweep_reads_each_manifest_once_and_decides_the_same(catalog):
    """Manifest lists and manifests are immutable: a later sweep reads only what the commits
    since wrote, and finds the same referenced set as reading everything afresh."""
    from pipeline.iceberg import reachable as module

    table = make_table(catalog)
    feed(table, 6)
    module.referenced(table.metadata, table.metadata_location, table.io)
    lists, manifests = module.MANIFEST_LISTS.reads, module.MANIFESTS.reads
    module.referenced(table.metadata, table.metadata_location, table.io)
    assert (module.MANIFEST_LISTS.reads, module.MANIFESTS.reads) == (lists, manifests)
    append(table, 6)
    table.refresh()
    module.referenced(table.metadata, table.metadata_location, table.io)
    assert module.MANIFEST_LISTS.reads == lists + 1  # the new snapshot's list only
    new_manifests = module.MANIFESTS.reads - manifests
    assert 1 <= new_manifests < len(table.current_snapshot().manifests(table.io))
    cached = module.referenced(table.metadata, table.metadata_location, table.io)
    fresh_lists, fresh_manifests = module.ImmutableReads(), module.ImmutableReads()
    saved = module.MANIFEST_LISTS, module.MANIFESTS
    module.MANIFEST_LISTS, module.MANIFESTS = fresh_lists, fresh_manifests
    try:
        assert module.referenced(table.metadata, table.metadata_location, table.io) == cached
    finally:
        module.MANIFEST_LISTS, module.MANIFESTS = saved
    assert all(module.normalize(f) in cached for f in live_data_files(table))


def test_the_sweep_cache_stays_bounded() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from pipeline.iceberg.reachable import ImmutableReads

    kept: ImmutableReads[str] = ImmutableReads(max_paths=3)
    with ThreadPoolExecutor(2) as pool:
        for name in "abcde":
            assert kept.get_many([name], lambda path: (path * 2,), pool) == {name: (name * 2,)}
        assert kept.get_many(["e", "a"], lambda path: ("again",), pool) == {
            "e": ("ee",), "a": ("again",)}
    assert kept.reads == 6  # "a" fell out (least recently used) and was read again


def test_a_continuously_fed_table_stays_bounded(catalog):
    table = make_table(catalog)
    # keep_last=2: the append before each compaction stays, with the small files it names.
    settings = MaintenanceSettings(keep_last=2, max_snapshot_age_s=0, min_input_files=4)
    counts: list[int] = []
    for n in range(60):
        append(table, n)
        if n % 10 == 9:
            report = run_maintenance(table, epoch=1, settings=settings)
            assert report.compaction.files_added == DAYS
            counts.append(len(files_on_disk(table)))
    # Unmaintained: 180 data files, 120 manifests/lists, 61 metadata.json. Maintained: the
    # live files, one retained append's small files and a 6-entry metadata log, flat.
    assert max(counts) <= 60
    assert max(counts[1:]) - min(counts[1:]) <= 2
    assert len(live_data_files(table)) == DAYS
    loaded = catalog.load_table("ns.events")
    assert committed_state(loaded).sequence == 59
    assert contents(loaded) == expected_contents(range(60))
    with pytest.raises(TableFencedError):
        run_maintenance(table, epoch=0, settings=settings)


@pytest.mark.s3
def test_maintenance_on_s3(s3_bucket, tmp_path):
    import boto3

    catalog = SqlCatalog("s3test", **{
        "uri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": s3_bucket.url.rstrip("/"),
        "s3.endpoint": s3_bucket.endpoint_url, "s3.access-key-id": "testing",
        "s3.secret-access-key": "testing", "s3.region": "us-east-1"})
    catalog.create_namespace("ns")
    table = make_table(catalog, partitioned=False)
    feed(table, 6)
    orphan_key = table.location().split(f"{s3_bucket.bucket}/", 1)[1] + "/data/orphan.parquet"
    client = boto3.client("s3", endpoint_url=s3_bucket.endpoint_url, region_name="us-east-1")
    client.put_object(Bucket=s3_bucket.bucket, Key=orphan_key, Body=b"orphan")

    report = run_maintenance(table, epoch=1, settings=MaintenanceSettings(
        keep_last=1, max_snapshot_age_s=0, min_input_files=4, orphan_age_s=0))

    listing = client.list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]
    client.close()
    keys = [o["Key"] for o in listing if not o["Key"].endswith("/")]  # skip dir markers
    assert orphan_key not in keys
    assert (report.compaction.files_removed, report.expired_snapshots) == (6, 6)
    assert len([k for k in keys if k.endswith(".parquet")]) == 1
    # 6 metadata.json (current + 5 logged), 1 manifest list, at most 3 manifests
    assert len(keys) <= 11
    assert contents(catalog.load_table("ns.events")) == expected_contents(range(6))


# --------------------------------------------------------------------------- store clock


def append_at(table: Table, n: int, store: Clock) -> None:
    """An icefloe commit stamped with the store's time (``icefloe.committed-at``)."""
    table.append(batch(n), snapshot_properties=summary_props(n, 1, int(store.time() * 1000)))


def test_expiry_judges_age_by_the_recorded_store_time(catalog):
    """The committing host ran 10 h behind the store (its timestamp-ms look 10 h old):
    snapshots a minute old by the store's clock are kept, an hour later they expire."""
    table = make_table(catalog)
    store = ManualClock(time.time()).skewed(10 * 3600)
    for n in range(5):
        append_at(table, n, store)
    store.advance(60)
    now_ms = int(store.time() * 1000)
    assert expire_snapshots(table, keep_last=0, max_age_s=600, now_ms=now_ms) == 0
    store.advance(3600)
    assert expire_snapshots(table, keep_last=0, max_age_s=600, clock=store) == 4


def test_maintenance_on_a_host_hours_ahead_keeps_young_snapshots_and_files(catalog):
    """The collector's host clock runs 3 h ahead; maintenance judges by the store's clock
    (as the manifest reads it), so the commits and an in-flight file of a minute ago
    survive. Judged by the host's clock, both would go."""
    table = make_table(catalog)
    host = ManualClock(time.time()).skewed(3 * 3600)
    store = StoreClock(host)
    store.observe(time.time())  # the local store's time, as a manifest read returns it
    for n in range(5):
        append_at(table, n, store)
    in_flight = table_dir(table) / "data" / "00000-0-in-flight.parquet"
    in_flight.write_bytes(b"written by a commit not yet landed")
    host.advance(60)
    settings = MaintenanceSettings(keep_last=1, max_snapshot_age_s=600, min_input_files=100,
                                   orphan_age_s=3600)

    report = run_maintenance(table, epoch=1, settings=settings, clock=store)

    assert report.expired_snapshots == 0
    assert in_flight in files_on_disk(table)
    assert len(table.metadata.snapshots) == 5
    report = run_maintenance(table, epoch=1, settings=settings, clock=host)  # the bug
    assert report.expired_snapshots == 4
    assert in_flight not in files_on_disk(table)
    assert contents(catalog.load_table("ns.events")) == expected_contents(range(5))
