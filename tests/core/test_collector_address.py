"""The active collector's published address: round-trips on a real (local) store, reads as
None when absent or undecodable (then ``icefloe run`` asks the config's address), and a
wildcard or IPv6 host becomes a URL a client on this machine can ask."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import msgspec
import pytest

from icefloe.clock import ManualClock
from icefloe.collector_address import KEY, Address, local_url, publish, read
from icefloe.errors import NotFound
from icefloe.store import open_async_store
from icefloe.store.faults import FaultRule, FaultyAsyncStore


async def test_an_address_round_trips_and_the_newest_counts(tmp_path: Path) -> None:
    store = open_async_store((tmp_path / "store").as_uri())
    try:
        assert await read(store) is None
        await publish(store, Address("collector-A", 1, "http", "0.0.0.0", 9464))
        await publish(store, Address("collector-B", 2, "https", "::", 40001))
        got = await read(store)
        assert got == Address("collector-B", 2, "https", "::", 40001)
        assert got is not None
        assert got.url() == "https://127.0.0.1:40001"
    finally:
        await store.close()


async def test_an_undecodable_record_reads_as_none_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_async_store((tmp_path / "store").as_uri())
    try:
        await store.put(KEY, b'{"holder": 7}')
        with caplog.at_level(logging.WARNING):
            assert await read(store) is None
        assert "cannot be decoded" in caplog.text
        assert KEY in caplog.text
    finally:
        await store.close()


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "http://127.0.0.1:9464"),
    ("", "http://127.0.0.1:9464"),
    ("collector.internal", "http://collector.internal:9464"),
    ("fd00::5", "http://[fd00::5]:9464"),
])
def test_urls(host: str, url: str) -> None:
    assert local_url("http", host, 9464) == url


async def test_an_older_holder_never_overwrites_a_newer_one(tmp_path: Path) -> None:
    """The record only moves to the same or a higher epoch: a collector whose publish is
    retried late must not hide the holder that took over since."""
    store = open_async_store((tmp_path / "store").as_uri())
    newer = Address("collector-B", 2, "http", "127.0.0.1", 40001)
    try:
        assert await publish(store, newer) is True
        assert await publish(store, Address("collector-A", 1, "http", "127.0.0.1", 9464)) \
            is False
        assert await read(store) == newer
        etag = (await store.get(KEY)).etag
        assert await publish(store, newer) is True  # already there: nothing written
        assert (await store.get(KEY)).etag == etag
        newest = Address("collector-C", 3, "http", "127.0.0.1", 40002)
        assert await publish(store, newest) is True
        assert await read(store) == newest
    finally:
        await store.close()


async def test_a_write_in_between_is_looked_at_again(tmp_path: Path) -> None:
    """Another holder writes between this one's read and its conditional write: a newer
    record wins (False, left alone), an older one is replaced."""
    inner = open_async_store((tmp_path / "store").as_uri())
    ours = Address("collector-B", 2, "http", "127.0.0.1", 40001)
    try:
        for theirs, expected, final in (
                (Address("collector-C", 3, "http", "127.0.0.1", 40002), False, "collector-C"),
                (Address("collector-A", 1, "http", "127.0.0.1", 9464), True, "collector-B")):
            with contextlib.suppress(NotFound):  # the first round's record
                await inner.delete(KEY)

            async def write_theirs(record: Address = theirs) -> None:
                await inner.put(KEY, msgspec.json.encode(record))
            store = FaultyAsyncStore(inner, [FaultRule("delay", ops=frozenset({"put"}),
                                                       key_prefix=KEY, delay_s=(0.0, 0.0),
                                                       on_fire=write_theirs)])
            assert await publish(store, ours) is expected
            got = await read(inner)
            assert got is not None
            assert got.holder == final
    finally:
        await inner.close()


async def test_a_failed_publish_is_tried_again_until_it_lands(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A store that refuses the write (past its own retries) costs waits, not the record:
    tried again with doubling waits (capped), warned about once, published in the end; a
    write whose answer was lost counts as done when it is read back."""
    from collector.runner import ADDRESS_RETRY_MAX_S, publish_until_done  # why: pyspark

    inner = open_async_store((tmp_path / "store").as_uri())
    address = Address("collector-B", 2, "http", "127.0.0.1", 40001)
    store = FaultyAsyncStore(inner, [
        FaultRule("fail", ops=frozenset({"put"}), key_prefix=KEY, times=7),
        FaultRule("lose_response", ops=frozenset({"put"}), key_prefix=KEY, times=1, skip=7)])
    clock = ManualClock()
    started = clock.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="icefloe.collector"):
            assert await publish_until_done(store, address, clock) is True
        assert await read(inner) == address
        assert store.injected == {"fail": 7, "lose_response": 1}
        waited = clock.monotonic() - started
        assert waited == 1 + 2 + 4 + 8 + 16 + ADDRESS_RETRY_MAX_S * 3  # 8 failures, capped
        assert caplog.text.count("collector address not published") == 1
        assert "published after 8 failed tries" in caplog.text
    finally:
        await inner.close()
