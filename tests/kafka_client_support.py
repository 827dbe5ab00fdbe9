"""A real ingestor with its Kafka listener, in a thread of its own, behind a proxy that
counts every request's (API key, version) per client id.

Why a thread: confluent-kafka and kafka-python block, so the tests drive them from the test's
thread while the ingestor's loop serves. Why a proxy: which Produce/Metadata versions a
client really negotiated is only visible on the wire, and reading it there needs no change
to the product. The ingestor advertises the proxy's address in Metadata, so every
connection a client makes (bootstrap and broker) goes through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from icefloe.config import Config
from icefloe.formats.envelope import Envelope
from ingestor.kafka import apis
from ingestor.kafka.apis import RequestHeader, read_header
from ingestor.kafka.wire import Malformed, Writer
from tests.ingest_support import stored_events
from tests.security_support import ingestor

START_TIMEOUT_S = 60.0


@dataclass
class RequestLog:
    """Requests seen per (client id, API key, version); thread-safe."""

    counts: Counter[tuple[str | None, int, int]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, client_id: str | None, key: int, version: int) -> None:
        with self.lock:
            self.counts[(client_id, key, version)] += 1

    def versions(self, client_id: str, key: int) -> set[int]:
        """The versions of API ``key`` the client ``client_id`` sent."""
        with self.lock:
            return {v for (c, k, v) in self.counts if c == client_id and k == key}

    def count(self, client_id: str, key: int) -> int:
        """How many requests of API ``key`` the client ``client_id`` sent."""
        with self.lock:
            return sum(n for (c, k, _), n in self.counts.items()
                       if c == client_id and k == key)

    def apis(self, client_id: str) -> set[int]:
        with self.lock:
            return {k for (c, k, _) in self.counts if c == client_id}


@dataclass
class KafkaIngestor:
    """A running ingestor: ``bootstrap`` (the proxy, which Metadata advertises), the
    request log, and the config it serves. ``caps`` makes the proxy play an older broker
    for a client id: it answers that client's ApiVersions itself, with the ingestor's
    ranges capped at ``{api key: highest version}`` (what, say, Kafka 0.11 would list).
    ``lose_answers`` makes the proxy lose the answer to the next Produce of a client id:
    it waits for the ingestor's answer (the batch is durable by then), drops it and closes
    the client's connection, as a network failure at the worst moment would."""

    config: Config
    port: int
    requests: RequestLog
    caps: dict[str, dict[int, int]] = field(default_factory=dict)
    lose_answers: set[str] = field(default_factory=set)
    lost: int = 0
    """Answers lost so far."""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stored(self, stream: str) -> list[Envelope]:
        """The events of ``stream`` in the store's batch files (flushed, durable)."""
        return [e for e in asyncio.run(stored_events(self.config.store.url))
                if e.stream == stream]


def api_versions_capped(header: RequestHeader, caps: dict[int, int]) -> bytes:
    """The ApiVersions answer of a broker whose highest versions are ``caps`` (APIs not
    named keep the ingestor's range), framed for ``header``."""
    version = min(header.version, 3)
    compact = version >= 3
    table = {key: (low, min(high, caps.get(key, high)))
             for key, (low, high) in apis.ADVERTISED.items()}
    out = Writer().int16(0).array_len(len(table), compact=compact)
    for key, (low, high) in sorted(table.items()):
        out.int16(key).int16(low).int16(high)
        if compact:
            out.tagged_fields()
    if version >= 1:
        out.int32(0)
    if compact:
        out.tagged_fields()
    head = Writer().int32(header.correlation_id).getvalue()
    body = head + out.getvalue()
    return len(body).to_bytes(4, "big") + body


async def _pump_requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         back: asyncio.StreamWriter, front: KafkaIngestor,
                         lose: set[int]) -> None:
    """Forward client frames one by one, logging each header (a frame that does not
    parse, e.g. raw SASL bytes, is forwarded unlogged). A capped client's ApiVersions is
    answered here (the first request on a connection: nothing else is in flight); the
    correlation id of a Produce whose answer is to be lost goes into ``lose``."""
    while True:
        size = await reader.readexactly(4)
        frame = await reader.readexactly(int.from_bytes(size, "big", signed=True))
        with contextlib.suppress(Malformed):
            header, _ = read_header(frame)
            client = header.client_id or ""
            front.requests.add(header.client_id, header.api_key, header.version)
            caps = front.caps.get(client)
            if caps is not None and header.api_key == apis.API_VERSIONS:
                back.write(api_versions_capped(header, caps))
                await back.drain()
                continue
            if header.api_key == apis.PRODUCE and client in front.lose_answers:
                front.lose_answers.discard(client)
                lose.add(header.correlation_id)
        writer.write(size + frame)
        await writer.drain()


async def _pump_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        front: KafkaIngestor, lose: set[int]) -> None:
    """Forward the ingestor's answers frame by frame; at an answer to lose, stop (the
    handler then closes both connections)."""
    while True:
        size = await reader.readexactly(4)
        frame = await reader.readexactly(int.from_bytes(size, "big", signed=True))
        if int.from_bytes(frame[:4], "big", signed=True) in lose:
            front.lost += 1
            return
        writer.write(size + frame)
        await writer.drain()


def _proxy(target: list[int], front: list[KafkaIngestor]) -> Any:
    """The proxy's connection handler, to 127.0.0.1:``target[0]`` (known once the
    ingestor has bound)."""
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target[0])
        lose: set[int] = set()
        pumps = [asyncio.ensure_future(_pump_requests(client_r, server_w, client_w,
                                                      front[0], lose)),
                 asyncio.ensure_future(_pump_answers(server_r, client_w, front[0], lose))]
        with contextlib.suppress(Exception):
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for w in (client_w, server_w):
            w.close()
    return handle


async def _serve(config: Config, state: dict[str, Any], ready: threading.Event) -> None:
    target: list[int] = [0]
    front: list[KafkaIngestor] = []
    proxy = await asyncio.start_server(_proxy(target, front), "127.0.0.1", 0)
    port = proxy.sockets[0].getsockname()[1]
    ing = msgspec.structs.replace(config.ingestor, host="127.0.0.1", http_port=0,
                                  grpc_port=0, kafka_port=0,
                                  kafka_advertised_host="127.0.0.1",
                                  kafka_advertised_port=port)
    served = msgspec.structs.replace(config, ingestor=ing)
    stop = asyncio.Event()
    state.update(loop=asyncio.get_running_loop(), stop=stop)
    try:
        async with ingestor(served) as ports:
            assert ports.kafka is not None
            target[0] = ports.kafka
            front.append(KafkaIngestor(served, port, RequestLog()))
            state["ingestor"] = front[0]
            ready.set()
            await stop.wait()
    finally:
        proxy.close()


@contextlib.contextmanager
def kafka_ingestor(config: Config) -> Iterator[KafkaIngestor]:
    """Serve ``config`` (its Kafka listener on a free port, behind the proxy) until the
    block ends; a failure to start or stop fails the test with its exception."""
    state: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        try:
            asyncio.run(_serve(config, state, ready))
        except BaseException as exc:
            state["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, name="kafka-ingestor", daemon=True)
    thread.start()
    assert ready.wait(START_TIMEOUT_S), "the ingestor did not start"
    if "error" in state:
        raise state["error"]
    try:
        yield state["ingestor"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(START_TIMEOUT_S)
    if "error" in state:
        raise state["error"]
