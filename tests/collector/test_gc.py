"""Batch-file GC: what is kept, what is deleted, and safety under races and crashes.

Ages on the local store are set with ``os.utime`` (its ``last_modified`` is the file mtime
and its store clock is the local clock). moto reports ``Last-Modified`` and ``Date`` in whole
seconds, so the S3 tests wait a little over two seconds and use a one-second grace.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from _workers import store_options

from collector.gc import GcResult, collect_garbage
from icefloe.errors import ManifestCorruptError, TransientStoreError
from icefloe.manifest import BatchRef, ManifestConfig, ManifestConsumer, ManifestProducer, load
from icefloe.store import AsyncObjectStore, ListResult, ObjectInfo, open_async_store
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.base import GetResult, IfNoneMatch, PutResult
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy

KEY = ManifestConfig().key
GRACE = 600.0
OLD = 3600.0
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay_s=0.001, max_delay_s=0.01, budget_s=5)


class Crash(Exception):
    """Raised by a hook to simulate the collector dying at that point."""


def crash_at(stage: str, nth: int = 1) -> tuple[list[str], object]:
    """A hook that records stages and raises :class:`Crash` on the ``nth`` ``stage``."""
    seen: list[str] = []

    def hook(current: str) -> None:
        seen.append(current)
        if current == stage and seen.count(stage) == nth:
            raise Crash(f"{stage} #{nth}")

    return seen, hook


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[tuple[AsyncObjectStore, Path]]:
    root = tmp_path / "store"
    store = open_async_store(root.as_uri())
    yield store, root
    await store.close()


async def put_batch(store: AsyncObjectStore, name: str, size: int = 100) -> str:
    key = f"batches/{name}.ifb"
    await store.put(key, b"x" * size)
    return key


def age(root: Path, key: str, seconds: float = OLD) -> None:
    """Make ``key`` look ``seconds`` old to the local store (its mtime is last_modified)."""
    stamp = time.time() - seconds
    os.utime(root / key, (stamp, stamp))


async def append(store: AsyncObjectStore, *keys: str, config: ManifestConfig | None = None
                 ) -> list[int | None]:
    """Append ``keys`` as entries through the real producer."""
    producer = ManifestProducer(store, config)
    return [await producer.append(BatchRef(key, 100, 7, 10, ("s",), time.time()))
            for key in keys]


async def keys(store: AsyncObjectStore, prefix: str = "") -> set[str]:
    return {info.key for info in (await store.list(prefix)).objects}


# --- what is kept and what is deleted ------------------------------------------------------

async def test_should_delete_only_old_files_no_entry_references(local, caplog):
    store, root = local
    pinned, acked, dequeued, orphan, young = [
        await put_batch(store, name, size=100 + i)
        for i, name in enumerate(["pinned", "acked", "dequeued", "orphan", "young"])]
    seqs = await append(store, dequeued, acked, pinned)
    consumer = ManifestConsumer(store)
    await consumer.initialize()
    await consumer.ack(seqs[0], dequeue=True)  # committed and dequeued: releases its file
    await consumer.ack(seqs[1])  # acked but still queued: still pins its file
    for key in (pinned, acked, dequeued, orphan):
        age(root, key)
    age(root, young, GRACE / 2)

    with caplog.at_level(logging.INFO, logger="icefloe.gc"):
        result = await collect_garbage(store, KEY, grace_s=GRACE)

    assert result == GcResult(listed=5, referenced=2, young=1, deleted=2,
                              bytes_deleted=102 + 103, seconds=result.seconds)
    assert await keys(store) == {KEY, pinned, acked, young}
    [line] = [r for r in caplog.records if r.name == "icefloe.gc"]
    assert (line.listed, line.referenced, line.young, line.deleted, line.deferred) == \
        (5, 2, 1, 2, 0)
    assert line.manifest_key == KEY


async def test_should_never_touch_keys_outside_the_batch_files(tmp_path):
    root = tmp_path / "store"
    # The manifest itself lives under the prefix with the batch suffix: still never a batch.
    config = ManifestConfig(key="batches/queue.ifb")
    store = open_async_store(root.as_uri())
    others = ["other/x.ifb", "batches/notes.txt", "batches-archive/y.ifb", "warehouse/t/d.parquet"]
    for key in others:
        await store.put(key, b"keep")
    orphan = await put_batch(store, "orphan")
    await append(store, await put_batch(store, "pinned"), config=config)
    for key in [*others, orphan, config.key]:
        age(root, key)

    result = await collect_garbage(store, config.key, grace_s=GRACE)

    assert (result.listed, result.referenced, result.deleted) == (2, 1, 1)
    assert await keys(store) == {*others, config.key, "batches/pinned.ifb"}
    for bad in ("", "batches"):  # the whole store; a prefix that also matches batches-archive/
        with pytest.raises(ValueError, match="prefix"):
            await collect_garbage(store, config.key, grace_s=GRACE, prefix=bad)
    with pytest.raises(ValueError, match="grace_s"):
        await collect_garbage(store, config.key, grace_s=-1)
    await store.close()


async def test_should_delete_nothing_without_a_readable_manifest(local):
    """A missing manifest most likely means a wrong key; a corrupt one cannot be trusted."""
    store, root = local
    orphan = await put_batch(store, "orphan")
    age(root, orphan)

    result = await collect_garbage(store, KEY, grace_s=GRACE)
    assert (result.listed, result.deleted) == (1, 0)

    await store.put(KEY, b"not a manifest at all, not even a footer")
    with pytest.raises(ManifestCorruptError):
        await collect_garbage(store, KEY, grace_s=GRACE)
    assert await keys(store, "batches/") == {orphan}


class SkewedStore(AsyncObjectStore):
    """A local store whose clock runs ``skew_s`` off the local clock (all its times shift)."""

    def __init__(self, inner: AsyncObjectStore, skew_s: float) -> None:
        self.inner, self.skew_s, self.url = inner, skew_s, inner.url

    async def get(self, key: str) -> GetResult:
        got = await self.inner.get(key)
        return GetResult(got.data, got.etag, got.last_modified + self.skew_s,
                         got.store_time + self.skew_s)

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        put = await self.inner.put(key, data, if_match=if_match, if_none_match=if_none_match)
        return PutResult(put.etag, put.store_time + self.skew_s)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str = "") -> ListResult:
        listed = await self.inner.list(prefix)
        return ListResult([ObjectInfo(o.key, o.size, o.last_modified + self.skew_s, o.etag)
                           for o in listed.objects], listed.store_time + self.skew_s)

    async def head(self, key: str) -> ObjectInfo:
        raise NotImplementedError


@pytest.mark.parametrize("skew_s", [-10 * OLD, 10 * OLD])
async def test_should_age_files_on_the_store_clock_not_the_local_one(local, skew_s):
    inner, root = local
    store = SkewedStore(inner, skew_s)
    old, young = await put_batch(store, "old"), await put_batch(store, "young")
    await append(store, await put_batch(store, "pinned"))
    age(root, old)
    age(root, young, GRACE / 2)

    result = await collect_garbage(store, KEY, grace_s=GRACE)

    assert (result.young, result.deleted) == (1, 1)
    assert await keys(store, "batches/") == {young, "batches/pinned.ifb"}


# --- races -----------------------------------------------------------------------------

async def test_should_keep_a_file_appended_between_listing_and_manifest_read(local):
    store, root = local
    late_append, orphan = await put_batch(store, "late-append"), await put_batch(store, "orphan")
    await append(store, await put_batch(store, "pinned"))
    for key in (late_append, orphan):
        age(root, key)
    written_after_listing = "batches/written-after-listing.ifb"

    async def hook(stage: str) -> None:
        if stage == "listed":  # a producer acts right after GC listed
            await append(store, late_append)
            await store.put(written_after_listing, b"new")
            age(root, written_after_listing)  # even an "old" one: it is not in the listing

    result = await collect_garbage(store, KEY, grace_s=GRACE, hook=hook)

    assert (result.listed, result.referenced, result.deleted) == (3, 2, 1)
    assert await keys(store, "batches/") == {late_append, written_after_listing,
                                             "batches/pinned.ifb"}


# --- crashes and re-runs -------------------------------------------------------------------

async def setup_mixed(store: AsyncObjectStore, root: Path) -> tuple[set[str], set[str]]:
    """Six old orphans, two pinned old files, one young orphan: (garbage, survivors)."""
    garbage = {await put_batch(store, f"orphan-{i}") for i in range(6)}
    pinned = {await put_batch(store, f"pinned-{i}") for i in range(2)}
    await append(store, *sorted(pinned))
    young = await put_batch(store, "young")
    for key in garbage | pinned:
        age(root, key)
    return garbage, {*pinned, young, KEY}


@pytest.mark.parametrize(("stage", "nth", "concurrency", "left"), [
    ("listed", 1, 8, 6),
    ("loaded", 1, 8, 6),
    ("before_delete", 1, 1, 6),
    ("before_delete", 4, 1, 3),  # mid-deletion: exactly three done
    ("after_delete", 2, 1, 4),
    ("before_delete", 3, 8, None),  # parallel deletes in flight: any prefix may be done
])
async def test_should_finish_correctly_when_rerun_after_a_crash(local, stage, nth,
                                                                concurrency, left):
    store, root = local
    garbage, survivors = await setup_mixed(store, root)
    _, hook = crash_at(stage, nth)

    with pytest.raises(Crash):
        await collect_garbage(store, KEY, grace_s=GRACE, hook=hook, concurrency=concurrency)

    after_crash = await keys(store)
    assert survivors <= after_crash  # nothing pinned or young was lost at any point
    if left is not None:
        assert len(after_crash & garbage) == left
    result = await collect_garbage(store, KEY, grace_s=GRACE)
    assert await keys(store) == survivors
    assert result.deleted == len(after_crash & garbage)
    again = await collect_garbage(store, KEY, grace_s=GRACE)  # idempotent
    assert again.deleted == 0


async def test_should_call_hooks_in_order(local):
    store, root = local
    for name in ("a", "b"):
        age(root, await put_batch(store, name))
    await append(store, await put_batch(store, "pinned"))
    seen, hook = crash_at("never")

    await collect_garbage(store, KEY, grace_s=GRACE, hook=hook, concurrency=1)

    assert seen == ["listed", "loaded", "before_delete", "after_delete", "before_delete",
                    "after_delete"]


async def test_should_survive_lost_responses_and_failing_deletes(tmp_path):
    root = tmp_path / "store"
    faulty = FaultyAsyncStore(ThreadedAsyncStore(LocalStore(root)), seed=3)
    store = RetryingAsyncStore(faulty, FAST_RETRY)
    _, survivors = await setup_mixed(store, root)
    # A delete applied whose answer was lost is retried: deleting a missing key succeeds.
    faulty.add(FaultRule("lose_response", ops=frozenset({"delete"}), times=2))
    result = await collect_garbage(store, KEY, grace_s=GRACE, max_deletes=3, concurrency=1)
    assert result.deleted == 3
    assert faulty.injected["lose_response"] == 2
    # A store that keeps failing deletes stops the run; nothing else is harmed.
    faulty.add(FaultRule("fail", ops=frozenset({"delete"}), times=None))
    with pytest.raises(TransientStoreError):
        await collect_garbage(store, KEY, grace_s=GRACE)
    faulty.rules.clear()
    await collect_garbage(store, KEY, grace_s=GRACE)
    assert await keys(store) == survivors


# --- bounds ----------------------------------------------------------------------------

async def test_should_delete_at_most_max_deletes_oldest_first(local):
    store, root = local
    await append(store, await put_batch(store, "pinned"))
    names = [await put_batch(store, f"orphan-{i}") for i in range(5)]
    for i, key in enumerate(names):
        age(root, key, OLD + 100 * (5 - i))  # orphan-0 is the oldest

    first = await collect_garbage(store, KEY, grace_s=GRACE, max_deletes=2)
    assert (first.deleted, first.deferred) == (2, 3)
    assert await keys(store, "batches/") == {"batches/pinned.ifb", *names[2:]}
    none = await collect_garbage(store, KEY, grace_s=GRACE, max_deletes=0)
    assert (none.deleted, none.deferred) == (0, 3)
    rest = await collect_garbage(store, KEY, grace_s=GRACE)
    assert (rest.deleted, rest.deferred) == (3, 0)
    assert await keys(store, "batches/") == {"batches/pinned.ifb"}


# --- S3 (moto server) ----------------------------------------------------------------------

@pytest.fixture
async def s3_store(s3_bucket) -> AsyncIterator[AsyncObjectStore]:
    store = open_async_store(s3_bucket.url, store_options(s3_bucket.endpoint_url))
    yield store
    await store.close()


S3_GRACE = 1.0  # moto's clock and Last-Modified have one-second resolution
S3_WAIT = 2.1  # so files written before this wait are at least two seconds old


@pytest.mark.s3
async def test_should_collect_garbage_on_s3(s3_store):
    store = s3_store
    others = ["other/x.ifb", "batches/notes.txt"]
    for key in others:
        await store.put(key, b"keep")
    acked, dequeued, orphan, late_append = [
        await put_batch(store, name) for name in ("acked", "dequeued", "orphan", "late")]
    seqs = await append(store, dequeued, acked, await put_batch(store, "pinned"))
    consumer = ManifestConsumer(store)
    await consumer.initialize()
    await consumer.ack(seqs[0], dequeue=True)
    await consumer.ack(seqs[1])
    await asyncio.sleep(S3_WAIT)
    young = await put_batch(store, "young")

    async def hook(stage: str) -> None:
        if stage == "listed":
            await append(store, late_append)
            await store.put("batches/written-after-listing.ifb", b"new")

    result = await collect_garbage(store, KEY, grace_s=S3_GRACE, hook=hook)

    assert (result.listed, result.referenced, result.young, result.deleted) == (6, 3, 1, 2)
    assert result.bytes_deleted == 200
    assert await keys(store) == {*others, KEY, acked, late_append, young, "batches/pinned.ifb",
                                 "batches/written-after-listing.ifb"}
    assert orphan not in await keys(store)
    assert (await load(store, KEY)).manifest.entry_count == 3  # GC never writes the manifest


@pytest.mark.s3
async def test_should_rerun_after_a_crash_on_s3(s3_store):
    store = s3_store
    garbage = {await put_batch(store, f"orphan-{i}") for i in range(4)}
    pinned = await put_batch(store, "pinned")
    await append(store, pinned)
    await asyncio.sleep(S3_WAIT)
    _, hook = crash_at("before_delete", 3)

    with pytest.raises(Crash):
        await collect_garbage(store, KEY, grace_s=S3_GRACE, hook=hook, concurrency=1)
    assert len(await keys(store, "batches/") & garbage) == 2
    bounded = await collect_garbage(store, KEY, grace_s=S3_GRACE, max_deletes=1)
    assert (bounded.deleted, bounded.deferred) == (1, 1)
    await collect_garbage(store, KEY, grace_s=S3_GRACE)
    assert await keys(store) == {KEY, pinned}


async def test_should_keep_files_pinned_by_any_shard_and_take_both_key_layouts(local):
    """Entries on every shard pin their files; old keys (``batches/<ULID>.ifb``) and
    spread ones (``batches/xx/<ULID>.ifb``) are both found and collected."""
    from icefloe.manifest import ShardedProducer, grow_shards, shard_key
    from icefloe.manifest.publish import new_batch_key

    store, root = local
    config = ManifestConfig(shards=3)
    await grow_shards(store, KEY, 3, backoff=FAST_RETRY)
    pinned, garbage = set(), set()
    for shard in range(3):
        producer = ShardedProducer(store, config, shard=shard)
        for kind in ("old", "new"):
            for bucket in (pinned, garbage):
                key = new_batch_key() if kind == "new" else f"batches/{kind}-{shard}-" \
                    f"{len(bucket)}-{id(bucket)}.ifb"
                await store.put(key, b"x" * 100)
                age(root, key)
                bucket.add(key)
                if bucket is pinned:
                    await producer.append(BatchRef(key, 100, 7, 10, ("s",), time.time()))
    assert (await load(store, shard_key(KEY, 2))).manifest.entry_count == 2

    result = await collect_garbage(store, KEY, grace_s=GRACE)

    assert result.referenced == 6
    assert result.deleted == 6
    left = await keys(store, "batches/")
    assert left == pinned
