"""The HTTP front end to end: a real uvicorn server on 127.0.0.1, a real httpx client,
a real runtime on a local store; outcomes are read back from the store and the manifest."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gzip
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import msgspec
import pytest
import uvicorn
import zstandard
from ingest_support import (
    ORDERS,
    PAGEVIEWS,
    faulty_local_store,
    make_config,
    production_config,
    read_manifest,
    running,
    running_on,
    stored_events,
)
from prometheus_client.parser import text_string_to_metric_families

from icefloe.config import Column, Config, StreamConfig
from icefloe.store.faults import FaultRule
from icefloe.store.retry import RetryPolicy
from ingestor.runtime import IngestorRuntime
from ingestor.service import Caller

ALLTYPES = StreamConfig(
    name="alltypes", table="lab.alltypes",
    columns=(Column("s", "string"), Column("l", "long"), Column("i", "int"),
             Column("f", "float"), Column("d", "double"), Column("b", "boolean"),
             Column("t", "timestamp"), Column("day", "date"), Column("j", "json")))
STREAMS = (PAGEVIEWS, ORDERS, ALLTYPES)
MIB = 1024 * 1024
ORIGIN = "https://app.example"
EVENTS = "/v1/streams/pageviews/events"
ORDERS_URL = "/v1/streams/orders/events"
AUTH = {"Authorization": "Bearer s3cret-token"}
FAST_RETRY = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.002, budget_s=1)


class _Server(uvicorn.Server):
    """uvicorn with start and stop as events, leaving signal handling to pytest.

    uvicorn polls ``should_exit`` every 0.1 s; awaiting an event instead keeps each test's
    teardown prompt (the suite starts a server per test).
    """

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.up = asyncio.Event()
        self.down = asyncio.Event()

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        self.up.set()

    async def main_loop(self) -> None:
        await self.down.wait()

    def stop(self) -> None:
        self.should_exit = True
        self.down.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class Served:
    url: str
    runtime: IngestorRuntime
    client: httpx.AsyncClient

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def store_url(self) -> str:
        return self.runtime.config.store.url


@contextlib.asynccontextmanager
async def serving(runtime: IngestorRuntime, **changes: Any) -> AsyncIterator[Served]:
    """HttpApp as the ingestor serves it, in this test's loop, on a free port, with a
    client for it; ``changes`` override ``[ingestor]`` settings."""
    server = _Server(production_config(runtime, **changes))
    task = asyncio.create_task(server.serve())
    up = asyncio.create_task(server.up.wait())
    await asyncio.wait({task, up}, return_when=asyncio.FIRST_COMPLETED)
    if not up.done():
        up.cancel()
        task.result()
        raise RuntimeError("uvicorn stopped before it started")
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield Served(url, runtime, client)
    finally:
        server.stop()
        await task


def config_for(tmp_path: Path, **ingestor: Any) -> Config:
    settings: dict[str, Any] = {"max_body_bytes": MIB, "max_event_bytes": 64 * 1024,
                                "cors_origins": (ORIGIN,)}
    return make_config(tmp_path / "store", STREAMS, **(settings | ingestor))


@pytest.fixture(params=["fast-lane", "asgi-only"])
async def http(tmp_path, request) -> AsyncIterator[Served]:
    """A runtime (1 MiB body limit, 64 KiB event limit, one CORS origin) served over HTTP,
    once with the fast lane (plain POSTs answered from a callback) and once with every
    request on the ASGI path: both must give the same answers."""
    async with running(config_for(tmp_path)) as runtime, \
            serving(runtime, http_fast_lane=request.param == "fast-lane") as served:
        yield served


def payloads(events: list[Any]) -> list[bytes]:
    return [e.payload for e in events]


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"] == code, body
    # a 503 also says whether the failed flush may have stored the events
    assert set(body) == {"error", "message", "details"} | (
        {"may_be_stored"} if status == 503 else set())
    assert response.headers["content-type"] == "application/json"
    return body


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


@functools.cache
def gzip_bomb() -> bytes:
    """64 MiB of zeros in ~64 KiB of gzip."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(MIB)
    return b"".join(z.compress(block) for _ in range(64)) + z.flush()


# -- accepted bodies ----------------------------------------------------------------------

async def test_single_object_is_acked_and_stored_canonically(http):
    r = await http.client.post(EVENTS, content=b' {"url": "/a", "user_id": "u1", '
                               b'"duration_ms": 5, "extra": "dropped"}')
    assert r.status_code == 202
    assert r.json() == {"accepted": 1}
    [event] = await stored_events(http.store_url)
    assert event.stream == "pageviews"
    assert event.payload == b'{"user_id":"u1","url":"/a","duration_ms":5}'
    assert event.event_id


async def test_array_is_acked_in_order_with_unique_generated_ids(http):
    body = msgspec.json.encode([{"user_id": f"u{i}", "duration_ms": i} for i in range(3)])
    r = await http.client.post(EVENTS, content=body,
                               headers={"Content-Type": "application/json; charset=utf-8"})
    assert (r.status_code, r.json()) == (202, {"accepted": 3})
    events = await stored_events(http.store_url)
    assert payloads(events) == [b'{"user_id":"u%d","duration_ms":%d}' % (i, i)
                                for i in range(3)]
    assert len({e.event_id for e in events}) == 3


