"""Synthetic Kafka offsets: monotonic per partition whatever the clock does, bounded memory,
slots keeping two ingestors apart."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from icefloe.clock import ManualClock
from ingestor.kafka.offsets import EPOCH_MS, MAX_COUNT, SyntheticOffsets

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC).timestamp()
START_MS = round(START * 1000)


def offsets(slot: int = 5, **kwargs: int) -> tuple[SyntheticOffsets, ManualClock]:
    clock = ManualClock(START)
    return SyntheticOffsets(slot, clock=clock, **kwargs), clock


def test_epoch_is_2025_utc() -> None:
    assert round(datetime(2025, 1, 1, tzinfo=UTC).timestamp() * 1000) == EPOCH_MS


def test_layout_names_ms_slot_and_counter() -> None:
    gen, _ = offsets(slot=5)
    base = gen.assign("t", 0, 10)
    assert base == ((START_MS - EPOCH_MS) << 22) | (5 << 16)
    assert SyntheticOffsets.describe(base) == (START_MS, 5, 0)
    assert SyntheticOffsets.describe(gen.assign("t", 0, 1)) == (START_MS, 5, 10)
    assert 0 < base < 2**63


def test_monotonic_per_partition_and_partitions_independent() -> None:
    gen, clock = offsets()
    seen: dict[tuple[str, int], int] = {}
    for step in range(500):
        key = ("a" if step % 3 else "b", step % 4)
        count = 1 + step % 7
        base = gen.assign(*key, count)
        assert base > seen.get(key, -1)
        seen[key] = base + count - 1
        if step % 50 == 0:
            clock.advance(0.001)
    # a fresh partition starts at counter 0 of the current ms, not after the others
    assert SyntheticOffsets.describe(gen.assign("c", 0, 1))[2] == 0


def test_clock_going_backwards_never_lowers_offsets() -> None:
    gen, clock = offsets()
    first = gen.assign("t", 0, 3)
    clock.offset_s = -3600.0  # an NTP step an hour back
    second = gen.assign("t", 0, 3)
    assert second == first + 3
    # a partition first seen after the step still starts at the virtual clock, not an hour ago
    other = gen.assign("u", 1, 1)
    assert SyntheticOffsets.describe(other)[0] == START_MS
    clock.offset_s = 0.0
    clock.advance(0.002)
    assert SyntheticOffsets.describe(gen.assign("t", 0, 1)) == (START_MS + 2, 5, 0)


def test_full_cell_moves_to_the_next_ms_ahead_of_the_wall_clock() -> None:
    gen, _ = offsets()
    a = gen.assign("t", 0, 60_000)
    b = gen.assign("t", 0, 10_000)  # 60_000 + 10_000 > 65_536: the next ms
    assert SyntheticOffsets.describe(a) == (START_MS, 5, 0)
    assert SyntheticOffsets.describe(b) == (START_MS + 1, 5, 0)
    c = gen.assign("t", 0, MAX_COUNT)  # a whole cell
    assert SyntheticOffsets.describe(c) == (START_MS + 2, 5, 0)
    assert SyntheticOffsets.describe(c + MAX_COUNT - 1) == (START_MS + 2, 5, MAX_COUNT - 1)
    # the virtual clock ran 2 ms ahead, for every partition of the process
    assert SyntheticOffsets.describe(gen.assign("other", 3, 1))[0] == START_MS + 2


def test_exactly_filling_a_cell_stays_in_it() -> None:
    gen, _ = offsets()
    a = gen.assign("t", 0, MAX_COUNT - 1)
    b = gen.assign("t", 0, 1)
    assert b == a + MAX_COUNT - 1
    assert SyntheticOffsets.describe(b)[2] == MAX_COUNT - 1


@pytest.mark.parametrize(("count", "reason"), [
    (MAX_COUNT + 1, r"orders/7 holds 65537 records; .*1\.\.65536 .*send smaller batches"),
    (0, "orders/7 holds 0 records; a batch needs at least one"),
    (-1, "orders/7 holds -1 records; a batch needs at least one"),
])
def test_refuses_batches_it_cannot_number(count: int, reason: str) -> None:
    gen, _ = offsets()
    with pytest.raises(ValueError, match=reason):
        gen.assign("orders", 7, count)
    assert gen.tracked == 0  # nothing remembered for a refused batch


def test_refuses_bad_slot_and_partition() -> None:
    with pytest.raises(ValueError, match=r"slot 64 must be in 0\.\.63"):
        SyntheticOffsets(64)
    gen, _ = offsets()
    with pytest.raises(ValueError, match="partition -1 of topic 't'"):
        gen.assign("t", -1, 1)


def test_slots_separate_two_processes_at_the_same_ms() -> None:
    clock = ManualClock(START)
    one, two = SyntheticOffsets(0, clock=clock), SyntheticOffsets(1, clock=clock)
    a = [one.assign("t", 0, 100) + i for i in range(100)]
    b = [two.assign("t", 0, 100) + i for i in range(100)]
    assert SyntheticOffsets.describe(a[0])[0] == SyntheticOffsets.describe(b[0])[0]
    assert not set(a) & set(b)
    assert max(a) < min(b)  # slot 1's cell lies above slot 0's within a millisecond


def test_memory_is_bounded_and_eviction_keeps_monotonicity() -> None:
    gen, clock = offsets(max_partitions=3)
    last = gen.assign("t", 0, 5) + 4
    for partition in range(1, 4):  # three newer partitions push partition 0 out
        gen.assign("t", partition, 1)
    assert gen.tracked == 3
    again = gen.assign("t", 0, 1)  # same wall ms: must still be above its forgotten last
    assert again > last
    assert SyntheticOffsets.describe(again)[0] == START_MS + 1
    assert gen.tracked == 3
    clock.advance(1.0)
    assert SyntheticOffsets.describe(gen.assign("t", 9, 1)) == (START_MS + 1000, 5, 0)


def test_recently_used_partitions_survive_eviction() -> None:
    gen, _ = offsets(max_partitions=2)
    gen.assign("t", 0, 1)
    gen.assign("t", 1, 1)
    gen.assign("t", 0, 1)  # touch 0: partition 1 is now the oldest
    gen.assign("t", 2, 1)
    follow = gen.assign("t", 0, 1)
    assert SyntheticOffsets.describe(follow) == (START_MS, 5, 2)


def test_clock_before_2025_still_gives_positive_offsets() -> None:
    gen = SyntheticOffsets(0, clock=ManualClock(1_600_000_000.0))
    first = gen.assign("t", 0, 1)
    assert first > 0
    assert gen.assign("t", 0, 1) > first


def test_describe_refuses_non_offsets() -> None:
    with pytest.raises(ValueError, match="not a synthetic int64 offset"):
        SyntheticOffsets.describe(-1)
