"""An ingestor on a sharded manifest: grows the store at start, appends to its shard,
exports it, and starts with the store's count (and a warning) when its config asks for
fewer shards than the store has."""

from __future__ import annotations

import msgspec
import pytest
from ingest_support import make_config, running
from prometheus_client import generate_latest

from icefloe.config import load_config
from icefloe.errors import ConfigError
from icefloe.manifest import load, read_shard_count, shard_key
from icefloe.store import open_async_store


def sharded(tmp_path, shards: int, **ingestor):
    config = make_config(tmp_path / "store", **ingestor)
    return msgspec.structs.replace(
        config, manifest=msgspec.structs.replace(config.manifest, shards=shards))


@pytest.mark.parametrize("helper", [True, False])
async def test_should_grow_the_store_and_append_to_its_shard(tmp_path, helper):
    config = sharded(tmp_path, 4, store_helper=helper)
    async with running(config) as runtime:
        stream = runtime.service.stream("pageviews")
        assert await runtime.service.ingest(
            stream, stream.from_json(b'[{"user_id":"a"},{"user_id":"b"}]')) == 2
        shard = runtime.publisher.shard
        assert shard is not None
        assert 0 <= shard < 4
        scraped = generate_latest(runtime.metrics.registry).decode()
        assert f"icefloe_ingest_manifest_shard {float(shard)}" in scraped
    store = open_async_store((tmp_path / "store").as_uri())
    try:
        assert await read_shard_count(store, config.manifest.key) == 4
        entries = (await load(store, shard_key(config.manifest.key, shard))).manifest.entries
        assert [e.record_count for e in entries] == [2]
        assert entries[0].location.startswith("batches/")
        assert entries[0].location.count("/") == 2  # batches/<xx>/<ULID>.ifb
    finally:
        await store.close()


async def test_should_start_with_the_stores_count_when_its_config_says_fewer(tmp_path,
                                                                            caplog):
    """Shards grown online, then an ingestor replaced with the old config: the store's
    count wins (it used to refuse to start, #36), the warning names both numbers, and
    nothing shrinks."""
    async with running(sharded(tmp_path, 4, store_helper=False)):
        pass
    old = sharded(tmp_path, 2, store_helper=False, shard_index=3)
    with caplog.at_level("WARNING", logger="icefloe.manifest"):
        async with running(old) as runtime:
            stream = runtime.service.stream("pageviews")
            assert await runtime.service.ingest(
                stream, stream.from_json(b'[{"user_id":"a"}]')) == 1
            assert runtime.publisher.shard == 3  # index 3 % the store's 4, not % 2
    [warning] = [r.getMessage() for r in caplog.records if "manifest.shards" in
                 r.getMessage()]
    assert "manifest.shards = 2 is below the store's shard count 4" in warning
    store = open_async_store((tmp_path / "store").as_uri())
    try:
        assert await read_shard_count(store, old.manifest.key) == 4
    finally:
        await store.close()


@pytest.mark.parametrize("helper", [True, False])
async def test_should_append_to_the_shard_its_index_names(tmp_path, helper):
    """``ingestor.shard_index`` picks shard ``index % shards`` (exact spread), with and
    without the store helper; read from the environment like any key."""
    config = load_config(None, env={
        "ICEFLOE_STORE_URL": (tmp_path / "store").as_uri(),
        "ICEFLOE_INGESTOR_SHARD_INDEX": "6", "ICEFLOE_MANIFEST_SHARDS": "4"})
    assert config.ingestor.shard_index == 6
    config = msgspec.structs.replace(config, streams=make_config(tmp_path).streams,
                                     ingestor=msgspec.structs.replace(
                                         make_config(tmp_path).ingestor, shard_index=6,
                                         store_helper=helper),
                                     store=make_config(tmp_path / "store").store)
    async with running(config) as runtime:
        stream = runtime.service.stream("pageviews")
        assert await runtime.service.ingest(stream, stream.from_json(b'[{"user_id":"a"}]')) \
            == 1
        assert runtime.publisher.shard == 2


def test_should_refuse_a_negative_shard_index_other_than_minus_one(tmp_path):
    with pytest.raises(ConfigError, match=r"ingestor\.shard_index must be >= 0"):
        load_config(None, env={"ICEFLOE_STORE_URL": (tmp_path / "s").as_uri(),
                               "ICEFLOE_INGESTOR_SHARD_INDEX": "-2"})