async def test_ndjson_skips_blank_lines(http):
    body = b'{"user_id":"a"}\n\n{"user_id":"b"}\r\n{"user_id":"c"}\n'
    r = await http.client.post(EVENTS, content=body,
                               headers={"Content-Type": "application/x-ndjson"})
    assert (r.status_code, r.json()) == (202, {"accepted": 3})
    assert payloads(await stored_events(http.store_url)) == [
        b'{"user_id":"a"}', b'{"user_id":"b"}', b'{"user_id":"c"}']


async def test_text_plain_is_json_for_send_beacon(http):
    r = await http.client.post(EVENTS, content=b'{"user_id":"beacon"}',
                               headers={"Content-Type": "text/plain;charset=UTF-8"})
    assert r.status_code == 202
    assert payloads(await stored_events(http.store_url)) == [b'{"user_id":"beacon"}']


@pytest.mark.parametrize("content_type", ["text/plain;charset=UTF-8", None],
                         ids=["text-plain", "no-content-type"])
async def test_preflight_free_bodies_only_from_allowed_origins(http, content_type):
    """text/plain and a typeless body skip the browser's CORS preflight, so they are JSON
    only without an Origin (not a browser) or from an origin cors_origins lists; a page
    elsewhere gets 415, and JSON it must preflight is still handled (the browser enforces)."""
    typed = {} if content_type is None else {"Content-Type": content_type}
    listed = await http.client.post(EVENTS, content=b'{"user_id":"listed"}',
                                    headers={**typed, "Origin": ORIGIN})
    other = await http.client.post(EVENTS, content=b'{"user_id":"other"}',
                                   headers={**typed, "Origin": "https://evil.example"})
    no_origin = await http.client.post(EVENTS, content=b'{"user_id":"script"}', headers=typed)
    json_other = await http.client.post(EVENTS, content=b'{"user_id":"json"}', headers={
        "Content-Type": "application/json", "Origin": "https://evil.example"})
    assert listed.status_code == 202
    assert listed.headers["access-control-allow-origin"] == ORIGIN
    body = error(other, 415, "unsupported_media_type")
    assert "ingestor.cors_origins" in body["message"]
    assert no_origin.status_code == 202
    assert json_other.status_code == 202
    assert sorted(payloads(await stored_events(http.store_url))) == [
        b'{"user_id":"json"}', b'{"user_id":"listed"}', b'{"user_id":"script"}']


async def test_preflight_free_bodies_from_any_origin_under_a_wildcard(tmp_path):
    async with running(config_for(tmp_path, cors_origins=("*",))) as runtime, \
            serving(runtime) as http:
        r = await http.client.post(EVENTS, content=b'{"user_id":"a"}', headers={
            "Content-Type": "text/plain", "Origin": "https://any.example"})
    assert r.status_code == 202


async def test_preflight_free_bodies_from_browsers_need_cors_origins(tmp_path):
    async with running(config_for(tmp_path, cors_origins=())) as runtime, \
            serving(runtime) as http:
        r = await http.client.post("/collect/web/pageviews", content=b'{"user_id":"a"}',
                                   headers={"Content-Type": "text/plain",
                                            "Origin": "https://any.example"})
    error(r, 415, "unsupported_media_type")


async def test_chunked_upload_without_content_length(http):
    async def body() -> AsyncIterator[bytes]:
        yield b'[{"user_id":'
        yield b'"x"},{"user_id":"y"}]'

    r = await http.client.post(EVENTS, content=body())
    assert (r.status_code, r.json()) == (202, {"accepted": 2})


async def test_event_id_comes_from_the_id_field_before_the_idempotency_key(http):
    orders = [{"order_id": "o-1", "amount": 9.5}, {"order_id": "o-2", "qty": 2}]
    r = await http.client.post(ORDERS_URL, content=msgspec.json.encode(orders),
                               headers={**AUTH, "Idempotency-Key": "k"})
    assert r.status_code == 202
    events = await stored_events(http.store_url)
    assert [e.event_id for e in events] == ["o-1", "o-2"]
    assert payloads(events) == [b'{"order_id":"o-1","amount":9.5}',
                                b'{"order_id":"o-2","qty":2}']


async def test_event_ids_from_the_idempotency_key(http):
    one = await http.client.post(EVENTS, content=b'{"user_id":"a"}',
                                 headers={"Idempotency-Key": "req-1"})
    many = await http.client.post(EVENTS, content=b'[{"user_id":"b"},{"user_id":"c"}]',
                                  headers={"Idempotency-Key": "req-2"})
    assert one.status_code == many.status_code == 202
    events = await stored_events(http.store_url)
    assert [e.event_id for e in events] == ["req-1", "req-2:0", "req-2:1"]


async def test_an_oversized_idempotency_key_is_refused(http):
    r = await http.client.post(EVENTS, content=b'{"user_id":"a"}',
                               headers={"Idempotency-Key": "k" * 300})
    error(r, 400, "invalid_idempotency_key")


async def test_ingest_alias_is_the_events_route(http):
    array = await http.client.post("/ingest/pageviews", json=[{"user_id": "a"}, {"user_id": "b"}])
    lines = await http.client.post("/ingest/pageviews", content=b'{"user_id":"c"}\n',
                                   headers={"Content-Type": "application/x-ndjson"})
    assert (array.status_code, array.json()) == (202, {"accepted": 2})
    assert (lines.status_code, lines.json()) == (202, {"accepted": 1})
    unknown = await http.client.post("/ingest/nope", json={"user_id": "a"})
    assert unknown.status_code == 404
    assert unknown.json()["error"] == "unknown_stream"
    no_token = await http.client.post("/ingest/orders", json={"order_id": "o1"})
    assert no_token.status_code == 401
    assert [e.payload for e in await stored_events(http.store_url)] == [
        b'{"user_id":"a"}', b'{"user_id":"b"}', b'{"user_id":"c"}']


