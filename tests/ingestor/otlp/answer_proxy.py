"""A fault-injecting TCP proxy for OTLP exporters: it loses the answers of the first requests
*after* the ingestor made them durable.

Why: an exporter retries an export whose answer never came (a connection error is
retriable on OTLP/HTTP and OTLP/gRPC alike), with the same bytes. The case that tests exactly
once is a request that *was* durable while the exporter heard nothing. The proxy forwards
everything, and on the first ``drops`` connections cuts both sides the moment the
ingestor's answer starts (one proxy per exporter: the first request of each signal): on
HTTP/1.1 the first bytes the ingestor sends (it sends nothing before its
response), on HTTP/2 (gRPC) the first HEADERS frame of a stream (the server's SETTINGS,
PINGs and WINDOW_UPDATEs before it are forwarded). The ingestor answers only once the
request is durable, so a cut answer is a durable request the exporter will send again.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

HTTP2_HEADERS = 0x1
_FRAME_HEAD = 9


@dataclass
class ProxyStats:
    connections: int = 0
    cut: int = 0
    """Answers lost (the ingestor's response reached the proxy and went no further)."""


class AnswerDropProxy:
    """Listens on 127.0.0.1; each connection gets its own connection to ``target``."""

    def __init__(self, target: int, *, http2: bool, drops: int = 1) -> None:
        self.target = target
        self.http2 = http2
        self.drops = drops
        self.stats = ProxyStats()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> AnswerDropProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader,
                      client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.stats.connections += 1
        cut = self.drops > 0
        if cut:
            self.drops -= 1
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            client_w.close()
            return
        upstream = asyncio.create_task(self._pipe(client_r, up_w))
        try:
            await self._answers(up_r, client_w, cut)
        finally:
            upstream.cancel()
            with contextlib.suppress(BaseException):
                await upstream
            for writer in (client_w, up_w):
                writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    async def _answers(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       cut: bool) -> None:
        """Forward the ingestor's bytes; on a cut connection, stop at the answer's start."""
        pending = b""
        while data := await reader.read(65536):
            if not cut:
                writer.write(data)
                await writer.drain()
                continue
            if not self.http2:
                self.stats.cut += 1
                return
            pending += data
            forward, answered, pending = _split_at_headers(pending)
            writer.write(forward)
            await writer.drain()
            if answered:
                self.stats.cut += 1
                return


def _split_at_headers(data: bytes) -> tuple[bytes, bool, bytes]:
    """The whole HTTP/2 frames before the first HEADERS frame, whether one was found, and
    what is left (an incomplete frame, or the HEADERS frame on)."""
    at = 0
    while len(data) - at >= _FRAME_HEAD:
        length = int.from_bytes(data[at:at + 3], "big")
        if data[at + 3] == HTTP2_HEADERS:
            return data[:at], True, data[at:]
        if len(data) - at < _FRAME_HEAD + length:
            break
        at += _FRAME_HEAD + length
    return data[:at], False, data[at:]
