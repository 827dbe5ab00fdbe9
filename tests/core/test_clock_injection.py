"""The protocol reads time through an injected clock (issue #22): the manifest CAS loop, the
producer and consumer, the ingest buffer, the registry and GC take ``clock=`` and use it
instead of the system clock, so a simulator can drive them all from one seed. So do the
store's retry layer, the clients' backoff and the ingestor's receive time, token budget and
readiness cache."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time

import pytest
from ingest_support import ORDERS, PAGEVIEWS, make_config, stored_events

from collector.gc import collect_garbage
from icefloe.client import AsyncGrpcClient, Backoff, HttpClient, IngestRejected
from icefloe.client.http import retry_after
from icefloe.clock import ManualClock
from icefloe.errors import TransientStoreError
from icefloe.manifest import BatchRef, ManifestConfig, ManifestConsumer, ManifestProducer
from icefloe.registry import ops
from icefloe.registry.model import Registry
from icefloe.store import StoreOptions, open_store
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryingAsyncStore, RetryingStore, RetryPolicy, call_with_retry
from ingestor.auth import FAILED_BURST, FAILED_PER_S, TokenAuthority
from ingestor.errors import Overloaded, PermissionDenied
from ingestor.runtime import IngestorRuntime


def local(tmp_path) -> ThreadedAsyncStore:
    return ThreadedAsyncStore(LocalStore(tmp_path / "store"))


async def test_should_back_off_and_give_up_on_the_injected_clock(tmp_path):
    """A 412 storm with a 60 s contention budget and backoff up to 10 s: on a manual clock
    the producer gives up after 60 simulated seconds, in no real time at all."""
    clock = ManualClock()
    store = FaultyAsyncStore(local(tmp_path), [FaultRule(
        "precondition", ops=frozenset({"put"}), key_prefix=ManifestConfig.key, times=None)])
    config = ManifestConfig(conflict_backoff=RetryPolicy(
        max_attempts=1_000_000, base_delay_s=1.0, max_delay_s=10.0, budget_s=60.0))
    producer = ManifestProducer(store, config, clock=clock)
    start = clock.monotonic()
    batch = BatchRef("batches/a", 1, 0, 1, ("s",), written_at=clock.time())
    with pytest.raises(TransientStoreError, match="compare-and-swap races"):
        await asyncio.wait_for(producer.append(batch), 10)
    assert 40 < clock.monotonic() - start <= 60


async def test_should_read_an_absent_manifest_at_the_injected_time(tmp_path):
    clock = ManualClock(start=2_000_000_000.0)
    consumer = ManifestConsumer(local(tmp_path), clock=clock)
    await consumer.initialize()
    lease = (await consumer.snapshot()).consumer.lease_expires_at
    assert lease == 2_000_000_000.0 + consumer.config.lease_s  # the empty manifest's time


def test_should_stamp_registry_changes_with_the_injected_clock():
    clock = ManualClock(start=1_900_000_000.0)
    registry = ops.create_source(Registry(), ops.SourceSpec(id="a", sinks=()), clock=clock)
    assert registry.updated_at == 1_900_000_000.0
    clock.advance(5)
    registry = ops.delete_source(registry, "a", clock=clock)
    (tombstone,) = registry.sources
    assert tombstone.deleted_at == registry.updated_at == 1_900_000_005.0


async def test_should_time_a_gc_run_on_the_injected_clock(tmp_path):
    clock = ManualClock()
    result = await collect_garbage(local(tmp_path), ManifestConfig.key, grace_s=0.0,
                                   clock=clock)
    assert result.seconds == 0.0  # the manual clock did not move during the run


async def test_should_measure_the_flush_interval_on_the_injected_clock(tmp_path):
    """With a 60 s minimum flush interval a second request waits for the interval to pass
    on the injected clock, however long that takes in real time."""
    clock = ManualClock(start=time.time())
    config = make_config(tmp_path / "store", min_flush_interval_ms=60_000,
                         early_flush_requests=0)
    runtime = await IngestorRuntime.start(config, clock=clock)
    try:
        stream = runtime.service.stream("pageviews")

        def ingest(i: int) -> asyncio.Future[int]:
            body = stream.from_json(b'[{"user_id":"u%d"}]' % i)
            return asyncio.ensure_future(runtime.service.ingest(stream, body))

        assert await asyncio.wait_for(ingest(0), 5) == 1  # nothing waited: at once
        second = ingest(1)
        await asyncio.sleep(0.5)
        assert not second.done()  # the interval has not passed on the clock
        clock.advance(61)
        assert await asyncio.wait_for(second, 5) == 1
    finally:
        await runtime.close(10)


# -- the store's retry layer, the clients' backoff, the ingestor's receive time (#22 leftovers)

STORM = RetryPolicy(max_attempts=1_000_000, base_delay_s=1.0, max_delay_s=10.0, budget_s=60.0)
"""Backoff of up to 10 s within a 60 s budget: minutes of real time on the system clock."""


async def test_should_spend_the_store_retry_budget_on_the_injected_clock(tmp_path):
    """A store that fails every call: the retry layer backs off and gives up after 60
    seconds of the injected clock, in no real time."""
    clock = ManualClock()
    failing = FaultyAsyncStore(local(tmp_path), [FaultRule("fail", times=None)])
    store = RetryingAsyncStore(failing, STORM, clock=clock)
    start = clock.monotonic()
    with pytest.raises(TransientStoreError, match="gave up after"):
        await asyncio.wait_for(store.get("k"), 10)
    assert 40 < clock.monotonic() - start <= 60


@pytest.mark.parametrize("first", ["lose_response", "fail"])
async def test_a_write_given_up_on_is_ambiguous_if_any_attempt_was(tmp_path, first):
    """A PUT whose answer was lost, then refused outright on its retries, may have landed:
    the error given up with says so (callers that report "possibly stored" read it), though
    the last attempt alone was a clean refusal."""
    clock = ManualClock()
    rules = [FaultRule(first, ops=frozenset({"put"})),
             FaultRule("fail", ops=frozenset({"put"}), times=None)]
    store = RetryingAsyncStore(FaultyAsyncStore(local(tmp_path), rules),
                               RetryPolicy(max_attempts=3, base_delay_s=0.1), clock=clock)
    with pytest.raises(TransientStoreError, match="gave up after 3 attempt") as given_up:
        await asyncio.wait_for(store.put("k", b"v"), 10)
    assert given_up.value.ambiguous is (first == "lose_response")


def test_should_spend_the_sync_retry_budget_on_the_injected_clock():
    clock = ManualClock()
    attempts = []

    def down() -> None:
        attempts.append(clock.monotonic())
        raise TransientStoreError("down", op="get", key="k")

    started = time.monotonic()
    with pytest.raises(TransientStoreError, match="gave up after"):
        call_with_retry(STORM, down, clock)
    assert 40 < attempts[-1] - attempts[0] <= 60
    assert time.monotonic() - started < 5


def test_should_hand_the_store_options_clock_to_the_retry_layer(tmp_path):
    clock = ManualClock()
    store = open_store((tmp_path / "store").as_uri(), StoreOptions(clock=clock))
    assert isinstance(store, RetryingStore)
    assert store.clock is clock


def test_should_read_a_retry_after_date_against_the_injected_clock():
    clock = ManualClock(start=1_900_000_000.0)
    assert retry_after(email.utils.formatdate(1_900_000_030, usegmt=True), clock) == 30.0


def closed_port() -> int:
    """A local port nothing listens on (bound, read, released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


SLOW = Backoff(base_s=60.0, max_s=60.0)
"""Up to a minute between retries: the test would take minutes on the system clock."""


def test_should_back_off_an_http_client_on_the_injected_clock():
    clock = ManualClock()
    started = time.monotonic()
    with HttpClient(f"http://127.0.0.1:{closed_port()}", retries=3, timeout=2, backoff=SLOW,
                    clock=clock) as client, pytest.raises(IngestRejected) as info:
        client.send("pageviews", [{"user_id": "u"}])
    assert info.value.code == "connection_failed"
    assert info.value.attempts == 4
    assert clock.monotonic() > ManualClock().monotonic()  # three backoffs, on the clock
    assert time.monotonic() - started < 5


async def test_should_back_off_a_grpc_client_on_the_injected_clock():
    clock = ManualClock()
    started = time.monotonic()
    async with AsyncGrpcClient(f"127.0.0.1:{closed_port()}", retries=3, timeout=2,
                               backoff=SLOW, clock=clock) as client:
        with pytest.raises(IngestRejected) as info:
            await client.publish("pageviews", [{"user_id": "u"}])
    assert info.value.attempts == 4
    assert clock.monotonic() > ManualClock().monotonic()
    assert time.monotonic() - started < 5


async def test_should_stamp_received_at_with_the_injected_clock(tmp_path):
    """The ingestor's receive time (``received_at`` of every event) is the clock's."""
    clock = ManualClock(start=1_900_000_000.25)
    config = make_config(tmp_path / "store")
    runtime = await IngestorRuntime.start(config, clock=clock)
    try:
        stream = runtime.service.stream("pageviews")
        body = stream.from_json(b'[{"user_id":"u1"}]')
        assert await asyncio.wait_for(runtime.service.ingest(stream, body), 5) == 1
    finally:
        await runtime.close(10)
    (event,) = await stored_events(config.store.url)
    assert event.received_at_ms == 1_900_000_000_250


async def test_should_refill_the_wrong_token_budget_on_the_injected_clock(tmp_path):
    """An address that spent its wrong-token budget is throttled until the injected clock
    has moved on, however much real time passes."""
    clock = ManualClock()
    authority = TokenAuthority(make_config(tmp_path, (PAGEVIEWS, ORDERS)), clock=clock)
    for i in range(int(FAILED_BURST)):
        with pytest.raises(PermissionDenied):
            await authority.authorize("orders", f"ifl_wrong-{i}", "10.0.0.1")
    with pytest.raises(Overloaded, match="too many wrong tokens"):
        await authority.authorize("orders", "ifl_wrong-next", "10.0.0.1")
    clock.advance(1 / FAILED_PER_S)
    with pytest.raises(PermissionDenied):  # one verification's worth refilled
        await authority.authorize("orders", "ifl_wrong-later", "10.0.0.1")