async def test_collect_aliases_feed_the_stream_of_the_table(http):
    one = await http.client.post("/collect/web/pageviews", content=b'{"user_id":"a"}')
    batch = await http.client.post("/collect/web/pageviews/batch",
                                   content=b'[{"user_id":"b"},{"user_id":"c"}]')
    assert (one.status_code, one.json()) == (202, {"accepted": 1})
    assert (batch.status_code, batch.json()) == (202, {"accepted": 2})
    events = await stored_events(http.store_url)
    assert {e.stream for e in events} == {"pageviews"}
    assert len(events) == 3


async def test_collect_aliases_keep_the_seed_body_shapes(http):
    array_to_one = await http.client.post("/collect/web/pageviews", content=b'[{"user_id":"a"}]')
    object_to_batch = await http.client.post("/collect/web/pageviews/batch",
                                             content=b'{"user_id":"a"}')
    ndjson = await http.client.post("/collect/web/pageviews/batch", content=b'{"user_id":"a"}',
                                    headers={"Content-Type": "application/x-ndjson"})
    assert "/batch" in error(array_to_one, 400, "invalid_json")["message"]
    error(object_to_batch, 400, "invalid_json")
    error(ndjson, 415, "unsupported_media_type")


# -- compression ----------------------------------------------------------------------------

@pytest.mark.parametrize(("encoding", "compress"), [
    ("gzip", gzip.compress),
    ("zstd", lambda data: zstandard.ZstdCompressor().compress(data)),
])
async def test_compressed_bodies(http, encoding, compress):
    body = msgspec.json.encode([{"user_id": f"u{i}", "url": "/x" * 50} for i in range(200)])
    r = await http.client.post(EVENTS, content=compress(body),
                               headers={"Content-Encoding": encoding})
    assert (r.status_code, r.json()) == (202, {"accepted": 200})
    assert len(await stored_events(http.store_url)) == 200


async def test_streamed_multi_member_gzip_and_multi_frame_zstd(http):
    gz = gzip.compress(b'[{"user_id":"a"},') + gzip.compress(b'{"user_id":"b"}]')
    zc = zstandard.ZstdCompressor()
    zs = zc.compress(b'{"user_id":"c"}\n') + zc.compress(b'{"user_id":"d"}\n')

    async def trickle(data: bytes) -> AsyncIterator[bytes]:
        for i in range(0, len(data), 7):
            yield data[i:i + 7]

    r1 = await http.client.post(EVENTS, content=trickle(gz), headers={"Content-Encoding": "gzip"})
    r2 = await http.client.post(EVENTS, content=trickle(zs), headers={
        "Content-Encoding": "zstd", "Content-Type": "application/x-ndjson"})
    assert r1.status_code == r2.status_code == 202
    assert payloads(await stored_events(http.store_url)) == [
        b'{"user_id":"a"}', b'{"user_id":"b"}', b'{"user_id":"c"}', b'{"user_id":"d"}']


async def test_unknown_content_encoding_is_415(http):
    r = await http.client.post(EVENTS, content=b'{"user_id":"a"}',
                               headers={"Content-Encoding": "br"})
    error(r, 415, "unsupported_encoding")


@pytest.mark.parametrize(("encoding", "body"), [
    ("gzip", b"\x1f\x8bthis is not gzip"),
    ("gzip", gzip.compress(b'{"user_id":"a"}')[:-6]),  # truncated
    ("zstd", b"not zstd at all"),
    ("zstd", zstandard.ZstdCompressor().compress(b'{"user_id":"a"}' * 50)[:-4]),  # truncated
])
async def test_corrupt_or_truncated_compression_is_400(http, encoding, body):
    r = await http.client.post(EVENTS, content=body, headers={"Content-Encoding": encoding})
    error(r, 400, "invalid_encoding")
    assert await stored_events(http.store_url) == []


async def test_an_empty_compressed_body_is_an_empty_body(http):
    r = await http.client.post(EVENTS, content=b"", headers={"Content-Encoding": "gzip"})
    error(r, 400, "empty_body")


# -- validation -------------------------------------------------------------------------------

async def test_every_column_type_is_canonicalised(http):
    events = [
        {"s": "x", "l": 9007199254740993, "i": -2147483648, "f": 1.5, "d": 2, "b": False},
        {"t": "2024-05-01T12:00:00.5+02:00"},  # offset → UTC, Z
        {"t": 1714557600123},  # epoch ms → RFC 3339
        {"t": "2024-05-01T10:00:00Z", "day": "2024-02-29"},
        {"j": {"a": [1, {"b": None}]}},  # json → JSON text
    ]
    r = await http.client.post("/v1/streams/alltypes/events", content=msgspec.json.encode(events))
    assert r.status_code == 202, r.text
    assert payloads(await stored_events(http.store_url)) == [
        b'{"s":"x","l":9007199254740993,"i":-2147483648,"f":1.5,"d":2.0,"b":false}',
        b'{"t":"2024-05-01T10:00:00.500000Z"}',
        b'{"t":"2024-05-01T10:00:00.123000Z"}',
        b'{"t":"2024-05-01T10:00:00Z","day":"2024-02-29"}',
        b'{"j":"{\\"a\\":[1,{\\"b\\":null}]}"}',
    ]


