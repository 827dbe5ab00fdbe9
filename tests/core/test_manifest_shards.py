"""Manifest shards: the shard set, producers spread over shards, growing online, refusing
to shrink, the multi-shard consumer, and fencing across shards through a crash mid-fence.

Runs against the local store and a real moto S3 server; faults are injected at the store
boundary (:mod:`icefloe.store.faults`), time through :class:`~icefloe.clock.ManualClock`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator

import pytest
from _workers import store_options

from icefloe.clock import ManualClock
from icefloe.config import load_config
from icefloe.errors import ConfigError, FencedError, TransientStoreError
from icefloe.manifest import (
    BatchRef,
    ManifestConfig,
    ManifestConsumer,
    ManifestProducer,
    ShardedConsumer,
    ShardedProducer,
    ShardEntry,
    grow_shards,
    load,
    read_shard_count,
    shard_key,
    shard_set_key,
)
from icefloe.manifest.publish import new_batch_key
from icefloe.manifest.shards import pick_shard
from icefloe.store import AsyncObjectStore, open_async_store
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryPolicy

KEY = ManifestConfig().key
FAST = RetryPolicy(max_attempts=100_000, base_delay_s=0.0005, max_delay_s=0.005, budget_s=30)


def config(shards: int = 1) -> ManifestConfig:
    return ManifestConfig(shards=shards, conflict_backoff=FAST)


def ref(name: str) -> BatchRef:
    return BatchRef(f"batches/{name}.ifb", 10, 1, 1, ("s",), time.time())


@pytest.fixture(params=["local", "s3"])
async def store(request, tmp_path) -> AsyncIterator[AsyncObjectStore]:
    """An empty store: a local directory or a bucket on the moto server."""
    if request.param == "local":
        opened = open_async_store((tmp_path / "store").as_uri())
    else:
        target = request.getfixturevalue("s3_bucket")
        opened = open_async_store(target.url, store_options(target.endpoint_url))
    yield opened
    await opened.close()


@pytest.fixture
async def local(tmp_path) -> AsyncIterator[AsyncObjectStore]:
    opened = open_async_store((tmp_path / "store").as_uri())
    yield opened
    await opened.close()


async def epochs(store: AsyncObjectStore, count: int) -> list[int]:
    return [(await load(store, shard_key(KEY, n))).manifest.epoch for n in range(count)]


# --- configuration and the shard set ----------------------------------------------------

@pytest.mark.parametrize(("value", "message"), [
    (0, r"manifest\.shards must be > 0, got 0"),
    (257, r"manifest\.shards must be at most 256, got 257"),
])
def test_should_refuse_a_bad_shard_count_in_the_config_file(tmp_path, value, message):
    path = tmp_path / "icefloe.toml"
    path.write_text(f"[manifest]\nshards = {value}\n")
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path, env={})
    assert str(path) in str(info.value)


def test_should_default_to_one_shard_under_the_manifest_key():
    assert ManifestConfig().shards == 1
    assert shard_key(KEY, 0) == KEY  # existing deployments are shard 0 unchanged
    assert shard_key(KEY, 3) == f"{KEY}-shard3"
    assert shard_set_key(KEY) == f"{KEY}.shards"


async def test_should_grow_the_recorded_count_and_refuse_to_shrink_it(store, caplog):
    assert await read_shard_count(store, KEY) == 1  # never recorded: one shard
    assert await grow_shards(store, KEY, 4, backoff=FAST) == 4
    assert await grow_shards(store, KEY, 4, backoff=FAST) == 4  # no write, same answer
    with pytest.raises(ConfigError, match=r"manifest\.shards = 2 is below the store's "
                                          r"shard count 4"):
        await grow_shards(store, KEY, 2, backoff=FAST)
    # a process started with an older config (shards grown online since): the store's
    # count wins, with a warning naming both (it used to refuse to start, #36)
    consumer = ShardedConsumer(store, config(3))
    with caplog.at_level("WARNING", logger="icefloe.manifest"):
        await consumer.initialize()
    assert consumer.shard_count == 4
    assert "manifest.shards = 3 is below the store's shard count 4" in caplog.text
    assert await read_shard_count(store, KEY) == 4


def test_should_spread_instances_evenly_and_move_few_when_growing():
    names = [f"ingestor-{i}" for i in range(4000)]
    counts = Counter(pick_shard(name, 8) for name in names)
    assert set(counts) == set(range(8))
    assert max(counts.values()) < 1.15 * len(names) / 8 < 1.3 * min(counts.values())
    moved = [name for name in names if pick_shard(name, 8) != pick_shard(name, 16)]
    assert all(pick_shard(name, 16) >= 8 for name in moved)  # only onto the new shards
    assert 0.4 < len(moved) / len(names) < 0.6


def test_should_spread_batch_keys_over_prefixes():
    keys = [new_batch_key() for _ in range(2000)]
    prefixes = Counter(key.split("/")[1] for key in keys)
    assert all(key.startswith("batches/") and key.endswith(".ifb") for key in keys)
    assert all(len(prefix) == 2 for prefix in prefixes)
    assert len(prefixes) > 200  # 256 possible


# --- producing and consuming ---------------------------------------------------------------

async def test_should_read_a_single_manifest_layout_as_shard_0(store):
    """An old deployment (one manifest, old producer, old batch keys) is shard 0."""
    old = ManifestProducer(store, config())
    assert [await old.append(ref(f"old-{i}")) for i in range(3)] == [0, 1, 2]
    consumer = ShardedConsumer(store, config(3))  # grows the store to 3 at start
    await consumer.initialize()
    sharded = ShardedProducer(store, config(3), shard=2)
    await sharded.append(ref("new"))

    read = await consumer.read()
    assert sorted(item.position for item in read) == [(0, 0), (0, 1), (0, 2), (2, 0)]
    assert {item.entry.location for item in read if item.shard == 0} == {
        f"batches/old-{i}.ifb" for i in range(3)}
    assert await consumer.ack({0: 2, 2: 0}, dequeue=True) == {0: 3, 2: 1}
    assert await consumer.read() == []
    assert await old.append(ref("old-3")) == 3  # an old ingestor keeps writing shard 0
    assert [item.position for item in await consumer.read()] == [(0, 3)]


async def test_should_spread_producers_and_keep_each_producers_order(store):
    await grow_shards(store, KEY, 4, backoff=FAST)
    producers = [ShardedProducer(store, config(4), instance=f"ingestor-{i}")
                 for i in range(8)]

    async def run(producer: ShardedProducer, index: int) -> None:
        for n in range(6):
            await producer.append(ref(f"p{index}-{n}"))

    await asyncio.gather(*(run(p, i) for i, p in enumerate(producers)))
    consumer = ShardedConsumer(store, config(4))
    await consumer.initialize()
    read = await consumer.read()

    assert len(read) == 48
    assert len({item.entry.location for item in read}) == 48
    assert {item.shard for item in read} == {p.shard for p in producers}
    assert len({p.shard for p in producers}) >= 3
    assert_producer_order(read)
    by_shard = defaultdict(list)
    for item in read:
        by_shard[item.shard].append(item.sequence)
    assert all(seqs == list(range(len(seqs))) for seqs in by_shard.values())
    limited = await consumer.read(max_entries=10)
    assert len(limited) == 10
    for number in {item.shard for item in limited}:  # every shard's part is a prefix
        seqs = [item.sequence for item in limited if item.shard == number]
        assert seqs == list(range(len(seqs)))


async def test_should_spread_indexed_producers_exactly_and_follow_a_grow(local):
    """``index`` spreads exactly (hashing is even only on average: one shard per ingestor
    leaves some shards 3-5 writers) and is re-applied when the count grows."""
    await grow_shards(local, KEY, 4, backoff=FAST)
    clock = ManualClock(start=time.time())
    producers = [ShardedProducer(local, config(4), instance="same-name", index=i,
                                 recheck_s=10, clock=clock) for i in range(8)]
    for i, producer in enumerate(producers):
        await producer.append(ref(f"a{i}"))
    assert [p.shard for p in producers] == [0, 1, 2, 3, 0, 1, 2, 3]
    await grow_shards(local, KEY, 8, backoff=FAST)
    clock.advance(11)
    for i, producer in enumerate(producers):
        await producer.append(ref(f"b{i}"))
    assert [p.shard for p in producers] == list(range(8))
    consumer = ShardedConsumer(local, config(8))
    await consumer.initialize()
    assert_producer_order(await consumer.read())


def assert_producer_order(read: list[ShardEntry]) -> None:
    """Within a producer id, batch numbers appear in order and without gaps."""
    numbers: dict[str, list[int]] = defaultdict(list)
    shards: dict[str, set[int]] = defaultdict(set)
    for item in read:
        numbers[item.entry.producer_id].append(item.entry.producer_batch)
        shards[item.entry.producer_id].add(item.shard)
    for pid, seen in numbers.items():
        assert seen == list(range(1, len(seen) + 1)), pid
        assert len(shards[pid]) == 1, pid  # a producer stays on one shard


async def test_should_grow_online_while_producers_append_and_a_consumer_drains(store):
    """1 -> 4 shards while six producers append and the consumer acks and dequeues:
    every batch is consumed exactly once, in order within its producer."""
    clock = ManualClock(start=time.time())
    producers = [ShardedProducer(store, config(1), instance=f"ingestor-{i}", recheck_s=5,
                                 clock=clock) for i in range(6)]
    consumer = ShardedConsumer(store, config(1), clock=clock)
    await consumer.initialize()
    consumed: list[ShardEntry] = []
    stop = asyncio.Event()
    grown = asyncio.Event()

    appended = asyncio.Event()
    halfway: list[int] = []
    all_halfway = asyncio.Event()

    async def produce(producer: ShardedProducer, index: int) -> None:
        for n in range(16):
            await producer.append(ref(f"p{index}-{n}"))
            appended.set()
            if n == 7:
                halfway.append(index)
                if len(halfway) == len(producers):
                    all_halfway.set()
                await grown.wait()  # half before the grow, half after

    async def drain() -> None:
        while True:
            last = stop.is_set()
            if not last:
                await appended.wait()  # read when there is something new
                appended.clear()
            batch = await consumer.read()
            consumed.extend(batch)
            ends: dict[int, int] = {}
            for item in batch:
                ends[item.shard] = max(ends.get(item.shard, -1), item.sequence)
            if ends:
                await consumer.ack(ends, dequeue=True)
            if last:
                return

    draining = asyncio.create_task(drain())
    producing = asyncio.gather(*(produce(p, i) for i, p in enumerate(producers)))
    await all_halfway.wait()
    assert await grow_shards(store, KEY, 4, backoff=FAST) == 4
    clock.advance(6)  # producers re-read the count at their next append
    grown.set()
    await producing
    stop.set()
    appended.set()
    await draining

    assert sorted(item.entry.location for item in consumed) == sorted(
        f"batches/p{i}-{n}.ifb" for i in range(6) for n in range(16))  # once each
    assert_producer_order(consumed)
    moved = [p for p in producers if p.moves]
    assert moved
    assert all(p.shard == pick_shard(p.instance, 4) for p in producers)
    assert {item.shard for item in consumed} == {0} | {p.shard for p in moved}
    assert await epochs(store, 4) == [consumer.epoch] * 4  # new shards adopted on use
    shards = await consumer.snapshot()
    assert all(m.entry_count == 0 for m in shards.values())


# --- fencing across shards -------------------------------------------------------------------

async def filled(store: AsyncObjectStore, count: int) -> ShardedConsumer:
    """A store grown to ``count`` shards with two entries on each, and its consumer."""
    await grow_shards(store, KEY, count, backoff=FAST)
    for number in range(count):
        producer = ShardedProducer(store, config(count), shard=number)
        for n in range(2):
            await producer.append(ref(f"s{number}-{n}"))
    old = ShardedConsumer(store, config(count), holder="old")
    await old.initialize()
    assert len(await old.read()) == 2 * count
    return old


@pytest.mark.parametrize("fault", ["fail", "lose_response"])
async def test_should_fence_every_shard_when_a_takeover_crashes_between_fences(
        store, fault):
    """The new consumer claims shard 0, fences shard 1, and dies on shards 2 and 3 (the
    fences run at once). The old consumer must then be refused on every shard — shard 3,
    and shard 2 unless its answer was lost, still show its epoch."""
    old = await filled(store, 4)
    faulty = FaultyAsyncStore(store, [
        FaultRule(fault, ops=frozenset({"put"}), key_prefix=shard_key(KEY, 2)),
        FaultRule("fail", ops=frozenset({"put"}), key_prefix=shard_key(KEY, 3))])
    new = ShardedConsumer(faulty, config(4), holder="new")
    with pytest.raises(TransientStoreError, match="injected"):
        await new.initialize()
    crashed = await epochs(store, 4)
    assert crashed[:2] == [2, 2]
    assert crashed[3] == 1
    assert crashed[2] == (2 if fault == "lose_response" else 1)

    with pytest.raises(FencedError):
        await old.read()
    for shard in (1, 2, 3):
        with pytest.raises(FencedError):
            await old.ack({shard: 1}, dequeue=True)
    with pytest.raises(FencedError):
        await old.dequeue()
    with pytest.raises(FencedError):
        await old.renew_lease()
    snapshot = await old.snapshot()
    assert all(m.consumer.acked_through == -1 and m.entry_count == 2
               for m in snapshot.values())  # nothing acked or dequeued anywhere

    # the takeover is retried (a restart claims a newer epoch) and fences every shard
    retried = ShardedConsumer(store, config(4), holder="new")
    assert await retried.initialize() == 3
    assert await epochs(store, 4) == [3, 3, 3, 3]
    assert len(await retried.read()) == 8
    assert await retried.ack({n: 1 for n in range(4)}, dequeue=True) == {n: 2 for n in
                                                                          range(4)}


class Recording(AsyncObjectStore):
    """Passes every request on, noting ``(op, key)`` as it starts."""

    def __init__(self, inner: AsyncObjectStore) -> None:
        self.inner, self.url, self.started = inner, inner.url, []

    async def get(self, key):
        self.started.append(("get", key))
        return await self.inner.get(key)

    async def put(self, key, data, *, if_match=None, if_none_match=None):
        self.started.append(("put", key))
        return await self.inner.put(key, data, if_match=if_match, if_none_match=if_none_match)

    async def delete(self, key):
        return await self.inner.delete(key)

    async def list(self, prefix=""):
        return await self.inner.list(prefix)

    async def head(self, key):
        return await self.inner.head(key)


async def test_should_fence_the_other_shards_at_once_on_takeover(local):
    """A takeover fences shards 1..N-1 concurrently, not one CAS after the other: every
    fence has read its shard before the first one writes. (One after the other, a takeover
    at 64 shards whose producers contend took seconds with nothing drained.)"""
    await filled(local, 4)
    recording = Recording(local)
    new = ShardedConsumer(recording, config(4), holder="new")
    assert await new.initialize() == 2
    others = {shard_key(KEY, n) for n in (1, 2, 3)}
    fencing = [(op, key) for op, key in recording.started if key in others]
    first_put = next(i for i, (op, _) in enumerate(fencing) if op == "put")
    assert {key for op, key in fencing[:first_put] if op == "get"} == others
    assert await epochs(local, 4) == [2, 2, 2, 2]


async def test_should_refuse_a_stale_consumer_on_an_unfenced_shard_it_reaches_directly(
        local):
    """Even a consumer that touched shard 3 without the shard-0 check is refused once
    the takeover fenced shard 3; before that, the shard-0 check refuses it."""
    old = await filled(local, 4)
    new = ShardedConsumer(local, config(4), holder="new")
    await new.initialize()
    with pytest.raises(FencedError):
        await old.shard(3).ack(0)
    assert (await load(local, shard_key(KEY, 3))).manifest.consumer.acked_through == -1


async def test_should_adopt_a_shard_created_after_the_takeover(local):
    consumer = ShardedConsumer(local, config(1))
    assert await consumer.initialize() == 1
    await grow_shards(local, KEY, 3, backoff=FAST)
    await ShardedProducer(local, config(3), shard=2).append(ref("late"))
    read = await consumer.read()
    assert [item.position for item in read] == [(2, 0)]
    assert await epochs(local, 3) == [1, 1, 1]
    # a newer consumer claims; the old one cannot use the grown shard either
    await ShardedConsumer(local, config(3)).initialize()
    with pytest.raises(FencedError):
        await consumer.ack({2: 0})


async def test_should_keep_single_shard_consumers_compatible(local):
    """A ManifestConsumer (today's collector) and a one-shard ShardedConsumer fence each
    other through the same object: shard 0 is the manifest."""
    today = ManifestConsumer(local, config())
    await today.initialize()
    sharded = ShardedConsumer(local, config())
    await sharded.initialize()
    with pytest.raises(FencedError):
        await today.read()
    await today.initialize()
    with pytest.raises(FencedError):
        await sharded.read()


async def test_should_count_cas_writes_and_conflicts_per_shard(tmp_path):
    faulty = FaultyAsyncStore(ThreadedAsyncStore(LocalStore(tmp_path / "store")))
    consumer = await filled(faulty, 2)
    faulty.add(FaultRule("precondition", ops=frozenset({"put"}),
                         key_prefix=shard_key(KEY, 1), times=2))
    await consumer.ack({0: 1, 1: 1})
    stats = consumer.stats
    assert stats[1].conflicts == 2
    assert stats[1].writes == 2
    assert stats[0].conflicts == 0
