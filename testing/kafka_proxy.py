"""A fault-injecting TCP proxy for Kafka clients: it loses the answers of chosen Produce
requests *after* the requests reached the broker (an icefloe ingestor).

Why: an idempotent producer's exactly-once rests on retries — a batch whose answer never
came is sent again with the same producer id, epoch and sequences. The interesting case
is a batch that *was* made durable while the client heard nothing. This proxy forwards a
chosen Produce request to the ingestor, then cuts the client's connection either at once
(``"early"``: the retry may arrive while the first attempt is still being flushed) or when
the ingestor's answer arrives (``"late"``: the first attempt is durable before the client
even notices). Either way the proxy keeps the ingestor's side of the connection open
until that answer came, so the batch is durable; only the client is left in the dark.

Frames are parsed only as far as Kafka's framing needs: a 4-byte size, then the request
header's API key and correlation id (answers carry the correlation id first, in request
order). ``route`` picks the ingestor of each new client connection, so a retry can be
sent to another ingestor than its first attempt. Nothing here imports icefloe.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

PRODUCE = 0
Mode = Literal["early", "late"]
Route = Callable[[int], tuple[str, int]]
"""Connection number (0, 1, ...) -> the (host, port) it is forwarded to."""
Policy = Callable[[int], "Mode | None"]
"""Produce request number (0, 1, ... over all connections) -> drop its answer how, or not."""
ANSWER_WAIT_S = 30.0


@dataclass
class _Cut:
    """The Produce request of one connection whose answer is being dropped."""

    correlation: int
    mode: Mode
    answered: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class ProxyStats:
    connections: int = 0
    produce_requests: int = 0
    cuts: int = 0
    """Produce requests chosen to lose their answer so far (counted when chosen, so a
    route can send the client's reconnect elsewhere)."""
    dropped: Counter[str] = field(default_factory=Counter)
    """Answers dropped by mode (``early``/``late``) whose request the ingestor answered."""
    routed: Counter[tuple[str, int]] = field(default_factory=Counter)


class KafkaProxy:
    """Listens on 127.0.0.1; every client connection gets its own upstream connection."""

    def __init__(self, route: Route, policy: Policy) -> None:
        self.route = route
        self.policy = policy
        self.stats = ProxyStats()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, client_r: asyncio.StreamReader,
                     client_w: asyncio.StreamWriter) -> None:
        target = self.route(self.stats.connections)
        self.stats.connections += 1
        try:
            up_r, up_w = await asyncio.open_connection(*target)
        except OSError:
            return  # as a refused connection to the client: it reconnects and retries
        self.stats.routed[target] += 1
        cuts: list[_Cut] = []
        answers = asyncio.create_task(self._answers(up_r, client_w, cuts))
        try:
            cut = await self._requests(client_r, up_w, cuts)
            if cut is None:
                await answers
                return
            if cut.mode == "early":
                client_w.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cut.answered.wait(), ANSWER_WAIT_S)
            if cut.answered.is_set():
                self.stats.dropped[cut.mode] += 1
        finally:
            answers.cancel()
            with contextlib.suppress(BaseException):
                await answers
            up_w.close()

    async def _requests(self, client_r: asyncio.StreamReader, up_w: asyncio.StreamWriter,
                        cuts: list[_Cut]) -> _Cut | None:
        """Forward the client's frames until one is chosen to lose its answer (returned,
        after it was written to the ingestor), or the client closed (None)."""
        while (frame := await _frame(client_r)) is not None:
            up_w.write(frame)
            await up_w.drain()
            if int.from_bytes(frame[4:6], "big") != PRODUCE:
                continue
            number = self.stats.produce_requests
            self.stats.produce_requests += 1
            mode = self.policy(number)
            if mode is not None:
                cut = _Cut(int.from_bytes(frame[8:12], "big", signed=True), mode)
                self.stats.cuts += 1
                cuts.append(cut)
                return cut
        up_w.write_eof()
        return None

    @staticmethod
    async def _answers(up_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                       cuts: list[_Cut]) -> None:
        """Forward answers until the dropped one arrives; it, and all after it, are not."""
        while (frame := await _frame(up_r)) is not None:
            if cuts and int.from_bytes(frame[4:8], "big", signed=True) == cuts[0].correlation:
                cuts[0].answered.set()
                client_w.close()
                return
            if cuts and cuts[0].mode == "early":
                continue  # the client is gone already
            client_w.write(frame)
            with contextlib.suppress(ConnectionError):
                await client_w.drain()
        client_w.close()


async def _frame(reader: asyncio.StreamReader) -> bytes | None:
    """One size-prefixed frame (with its size), or None at the end of the stream."""
    try:
        size = await reader.readexactly(4)
        return size + await reader.readexactly(int.from_bytes(size, "big"))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def every(nth: int, *, limit: int, modes: tuple[Mode, ...] = ("early", "late"),
          offset: int = 1) -> Policy:
    """Drop the answer of Produce request ``offset``, ``offset + nth``, ... (``limit`` in
    all), alternating ``modes``."""

    def policy(number: int) -> Mode | None:
        if number < offset or (number - offset) % nth:
            return None
        index = (number - offset) // nth
        return modes[index % len(modes)] if index < limit else None

    return policy