async def test_every_bad_event_is_reported_by_index_and_field(http):
    events = [
        {"l": 1.5}, {"l": 2**63}, {"i": 2**31}, {"d": "1"}, {"b": "true"},
        {"t": "2024-05-01T12:00:00"},  # naive: no offset
        {"s": "fine"},
        {"t": "yesterday"}, {"day": "2024-13-01"}, {"s": 5},
    ]
    r = await http.client.post("/v1/streams/alltypes/events", content=msgspec.json.encode(events))
    body = error(r, 400, "validation_failed")
    assert [(d["index"], d["field"]) for d in body["details"]] == [
        (0, "l"), (1, "l"), (2, "i"), (3, "d"), (4, "b"), (5, "t"), (7, "t"), (8, "day"),
        (9, "s")]
    assert "timezone" in body["details"][5]["reason"]
    assert all(d["reason"] for d in body["details"])


async def test_epoch_millis_out_of_range_is_refused(http):
    r = await http.client.post("/v1/streams/alltypes/events", content=b'{"t":253402300800000}')
    body = error(r, 400, "validation_failed")
    assert body["details"] == [{"index": 0, "field": "t", "reason": body["details"][0]["reason"]}]
    assert "out of range" in body["details"][0]["reason"]


async def test_a_request_with_good_and_bad_events_stores_nothing(http):
    assert (await http.client.post(EVENTS, content=b'{"user_id":"first"}')).status_code == 202
    before = await read_manifest(http.store_url)
    mixed = [{"user_id": "ok"}, {"url": "/no-user"}, {"user_id": "ok2", "duration_ms": "slow"}]
    r = await http.client.post(EVENTS, content=msgspec.json.encode(mixed))
    body = error(r, 400, "validation_failed")
    assert [(d["index"], d["field"]) for d in body["details"]] == [
        (1, "user_id"), (2, "duration_ms")]
    after = await read_manifest(http.store_url)
    assert len(after.entries) == len(before.entries) == 1
    assert payloads(await stored_events(http.store_url)) == [b'{"user_id":"first"}']


@pytest.mark.parametrize(("body", "headers", "status", "code"), [
    (b'{"user_id": "a",', {}, 400, "invalid_json"),
    (b'[{"user_id":"a"}, 17]', {}, 400, "validation_failed"),
    (b"", {}, 400, "empty_body"),
    (b"  \n", {"Content-Type": "application/x-ndjson"}, 400, "empty_body"),
    (b'"a string"', {}, 400, "invalid_json"),
    (b"user_id=a", {"Content-Type": "application/x-www-form-urlencoded"}, 415,
     "unsupported_media_type"),
])
async def test_malformed_bodies(http, body, headers, status, code):
    error(await http.client.post(EVENTS, content=body, headers=headers), status, code)


async def test_unknown_fields_are_refused_on_a_reject_stream(http):
    r = await http.client.post(ORDERS_URL, headers=AUTH,
                               content=b'{"order_id":"o-9","coupon":"FREE"}')
    body = error(r, 400, "validation_failed")
    assert [(d["index"], d["field"]) for d in body["details"]] == [(0, "coupon")]


# -- streams and tokens ---------------------------------------------------------------------

async def test_unknown_stream_and_table_are_404(http):
    body = error(await http.client.post("/v1/streams/nope/events", content=b"{}"),
                 404, "unknown_stream")
    assert "'nope'" in body["message"]
    assert "pageviews" not in body["message"]  # configured streams are not disclosed
    error(await http.client.post("/collect/web/nope", content=b"{}"), 404, "unknown_stream")
    error(await http.client.post("/collect/nope/pageviews/batch", content=b"[]"),
          404, "unknown_stream")


@pytest.mark.parametrize(("headers", "status", "code"), [
    ({}, 401, "unauthenticated"),
    ({"Authorization": "Basic czNjcmV0LXRva2Vu"}, 401, "unauthenticated"),
    ({"Authorization": "Bearer wrong"}, 403, "permission_denied"),
])
async def test_tokens_are_checked_before_the_body(http, headers, status, code):
    # a body that would fail validation: the token check must come first
    r = await http.client.post(ORDERS_URL, content=b"not json", headers=headers)
    error(r, status, code)


async def test_the_right_token_is_accepted_case_insensitively_on_the_scheme(http):
    r = await http.client.post(ORDERS_URL, content=b'{"order_id":"o-1","paid":true}',
                               headers={"Authorization": "bearer s3cret-token"})
    assert r.status_code == 202


# -- limits ---------------------------------------------------------------------------------

