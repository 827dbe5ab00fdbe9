"""The in-process API: ``Ingestor.ingest`` handles that resolve when durable, and a
``Collector`` that reads, acks and is fenced like the real one — over a real local store,
next to a real HTTP ingestor writing the same manifest."""

from __future__ import annotations

from pathlib import Path

import httpx
import msgspec
import pytest
from ingest_support import PAGEVIEWS, http_serving, make_config, running

from icefloe.config import Config
from icefloe.errors import FencedError, LeaseHeldError
from icefloe.manifest.embed import Collector
from ingestor.embed import Ingestor
from ingestor.errors import BadRequest, IngestError


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return make_config(tmp_path / "store", (PAGEVIEWS,))


def users(batch: object) -> list[str]:
    return [msgspec.json.decode(e.payload)["user_id"] for e in batch.events]  # type: ignore[attr-defined]


async def test_should_ingest_in_process_and_collect_with_the_servers_entries(config: Config
                                                                            ) -> None:
    async with await Ingestor.open(config) as ingestor:
        handle = ingestor.ingest([{"user_id": "a", "duration_ms": 1}, b'{"user_id":"b"}',
                                  '{"user_id":"c"}'])
        assert not handle.done()  # buffered, not yet durable
        assert await handle == 3
        assert handle.done()
        with pytest.raises(BadRequest) as refused:
            ingestor.ingest([{"user_id": "d"}, {"duration_ms": "long"}], stream="pageviews")
        assert refused.value.code == "validation_failed"
        assert {d["index"] for d in refused.value.details} == {1}
        with pytest.raises(IngestError, match="unknown stream 'nope'"):
            ingestor.ingest([{"user_id": "x"}], stream="nope")
        keyed = ingestor.ingest([{"user_id": "k"}], idempotency_key="order-7")
        assert await keyed == 1
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        sent = await client.post("/v1/streams/pageviews/events", json=[{"user_id": "h"}])
        assert sent.status_code == 202, sent.text

    async with Collector.open(config) as collector:
        await collector.initialize()
        batch = await collector.next_batch()
        assert batch is not None
        assert users(batch) == ["a", "b", "c", "k", "h"]  # nothing of the refused call
        assert [e.event_id for e in batch.events][3] == "order-7"
        assert await collector.next_batch() is None  # handed out, not acked
        await collector.ack(batch)
    async with Collector.open(config) as later:
        await later.initialize(takeover=True)  # the closed reader's lease outlives it
        assert await later.next_batch() is None  # acked and dequeued: never again


async def test_should_refuse_to_fence_a_live_reader_unless_taking_over(config: Config
                                                                      ) -> None:
    async with await Ingestor.open(config) as ingestor:
        await ingestor.ingest([{"user_id": "a"}, {"user_id": "b"}])
    first = Collector.open(config, holder="first")
    await first.initialize()
    unacked = await first.next_batch()
    assert unacked is not None
    second = Collector.open(config, holder="second")
    with pytest.raises(LeaseHeldError) as held:
        await second.initialize()
    assert held.value.holder == "first"
    await second.initialize(takeover=True)
    again = await second.next_batch()  # the first reader never acked: delivered again
    assert again is not None
    assert users(again) == users(unacked) == ["a", "b"]
    with pytest.raises(FencedError):
        await first.ack(unacked)
    await second.ack(again)
    assert await second.next_batch() is None
    await first.close()
    await second.close()


def test_should_run_the_documented_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The in-process example of docs/coming-from/opendata.md, run as printed there."""
    readme = (Path(__file__).parents[2] / "docs" / "coming-from" / "opendata.md").read_text()
    start = readme.index("```python\nimport asyncio\n\nfrom icefloe.config import load_config")
    code = readme[start + len("```python\n"):readme.index("```", start + 9)]
    (tmp_path / "icefloe.toml").write_text(
        '[store]\nurl = "file://store"\n[[streams]]\nname = "entries"\n'
        'table = "raw.entries"\npayload = "bytes"\n'
        'columns = [{ name = "entry", type = "binary" }]\n')
    monkeypatch.chdir(tmp_path)
    written: list[tuple[list[bytes], object]] = []
    exec(compile(code, "opendata.md", "exec"), {
        "__name__": "readme", "load_positions": dict,
        "write_downstream": lambda payloads, positions: written.append((payloads, positions))})
    assert [p for payloads, _ in written for p in payloads] == [b"\x00\x01", b"any bytes\n"]


async def test_should_keep_its_lease_while_it_reads_and_lose_it_when_it_stops(
        config: Config) -> None:
    import asyncio
    import time

    short = msgspec.structs.replace(config, manifest=msgspec.structs.replace(
        config.manifest, lease_s=0.6))
    reader = Collector.open(short, holder="reader")
    standby = Collector.open(short, holder="standby")
    await reader.initialize()
    until = time.monotonic() + 1.5  # well past one lease: only renewals keep it
    while time.monotonic() < until:
        assert await reader.next_batch() is None
        await asyncio.sleep(0.1)
    with pytest.raises(LeaseHeldError):
        await standby.initialize()
    await asyncio.sleep(0.7)  # the reader stopped calling next_batch: its lease lapses
    await standby.initialize()
    with pytest.raises(FencedError):
        await reader.next_batch()
    await reader.close()
    await standby.close()
