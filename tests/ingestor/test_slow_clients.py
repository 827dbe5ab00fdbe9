"""Slow-loris and idle connections on a real ingestor, driven by raw sockets.

Deadlines are short here (0.5 s) and every wait is bounded generously; the assertions are
about what happens (408 and a closed connection, or an accepted request), not how fast.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from ingest_support import PAGEVIEWS, make_config
from security_support import ingestor

from icefloe.config import Config
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

QUICK = {"header_timeout_s": 0.5, "body_timeout_s": 0.5, "body_min_bytes_per_s": 200,
         "keep_alive_s": 0.5}
GIVE_UP_S = 8.0
BODY = b'{"user_id":"u1","url":"/slow"}'


def head(length: int = len(BODY)) -> bytes:
    return (b"POST /v1/streams/pageviews/events HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % length)


@contextlib.asynccontextmanager
async def connection(port: int) -> AsyncIterator[tuple[asyncio.StreamReader,
                                                       asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def dribble(writer: asyncio.StreamWriter, data: bytes, every_s: float) -> None:
    """Send ``data`` a byte at a time until done or the server hangs up."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(every_s)


@pytest.fixture
def quick(tmp_path: Path) -> Callable[..., Config]:
    """A config with short deadlines (``QUICK``), plus any other ingestor settings."""
    def build(**settings: object) -> Config:
        return make_config(tmp_path / "store", (PAGEVIEWS,), **{**QUICK, **settings})
    return build


async def answer(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded)."""
    return await asyncio.wait_for(reader.read(), GIVE_UP_S)


async def test_should_cut_off_headers_that_arrive_too_slowly(quick):
    async with ingestor(quick()) as ports, \
            connection(ports.http) as (reader, writer):
        sender = asyncio.create_task(dribble(writer, head(), every_s=0.1))
        reply = await answer(reader)  # returns once the server closed the connection
        sender.cancel()
    assert reply.startswith(b"HTTP/1.1 408 ")
    assert b'"error":"request_timeout"' in reply


async def test_should_close_a_connection_that_never_sends_anything(quick):
    async with ingestor(quick()) as ports, \
            connection(ports.http) as (reader, _):
        assert (await answer(reader)).startswith(b"HTTP/1.1 408 ")


async def test_should_cut_off_a_body_that_trickles_in(quick):
    async with ingestor(quick()) as ports, \
            connection(ports.http) as (reader, writer):
        writer.write(head(4000))  # 4000 bytes at ~10 bytes/s: far below 200 bytes/s
        sender = asyncio.create_task(dribble(writer, b" " * 4000, every_s=0.1))
        try:
            reply: bytes | None = await answer(reader)
        except ConnectionResetError:
            # The server closed while our bytes were still arriving: the kernel answers
            # those with a reset, which can overtake the 408 (uvicorn does not linger the
            # way nginx does). Being cut off within GIVE_UP_S is the behaviour under test.
            reply = None
        sender.cancel()
    if reply is not None:
        status, _, rest = reply.partition(b"\r\n")
        assert status == b"HTTP/1.1 408 Request Timeout"
        assert b"connection: close" in rest.lower()
        assert b'"error":"request_timeout"' in rest


async def test_should_accept_a_slow_but_steady_body(quick):
    body = b"[" + b",".join([BODY] * 20) + b"]"  # ~640 bytes in ~1.3 s: above 200 bytes/s
    async with ingestor(quick()) as ports, \
            connection(ports.http) as (reader, writer):
        writer.write(head(len(body)))
        for start in range(0, len(body), 32):
            writer.write(body[start:start + 32])
            await writer.drain()
            await asyncio.sleep(0.06)
        status = await asyncio.wait_for(reader.readline(), GIVE_UP_S)
    assert status.startswith(b"HTTP/1.1 202 ")


async def test_should_close_idle_keep_alive_connections(quick):
    async with ingestor(quick()) as ports, \
            connection(ports.http) as (reader, writer):
        writer.write(head() + BODY)
        await writer.drain()
        reply = await answer(reader)  # the 202, then the close after keep_alive_s idle
    assert reply.startswith(b"HTTP/1.1 202 ")
    assert reply.count(b"HTTP/1.1") == 1


async def test_should_bound_concurrent_grpc_calls_per_connection(quick):
    config = quick(grpc_max_streams_per_connection=1)
    async with ingestor(config) as ports:
        request = ingest_pb2.PublishRequest(stream="pageviews", events=[
            ingest_pb2.Event(json=BODY)])
        own = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports.grpc}", own) as busy, \
                grpc.aio.insecure_channel(f"127.0.0.1:{ports.grpc}", own) as other:
            held = ingest_pb2_grpc.IngestStub(busy).PublishStream()
            await held.write(request)
            assert (await held.read()).accepted == 1  # the one stream is open, and stays so
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ingest_pb2_grpc.IngestStub(busy).Publish(request, timeout=1)
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # queued behind it
            assert (await ingest_pb2_grpc.IngestStub(other).Publish(
                request, timeout=10)).accepted == 1  # another connection is not affected
            await held.done_writing()
            assert await held.read() is grpc.aio.EOF




def refused_head(length: int) -> bytes:
    """A request the ingestor answers (404) before reading a byte of its body."""
    return (b"POST /v1/streams/no-such-stream/events HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % length)


async def test_should_cut_off_the_trickling_body_of_a_refused_request(quick):
    """Answered before its body is read, a request must not let the client hold the
    connection by trickling that body (uvicorn discards it and cancels keep-alive on
    every byte): the rest must come within header_timeout_s of the answer."""
    async with ingestor(quick()) as ports, \
            connection(ports.http) as (reader, writer):
        writer.write(refused_head(4000))
        sender = asyncio.create_task(dribble(writer, b" " * 4000, every_s=0.1))
        reply = await asyncio.wait_for(reader.readuntil(b'"details":[]}'), GIVE_UP_S)
        # then the connection must end (a reset is fine: the client was still sending)
        with contextlib.suppress(ConnectionResetError):
            await answer(reader)
        sender.cancel()
    assert reply.startswith(b"HTTP/1.1 404 ")


async def test_should_close_an_idle_connection_after_a_refused_body_arrived(quick):
    """uvicorn's keep-alive timer is cancelled by the late body and never armed again."""
    async with ingestor(quick()) as ports, \
            connection(ports.http) as (reader, writer):
        writer.write(refused_head(len(BODY)))
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b'"details":[]}'), GIVE_UP_S)
        writer.write(BODY)  # the rest of the refused request, then nothing
        await writer.drain()
        reply = first + await answer(reader)
    assert reply.startswith(b"HTTP/1.1 404 ")
    assert reply.count(b"HTTP/1.1 ") == 2
    assert b"HTTP/1.1 408 " in reply