async def raw_request(port: int, head: bytes) -> tuple[bytes, bytes]:
    """Send only a request head; return the response head and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        response = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = next(int(line.split(b":")[1]) for line in response.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        return response, await reader.readexactly(length)
    finally:
        writer.close()


async def test_declared_content_length_over_the_limit_is_refused_before_reading(http):
    head, body = await raw_request(http.port, (
        b"POST /v1/streams/pageviews/events HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 10485760\r\n"
        b"Expect: 100-continue\r\n\r\n"))
    # answered without a byte of the body sent (no "100 Continue" first)
    assert head.startswith(b"HTTP/1.1 413 ")
    assert msgspec.json.decode(body)["error"] == "payload_too_large"


async def test_chunked_body_over_the_limit_is_413(http):
    async def body() -> AsyncIterator[bytes]:  # 2.5 MiB, no Content-Length
        yield b'[{"user_id":"' + b"x" * (64 * 1024)
        for _ in range(40):
            yield b"x" * (64 * 1024)
        yield b'"}]'

    error(await http.client.post(EVENTS, content=body()), 413, "payload_too_large")
    assert await stored_events(http.store_url) == []


@pytest.mark.parametrize("encoding", ["gzip", "zstd"])
async def test_decompression_bomb_is_413_quickly(http, encoding):
    bomb = gzip_bomb() if encoding == "gzip" else \
        zstandard.ZstdCompressor().compress(bytes(64 * MIB))
    assert len(bomb) < 100 * 1024
    started = time.monotonic()
    r = await http.client.post(EVENTS, content=bomb, headers={"Content-Encoding": encoding})
    assert "decompressed" in error(r, 413, "payload_too_large")["message"]
    assert time.monotonic() - started < 2


async def test_event_over_max_event_bytes_is_413(http):
    events = [{"user_id": "ok"}, {"user_id": "big", "url": "x" * (65 * 1024)}]
    r = await http.client.post(EVENTS, content=msgspec.json.encode(events))
    body = error(r, 413, "event_too_large")
    assert body["details"][0]["index"] == 1
    assert await stored_events(http.store_url) == []


# -- backpressure and store failures ------------------------------------------------------

async def test_a_full_buffer_is_429_with_retry_after_and_stores_nothing(tmp_path):
    put_started, release = asyncio.Event(), asyncio.Event()

    async def hold_the_put() -> None:
        put_started.set()
        await release.wait()

    gate = FaultRule("delay", ops=frozenset({"put"}), key_prefix="batches/",
                     delay_s=(0, 0), on_fire=hold_the_put)
    store, _faulty = faulty_local_store(tmp_path / "store", [gate], FAST_RETRY)
    config = config_for(tmp_path, buffer_max_bytes=4096, flush_bytes=4096, retry_after_s=2)
    async with running_on(config, store) as runtime, serving(runtime) as http:
        first = asyncio.create_task(http.client.post(
            EVENTS, content=msgspec.json.encode({"user_id": "held", "url": "a" * 2500})))
        await put_started.wait()  # the first request's bytes are held by a flush
        refused = await http.client.post(
            EVENTS, content=msgspec.json.encode({"user_id": "refused", "url": "b" * 2500}))
        error(refused, 429, "buffer_full")
        assert refused.headers["retry-after"] == "2"
        release.set()
        assert (await first).status_code == 202
        stored = await stored_events(http.store_url)
        assert [msgspec.json.decode(p)["user_id"] for p in payloads(stored)] == ["held"]


async def test_store_down_is_503_nothing_acked_and_not_ready(tmp_path):
    store, faulty = faulty_local_store(tmp_path / "store", [], FAST_RETRY)
    async with running_on(config_for(tmp_path), store) as runtime, serving(runtime) as http:
        assert (await http.client.post(EVENTS, content=b'{"user_id":"a"}')).status_code == 202
        down = faulty.add(FaultRule("fail", times=None))
        r = await http.client.post(EVENTS, content=b'[{"user_id":"b"},{"user_id":"c"}]')
        assert error(r, 503, "store_unavailable")["may_be_stored"] is False  # refused writes
        assert int(r.headers["retry-after"]) >= 1
        ready = await http.client.get("/readyz")
        error(ready, 503, "not_ready")
        assert ready.headers["retry-after"] == "1"
        manifest = await read_manifest(http.store_url)
        assert len(manifest.entries) == 1
        assert payloads(await stored_events(http.store_url)) == [b'{"user_id":"a"}']
        faulty.rules.remove(down)  # the store is back: the same request now succeeds
        assert (await http.client.post(EVENTS, content=b'{"user_id":"d"}')).status_code == 202


async def test_should_say_a_503_may_be_stored_when_the_manifest_write_may_have_landed(
        tmp_path):
    """The manifest append is applied but its answer is lost, and the store then fails
    every retry and every read-back: the flush gives up without knowing. The 503 says
    ``may_be_stored`` -- and the events are in fact in the manifest."""
    lost = FaultRule("lose_response", ops=frozenset({"put"}), key_prefix="manifest")
    down = FaultRule("fail", ops=frozenset({"put", "get"}), key_prefix="manifest",
                     times=None, skip=1)  # not the first put: that one is lost instead
    store, faulty = faulty_local_store(tmp_path / "store", [], FAST_RETRY)
    async with running_on(config_for(tmp_path), store) as runtime, serving(runtime) as http:
        assert (await http.client.post(EVENTS, content=b'{"user_id":"a"}')).status_code == 202
        faulty.rules += [lost, down]
        r = await http.client.post(EVENTS, content=b'{"user_id":"b"}')
        assert error(r, 503, "store_unavailable")["may_be_stored"] is True, r.text
        assert lost.fired == 1
        assert down.fired >= 1
        faulty.rules.clear()
        assert (await http.client.post(EVENTS, content=b'{"user_id":"c"}')).status_code == 202
    assert [msgspec.json.decode(p)["user_id"] for p in payloads(
        await stored_events(store.url))] == ["a", "b", "c"]


async def test_store_down_from_the_start_acks_nothing(tmp_path):
    store, _faulty = faulty_local_store(tmp_path / "store",
                                        [FaultRule("fail", ops=frozenset({"put"}), times=None)],
                                        FAST_RETRY)
    async with running_on(config_for(tmp_path), store, probe=False) as runtime, \
            serving(runtime) as http:
        r = await http.client.post(EVENTS, content=b'{"user_id":"a"}')
        error(r, 503, "store_unavailable")
        assert r.headers["retry-after"] == "1"
        assert (await read_manifest(http.store_url)).entries == ()


# -- health, readiness, metrics ------------------------------------------------------------

async def test_healthz_and_readyz(http):
    health = await http.client.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = await http.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    assert "detail" in ready.json()


async def test_metrics_count_events_requests_refusals_and_acks(http):
    await http.client.post(EVENTS, content=b'[{"user_id":"a"},{"user_id":"b"},{"user_id":"c"}]')
    await http.client.post(EVENTS, content=b'{"url":"/missing-user"}')
    await http.client.post("/v1/streams/nope/events", content=b"{}")
    r = await http.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert "icefloe_ingest_events_accepted" in text
    assert sample(text, "icefloe_ingest_events_accepted_total", stream="pageviews") == 3
    assert sample(text, "icefloe_ingest_requests_total", transport="http",
                  stream="pageviews", status="202") == 1
    assert sample(text, "icefloe_ingest_requests_total", transport="http",
                  stream="pageviews", status="400") == 1
    assert sample(text, "icefloe_ingest_requests_total", transport="http",
                  stream="-", status="404") == 1
    assert sample(text, "icefloe_ingest_events_rejected_total", stream="pageviews",
                  reason="validation_failed") == 1
    assert sample(text, "icefloe_ingest_events_rejected_total", stream="-",
                  reason="unknown_stream") == 1
    assert sample(text, "icefloe_ingest_ack_seconds_count", transport="http") == 1


# -- CORS, routing ------------------------------------------------------------------------------

async def test_preflight_from_an_allowed_origin(http):
    r = await http.client.options(EVENTS, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization"})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    for header in ("content-type", "content-encoding", "authorization", "idempotency-key"):
        assert header in allowed
    assert int(r.headers["access-control-max-age"]) > 0
    assert "origin" in r.headers["vary"].lower()


async def test_preflight_from_another_origin_gets_no_grant(http):
    r = await http.client.options(EVENTS, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 204
    assert "access-control-allow-origin" not in r.headers
    assert "access-control-allow-methods" not in r.headers


async def test_cors_headers_on_responses_only_for_allowed_origins(http):
    ok = await http.client.post(EVENTS, content=b'{"user_id":"a"}', headers={"Origin": ORIGIN})
    bad = await http.client.post(EVENTS, content=b"{", headers={"Origin": ORIGIN})
    other = await http.client.post(EVENTS, content=b'{"user_id":"b"}',
                                   headers={"Origin": "https://evil.example",
                                            "Content-Type": "application/json"})
    assert ok.headers["access-control-allow-origin"] == ORIGIN
    assert "retry-after" in ok.headers["access-control-expose-headers"].lower()
    assert bad.status_code == 400
    assert bad.headers["access-control-allow-origin"] == ORIGIN
    assert other.status_code == 202  # still handled: only the browser enforces CORS
    assert "access-control-allow-origin" not in other.headers


async def test_wildcard_cors_and_no_cors(tmp_path):
    config = config_for(tmp_path, cors_origins=("*",))
    async with running(config) as runtime, serving(runtime) as http:
        r = await http.client.options(EVENTS, headers={"Origin": "https://any.example"})
        assert r.headers["access-control-allow-origin"] == "*"
        r = await http.client.post(EVENTS, content=b'{"user_id":"a"}',
                                   headers={"Origin": "https://any.example"})
        assert r.headers["access-control-allow-origin"] == "*"
    config = config_for(tmp_path, cors_origins=())
    async with running(config) as runtime, serving(runtime) as http:
        r = await http.client.options(EVENTS, headers={"Origin": ORIGIN})
        assert r.status_code == 204
        assert "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("path", ["/", "/nope", "/v1/streams/pageviews", "/v1/streams//events",
                                  "/v1/streams/pageviews/events/extra", "/collect/web",
                                  "/collect/web/pageviews/other"])
async def test_unknown_paths_are_404(http, path):
    error(await http.client.post(path, content=b"{}"), 404, "not_found")


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("GET", EVENTS, "OPTIONS, POST"),
    ("PUT", "/collect/web/pageviews", "OPTIONS, POST"),
    ("POST", "/healthz", "GET"),
    ("DELETE", "/metrics", "GET"),
])
async def test_wrong_methods_are_405_with_allow(http, method, path, allow):
    r = await http.client.request(method, path)
    error(r, 405, "method_not_allowed")
    assert r.headers["allow"] == allow


# -- robustness -----------------------------------------------------------------------------

async def test_an_unexpected_error_is_a_logged_500_and_the_server_carries_on(
        http, monkeypatch, caplog):
    def broken(*_args: Any, **_kwargs: Any) -> asyncio.Future[None]:
        raise RuntimeError("boom")

    monkeypatch.setattr(http.runtime.service, "admit", broken)
    r = await http.client.post(EVENTS, content=b'{"user_id":"a"}')
    error(r, 500, "internal")
    assert "boom" not in r.text  # details stay in the log
    assert any(rec.exc_info and "boom" in str(rec.exc_info[1]) for rec in caplog.records)
    monkeypatch.undo()
    assert (await http.client.post(EVENTS, content=b'{"user_id":"b"}')).status_code == 202


async def test_a_flush_that_fails_unexpectedly_is_a_logged_500(http, monkeypatch, caplog):
    """A wait for durability that ends in an error no refusal describes (a bug) is a 500,
    never an acknowledgement, and the connection keeps serving."""
    def failing(*_args: Any, **_kwargs: Any) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(RuntimeError("flush bug"))
        return future

    monkeypatch.setattr(http.runtime.service, "admit", failing)
    r = await http.client.post(EVENTS, content=b'{"user_id":"a"}')
    error(r, 500, "internal")
    assert any(rec.exc_info and "flush bug" in str(rec.exc_info[1]) for rec in caplog.records)
    monkeypatch.undo()
    assert (await http.client.post(EVENTS, content=b'{"user_id":"b"}')).status_code == 202


async def test_a_client_that_hangs_up_mid_body_is_counted_and_nothing_stored(http):
    reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
    writer.write(b"POST /v1/streams/pageviews/events HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: 1000\r\n\r\n" + b'[{"user_id":"gone"}')
    await writer.drain()
    writer.write_eof()  # hang up mid-body (our read side stays open to see the answer)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # none: the client has gone
    writer.close()
    deadline = time.monotonic() + 5
    while True:  # the server notices the hang-up on its own schedule: nothing to await
        text = (await http.client.get("/metrics")).text
        gone = sample(text, "icefloe_ingest_requests_total", stream="pageviews", status="499")
        if gone == 1 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    assert gone == 1
    assert await stored_events(http.store_url) == []


# -- the fast lane ----------------------------------------------------------------------------

async def exchange(port: int, data: bytes, responses: int = 1) -> list[tuple[bytes, bytes]]:
    """Send ``data`` on one connection; return ``responses`` (head, body) pairs in order."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        answers = []
        for _ in range(responses):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            answers.append((head, await reader.readexactly(length)))
        return answers
    finally:
        writer.close()


