"""opendata's ingest buffer, typed as its users do (#37): opaque byte entries in, the same
bytes out; ``batch_compression``; a consumer that resumes after positions it stored itself
(``initialize(start_after=…)``) and acknowledges in bulk (``flush()``).

opendata's own API (``buffer/`` of github.com/opendata-oss/opendata, RFC 0001): a producer
takes ``Vec<Bytes>``; the consumer's ``initialize(last_acked_sequence)`` "resumes after
sequence seq", ``next_batch()`` gives the entries, ``flush()`` dequeues what was acked; the
batch file footer's compression byte is 0 (none) or 1 (zstd). Here: a real local store, the
in-process ``Ingestor``/``Collector`` and a real HTTP ingestor on the same manifest.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from ingest_support import http_serving, make_config, read_manifest, running

from icefloe.config import Column, Config, StreamConfig
from icefloe.errors import ConfigError
from icefloe.formats.batch import Compression, read_footer
from icefloe.manifest.embed import Collector
from icefloe.store import open_async_store
from icefloe.streams import validate_stream
from ingestor.embed import Ingestor
from ingestor.errors import BadRequest

ENTRIES = StreamConfig(name="entries", table="buffer.entries", payload="bytes",
                       columns=(Column("entry", "binary", required=True),))
OPAQUE = [b"\x00\x01\xff\xfe", b"line one\nline two\r\n", b"", b'{"not": "parsed"}',
          bytes(range(256))]


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return make_config(tmp_path / "store", (ENTRIES,))


async def produce(config: Config, *batches: list[bytes]) -> None:
    """One durable batch file (one manifest entry) per list, in order."""
    async with await Ingestor.open(config) as ingestor:
        for entries in batches:
            assert await ingestor.ingest(entries, stream="entries") == len(entries)


async def batch_footers(config: Config) -> list[Compression]:
    store = open_async_store(config.store.url)
    try:
        manifest = await read_manifest(config.store.url)
        return [read_footer((await store.get(entry.location)).data).compression
                for entry in manifest.entries]
    finally:
        await store.close()


async def test_opaque_entries_come_back_as_the_same_bytes(config: Config) -> None:
    await produce(config, OPAQUE)
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        sent = await client.post("/v1/streams/entries/events", content=b"\x07raw\nbody",
                                 headers={"content-type": "application/octet-stream"})
        assert sent.status_code == 202, sent.text
        assert sent.json() == {"accepted": 1}
    async with Collector.open(config) as collector:
        await collector.initialize()
        batch = await collector.next_batch()
        assert batch is not None
        assert [e.payload for e in batch.events] == [*OPAQUE, b"\x07raw\nbody"]
        assert {e.stream for e in batch.events} == {"entries"}


async def test_json_is_refused_by_name_where_entries_are_expected(config: Config,
                                                                  tmp_path: Path) -> None:
    async with await Ingestor.open(config) as ingestor:
        with pytest.raises(BadRequest, match="entry 1 is a str; a bytes stream takes bytes"):
            ingestor.ingest([b"ok", "text"], stream="entries")
    other = make_config(tmp_path / "other", (StreamConfig(
        name="pages", table="web.pages", columns=(Column("url", "string"),)),))
    async with running(other) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        sent = await client.post("/v1/streams/pages/events", content=b"\x00",
                                 headers={"content-type": "application/octet-stream"})
        assert sent.status_code == 400
        assert sent.json()["error"] == "not_a_bytes_stream"


def test_a_bytes_stream_has_one_binary_column() -> None:
    with pytest.raises(ConfigError, match="exactly one plain column of type binary"):
        validate_stream(StreamConfig(name="e", table="b.e", payload="bytes",
                                     columns=(Column("entry", "string"),)), "streams[0]")
    with pytest.raises(ConfigError, match="event_id_field: a payload = \"bytes\" stream"):
        validate_stream(StreamConfig(name="e", table="b.e", payload="bytes",
                                     event_id_field="entry",
                                     columns=(Column("entry", "binary", required=True),)),
                        "streams[0]")


@pytest.mark.parametrize(("setting", "byte"), [("none", Compression.NONE),
                                               ("zstd", Compression.ZSTD)])
async def test_batch_compression_sets_the_footer_byte(tmp_path: Path, setting: str,
                                                     byte: Compression) -> None:
    config = make_config(tmp_path / "store", (ENTRIES,), batch_compression=setting)
    await produce(config, [b"a" * 1000, b"b"])
    assert await batch_footers(config) == [byte]


async def test_readers_take_both_codecs_in_one_queue(tmp_path: Path) -> None:
    zstd = make_config(tmp_path / "store", (ENTRIES,))
    plain = make_config(tmp_path / "store", (ENTRIES,), batch_compression="none")
    await produce(zstd, [b"z1"])
    await produce(plain, [b"n1", b"n2"])
    assert await batch_footers(zstd) == [Compression.ZSTD, Compression.NONE]
    async with Collector.open(zstd) as collector:
        await collector.initialize()
        batch = await collector.next_batch()
        assert batch is not None
        assert [e.payload for e in batch.events] == [b"z1", b"n1", b"n2"]


async def test_start_after_skips_what_the_caller_stored_downstream(config: Config) -> None:
    await produce(config, [b"s0"], [b"s1"], [b"s2"])
    crashed = Collector.open(config, holder="before-the-crash")
    await crashed.initialize()
    first = await crashed.next_batch(max_entries=1)
    assert first is not None
    assert first.positions == {0: 0}
    stored = dict(first.positions)  # written downstream with the data; the queue not acked
    await crashed.close()

    async with Collector.open(config) as resumed:
        await resumed.initialize(takeover=True, start_after=stored)
        batch = await resumed.next_batch()
        assert batch is not None
        assert [e.payload for e in batch.events] == [b"s1", b"s2"]  # s0: never again
        assert await resumed.next_batch() is None
    async with Collector.open(config) as beyond:  # a position past the queue's end
        await beyond.initialize(takeover=True, start_after={0: 2})
        assert await beyond.next_batch() is None


async def test_flush_acknowledges_and_dequeues_everything_read(config: Config) -> None:
    await produce(config, [b"f0"], [b"f1"], [b"f2"])
    async with Collector.open(config) as collector:
        await collector.initialize(start_after={0: 0})
        assert await collector.next_batch(max_entries=1) is not None  # f1
        assert (await read_manifest(config.store.url)).consumer.acked_through == -1
        assert await collector.flush() == {0: 1}
        manifest = await read_manifest(config.store.url)
        assert manifest.consumer.acked_through == 1
        assert [e.sequence for e in manifest.entries] == [2]  # dequeued in the same write
        rest = await collector.next_batch()
        assert rest is not None
        assert [e.payload for e in rest.events] == [b"f2"]
        assert await collector.flush() == {0: 2}
        assert (await read_manifest(config.store.url)).entries == ()
    async with Collector.open(config) as later:
        await later.initialize(takeover=True)
        assert await later.next_batch() is None
