"""The pipeline on real Spark: data source, columnar decode, dead letters, transient errors."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pyarrow as pa
import pytest
from collector_support import BUYS, CLICKS, buy, click, collector_config, publish_sync

from icefloe.errors import NotFound
from icefloe.formats.batch import BatchBuilder, Compression
from icefloe.manifest.consumer import ManifestConsumer
from icefloe.manifest.publish import build_batch
from icefloe.store import local_path, open_async_store
from pipeline.columns import columns_arrow_schema, dead_letter_arrow_schema, table_arrow_schema
from pipeline.load.run import run_local, run_spark
from pipeline.load.spec import RunSpec, group_refs, run_spec


def entries_of(config):
    async def go():
        store = open_async_store(config.store.url)
        try:
            consumer = ManifestConsumer(store)
            await consumer.initialize()
            return await consumer.read()
        finally:
            await store.close()
    return asyncio.run(go())


def write_raw_batch(config, data: bytes, streams=("clicks",), count=1) -> None:
    """Append a hand-made batch file (e.g. corrupt) through the real producer."""
    from icefloe.manifest import ManifestProducer
    from icefloe.manifest.publish import publish_batch

    async def go():
        store = open_async_store(config.store.url)
        producer = ManifestProducer(store)
        try:
            await publish_batch(store, producer, data, record_count=count, streams=streams)
        finally:
            await producer.close()
            await store.close()
    asyncio.run(go())


def sorted_rows(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: r["_event_id"])


@pytest.fixture
def config(tmp_path: Path):
    return collector_config(tmp_path)


SPARK_PATHS = pytest.mark.parametrize("packed", [True, False], ids=["packed", "rows"])


@SPARK_PATHS
def test_spark_and_local_decode_every_type_identically(spark, config, packed):
    publish_sync(config, [[click(i) for i in range(0, 300)] + [buy(i) for i in range(40)],
                          [click(i) for i in range(300, 500)],
                          [buy(i) for i in range(40, 60)]])
    spec = run_spec(config, entries_of(config), partitions=2)
    local = run_local(spec)
    remote = run_spark(spark, spec, packed=packed)
    for stream in (CLICKS, BUYS):
        assert remote.tables[stream.name].schema.equals(table_arrow_schema(stream))
        assert sorted_rows(remote.tables[stream.name]) == sorted_rows(local.tables[stream.name])
    clicks = sorted_rows(remote.tables["clicks"])
    assert len(clicks) == 500
    assert {r["_sequence"] for r in clicks} == {0, 1}
    first = next(r for r in clicks if r["_event_id"] == "c7")
    assert first["n"] == 7
    assert first["url"] == "/p/7"
    assert first["ts"].isoformat() == "2026-11-23T10:00:00.123456+00:00"
    buys = {r["_event_id"]: r for r in remote.tables["buys"].to_pylist()}
    assert len(buys) == 60
    assert buys["b3"]["amount"] == 4.5
    assert buys["b3"]["qty"] == 3
    assert buys["b3"]["paid"] is False
    assert str(buys["b3"]["day"]) == "2026-11-23"
    assert buys["b3"]["meta"] == '{"k":[1,2]}'
    assert buys["b3"]["ratio"] == 0.5
    assert remote.dead.num_rows == 0


@SPARK_PATHS
def test_bad_records_become_dead_letters_and_the_rest_lands(spark, config, packed):
    builder = BatchBuilder()
    data, _, _ = build_batch([click(1), ("ghosts", "g1", 5, b'{"x":1}'), click(2)])
    from icefloe.formats.batch import decode_batch

    for record in decode_batch(data):
        builder.add(record)
    builder.add(b"\x07not an envelope")  # malformed envelope
    write_raw_batch(config, builder.finish(Compression.ZSTD), count=4)
    write_raw_batch(config, b"this is not a batch file at all")  # corrupt: bad footer
    publish_sync(config, [[click(3)]])
    spec = run_spec(config, entries_of(config))
    for out in (run_local(spec), run_spark(spark, spec, packed=packed)):
        assert sorted(out.tables["clicks"].column("_event_id").to_pylist()) == ["c1", "c2", "c3"]
        assert out.dead.schema.equals(dead_letter_arrow_schema())
        dead = sorted(out.dead.to_pylist(), key=lambda r: r["reason"])
        reasons = [r["reason"] for r in dead]
        assert reasons[0].startswith("bad_envelope:")
        assert reasons[1].startswith("corrupt_batch:")
        assert reasons[2] == "unknown_stream"
        corrupt = dead[1]
        assert corrupt["raw"] is None  # a corrupt file is named, not copied
        assert corrupt["location"].startswith("batches/")
        assert corrupt["sequence"] == 1
        assert dead[2]["raw"] == b'{"x":1}'
        assert dead[2]["event_id"] == "g1"


def test_only_rows_that_do_not_match_the_schema_are_dead_lettered(config):
    good = click(1)
    bad = ("clicks", "bad1", 7, b'{"user_id":"u","n":"not a number"}')
    publish_sync(config, [[good, bad, click(2)]])
    out = run_local(run_spec(config, entries_of(config)))
    assert sorted(out.tables["clicks"].column("_event_id").to_pylist()) == ["c1", "c2"]
    [dead] = out.dead.to_pylist()
    assert dead["reason"] == "payload_mismatch"
    assert dead["event_id"] == "bad1"
    assert dead["raw"] == bad[3]
    assert dead["record_index"] == 1


def test_a_checksum_mismatch_that_persists_is_one_dead_letter(config):
    publish_sync(config, [[click(1)]])
    [entry] = entries_of(config)
    path = Path(local_path(config.store.url)) / entry.location
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))
    out = run_local(run_spec(config, [entry]))
    assert not out.tables
    [dead] = out.dead.to_pylist()
    assert dead["reason"] == "corrupt_batch:integrity"
    assert "CRC32C" in dead["message"]
    # The acknowledged events stay recoverable after GC deletes the batch file.
    quarantined = Path(local_path(config.store.url)) / "quarantine" / entry.location
    assert quarantined.read_bytes() == bytes(raw)
    assert f"quarantine/{entry.location}" in dead["message"]


@SPARK_PATHS
def test_a_missing_batch_file_fails_the_run_instead_of_skipping(spark, config, packed):
    publish_sync(config, [[click(1)]])
    [entry] = entries_of(config)
    os.remove(Path(local_path(config.store.url)) / entry.location)
    spec = run_spec(config, [entry])
    with pytest.raises(NotFound):
        run_local(spec)
    with pytest.raises(Exception, match=r"NotFound|not found|No such"):
        run_spark(spark, spec, packed=packed)


def test_files_are_grouped_into_balanced_partitions():
    spec = RunSpec("file:///x", None, None, (), tuple(
        (i, f"batches/{i}", size, 0) for i, size in enumerate([900, 100, 100, 500, 400, 50])))
    groups = group_refs(spec.refs(), 3)
    assert len(groups) == 3
    sizes = sorted(sum(r.size for r in g) for g in groups)
    assert sizes[-1] == 900  # the big file alone
    assert sum(sizes) == 2050
    assert all(g == sorted(g, key=lambda r: r.sequence) for g in groups)
    assert len(group_refs(spec.refs(), 10)) == 6


def test_packed_values_round_trip_in_slices_with_dead_letters(monkeypatch):
    """pack/unpack without Spark: a table wider than one packed value comes back whole and
    in order, dead letters separately, and a file with nothing to pack yields nothing."""
    from pipeline.load import packed
    from pipeline.load.decode import Decoded
    from pipeline.load.spec import EntryFile, StreamSpec

    monkeypatch.setattr(packed, "MAX_PART_ROWS", 3)
    streams = (StreamSpec("buys", (("n", "long"),)), StreamSpec("clicks", (("n", "long"),)))
    table = pa.Table.from_pydict({
        "n": list(range(10)), "_event_id": [f"e{i}" for i in range(10)],
        "_received_at": [i * 1000 for i in range(10)], "_sequence": [7] * 10},
        schema=columns_arrow_schema(streams[0].columns))
    first = Decoded(tables={"clicks": table})
    first.dead.add(EntryFile(4, "batches/k", 10, 0), reason="unknown_stream", message="m")
    second = Decoded(tables={"buys": table.slice(0, 2), "clicks": table.slice(0, 0)})
    batches = list(packed.pack([first, second, Decoded()]))
    assert [b.num_rows for b in batches] == [5, 1]  # 4 slices + dead letters; empty skipped
    spec = RunSpec("file:///x", None, None, streams, ())
    tables, dead = packed.unpack(pa.Table.from_batches(batches), spec)
    assert list(tables) == ["buys", "clicks"]  # the spec's order, not first appearance
    assert tables["clicks"].to_pylist() == table.to_pylist()
    assert tables["buys"].to_pylist() == table.slice(0, 2).to_pylist()
    assert dead.schema.equals(dead_letter_arrow_schema())
    assert dead.column("reason").to_pylist() == ["unknown_stream"]


def test_packed_and_row_paths_agree_row_for_row(spark, config, monkeypatch):
    """Same tables in the spec's stream order, same rows in the same order, same dead
    letters: the collector's dedup keeps the first of repeated ids, so order matters. The
    run takes the packed path by itself (no sql columns)."""
    import pipeline.load.run as run_module

    unpacked: list[int] = []
    unpack = run_module.unpack

    def counting_unpack(*args, **kwargs):  # a spy: records the call, changes nothing
        unpacked.append(1)
        return unpack(*args, **kwargs)

    monkeypatch.setattr(run_module, "unpack", counting_unpack)
    publish_sync(config, [[buy(i) for i in range(5)] + [click(i) for i in range(50)],
                          [click(i) for i in range(50, 90)] + [click(5)],  # a repeated id
                          [buy(i) for i in range(5, 9)]])
    write_raw_batch(config, b"this is not a batch file at all")
    publish_sync(config, [[click(i) for i in range(90, 120)]])
    spec = run_spec(config, entries_of(config), partitions=2)
    auto = run_spark(spark, spec)
    assert unpacked == [1]
    rows = run_spark(spark, spec, packed=False)
    assert unpacked == [1]
    local = run_local(spec)
    assert list(auto.tables) == list(rows.tables) == list(local.tables) == ["clicks", "buys"]
    for name in ("clicks", "buys"):
        assert auto.tables[name].schema.equals(rows.tables[name].schema)
        assert auto.tables[name].to_pylist() == rows.tables[name].to_pylist()
    assert auto.tables["clicks"].num_rows == 121
    assert auto.dead.to_pylist() == rows.dead.to_pylist()
    [dead] = auto.dead.to_pylist()
    assert dead["reason"].startswith("corrupt_batch:")


def test_a_run_of_files_without_records_yields_nothing_on_either_path(spark, config):
    write_raw_batch(config, BatchBuilder().finish(Compression.ZSTD), count=0)
    spec = run_spec(config, entries_of(config))
    for packed in (True, False):
        out = run_spark(spark, spec, packed=packed)
        assert out.tables == {}
        assert out.dead.num_rows == 0
        assert out.dead.schema.equals(dead_letter_arrow_schema())


def test_large_runs_are_spread_so_no_packed_partition_nears_2_gib():
    from pipeline.load.packed import PARTITION_BYTES, packed_partitions

    small = RunSpec("file:///x", None, None, (), ((0, "a", 1000, 0),), partitions=4)
    assert packed_partitions(small) == 4
    big = RunSpec("file:///x", None, None, (), tuple(
        (i, f"b{i}", PARTITION_BYTES // 2 + 1, 0) for i in range(20)), partitions=4)
    assert packed_partitions(big) == 11
    assert max(sum(r.size for r in g) for g in group_refs(
        big.refs(), packed_partitions(big))) <= 2 * PARTITION_BYTES


def test_a_packed_table_with_undeclared_types_is_refused_not_cast():
    from pipeline.load.packed import PACKED_ARROW_SCHEMA, _ipc, unpack
    from pipeline.load.spec import stream_specs

    spec = RunSpec("file:///x", None, None, stream_specs([CLICKS]), ())
    wrong = pa.table({"user_id": ["u"], "n": ["not a long"]})
    packed = pa.table({"_stream": ["clicks"], "_part": [_ipc(wrong)]},
                      schema=PACKED_ARROW_SCHEMA)
    with pytest.raises(ValueError, match="do not match the declared"):
        unpack(packed, spec)