def post(path: str, body: bytes, *extra: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body),
                                                  b"".join(h + b"\r\n" for h in extra), body))


def normalized(head: bytes) -> list[bytes]:
    """A response head without its date (which differs by the second), headers sorted."""
    status, *headers = head.rstrip(b"\r\n").split(b"\r\n")
    return [status, *sorted(h.lower() for h in headers if not h.lower().startswith(b"date:"))]


SAME_ANSWERS = [  # (request, expected status): each lane must answer it byte for byte alike
    (post(EVENTS, b'{"user_id":"a"}', b"Idempotency-Key: k-1"), 202),
    (post(EVENTS, b'[{"user_id":"a"},{"url":"no user"}]'), 400),
    (post(EVENTS, b"{nope"), 400),
    (post("/v1/streams/nope/events", b"{}"), 404),
    (post("/v1/streams/orders/events", b"{}"), 401),
    (post("/v1/streams/orders/events", b"{}", b"Authorization: Bearer wrong"), 403),
    (post(EVENTS, b"{}", b"Origin: " + ORIGIN.encode()), 400),
    (post(EVENTS, b"<xml/>").replace(b"application/json", b"application/xml"), 415),
    (post(EVENTS, b'{"user_id":"a"}', b"Idempotency-Key: " + b"k" * 300), 400),
    (post("/collect/web/pageviews", b'[{"user_id":"a"}]'), 400),
    (post("/collect/web/pageviews/batch", b'[{"user_id":"a"}]', b"Origin: https://evil.example"),
     202),
]


