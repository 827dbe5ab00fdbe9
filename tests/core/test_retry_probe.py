"""Retry layer and the conditional-write probe."""

from __future__ import annotations

import asyncio
import random

import pytest

from icefloe.checksum import crc32c
from icefloe.errors import ConditionalWritesUnsupported, PermanentStoreError, TransientStoreError
from icefloe.formats.batch import BatchBuilder, decode_batch
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.base import IfNoneMatch, PutResult
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.probe import PROBE_PREFIX, measure_puts, probe_conditional_writes
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy, call_with_retry
from ingestor.store_helper import ProcessAsyncStore

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.001, max_delay_s=0.002, budget_s=5)


class IgnoresConditions(ThreadedAsyncStore):
    """A store that accepts If-Match/If-None-Match and ignores them, like some S3 clones."""

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        return await super().put(key, data)


def test_should_retry_transient_errors_and_give_up_with_attempt_count():
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransientStoreError("boom", op="get", key="k", code="SlowDown")
        return "ok"

    assert call_with_retry(FAST, flaky) == "ok"
    assert len(calls) == 3

    def always() -> None:
        raise TransientStoreError("down", op="get", key="k")

    with pytest.raises(TransientStoreError, match=r"gave up after 4 attempt\(s\)"):
        call_with_retry(FAST, always)


def test_should_not_retry_permanent_errors():
    calls = []

    def denied() -> None:
        calls.append(1)
        raise PermanentStoreError("access denied", op="get", key="k")

    with pytest.raises(PermanentStoreError):
        call_with_retry(FAST, denied)
    assert calls == [1]


def test_should_stop_retrying_when_the_time_budget_is_spent():
    slow = RetryPolicy(max_attempts=100, base_delay_s=0.05, max_delay_s=0.05, budget_s=0.12)
    calls = []
    # Full jitter draws each delay from [0, 0.05]: seeded, so the count does not depend on
    # luck (about 1 run in 150 drew nine tiny delays in a row and made 10 calls).
    random.seed(20261124)

    def always() -> None:
        calls.append(1)
        raise TransientStoreError("down", op="get", key="k")

    with pytest.raises(TransientStoreError, match="gave up"):
        call_with_retry(slow, always)
    assert len(calls) < 10


@pytest.mark.parametrize("helper", [False, True], ids=["threads", "helper-process"])
def test_should_retry_an_encoded_put_through_injected_put_faults(tmp_path, helper):
    """Batch files go through ``put_encoded``: the fault layer must treat it as a put (so
    chaos rules on puts still hit batch files) and the retry layer must retry it."""
    builder = BatchBuilder()
    builder.extend([b"event-%d" % i for i in range(50)])
    block = builder.to_block()

    async def scenario() -> tuple[int, int, bytes, int]:
        inner = ProcessAsyncStore(tmp_path) if helper else ThreadedAsyncStore(
            LocalStore(tmp_path))
        faulty = FaultyAsyncStore(inner, [FaultRule("fail", ops=frozenset({"put"}),
                                                    times=2)])
        store = RetryingAsyncStore(faulty, FAST)
        try:
            stored = await store.put_encoded("batches/b.ifb", block)
            data = (await store.get("batches/b.ifb")).data
        finally:
            await store.close()
        return faulty.injected["fail"], stored.size, data, stored.crc32c

    injected, size, data, checksum = asyncio.run(scenario())
    assert injected == 2
    assert size == len(data)
    assert checksum == crc32c(data)
    assert decode_batch(data) == [b"event-%d" % i for i in range(50)]


def test_should_reject_bad_policies():
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


def test_should_pass_the_probe_on_a_real_store_and_clean_up(tmp_path):
    store = ThreadedAsyncStore(LocalStore(tmp_path))
    asyncio.run(probe_conditional_writes(store))
    assert asyncio.run(store.list(PROBE_PREFIX)).objects == []


def test_should_detect_a_store_that_ignores_conditional_writes(tmp_path):
    store = IgnoresConditions(LocalStore(tmp_path))
    with pytest.raises(ConditionalWritesUnsupported, match=r"does not enforce conditional"):
        asyncio.run(probe_conditional_writes(store))
    assert asyncio.run(store.list(PROBE_PREFIX)).objects == []


def test_should_retry_the_probe_through_throttling(tmp_path):
    faulty = FaultyAsyncStore(ThreadedAsyncStore(LocalStore(tmp_path)),
                              [FaultRule("slowdown", times=3)])
    asyncio.run(probe_conditional_writes(RetryingAsyncStore(faulty, FAST)))
    assert faulty.injected["slowdown"] == 3


def test_should_time_puts_and_delete_the_written_ones_when_a_put_fails(tmp_path):
    inner = ThreadedAsyncStore(LocalStore(tmp_path))
    store = FaultyAsyncStore(inner, [FaultRule("fail", ops=frozenset({"put"}), skip=3,
                                               times=None)])

    async def scenario() -> None:
        timed = await measure_puts(inner, 5)
        assert timed.count == 5
        assert 0 < timed.p50_s <= timed.p99_s
        with pytest.raises(TransientStoreError):
            await measure_puts(store, 5)
        assert (await inner.list(PROBE_PREFIX)).objects == []
        with pytest.raises(ValueError, match="at least 1"):
            await measure_puts(inner, 0)

    asyncio.run(scenario())
