"""The protocol reads time through an injected clock (issue #22): the manifest CAS loop, the
producer and consumer, the ingest buffer, the registry and GC take ``clock=`` and use it
instead of the system clock, so a simulator can drive them all from one seed."""

from __future__ import annotations

import asyncio
import time

import pytest
from ingest_support import make_config

from collector.gc import collect_garbage
from icefloe.clock import ManualClock
from icefloe.errors import TransientStoreError
from icefloe.manifest import BatchRef, ManifestConfig, ManifestConsumer, ManifestProducer
from icefloe.registry import ops
from icefloe.registry.model import Registry
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryPolicy
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
