"""Manifest queue: ordering, group commit, idempotent appends, fencing, bounds, faults."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest
from _workers import produce, store_options

from icefloe.errors import (
    ConfigError,
    DeadlineExceededError,
    FencedError,
    ManifestCorruptError,
    QueueFullError,
    TransientStoreError,
)
from icefloe.manifest import (
    BatchRef,
    Entry,
    Manifest,
    ManifestConfig,
    ManifestConsumer,
    ManifestProducer,
    ProducerState,
    cas_update,
    load,
)
from icefloe.manifest.model import FOOTER
from icefloe.store import open_async_store
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.cas import LastWritten, Versioned
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy

FAST_RETRY = RetryPolicy(max_attempts=6, base_delay_s=0.001, max_delay_s=0.01, budget_s=5)
KEY = ManifestConfig().key


def ref(name: str, written_at: float | None = None, streams: tuple[str, ...] = ("s",)
        ) -> BatchRef:
    return BatchRef(f"batches/{name}", 123, 42, 10, streams,
                    time.time() if written_at is None else written_at)


@pytest.fixture(params=["local", "s3"])
def store_target(request, tmp_path) -> Iterator[tuple[str, str | None]]:
    """(url, endpoint) of an empty store: a local directory or a moto S3 bucket."""
    if request.param == "local":
        yield (tmp_path / "store").as_uri(), None
    else:
        target = request.getfixturevalue("s3_bucket")
        yield target.url, target.endpoint_url


def faulty_local(tmp_path, rules: list[FaultRule] | None = None
                 ) -> tuple[RetryingAsyncStore, FaultyAsyncStore]:
    faulty = FaultyAsyncStore(ThreadedAsyncStore(LocalStore(tmp_path / "store")), rules, seed=7)
    return RetryingAsyncStore(faulty, FAST_RETRY), faulty


def all_entries(manifest: Manifest) -> list[Entry]:
    return list(manifest.entries)


# --- format ----------------------------------------------------------------------------

def test_should_round_trip_and_change_bytes_on_every_write():
    manifest = Manifest().replace(
        entries=(Entry(sequence=0, location="batches/a", size=1, crc32c=2, record_count=3,
                       streams=("s",), ingested_at=1.5, producer_id="p", producer_batch=1),),
        next_sequence=1, producers={"p": ProducerState(batch=1, sequence=0, updated_at=1.5)})
    data = manifest.encode()
    assert Manifest.decode(data) == manifest
    assert manifest.replace().encode() != data  # same content, new revision, new bytes


def test_should_compress_large_manifests_and_decode_them():
    entries = tuple(Entry(sequence=i, location=f"batches/{i:08d}", size=i, crc32c=i,
                          record_count=i, streams=("pageviews",), ingested_at=float(i),
                          producer_id="p", producer_batch=i + 1) for i in range(2000))
    manifest = Manifest(entries=entries, next_sequence=2000)
    data = manifest.encode()
    assert data[-FOOTER.size] == 1  # zstd
    assert Manifest.decode(data) == manifest


@pytest.mark.parametrize(("mangle", "message"), [
    (lambda d: d[:10], "shorter than"),
    (lambda d: d[:-4] + b"XXXX", "magic"),
    (lambda d: b"x" + d[1:], "checksum"),
    (lambda d: d[:-6] + b"\x09\x00" + d[-4:], "version 9"),
])
def test_should_reject_corrupt_manifests(mangle, message):
    data = Manifest(next_sequence=0).replace().encode()
    with pytest.raises(ManifestCorruptError, match=message):
        Manifest.decode(mangle(data))


def test_should_read_producer_records_written_before_refusals_were_kept():
    """Manifests written before ``refused`` existed decode with it empty, and a record
    without refusals is written exactly as before (the field is omitted)."""
    old = Manifest(producers={"p": ProducerState(batch=3, sequence=7, updated_at=1.5)})
    data = old.encode()
    assert b"refused" not in data
    assert Manifest.decode(data).producers["p"].refused == ()
    kept = Manifest(producers={"p": ProducerState(batch=3, sequence=7, updated_at=1.5,
                                                  refused=(1, 2))})
    assert Manifest.decode(kept.encode()).producers["p"].refused == (1, 2)

def test_should_reject_non_contiguous_sequences():
    bad = Manifest(entries=(
        Entry(sequence=0, location="a", size=1, crc32c=1, record_count=1, streams=(),
              ingested_at=0, producer_id="p", producer_batch=1),
        Entry(sequence=2, location="b", size=1, crc32c=1, record_count=1, streams=(),
              ingested_at=0, producer_id="p", producer_batch=2)), next_sequence=3)
    decoded = Manifest.decode(bad.encode())  # entries are checked when first decoded
    with pytest.raises(ManifestCorruptError, match="not contiguous"):
        _ = decoded.entries


def test_should_refuse_config_where_gc_could_delete_appendable_batches():
    with pytest.raises(ConfigError, match=r"gc_grace_s \(200\).*append_deadline_s \(120\)"):
        ManifestConfig(gc_grace_s=200)
    with pytest.raises(ConfigError, match="producer_ttl_s"):
        ManifestConfig(producer_ttl_s=10)
    with pytest.raises(ConfigError, match="max_entries must be > 0"):
        ManifestConfig(max_entries=0)


# --- producers and consumers on both stores ---------------------------------------------

def test_should_keep_sequences_contiguous_across_producer_processes(store_target):
    url, endpoint = store_target
    processes, appends = 4, 25
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        start = manager.Event()
        futures = [pool.submit(produce, url, endpoint, f"p{n}", appends, 5, start)
                   for n in range(processes)]
        start.set()
        results = [item for future in futures for item in future.result(timeout=120)]

    async def check() -> None:
        store = open_async_store(url, store_options(endpoint))
        manifest = (await load(store, KEY)).manifest
        await store.close()
        sequences = [e.sequence for e in manifest.entries]
        assert sequences == list(range(processes * appends))
        locations = [e.location for e in manifest.entries]
        assert sorted(locations) == sorted(loc for loc, _ in results)
        assert len(set(locations)) == processes * appends
        by_location = {e.location: e.sequence for e in manifest.entries}
        assert all(by_location[loc] == seq for loc, seq in results)

    asyncio.run(check())


def test_should_fence_the_older_consumer_and_keep_producer_appends(store_target):
    url, endpoint = store_target

    async def run() -> None:
        store = open_async_store(url, store_options(endpoint))
        producer = ManifestProducer(store)
        first = ManifestConsumer(store, holder="a")
        assert await first.initialize() == 1
        await producer.append(ref("before"))
        second = ManifestConsumer(store, holder="b")
        # a producer racing the takeover loses nothing
        racing = [producer.append(ref(f"race-{i}")) for i in range(10)]
        results = await asyncio.gather(second.initialize(), *racing)
        assert results[0] == 2
        for operation in (first.read(), first.ack(0), first.dequeue()):
            with pytest.raises(FencedError) as info:
                await operation
            assert (info.value.our_epoch, info.value.current_epoch) == (1, 2)
        entries = await second.read()
        assert next(e.location for e in entries) == "batches/before"
        assert sorted(e.location for e in entries[1:]) == sorted(
            f"batches/race-{i}" for i in range(10))
        assert [e.sequence for e in entries] == list(range(11))
        await second.ack(10)
        assert await second.dequeue() == 11
        await store.close()

    asyncio.run(run())


def test_should_ack_dequeue_and_never_reuse_sequences(tmp_path):
    async def run() -> None:
        store = ThreadedAsyncStore(LocalStore(tmp_path))
        producer, consumer = ManifestProducer(store), ManifestConsumer(store)
        with pytest.raises(RuntimeError, match="initialize"):
            await consumer.read()
        await consumer.initialize()
        seqs = await asyncio.gather(*(producer.append(ref(f"b{i}")) for i in range(5)))
        assert seqs == [0, 1, 2, 3, 4]
        assert producer.stats.writes == 1  # five concurrent appends, one group commit
        assert [e.sequence for e in await consumer.read(from_sequence=3)] == [3, 4]
        assert [e.sequence for e in await consumer.read(max_entries=2)] == [0, 1]
        with pytest.raises(ValueError, match="highest sequence in the manifest is 4"):
            await consumer.ack(5)
        await consumer.ack(2)
        await consumer.ack(1)  # older ack: a no-op, not a regression
        assert [e.sequence for e in await consumer.read()] == [3, 4]
        assert await consumer.dequeue() == 3
        assert await consumer.dequeue() == 0
        assert await producer.append(ref("after")) == 5
        assert await consumer.ack(4, dequeue=True) == 2  # ack and dequeue 3, 4 in one write
        assert await producer.append(ref("later")) == 6
        manifest = await consumer.snapshot()
        assert (manifest.first_sequence, manifest.next_sequence) == (5, 7)
        assert manifest.consumer.acked_through == 4

    asyncio.run(run())


# --- bounds and deadlines ------------------------------------------------------------------

def test_should_refuse_appends_when_the_queue_is_full_until_dequeued(tmp_path):
    async def run() -> None:
        store = ThreadedAsyncStore(LocalStore(tmp_path))
        config = ManifestConfig(max_entries=3)
        producer, consumer = ManifestProducer(store, config), ManifestConsumer(store, config)
        await consumer.initialize()
        results = await asyncio.gather(*(producer.append(ref(f"b{i}")) for i in range(5)),
                                       return_exceptions=True)
        assert results[:3] == [0, 1, 2]
        assert all(isinstance(r, QueueFullError) for r in results[3:])
        assert "3 entries" in str(results[3])
        assert "collector is behind" in str(results[3])
        assert producer.stats.queue_full == 2
        await consumer.ack(2)
        await consumer.dequeue()
        assert await producer.append(ref("later")) == 3

    asyncio.run(run())


def test_should_refuse_appends_when_the_manifest_exceeds_its_byte_bound(tmp_path):
    async def run() -> None:
        store = ThreadedAsyncStore(LocalStore(tmp_path))
        producer = ManifestProducer(store, ManifestConfig(max_bytes=1500))
        for _ in range(200):
            try:
                await producer.append(ref(uuid.uuid4().hex))  # incompressible names
            except QueueFullError:
                break
        else:
            pytest.fail("the byte bound never triggered")
        size = (await load(store, KEY)).size
        assert 1500 <= size < 3000  # bounded: at most one group beyond the limit

    asyncio.run(run())


def test_should_not_append_batches_past_the_deadline(tmp_path):
    async def run() -> None:
        store = ThreadedAsyncStore(LocalStore(tmp_path))
        producer = ManifestProducer(store)
        old = ref("old", written_at=time.time() - 121)
        results = await asyncio.gather(producer.append(old), producer.append(ref("fresh")),
                                       return_exceptions=True)
        assert isinstance(results[0], DeadlineExceededError)
        assert "append deadline" in str(results[0])
        assert results[1] == 0
        manifest = (await load(store, KEY)).manifest
        assert [e.location for e in manifest.entries] == ["batches/fresh"]

    asyncio.run(run())


def test_should_forget_idle_producers_after_their_ttl(tmp_path):
    async def run() -> None:
        store = ThreadedAsyncStore(LocalStore(tmp_path))
        stale = ProducerState(batch=9, sequence=0, updated_at=time.time() - 8 * 86400)
        recent = ProducerState(batch=3, sequence=0, updated_at=time.time() - 3600)
        await cas_update(store, KEY, lambda loaded: loaded.manifest.replace(
            producers={"stale": stale, "recent": recent}), backoff=FAST_RETRY)
        await ManifestProducer(store, producer_id="new").append(ref("x"))
        producers = (await load(store, KEY)).manifest.producers
        assert set(producers) == {"recent", "new"}

    asyncio.run(run())


# --- faults at the store boundary ------------------------------------------------------

def test_should_retry_a_failed_manifest_put(tmp_path):
    async def run() -> None:
        store, faulty = faulty_local(tmp_path, [FaultRule("fail", ops=frozenset({"put"}),
                                                          key_prefix=KEY, times=2)])
        assert await ManifestProducer(store).append(ref("a")) == 0
        assert faulty.injected["fail"] == 2
        assert len((await load(store, KEY)).manifest.entries) == 1

    asyncio.run(run())


def test_should_not_duplicate_when_a_put_applies_but_its_response_is_lost(tmp_path):
    async def run() -> None:
        store, faulty = faulty_local(tmp_path)
        producer = ManifestProducer(store)
        await producer.append(ref("first"))
        faulty.add(FaultRule("lose_response", ops=frozenset({"put"}), key_prefix=KEY))
        assert await producer.append(ref("second")) == 1
        assert faulty.injected["lose_response"] == 1
        assert producer.stats.duplicates_skipped == 1
        manifest = (await load(store, KEY)).manifest
        assert [e.location for e in manifest.entries] == ["batches/first", "batches/second"]

    asyncio.run(run())


def test_should_refuse_again_a_batch_refused_beside_a_lost_append(tmp_path):
    """Issue #22, case 1: one group commit refuses an older batch (past its deadline) and
    appends a newer one; the store applies that write but its answer is lost. The retry
    must find the older batch *not* appended and refuse it again: reporting it durable
    ("already dequeued") would acknowledge data that is in no entry."""
    async def run() -> None:
        store, faulty = faulty_local(tmp_path)
        producer = ManifestProducer(store)
        faulty.add(FaultRule("lose_response", ops=frozenset({"put"}), key_prefix=KEY))
        old = ref("old", written_at=time.time() - 121)
        results = await asyncio.gather(producer.append(old), producer.append(ref("fresh")),
                                       return_exceptions=True)
        assert faulty.injected["lose_response"] == 1
        assert isinstance(results[0], DeadlineExceededError), results[0]
        assert results[1] == 0
        manifest = (await load(store, KEY)).manifest
        assert [e.location for e in manifest.entries] == ["batches/fresh"]
        assert manifest.producers[producer.producer_id].refused == (1,)
        assert producer.stats.deadline_exceeded == 1
        # the next group forgets what can no longer be asked about
        assert await producer.append(ref("later")) == 1
        assert (await load(store, KEY)).manifest.producers[producer.producer_id].refused == ()

    asyncio.run(run())

def test_should_append_a_batch_refused_earlier_without_lowering_the_mark(tmp_path):
    """A number the manifest lists as refused is judged again, like a new batch; if it can
    be appended now it is, after higher numbers, and the producer's mark stays at the
    highest number appended (a lower mark would let a retry append a batch twice)."""
    async def run() -> None:
        store = ThreadedAsyncStore(LocalStore(tmp_path))
        now = time.time()
        # as an earlier attempt left it: batch 2 appended, batch 1 refused, answer lost
        earlier = Entry(sequence=0, location="batches/two", size=123, crc32c=42,
                        record_count=10, streams=("s",), ingested_at=now,
                        producer_id="p", producer_batch=2)
        await cas_update(store, KEY, lambda loaded: loaded.manifest.replace(
            entries=[earlier], next_sequence=1, producers={"p": ProducerState(
                batch=2, sequence=0, updated_at=now, refused=(1,))}), backoff=FAST_RETRY)
        producer = ManifestProducer(store, producer_id="p")
        one, two = await asyncio.gather(producer.append(ref("one")), producer.append(ref("two")))
        assert (one, two) == (1, 0)  # 1 appended now, 2 found where the lost write put it
        manifest = (await load(store, KEY)).manifest
        assert [e.location for e in manifest.entries] == ["batches/two", "batches/one"]
        assert manifest.producers["p"].batch == 2
        assert manifest.producers["p"].refused == ()

    asyncio.run(run())

def test_should_survive_a_412_storm(tmp_path):
    async def run() -> None:
        store, _faulty = faulty_local(tmp_path, [FaultRule("precondition", ops=frozenset({"put"}),
                                                          key_prefix=KEY, times=25)])
        producer = ManifestProducer(store)
        seqs = await asyncio.gather(*(producer.append(ref(f"b{i}")) for i in range(3)))
        assert sorted(seqs) == [0, 1, 2]
        assert producer.stats.conflicts == 25
        assert len((await load(store, KEY)).manifest.entries) == 3

    asyncio.run(run())


def test_should_ride_out_throttling_bursts(tmp_path):
    async def run() -> None:
        store, faulty = faulty_local(tmp_path, [FaultRule("slowdown", times=4)])
        consumer = ManifestConsumer(store)
        await consumer.initialize()
        assert await ManifestProducer(store).append(ref("a")) == 0
        assert [e.location for e in await consumer.read()] == ["batches/a"]
        assert faulty.injected["slowdown"] == 4

    asyncio.run(run())


def test_should_fail_the_append_without_acking_when_throttling_outlasts_the_budget(tmp_path):
    async def run() -> None:
        store, faulty = faulty_local(tmp_path)
        producer = ManifestProducer(store)
        await producer.append(ref("a"))
        faulty.add(FaultRule("slowdown", ops=frozenset({"put"}), times=None))
        with pytest.raises(TransientStoreError, match=r"SlowDown|gave up"):
            await producer.append(ref("b"))
        faulty.rules.clear()
        assert [e.location for e in (await load(store, KEY)).manifest.entries] == ["batches/a"]

    asyncio.run(run())


def test_should_not_reappend_an_ambiguous_batch_the_consumer_already_dequeued(tmp_path):
    async def run() -> None:
        store, faulty = faulty_local(tmp_path)
        consumer = ManifestConsumer(store)
        await consumer.initialize()
        seen: list[str] = []

        async def consume_everything() -> None:
            entries = await consumer.read()
            seen.extend(e.location for e in entries)
            await consumer.ack(entries[-1].sequence)
            assert await consumer.dequeue() == 1

        faulty.add(FaultRule("lose_response", ops=frozenset({"put"}), key_prefix=KEY,
                             on_fire=consume_everything))
        producer = ManifestProducer(store)
        assert await producer.append(ref("ambiguous")) is None  # durable, already consumed
        assert seen == ["batches/ambiguous"]
        manifest = (await load(store, KEY)).manifest
        assert manifest.entries == ()
        assert manifest.next_sequence == 1
        assert await producer.append(ref("next")) == 1
        assert [e.location for e in await consumer.read()] == ["batches/next"]

    asyncio.run(run())


def test_should_keep_consumer_operations_idempotent_under_lost_responses(tmp_path):
    async def run() -> None:
        store, faulty = faulty_local(tmp_path)
        producer, consumer = ManifestProducer(store), ManifestConsumer(store)
        await consumer.initialize()
        await asyncio.gather(*(producer.append(ref(f"b{i}")) for i in range(4)))
        lose_next_put = FaultRule("lose_response", ops=frozenset({"put"}), key_prefix=KEY)
        faulty.add(lose_next_put)
        await consumer.ack(1)
        assert (await consumer.snapshot()).consumer.acked_through == 1
        lose_next_put.fired = 0  # arm it again for the dequeue
        assert await consumer.dequeue() == 0  # the lost first attempt already removed them
        manifest = await consumer.snapshot()
        assert (manifest.first_sequence, manifest.consumer.acked_through) == (2, 1)
        assert faulty.injected["lose_response"] == 2

    asyncio.run(run())


def test_should_append_without_reading_back_what_it_wrote_until_someone_else_writes(
        store_target):
    """The producer starts each CAS from the manifest it wrote last: one read for a run of
    appends; a write by someone else costs one failed conditional PUT and a read, and
    nothing is lost, duplicated or counted as a race."""
    url, endpoint = store_target

    async def run() -> None:
        plain = open_async_store(url, store_options(endpoint))
        watched = FaultyAsyncStore(plain)
        reads = watched.add(FaultRule("delay", ops=frozenset({"get"}), key_prefix=KEY,
                                      times=None, delay_s=(0.0, 0.0)))
        producer, consumer = ManifestProducer(watched), ManifestConsumer(plain)
        await consumer.initialize()
        assert [await producer.append(ref(f"b{i}")) for i in range(5)] == [0, 1, 2, 3, 4]
        assert reads.fired == 1
        await consumer.ack(1, dequeue=True)  # the collector writes in between
        assert await producer.append(ref("after")) == 5
        assert (producer.stats.stale, producer.stats.conflicts, reads.fired) == (1, 0, 2)
        manifest = (await load(plain, KEY)).manifest
        assert [e.location for e in manifest.entries] == [
            "batches/b2", "batches/b3", "batches/b4", "batches/after"]
        assert manifest.consumer.acked_through == 1
        await plain.close()

    asyncio.run(run())


def test_should_back_off_from_the_remembered_manifest_while_others_write_often():
    """With several producers on one manifest most first attempts on the remembered version
    would fail (a wasted PUT each): after k misses in a row the next 2**k - 1 CASes read
    first; once one succeeds on it again, every CAS starts from it."""
    last: LastWritten[Manifest] = LastWritten()
    written = Versioned(Manifest(), '"etag"', time.time(), 10)

    def cas(contended: bool) -> bool:
        """One CAS as cas_document runs it; True if it started from the remembered one."""
        offered = last.take() is not None
        if offered and contended:
            last.stale()
        last.keep(written, remembered=offered and not contended)
        return offered

    last.keep(written, remembered=False)
    offered = [i for i in range(200) if cas(contended=True)]
    assert offered == [0, 2, 6, 14, 30, 62, 126, 190]  # gaps 1, 3, 7, ... capped at 63
    quiet = [cas(contended=False) for _ in range(70)]
    assert quiet.index(True) <= LastWritten.MAX_SKIPPED  # the backoff runs out ...
    assert all(quiet[quiet.index(True):])  # ... and one success restores every CAS