async def test_the_fast_lane_and_the_asgi_path_answer_alike(tmp_path):
    """Every answer the fast lane gives itself — acceptance and each refusal — has the
    status, headers and body the ASGI path gives to the same request."""
    async with running(config_for(tmp_path)) as runtime, \
            serving(runtime, http_fast_lane=True) as fast, \
            serving(runtime, http_fast_lane=False) as asgi:
        for request, status in SAME_ANSWERS:
            [(fast_head, fast_body)] = await exchange(fast.port, request)
            [(asgi_head, asgi_body)] = await exchange(asgi.port, request)
            assert fast_head.startswith(b"HTTP/1.1 %d " % status), (request, fast_head)
            assert normalized(fast_head) == normalized(asgi_head), request
            assert fast_body == asgi_body, request


@pytest.fixture
def asgi_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The methods of the requests that reached the ASGI app (the fast lane answers the
    others itself): proves which lane a request took."""
    from ingestor.http.app import HttpApp

    calls: list[str] = []
    original = HttpApp.__call__

    async def counting(self: HttpApp, scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["method"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(HttpApp, "__call__", counting)
    return calls


async def test_plain_posts_take_the_fast_lane_and_others_the_asgi_path(tmp_path, asgi_calls):
    """The lane is what it claims: a plain POST never reaches the ASGI app; a gzip body, a
    chunked body, HTTP/1.0 and ``Connection: close`` do, and all are accepted."""
    one = b'{"user_id":"a"}'
    async with running(config_for(tmp_path)) as runtime, serving(runtime) as served:
        [(head, _)] = await exchange(served.port, post(EVENTS, one))
        assert head.startswith(b"HTTP/1.1 202 ")
        assert asgi_calls == []
        squeezed = gzip.compress(one)
        for request in (
                post(EVENTS, squeezed, b"Content-Encoding: gzip"),
                b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n%s\r\n0\r\n\r\n" % (EVENTS.encode(), len(one), one),
                post(EVENTS, one).replace(b"HTTP/1.1", b"HTTP/1.0"),
                post(EVENTS, one, b"Connection: close")):
            [(head, body)] = await exchange(served.port, request)
            assert b" 202 " in head.split(b"\r\n")[0], (request, head, body)
        assert asgi_calls == ["POST"] * 4
        assert len(await stored_events(runtime.config.store.url)) == 5


async def test_pipelined_posts_are_answered_in_order(http):
    """Three requests in one write: the first takes the fast lane while the others queue
    behind it (uvicorn's pipeline); the answers come back in request order."""
    requests = [post(EVENTS, b'{"user_id":"p%d"}' % i, b"Idempotency-Key: pipe-%d" % i)
                for i in range(2)] + [post("/v1/streams/nope/events", b"{}")]
    answers = await exchange(http.port, b"".join(requests), responses=3)
    assert [head.split(b" ")[1] for head, _ in answers] == [b"202", b"202", b"404"]
    ids = {e.event_id for e in await stored_events(http.store_url)}
    assert ids == {"pipe-0", "pipe-1"}


async def test_content_length_with_chunked_encoding_is_refused(http):
    """Both framings at once (a request-smuggling shape) never reach either path: the
    parser refuses it with 400 and closes; nothing is stored."""
    chunk = b'[{"user_id":"smuggled"}]'
    reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
    try:
        writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                     % (EVENTS.encode(), len(chunk), chunk))
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert await stored_events(http.store_url) == []


