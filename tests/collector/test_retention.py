"""Retention (``[collector] keep_batches_s``): the index the collector writes before it
acks, GC keeping what the index promises and deleting it after, compaction, restarts.
No Spark: the in-process LocalEngine runs the pipeline."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from collector_support import CLICKS, click, collector_config, drain, open_store_of, start

from collector.gc import collect_garbage
from icefloe.config import load_config
from icefloe.errors import ConfigError, NotFound
from icefloe.manifest.model import Entry
from icefloe.retention import (
    COMPACT_MIN_SEGMENTS,
    INDEX_PREFIX,
    compact,
    read_index,
    record_run,
)
from icefloe.store import open_async_store
from icefloe.store.base import GetResult
from pipeline.load.run import LocalEngine

KEEP = 3600.0


def config_of(tmp_path: Any, keep: float = KEEP) -> Any:
    return collector_config(tmp_path, (CLICKS,), keep_batches_s=keep)


async def commit_batches(config: Any, batches: int, first: int = 0, *,
                         takeover: bool = True) -> None:
    """Publish ``batches`` files of 5 clicks, commit and dequeue them (one collector)."""
    from collector_support import publish

    store = open_store_of(config)
    try:
        await publish(store, [[click(first + b * 5 + i) for i in range(5)]
                              for b in range(batches)])
    finally:
        await store.close()
    collector = await start(config, LocalEngine(), takeover=takeover)
    try:
        await drain(collector)
        await collector.dequeue()
    finally:
        await collector.store.close()


async def batch_keys(config: Any) -> list[str]:
    store = open_store_of(config)
    try:
        return [o.key for o in (await store.list("batches/")).objects]
    finally:
        await store.close()


async def gc(config: Any, keep_s: float) -> Any:
    store = open_store_of(config)
    try:
        return await collect_garbage(store, config.manifest.key, grace_s=0.0, keep_s=keep_s)
    finally:
        await store.close()


async def index_of(config: Any) -> Any:
    store = open_store_of(config)
    try:
        return await read_index(store)
    finally:
        await store.close()


def test_retention_keeps_committed_files_that_gc_would_delete(tmp_path):
    config = config_of(tmp_path)

    async def go() -> None:
        await commit_batches(config, 3)
        kept = await gc(config, KEEP)
        assert (kept.deleted, kept.retained) == (0, 3)
        assert len(await batch_keys(config)) == 3
        index = await index_of(config)
        assert sorted(index.entries[0]) == [0, 1, 2]
        assert {e.entry.location for e in index.entries[0].values()} == \
            set(await batch_keys(config))
        # without retention the same files go at once (grace 0): what retention changed
        off = await gc(config, 0.0)
        assert off.deleted == 3
    asyncio.run(go())


def test_gc_deletes_files_and_their_index_entries_after_retention(tmp_path):
    config = config_of(tmp_path)

    async def go() -> None:
        await commit_batches(config, 3)
        expired = await gc(config, 1e-6)  # everything was committed longer ago than that
        assert (expired.deleted, expired.retained) == (3, 0)
        assert await batch_keys(config) == []
        index = await index_of(config)
        assert not any(index.entries.values())
        store = open_store_of(config)
        try:
            assert (await store.list(INDEX_PREFIX)).objects == []
        finally:
            await store.close()
    asyncio.run(go())


def test_the_index_survives_restart_and_takeover(tmp_path):
    config = config_of(tmp_path)

    async def go() -> None:
        await commit_batches(config, 2)
        await commit_batches(config, 2, first=100)  # a second collector takes over
        index = await index_of(config)
        assert sorted(index.entries[0]) == [0, 1, 2, 3]
        kept = await gc(config, KEEP)
        assert (kept.deleted, kept.retained) == (0, 4)
    asyncio.run(go())


def entry(seq: int) -> Entry:
    return Entry(sequence=seq, location=f"batches/{seq:04d}.ifb", size=10, crc32c=0,
                 record_count=1, streams=("clicks",), ingested_at=1000.0 + seq,
                 producer_id="p", producer_batch=seq + 1)


def test_compaction_merges_small_segments_and_drops_expired_entries(tmp_path):
    async def go() -> None:
        store = open_async_store((tmp_path / "s").as_uri())
        try:
            for seq in range(COMPACT_MIN_SEGMENTS + 4):
                await record_run(store, [(0, entry(seq))], committed_at=100.0 + seq)
            before = await read_index(store)
            # at t=110 with keep 5: entries committed before 105 are expired
            await compact(store, before, now=110.0, keep_s=5.0)
            after = await read_index(store)
            assert sorted(after.entries[0]) == list(range(5, COMPACT_MIN_SEGMENTS + 4))
            assert len(after.segments[0]) == 1
        finally:
            await store.close()
    asyncio.run(go())


class VanishingOnce:
    """A store whose first GET of an index segment answers NotFound, as when a compaction
    deleted it between a reader's LIST and GET (fault at the store boundary)."""

    def __init__(self, store: Any) -> None:
        self.store, self.failed = store, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def get(self, key: str) -> GetResult:
        if key.startswith(INDEX_PREFIX) and not self.failed:
            self.failed = True
            raise NotFound(key)
        return await self.store.get(key)


