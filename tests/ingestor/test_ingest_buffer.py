"""The ingest buffer and service without transports: durability, group commit, backpressure."""

from __future__ import annotations

import asyncio

import pytest
from ingest_support import make_config, read_manifest, running, stored_events

from icefloe.errors import TransientStoreError
from icefloe.manifest import ManifestConfig, ManifestConsumer
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy
from ingestor.errors import BadRequest, Overloaded, PayloadTooLarge, Unavailable
from ingestor.runtime import IngestorRuntime

ONE_TRY = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.002, budget_s=1)


def body(n: int, start: int = 0) -> bytes:
    return b"[" + b",".join(b'{"user_id":"u%d"}' % i for i in range(start, start + n)) + b"]"


def faulty_store(tmp_path, rules: list[FaultRule]) -> tuple[RetryingAsyncStore, FaultyAsyncStore]:
    faulty = FaultyAsyncStore(ThreadedAsyncStore(LocalStore(tmp_path / "store")), rules)
    return RetryingAsyncStore(faulty, ONE_TRY), faulty


async def ingest(runtime: IngestorRuntime, n: int, start: int = 0, key: str | None = None
                 ) -> int:
    stream = runtime.service.stream("pageviews")
    return await runtime.service.ingest(stream, stream.from_json(body(n, start)),
                                        idempotency_key=key)


async def test_should_ack_only_what_the_manifest_lists(tmp_path):
    url = (tmp_path / "store").as_uri()
    async with running(make_config(tmp_path / "store")) as runtime:
        assert await ingest(runtime, 3) == 3
        manifest = await read_manifest(url)  # already durable when ingest returned
        assert [e.record_count for e in manifest.entries] == [3]
        assert manifest.entries[0].streams == ("pageviews",)
    events = await stored_events(url)
    assert [e.payload for e in events] == [b'{"user_id":"u%d"}' % i for i in range(3)]
    assert len({e.event_id for e in events}) == 3


async def test_should_group_concurrent_requests_into_few_batches(tmp_path):
    url = (tmp_path / "store").as_uri()
    async with running(make_config(tmp_path / "store")) as runtime:
        results = await asyncio.gather(*(ingest(runtime, 2, 2 * i) for i in range(100)))
        assert sum(results) == 200
    manifest = await read_manifest(url)
    assert sum(e.record_count for e in manifest.entries) == 200
    assert len(manifest.entries) <= 5  # arrivals during a flush ride the next one
    assert len(await stored_events(url)) == 200


async def test_should_flush_a_lone_request_at_once_not_on_a_timer(tmp_path):
    config = make_config(tmp_path / "store", flush_age_ms=60_000)
    async with running(config) as runtime:
        await asyncio.wait_for(ingest(runtime, 1), 5)  # would hang 60 s if age were a tick


async def test_should_start_the_flush_inside_the_call_that_finds_the_flusher_idle(tmp_path):
    """Requests that are ready in one event-loop turn (many connections answered by one
    flush send their next requests together) must not all wait for one flush of all of
    them: the first starts a flush at once, inside its own call, and the rest of the turn
    rides the next one while it is written. That overlap is what keeps the loop busy."""
    url = (tmp_path / "store").as_uri()
    async with running(make_config(tmp_path / "store", min_flush_interval_ms=0)) as runtime:
        # gathered tasks take their first step in the same loop turn
        results = await asyncio.gather(*(ingest(runtime, 2, 2 * i) for i in range(50)))
        assert sum(results) == 100
    manifest = await read_manifest(url)
    assert [e.record_count for e in manifest.entries] == [2, 98]
    assert len(await stored_events(url)) == 100


async def test_should_answer_503_when_the_publisher_refuses_a_batch_outright(tmp_path):
    """A flush now starts inside a request's own call: a publisher that raises right there
    must fail that batch's requests like any failed flush (503, never acknowledged) and
    leave the flusher working, not strand the requests or count a flush forever in flight."""
    url = (tmp_path / "store").as_uri()
    async with running(make_config(tmp_path / "store")) as runtime:
        publisher = runtime.publisher
        real = publisher.dispatch

        def refuse_once(*args: object, **kwargs: object) -> object:
            publisher.dispatch = real  # type: ignore[method-assign]
            raise TransientStoreError("the helper's socket broke", op="put")

        publisher.dispatch = refuse_once  # type: ignore[method-assign]
        with pytest.raises(Unavailable) as refused:
            await asyncio.wait_for(ingest(runtime, 2), 5)
        assert refused.value.code == "store_unavailable"
        assert await asyncio.wait_for(ingest(runtime, 3, 2), 5) == 3
    manifest = await read_manifest(url)
    assert [e.record_count for e in manifest.entries] == [3]


