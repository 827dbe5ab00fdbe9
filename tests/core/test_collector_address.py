"""The active collector's published address: round-trips on a real (local) store, reads as
None when absent or undecodable (then ``icefloe run`` asks the config's address), and a
wildcard or IPv6 host becomes a URL a client on this machine can ask."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from icefloe.collector_address import KEY, Address, local_url, publish, read
from icefloe.store import open_async_store


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