def test_a_reader_lists_again_when_a_segment_vanished(tmp_path):
    async def go() -> None:
        store = open_async_store((tmp_path / "s").as_uri())
        try:
            await record_run(store, [(0, entry(0)), (0, entry(1))], committed_at=1.0)
            faulty = VanishingOnce(store)
            index = await read_index(faulty)  # type: ignore[arg-type]
            assert faulty.failed
            assert sorted(index.entries[0]) == [0, 1]
        finally:
            await store.close()
    asyncio.run(go())


def test_a_bad_keep_batches_s_is_refused_by_name(tmp_path):
    path = tmp_path / "icefloe.toml"
    path.write_text("[collector]\nkeep_batches_s = -1\n")
    with pytest.raises(ConfigError, match=r"collector.keep_batches_s"):
        load_config(path)


def test_retention_off_writes_no_index(tmp_path):
    config = config_of(tmp_path, keep=0.0)

    async def go() -> None:
        await commit_batches(config, 2)
        assert not (await index_of(config)).entries
    asyncio.run(go())


def test_indexed_entries_equal_the_manifest_entries(tmp_path):
    config = config_of(tmp_path)

    async def go() -> None:
        await commit_batches(config, 1)
        index = await index_of(config)
        item = index.entries[0][0]
        assert msgspec.to_builtins(item.entry)["location"].startswith("batches/")
        assert item.entry.record_count == 5
    asyncio.run(go())


class CountingGets:
    """Counts the GETs of index segments (a cache must spare the ones already read)."""

    def __init__(self, store: Any) -> None:
        self.store, self.gets = store, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def get(self, key: str) -> GetResult:
        if key.startswith(INDEX_PREFIX):
            self.gets += 1
        return await self.store.get(key)


def test_a_reader_with_a_cache_fetches_only_new_segments(tmp_path):
    async def go() -> None:
        store = open_async_store((tmp_path / "s").as_uri())
        try:
            counting = CountingGets(store)
            cache: dict[str, Any] = {}
            await record_run(store, [(0, entry(0))], committed_at=1.0)
            await record_run(store, [(0, entry(1))], committed_at=2.0)
            await read_index(counting, cache)  # type: ignore[arg-type]
            await record_run(store, [(0, entry(2))], committed_at=3.0)
            index = await read_index(counting, cache)  # type: ignore[arg-type]
            assert sorted(index.entries[0]) == [0, 1, 2]
            assert counting.gets == 3  # two, then only the new one
            await compact(store, index, now=10.0, keep_s=7.5)  # drops 0 and 1
            index = await read_index(counting, cache)  # type: ignore[arg-type]
            assert sorted(index.entries[0]) == [2]
            assert len(cache) == len(index.segments[0])  # deleted keys left the cache
        finally:
            await store.close()
    asyncio.run(go())