async def test_should_gather_arrivals_during_the_minimum_interval_into_one_flush(tmp_path):
    """``min_flush_interval_ms`` bounds PUTs per second: what arrives while the interval
    runs must wait in the open batch and go out together, not be sealed one by one into
    a queue of tiny batches released an interval apart."""
    url = (tmp_path / "store").as_uri()
    # the interval is long next to the arrivals (~100 ms unloaded) so a loaded machine
    # that stretches them still fits them all inside it
    config = make_config(tmp_path / "store", min_flush_interval_ms=1_500, flush_age_ms=10_000)
    async with running(config) as runtime:
        await ingest(runtime, 1)  # flushed at once: nothing was waiting
        loop = asyncio.get_running_loop()
        started = loop.time()
        requests = []
        for i in range(20):  # arrivals spread over ~100 ms, all inside the interval
            requests.append(asyncio.create_task(ingest(runtime, 1, 1 + i)))
            await asyncio.sleep(0.005)
        results = await asyncio.wait_for(asyncio.gather(*requests), 5)
        waited = loop.time() - started
    assert sum(results) == 20
    manifest = await read_manifest(url)
    assert [e.record_count for e in manifest.entries] == [1, 20]
    assert 0.5 < waited < 4  # waited out (the rest of) one interval, not twenty


async def test_should_flush_before_the_minimum_interval_once_enough_requests_wait(tmp_path):
    """``early_flush_requests``: the interval bounds PUTs for small batches, but a batch
    that many clients wait on goes out at once instead of holding them all for the rest
    of the interval."""
    url = (tmp_path / "store").as_uri()
    config = make_config(tmp_path / "store", min_flush_interval_ms=60_000,
                         flush_age_ms=120_000, early_flush_requests=5)
    async with running(config) as runtime:
        await ingest(runtime, 1)  # flushed at once: nothing was waiting; the interval runs
        waiting = [asyncio.create_task(ingest(runtime, 1, 1 + i)) for i in range(4)]
        await asyncio.sleep(0.2)
        assert not any(task.done() for task in waiting)  # 4 < 5: they wait for the interval
        fifth = asyncio.create_task(ingest(runtime, 1, 5))
        results = await asyncio.wait_for(asyncio.gather(*waiting, fifth), 5)  # not 60 s
    assert results == [1] * 5
    manifest = await read_manifest(url)
    assert [e.record_count for e in manifest.entries] == [1, 5]


async def test_should_seal_batches_at_the_size_limit(tmp_path):
    url = (tmp_path / "store").as_uri()
    store, _ = faulty_store(tmp_path, [FaultRule("delay", times=None, delay_s=(0.05, 0.05))])
    config = make_config(tmp_path / "store", flush_bytes=2000, buffer_max_bytes=10_000_000)
    runtime = await IngestorRuntime.start(config, store=store)
    try:
        await asyncio.gather(*(ingest(runtime, 10, 10 * i) for i in range(30)))
    finally:
        await runtime.close(10)
    manifest = await read_manifest(url)
    assert len(manifest.entries) > 3
    assert sum(e.record_count for e in manifest.entries) == 300


async def test_should_refuse_with_429_when_the_buffer_is_full_and_store_nothing_of_it(tmp_path):
    url = (tmp_path / "store").as_uri()
    store, _ = faulty_store(tmp_path, [FaultRule("delay", ops=frozenset({"put"}), times=None,
                                                 delay_s=(0.3, 0.3))])
    config = make_config(tmp_path / "store", buffer_max_bytes=3000, flush_bytes=1000)
    runtime = await IngestorRuntime.start(config, store=store, probe=False)
    try:
        first = asyncio.create_task(ingest(runtime, 40, 0))
        await asyncio.sleep(0)  # let it enter the buffer
        while runtime.batcher.held_bytes == 0:
            await asyncio.sleep(0.001)
        with pytest.raises(Overloaded) as info:
            await ingest(runtime, 40, 1000)
        assert info.value.code == "buffer_full"
        assert info.value.retry_after_s == 1
        assert await first == 40
    finally:
        await runtime.close(10)
    stored = {e.payload for e in await stored_events(url)}
    assert b'{"user_id":"u0"}' in stored
    assert b'{"user_id":"u1000"}' not in stored