class _Transport:
    """Collects what the fast lane writes (the lane's own unit test needs no socket)."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_the_fast_lane_refuses_a_body_longer_than_the_limit(tmp_path):
    """Defence in depth: the parser holds a body to its Content-Length (checked against the
    limit before the body), but should more bytes ever arrive, the lane answers 413 and
    keeps none of them."""
    from ingestor.http.app import HttpApp
    from ingestor.http.fast import FastIngest, FastLane
    from ingestor.http.steps import Request

    async with running(config_for(tmp_path, max_body_bytes=64)) as runtime:
        lane = FastLane(HttpApp(runtime))
        responded: list[bool] = []
        connection = SimpleNamespace(transport=_Transport(), headers=[],
                                     on_response_complete=lambda: responded.append(True))
        request = Request([(b"content-length", b"10")])
        request.stream = "pageviews"
        fast = FastIngest(lane, connection, request, [])  # type: ignore[arg-type]
        fast.ready(runtime.service.stream("pageviews"), Caller(), lambda *_: None, None)
        fast.body(b"x" * 40)
        fast.body(b"x" * 40)  # 80 > 64
        fast.complete()
        assert connection.transport.written.startswith(b"HTTP/1.1 413 ")
        assert b'"payload_too_large"' in connection.transport.written
        assert responded == [True]
        assert fast.chunks == [b"x" * 40]  # nothing past the limit was kept
        assert runtime.batcher.held_bytes == 0  # and nothing buffered


# -- header mappings ---------------------------------------------------------------------------

MAPPED = StreamConfig(
    name="mapped", table="web.mapped",
    columns=(Column("user_id", "string", required=True),
             Column("who", "string", header="X-User"),
             Column("headers", "json", source="headers")))
MAPPED_URL = "/v1/streams/mapped/events"


@pytest.mark.parametrize("fast_lane", [True, False], ids=["fast-lane", "asgi-only"])
async def test_header_values_are_stored_as_their_utf8_text_and_other_bytes_refused(
        tmp_path, asgi_calls, fast_lane):
    """A ``header`` mapping and a ``from = "headers"`` column store a value's UTF-8 text
    (``José`` as sent, not latin-1's ``JosÃ©``); a value they would store that is not UTF-8
    is a 400 ``invalid_utf8`` naming the header, nothing stored, while bytes in a header no
    column keeps (``Cookie``) refuse nothing. Both lanes, each seen to take the requests."""
    config = make_config(tmp_path / "store", (MAPPED,))
    async with running(config) as runtime, \
            serving(runtime, http_fast_lane=fast_lane) as served:
        sent = [post(MAPPED_URL, b'{"user_id":"u1"}', "X-User: José".encode(),
                     "X-Note: naïve ☃".encode(), b"Cookie: sid=\xff\xfe"),
                post(MAPPED_URL, b'{"user_id":"u2"}', b"X-User: Jos\xe9"),
                post(MAPPED_URL, b'{"user_id":"u3"}', b"X-User: ok", b"X-Note: caf\xe9")]
        answers = [await exchange(served.port, request) for request in sent]
        assert asgi_calls == ([] if fast_lane else ["POST"] * 3)
    [(head, body)] = answers[0]
    assert head.startswith(b"HTTP/1.1 202 "), body
    events = await stored_events(config.store.url)
    meta = msgspec.json.decode(events[0].meta)
    assert meta["h"] == {"x-user": "José"}
    kept = msgspec.json.decode(meta["hs"])
    assert (kept["x-user"], kept["x-note"]) == ("José", "naïve ☃")
    assert "cookie" not in kept
    for [(head, body)], header in zip(answers[1:], ("x-user", "x-note"), strict=True):
        assert head.startswith(b"HTTP/1.1 400 "), body
        refusal = msgspec.json.decode(body)
        assert refusal["error"] == "invalid_utf8"
        assert refusal["message"].startswith(f"header {header!r} is not valid UTF-8")
        assert refusal["details"] == [{"index": None, "field": header,
                                       "reason": "header value not UTF-8"}]
    assert len(events) == 1
