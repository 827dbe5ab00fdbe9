"""Kafka producer ids: unique across racing allocators and restarts, on a local directory and
on the moto S3 server; corrupt objects refused untouched; faults at the store boundary."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
from _workers import store_options

from icefloe.config import AdminSection, Config
from icefloe.errors import NotFound, PermanentStoreError, TransientStoreError
from icefloe.store import open_async_store
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.base import AsyncObjectStore
from icefloe.store.faults import FaultRule, FaultyAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy
from ingestor.kafka.producer_ids import ProducerIds, ProducerIdsDocument, producer_ids_key

KEY = producer_ids_key(Config())
FAST = RetryPolicy(max_attempts=50, base_delay_s=0.001, max_delay_s=0.005, budget_s=30)


@pytest.fixture(params=["local", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[AsyncObjectStore]:
    """An empty store: a local directory or a fresh bucket on the moto S3 server."""
    if request.param == "local":
        opened = open_async_store((tmp_path / "store").as_uri())
    else:
        target = request.getfixturevalue("s3_bucket")
        opened = open_async_store(target.url, store_options(target.endpoint_url))
    yield opened
    await opened.close()


def local(tmp_path, rules: list[FaultRule]) -> tuple[FaultyAsyncStore, AsyncObjectStore]:
    """A local store behind injected faults, and the same directory without them."""
    plain = ThreadedAsyncStore(LocalStore(tmp_path / "store"))
    return FaultyAsyncStore(plain, rules, seed=3), plain


async def stored(store: AsyncObjectStore) -> ProducerIdsDocument:
    return msgspec.json.decode((await store.get(KEY)).data, type=ProducerIdsDocument)


def unused_tail(ids: ProducerIds) -> range:
    block = ids.block
    assert block is not None
    return block[len(block) - ids.remaining:]


def test_key_lives_next_to_the_registry() -> None:
    assert KEY == "registry/kafka/producer-ids.json"
    nested = Config(admin=AdminSection(registry_key="control/reg/registry.json"))
    assert producer_ids_key(nested) == "control/reg/kafka/producer-ids.json"
    assert producer_ids_key(Config(admin=AdminSection(registry_key="r.json"))) == \
        "kafka/producer-ids.json"


async def test_racing_allocators_never_share_an_id(store: AsyncObjectStore) -> None:
    allocators = [ProducerIds(store, KEY, block_size=3, backoff=FAST) for _ in range(5)]

    async def draw(ids: ProducerIds) -> list[int]:
        await ids.start()
        return [await ids.next_id() for _ in range(10)]

    drawn = await asyncio.gather(*(draw(a) for a in allocators))
    everything = [i for ids in drawn for i in ids]
    assert len(everything) == len(set(everything)) == 50
    assert min(everything) >= 1
    assert sum(a.stats.conflicts for a in allocators) > 0  # the CAS races did happen
    doc = await stored(store)
    assert doc.claims == sum(a.blocks_claimed for a in allocators) == 5 * 4
    # no gaps but the unused tails of each allocator's current block
    tails = {i for a in allocators for i in unused_tail(a)}
    assert set(range(1, doc.next)) - set(everything) == tails
    assert len({a.slot for a in allocators}) == 5  # first blocks differ, so slots do


async def test_concurrent_callers_in_one_process_share_blocks(store: AsyncObjectStore) -> None:
    ids = ProducerIds(store, KEY, block_size=7, backoff=FAST)
    drawn = await asyncio.gather(*(ids.next_id() for _ in range(50)))
    assert sorted(drawn) == list(range(1, 51))
    assert ids.blocks_claimed == 8  # ceil(50 / 7): never two claims for one exhaustion
    assert ids.remaining == 6


async def test_restart_continues_after_the_last_claimed_block(store: AsyncObjectStore) -> None:
    before = ProducerIds(store, KEY, block_size=10, backoff=FAST)
    await before.start()
    handed = [await before.next_id() for _ in range(15)]  # two blocks: 1..20 claimed
    assert before.slot == 0
    after = ProducerIds(store, KEY, block_size=10, backoff=FAST)
    await after.start()
    assert await after.next_id() == 21 > max(handed)
    assert after.slot == 2  # the third block ever claimed
    assert await stored(store) == ProducerIdsDocument(next=31, block=10, claims=3)


async def test_slot_wraps_at_64_and_needs_start(tmp_path) -> None:
    store = ThreadedAsyncStore(LocalStore(tmp_path / "store"))
    waiting = ProducerIds(store, KEY, block_size=1)
    with pytest.raises(RuntimeError, match=r"after `await start\(\)`"):
        _ = waiting.slot
    slots = []
    for _ in range(66):
        ids = ProducerIds(store, KEY, block_size=1)
        await ids.start()
        await ids.start()  # idempotent: no second claim
        slots.append(ids.slot)
    assert slots == [*range(64), 0, 1]
    assert (await stored(store)).claims == 66


@pytest.mark.parametrize("body", [
    b"not json",
    b'{"format": 1, "next": 0, "block": 5, "claims": 1}',
    b'{"format": 1, "next": 10, "block": 5, "claims": -1}',
    b'{"format": 1, "next": 10, "block": 5, "claims": 1, "extra": true}',
    b'{"format": 1, "next": "10", "block": 5, "claims": 1}',
])
async def test_corrupt_object_is_refused_and_left_alone(store: AsyncObjectStore,
                                                        body: bytes) -> None:
    await store.put(KEY, body)
    ids = ProducerIds(store, KEY, backoff=FAST)
    with pytest.raises(PermanentStoreError,
                       match=r"'registry/kafka/producer-ids.json' is corrupt .*never delete"):
        await ids.next_id()
    assert (await store.get(KEY)).data == body


async def test_other_format_is_refused(tmp_path) -> None:
    store = ThreadedAsyncStore(LocalStore(tmp_path / "store"))
    body = b'{"format": 2, "next": 10, "block": 5, "claims": 1}'
    await store.put(KEY, body)
    with pytest.raises(PermanentStoreError, match=r"has format 2; .*upgrade icefloe"):
        await ProducerIds(store, KEY).start()
    assert (await store.get(KEY)).data == body


async def test_ids_are_int64_and_refuse_to_wrap(tmp_path) -> None:
    store = ThreadedAsyncStore(LocalStore(tmp_path / "store"))
    await store.put(KEY, ProducerIdsDocument(next=2**63 - 3, claims=9).encode())
    ids = ProducerIds(store, KEY, block_size=3)
    assert [await ids.next_id() for _ in range(3)] == [2**63 - 3, 2**63 - 2, 2**63 - 1]
    with pytest.raises(PermanentStoreError, match="int64 producer ids are exhausted"):
        await ids.next_id()
    with pytest.raises(ValueError, match="block_size 0"):
        ProducerIds(store, KEY, block_size=0)


async def test_lost_races_are_retried_then_succeed(tmp_path) -> None:
    faulty, plain = local(tmp_path, [FaultRule("precondition", ops=frozenset({"put"}),
                                               times=3)])
    ids = ProducerIds(faulty, KEY, block_size=4, backoff=FAST)
    assert await ids.next_id() == 1
    assert ids.stats.conflicts == 3
    assert faulty.injected["precondition"] == 3
    assert (await stored(plain)).next == 5


async def test_sustained_contention_fails_within_its_bound(tmp_path) -> None:
    faulty, plain = local(tmp_path, [FaultRule("precondition", ops=frozenset({"put"}),
                                               times=None)])
    bound = RetryPolicy(max_attempts=4, base_delay_s=0.001, max_delay_s=0.002, budget_s=5)
    ids = ProducerIds(faulty, KEY, block_size=4, backoff=bound)
    with pytest.raises(TransientStoreError) as caught:
        await ids.next_id()
    message = str(caught.value)
    assert message.startswith("kafka producer ids 'registry/kafka/producer-ids.json': could "
                              "not claim a block of 4 ids: kafka producer ids")
    assert "lost 4 compare-and-swap races in a row" in message
    assert "No producer id was handed out" in message
    assert caught.value.key == KEY
    assert caught.value.code == "CasContention"
    assert faulty.injected["precondition"] == 4
    assert ids.remaining == 0
    assert ids.blocks_claimed == 0
    with pytest.raises(NotFound):
        await plain.get(KEY)  # nothing was written


async def test_transient_put_errors_are_retried_by_the_store_layer(tmp_path) -> None:
    faulty, plain = local(tmp_path, [FaultRule("fail", ops=frozenset({"put"}), times=2)])
    ids = ProducerIds(RetryingAsyncStore(faulty, FAST), KEY, block_size=4, backoff=FAST)
    assert await ids.next_id() == 1
    assert faulty.injected["fail"] == 2
    assert (await stored(plain)).claims == 1


async def test_store_outage_surfaces_a_precise_error_and_then_recovers(tmp_path) -> None:
    rule = FaultRule("fail", ops=frozenset({"put"}), times=None)
    faulty, _ = local(tmp_path, [rule])
    bound = RetryPolicy(max_attempts=3, base_delay_s=0.001, max_delay_s=0.002, budget_s=5)
    ids = ProducerIds(RetryingAsyncStore(faulty, bound), KEY, block_size=4, backoff=FAST)
    with pytest.raises(TransientStoreError, match=r"could not claim a block of 4 ids: "
                       r"injected fail on put .*gave up after 3 attempt"):
        await ids.next_id()
    rule.times = rule.fired  # the store is back
    assert await ids.next_id() == 1


async def test_a_lost_response_leaves_a_gap_never_a_duplicate(tmp_path) -> None:
    faulty, plain = local(tmp_path, [FaultRule("lose_response", ops=frozenset({"put"}),
                                               times=1)])
    ids = ProducerIds(RetryingAsyncStore(faulty, FAST), KEY, block_size=4, backoff=FAST)
    # the first claim (ids 1..4) landed but its answer was lost: those ids are never used
    assert await ids.next_id() == 5
    assert ids.slot == 1
    other = ProducerIds(plain, KEY, block_size=4)
    assert await other.next_id() == 9
    assert (await stored(plain)).claims == 3