async def test_should_answer_503_and_ack_nothing_when_the_store_is_down(tmp_path):
    url = (tmp_path / "store").as_uri()
    store, faulty = faulty_store(tmp_path, [FaultRule("fail", ops=frozenset({"put"}),
                                                      times=None)])
    runtime = await IngestorRuntime.start(make_config(tmp_path / "store"), store=store,
                                          probe=False)
    try:
        with pytest.raises(Unavailable) as info:
            await ingest(runtime, 5)
        assert info.value.code == "store_unavailable"
        assert "gave up" in info.value.message
        assert faulty.injected["fail"] >= 2
        faulty.rules.clear()  # the store comes back: the next request succeeds
        assert await ingest(runtime, 2, 100) == 2
    finally:
        await runtime.close(10)
    manifest = await read_manifest(url)
    assert [e.record_count for e in manifest.entries] == [2]


async def test_should_answer_queue_full_when_the_collector_lags(tmp_path):
    config = make_config(tmp_path / "store")
    config = type(config)(store=config.store, ingestor=config.ingestor, streams=config.streams,
                          manifest=type(config.manifest)(max_entries=2))
    async with running(config) as runtime:
        await ingest(runtime, 1, 0)
        await ingest(runtime, 1, 1)
        with pytest.raises(Overloaded) as info:
            await ingest(runtime, 1, 2)
        assert info.value.code == "queue_full"
        consumer = ManifestConsumer(runtime.store, ManifestConfig(max_entries=2))
        await consumer.initialize()
        await consumer.ack(1, dequeue=True)
        assert await ingest(runtime, 1, 3) == 1


async def test_should_drain_waiting_requests_on_close_and_refuse_new_ones(tmp_path):
    url = (tmp_path / "store").as_uri()
    store, _ = faulty_store(tmp_path, [FaultRule("delay", ops=frozenset({"put"}), times=None,
                                                 delay_s=(0.1, 0.1))])
    runtime = await IngestorRuntime.start(make_config(tmp_path / "store"), store=store)
    pending = [asyncio.create_task(ingest(runtime, 1, i)) for i in range(20)]
    await asyncio.sleep(0.01)
    assert await runtime.close(10) is True
    assert sum([await p for p in pending]) == 20
    with pytest.raises(Unavailable, match="shutting down"):
        await ingest(runtime, 1, 99)
    assert len(await stored_events(url)) == 20


async def test_should_refuse_oversize_events_and_bad_ids(tmp_path):
    async with running(make_config(tmp_path / "store", max_event_bytes=50)) as runtime:
        stream = runtime.service.stream("pageviews")
        big = stream.from_json(b'{"user_id":"' + b"x" * 100 + b'"}')
        with pytest.raises(PayloadTooLarge) as info:
            await runtime.service.ingest(stream, big)
        assert info.value.details[0]["index"] == 0
        with pytest.raises(BadRequest, match="idempotency key"):
            await runtime.service.ingest(stream, stream.from_json(b'{"user_id":"a"}'),
                                         idempotency_key="k" * 300)


async def test_should_take_ids_from_body_field_then_key_then_generate(tmp_path):
    url = (tmp_path / "store").as_uri()
    async with running(make_config(tmp_path / "store")) as runtime:
        service = runtime.service
        orders = service.stream("orders")
        await service.ingest(orders, orders.from_json(b'[{"order_id":"o1"},{"order_id":"o2"}]'),
                             idempotency_key="ignored-when-body-has-ids")
        pv = service.stream("pageviews")
        await service.ingest(pv, pv.from_json(body(2)), idempotency_key="req-7")
        await service.ingest(pv, pv.from_json(body(1, 5)), idempotency_key="req-8")
        await service.ingest(pv, pv.from_json(body(2, 10)))
    ids = [e.event_id for e in await stored_events(url)]
    assert ids[:5] == ["o1", "o2", "req-7:0", "req-7:1", "req-8"]
    assert ids[5] != ids[6]
    assert ids[5].endswith("-0")


async def test_should_answer_413_not_429_for_a_request_larger_than_the_buffer(tmp_path):
    config = make_config(tmp_path / "store", buffer_max_bytes=2000, max_body_bytes=2000,
                         flush_bytes=1000)
    async with running(config) as runtime:
        with pytest.raises(PayloadTooLarge, match="more than this ingestor's whole buffer"):
            await ingest(runtime, 60)  # canonical + framing overhead exceeds 2000 bytes


