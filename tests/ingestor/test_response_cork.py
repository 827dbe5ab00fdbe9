"""ResponseCork: a response head rides with its body in one transport write, in order.

The transport here records writes (the cork's only boundary); the real-server behaviour is
covered by every HTTP test, which all go through the corked protocol.
"""

from __future__ import annotations

import asyncio

from ingestor.http.server import ResponseCork

HEAD = b"HTTP/1.1 202 Accepted\r\ncontent-length: 14\r\n\r\n"
BODY = b'{"accepted":1}'


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_should_send_head_and_body_in_one_write() -> None:
    transport = RecordingTransport()
    cork = ResponseCork(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    cork.write(HEAD)
    assert transport.writes == []
    cork.write(BODY)
    assert transport.writes == [HEAD + BODY]
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert transport.writes == [HEAD + BODY]


async def test_should_send_a_lone_head_at_the_end_of_the_loop_iteration() -> None:
    transport = RecordingTransport()
    cork = ResponseCork(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    cork.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]


async def test_should_keep_order_of_streamed_chunks_and_flush_on_close() -> None:
    transport = RecordingTransport()
    cork = ResponseCork(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    cork.write(HEAD)
    cork.write(b"chunk-1")
    cork.write(b"chunk-2")
    cork.write(b"HTTP/1.1 200 OK\r\n\r\n")  # a second (pipelined) response's head
    cork.close()
    assert b"".join(transport.writes) == HEAD + b"chunk-1chunk-2HTTP/1.1 200 OK\r\n\r\n"
    assert transport.closed
    await asyncio.sleep(0)  # the scheduled flush must not write after close
    assert len(transport.writes) == 3


async def test_should_drop_a_held_head_when_the_connection_is_already_gone() -> None:
    transport = RecordingTransport()
    cork = ResponseCork(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    cork.write(HEAD)
    transport.close()  # the peer hung up; uvicorn closed the real transport itself
    await asyncio.sleep(0)
    assert transport.writes == []


def test_should_delegate_everything_else_to_the_transport() -> None:
    loop = asyncio.new_event_loop()
    try:
        cork = ResponseCork(RecordingTransport(), loop)  # type: ignore[arg-type]
        assert cork.get_extra_info("peername") == "info:peername"
        assert not cork.is_closing()
    finally:
        loop.close()
