"""What Confluent's Kafka Connect HTTP Sink connector sends, to a real ingestor over HTTP,
and the ``from = "headers"`` column that keeps a request's headers.

The requests are shaped from the connector's documented configuration
(https://docs.confluent.io/kafka-connectors/http/current/connector_config.html):
``request.body.format=json`` with ``batch.json.as.array=true`` sends up to
``batch.max.size`` records as one JSON array; ``headers`` (split at ``header.separator``)
adds fixed headers to every request, the write token among them; records whose Kafka
headers differ travel in separate requests, with those headers as HTTP headers. Without
``batch.json.as.array`` the records are joined by ``batch.separator`` (``,``), which is
not JSON: that must be a 400, never half a batch.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import httpx
import msgspec
import pytest
from ingest_support import (
    TOKEN,
    TOKEN_HASH,
    grpc_serving,
    http_serving,
    make_config,
    running,
    stored_events,
)

from icefloe.config import Column, Config, StreamConfig, validate
from icefloe.errors import ConfigError
from icefloe.formats.batch import BatchBuilder
from icefloe.formats.envelope import frame_events
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from pipeline.load.decode import decode_batch_file
from pipeline.load.spec import EntryFile, stream_specs

CLICKS = StreamConfig(
    name="clicks", table="web.clicks", tokens=(TOKEN_HASH,),
    columns=(Column("user_id", "string", required=True), Column("url", "string"),
             Column("n", "long"), Column("headers", "json", source="headers"),
             Column("headers_text", "string", source="headers")))
CONNECTOR_HEADERS = {
    # from `headers=Content-Type:application/json|Authorization:Bearer <token>`
    "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}",
    "User-Agent": "Apache-HttpClient/4.5.14 (Java/17.0.9)",
}


def record(i: int) -> dict[str, object]:
    return {"user_id": f"u{i}", "url": f"/p/{i}", "n": i}


def body(records: list[dict[str, object]], *, as_array: bool = True) -> bytes:
    """The body the connector builds: ``[r1,r2]`` with batch.json.as.array, else the
    records joined by the default batch.separator."""
    joined = b",".join(msgspec.json.encode(r) for r in records)
    return b"[" + joined + b"]" if as_array else joined


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return make_config(tmp_path / "store", (CLICKS,))


async def test_should_take_the_connectors_json_array_batches_and_headers(config: Config
                                                                          ) -> None:
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        path = "/v1/streams/clicks/events"
        first = await client.post(path, content=body([record(i) for i in range(3)]),
                                  headers={**CONNECTOR_HEADERS, "trace-id": "t-1",
                                           "Cookie": "sid=abc", "X-Session-Id": "s9",
                                           "X-Note": "Bearer leaked-token"})
        assert first.status_code == 202, first.text
        assert first.json()["accepted"] == 3
        # batch.max.size reached at 3; the next record had other Kafka headers: its own request
        second = await client.post(path, content=body([record(3)]),
                                   headers={**CONNECTOR_HEADERS, "trace-id": "t-2"})
        assert second.status_code == 202, second.text
        joined = await client.post(path, content=body([record(4), record(5)],
                                                      as_array=False),
                                   headers=CONNECTOR_HEADERS)
        assert joined.status_code == 400, joined.text
        assert "batch.json.as.array=true" in joined.json()["message"]
        # no Content-Type configured: the JVM client's default text type is read as JSON
        plain = await client.post(path, content=body([record(7)]), headers={
            "Content-Type": "text/plain; charset=ISO-8859-1",
            "Authorization": f"Bearer {TOKEN}"})
        assert plain.status_code == 202, plain.text
        no_token = await client.post(path, content=body([record(6)]),
                                     headers={"Content-Type": "application/json"})
        assert no_token.status_code == 401
    events = await stored_events(config.store.url)
    assert [msgspec.json.decode(e.payload)["n"] for e in events] == [0, 1, 2, 3, 7]
    kept = [msgspec.json.decode(msgspec.json.decode(e.meta)["hs"]) for e in events]
    assert kept[0] == kept[2]  # one meta per request
    assert kept[0]["trace-id"] == "t-1"
    assert kept[3]["trace-id"] == "t-2"
    assert kept[0]["user-agent"] == "Apache-HttpClient/4.5.14 (Java/17.0.9)"
    assert kept[0]["content-type"] == "application/json"
    assert kept[0]["x-note"] == "Bearer ***"  # the log redaction applies to every value
    assert list(kept[0]) == sorted(kept[0])
    for secret in ("authorization", "cookie", "x-session-id"):
        assert secret not in kept[0]
    assert TOKEN not in repr([e.meta for e in events])


async def test_should_keep_grpc_metadata_in_a_headers_column(config: Config) -> None:
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        request = ingest_pb2.PublishRequest(stream="clicks", events=[
            ingest_pb2.Event(json=msgspec.json.encode(record(1)))])
        reply = await ingest_pb2_grpc.IngestStub(channel).Publish(request, metadata=(
            ("authorization", f"Bearer {TOKEN}"), ("trace-id", "g-1"),
            ("x-api-key", "k"), ("blob-bin", b"\x00\x01")))
        assert reply.accepted == 1
    [event] = await stored_events(config.store.url)
    kept = msgspec.json.decode(msgspec.json.decode(event.meta)["hs"])
    assert kept["trace-id"] == "g-1"
    assert not {"authorization", "x-api-key", "blob-bin"} & set(kept)


def test_should_decode_the_headers_column_as_json_or_text() -> None:
    headers = '{"accept":"*/*","trace-id":"t-1"}'
    meta = msgspec.json.encode({"hs": headers})
    framed = frame_events("clicks", 1_700_000_000_000, ["e1", "e2"],
                          [b'{"user_id":"a"}', b'{"user_id":"b"}'], meta=meta)
    builder = BatchBuilder()
    builder.add_framed(framed, 2)
    data = builder.finish()
    plan = stream_specs([CLICKS])[0].plan()
    rows = decode_batch_file(data, EntryFile(4, "k", len(data), 0),
                             {"clicks": plan}).tables["clicks"].to_pylist()
    assert [(r["user_id"], r["headers"], r["headers_text"]) for r in rows] == [
        ("a", headers, headers), ("b", headers, headers)]


@pytest.mark.parametrize(("column", "message"), [
    (Column("h", "long", source="headers"), "gives json or string, not long"),
    (Column("h", "json", source="headers", required=True), "always present"),
])
def test_should_refuse_a_headers_column_it_cannot_fill(column: Column, message: str) -> None:
    stream = StreamConfig(name="s", table="a.b", columns=(Column("a", "string"), column))
    with pytest.raises(ConfigError, match=message):
        validate(Config(streams=(stream,)), "test")