async def test_should_point_at_the_event_whose_id_is_too_long(tmp_path):
    async with running(make_config(tmp_path / "store")) as runtime:
        orders = runtime.service.stream("orders")
        body = b'[{"order_id":"ok"},{"order_id":"' + b"x" * 300 + b'"}]'
        with pytest.raises(BadRequest) as info:
            await runtime.service.ingest(orders, orders.from_json(body))
        assert info.value.details[0]["index"] == 1
        assert info.value.code == "invalid_event_id"


async def test_should_refuse_instead_of_hanging_when_the_flusher_is_gone(tmp_path):
    async with running(make_config(tmp_path / "store")) as runtime:
        task = runtime.batcher._loop_task
        assert task is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(Unavailable) as info:
            await asyncio.wait_for(ingest(runtime, 1), 5)
        assert info.value.code == "flusher_stopped"


async def test_should_count_queue_time_against_the_flush_deadline(tmp_path):
    """Regression (found by the chaos harness): with a stalled store every flush slot is
    busy for the whole timeout, and a batch queued behind them used to wait several
    timeouts in a row — a hang for its client. The deadline now runs from sealing."""
    store, _ = faulty_store(tmp_path, [FaultRule(
        "delay", ops=frozenset({"put"}), times=None, delay_s=(1.5, 1.5))])
    config = make_config(tmp_path / "store", flush_events=1, flush_timeout_s=1.0)
    runtime = await IngestorRuntime.start(config, store=store, probe=False)
    assert runtime.batcher.settings.max_inflight < 6  # so some batches must queue
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def one(i: int) -> float:
            with pytest.raises(Unavailable) as info:
                await ingest(runtime, 1, i)
            assert info.value.code == "store_timeout"
            return loop.time() - started

        waited = await asyncio.gather(*(one(i) for i in range(6)))
    finally:
        await runtime.close(10)
    # every request answered within one deadline (plus scheduling slack), none after two
    assert max(waited) < 1.7, waited


async def test_should_not_ack_a_batch_its_group_refused_when_the_append_answer_is_lost(
        tmp_path):
    """Issue #22, case 1, through the buffer: batch Y waits behind a slow manifest write
    until it is past the append deadline, then goes in one group commit with a fresh batch
    Z. The store applies that write (Z appended, Y refused) but loses its answer; the retry
    must answer Y's requests 503 (not appended), never 200.

    The flush timeout here exceeds the append deadline, which the config loader refuses
    (``ingestor.flush_timeout_s < manifest.append_deadline_s``): the producer must be exact
    even so, for every direct user of it."""
    deadline_s = 1.0
    files = tmp_path / "store" / "batches"

    async def hold_the_first_append() -> None:  # until Z's file is written and queued
        while len(list(files.rglob("*.ifb"))) < 3:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)

    store, faulty = faulty_store(tmp_path, [
        FaultRule("delay", ops=frozenset({"put"}), key_prefix=ManifestConfig.key,
                  delay_s=(0, 0), on_fire=hold_the_first_append),
        FaultRule("delay", ops=frozenset({"put"}), key_prefix="batches/", skip=2,
                  delay_s=(1.5, 1.5)),  # Z's file is written 1.5 s after Y's
        FaultRule("lose_response", ops=frozenset({"put"}), key_prefix=ManifestConfig.key,
                  skip=1)])
    config = make_config(tmp_path / "store")
    config = type(config)(store=config.store, ingestor=config.ingestor, streams=config.streams,
                          manifest=type(config.manifest)(append_deadline_s=deadline_s))
    runtime = await IngestorRuntime.start(config, store=store, probe=False)
    try:
        x = asyncio.create_task(ingest(runtime, 3, 0))
        while not any(files.rglob("*.ifb")):
            await asyncio.sleep(0.01)
        y = asyncio.create_task(ingest(runtime, 2, 10))
        while len(list(files.rglob("*.ifb"))) < 2:
            await asyncio.sleep(0.01)
        z = asyncio.create_task(ingest(runtime, 1, 20))
        assert await x == 3
        with pytest.raises(Unavailable) as info:
            await y
        assert info.value.code == "flush_deadline"
        assert await z == 1
        assert faulty.injected["lose_response"] == 1
        assert runtime.publisher.stats.largest_group == 2  # Y and Z went together
    finally:
        await runtime.close(10)
    manifest = await read_manifest((tmp_path / "store").as_uri())
    assert [e.record_count for e in manifest.entries] == [3, 1]
