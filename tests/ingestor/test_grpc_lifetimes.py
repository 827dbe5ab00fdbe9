"""gRPC connection and stream lifetimes on a real grpc.aio server, with real clients.

Idle PublishStreams are ended by the server; connections without calls, too old, or
flooding pings are closed by grpc core under the configured options; calls beyond the
per-connection stream limit (REFUSED_STREAM) all succeed through ``icefloe.client``.
A raw HTTP/2 client over a socket plays the peers a gRPC library would never be.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from ingest_support import grpc_serving, make_config

from icefloe.client import AsyncGrpcClient, IngestRejected
from icefloe.config import IngestorSection, load_config
from icefloe.errors import ConfigError
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

VIEW = ingest_pb2.Event(json=b'{"user_id":"u1"}')
ROOT = Path(__file__).resolve().parents[2]


def publish_request(n: int = 0) -> ingest_pb2.PublishRequest:
    return ingest_pb2.PublishRequest(stream="pageviews", request_id=f"r-{n}", events=[VIEW])


def reason(exc: grpc.aio.AioRpcError) -> str:
    status = rpc_status.from_call(exc)
    assert status is not None
    for packed in status.details:
        if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            packed.Unpack(info)
            return info.reason
    return ""


async def ended_by_server(call: grpc.aio.StreamStreamCall, within_s: float) -> str:
    """Read ``call`` until the server ends it; its ErrorInfo reason (fails after
    ``within_s``: the server left the stream open)."""
    async def drain() -> None:
        async with asyncio.timeout(within_s):
            while await call.read() is not grpc.aio.EOF:
                pass

    with pytest.raises(grpc.aio.AioRpcError) as info:
        await drain()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
    return reason(info.value)


# -- idle streams -----------------------------------------------------------------------------


async def test_should_end_publish_streams_that_send_nothing_and_keep_busy_ones(tmp_path):
    config = make_config(tmp_path / "store", grpc_stream_idle_s=0.4)
    async with grpc_serving(config) as (runtime, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        silent = [stub.PublishStream() for _ in range(40)]
        answered_once = stub.PublishStream()
        await answered_once.write(publish_request())
        assert (await answered_once.read()).accepted == 1
        busy = stub.PublishStream()

        async def keep_sending() -> int:
            for n in range(12):  # 1.2 s: three idle periods, never quiet for one
                await busy.write(publish_request(n))
                assert (await busy.read()).accepted == 1
                await asyncio.sleep(0.1)
            await busy.done_writing()
            return n + 1

        sent, *reasons = await asyncio.gather(
            keep_sending(), *(ended_by_server(call, 5) for call in [*silent, answered_once]))
        assert sent == 12
        assert await busy.code() == grpc.StatusCode.OK
        assert set(reasons) == {"stream_idle"}
        assert runtime.metrics.grpc_idle_streams._value.get() == 41


async def test_client_publish_stream_should_reopen_an_idle_ended_stream_without_retries(
        tmp_path):
    config = make_config(tmp_path / "store", grpc_stream_idle_s=0.3)

    async def slow_source() -> AsyncIterator[ingest_pb2.PublishRequest]:
        for n in range(3):
            yield publish_request(n)
            await asyncio.sleep(0.8)  # quiet for longer than the idle limit

    async with grpc_serving(config) as (_, served), \
            AsyncGrpcClient(f"127.0.0.1:{served.port}", retries=0) as client:
        responses = [r async for r in client.publish_stream(slow_source())]
    assert [(r.request_id, r.accepted) for r in responses] == [
        ("r-0", 1), ("r-1", 1), ("r-2", 1)]


def test_sync_client_publish_stream_should_reopen_an_idle_ended_stream(tmp_path):
    import threading

    from icefloe.client import GrpcClient

    config = make_config(tmp_path / "store", grpc_stream_idle_s=0.3)
    served_port: list[int] = []
    done = threading.Event()

    def slow_source():
        for n in range(2):
            yield publish_request(n)
            time.sleep(0.8)  # quiet for longer than the idle limit

    async def serve() -> None:
        async with grpc_serving(config) as (_, served):
            served_port.append(served.port)
            await asyncio.to_thread(done.wait, 30)

    def send() -> list[tuple[str, int]]:
        while not served_port:
            time.sleep(0.01)
        try:
            with GrpcClient(f"127.0.0.1:{served_port[0]}", retries=0) as client:
                return [(r.request_id, r.accepted)
                        for r in client.publish_stream(slow_source())]
        finally:
            done.set()

    async def main() -> list[tuple[str, int]]:
        server = asyncio.create_task(serve())
        try:
            return await asyncio.to_thread(send)
        finally:
            await server

    assert asyncio.run(main()) == [("r-0", 1), ("r-1", 1)]


# -- REFUSED_STREAM ---------------------------------------------------------------------------


async def test_should_answer_every_call_of_a_burst_over_one_channel_beyond_the_stream_limit(
        tmp_path):
    """1,000 concurrent unary calls on one channel against max_concurrent_streams = 16: grpc
    core resets a share of them with REFUSED_STREAM (the client's count of open streams
    drops before the server's does); the client retries those apart from ``retries``, so
    even with ``retries=0`` (no budget for outages) every call is acknowledged."""
    config = make_config(tmp_path / "store", grpc_max_streams_per_connection=16)
    async with grpc_serving(config) as (_, served), \
            AsyncGrpcClient(f"127.0.0.1:{served.port}", retries=0, timeout=30) as client:
        accepted = await asyncio.gather(*(
            client.publish("pageviews", [{"user_id": f"u{n}"}]) for n in range(1000)))
    assert accepted == [1] * 1000


async def test_a_refused_stream_is_reported_as_such_once_its_budget_is_spent(tmp_path):
    config = make_config(tmp_path / "store", grpc_max_streams_per_connection=4)
    async with grpc_serving(config) as (_, served), \
            AsyncGrpcClient(f"127.0.0.1:{served.port}", retries=0) as client:
        client.refused_budget_s = 0  # no waiting for refused streams at all
        results = await asyncio.gather(*(
            client.publish("pageviews", [{"user_id": "u"}]) for _ in range(300)),
            return_exceptions=True)
    refused = [r for r in results if isinstance(r, IngestRejected)]
    assert refused, "grpc core refused no stream of 300 concurrent calls over a limit of 4"
    assert {(r.code, r.retryable) for r in refused} == {("refused_stream", True)}


# -- connection lifetimes (raw HTTP/2) ----------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, PING, GOAWAY, HEADERS = 0x4, 0x6, 0x7, 0x1
ENHANCE_YOUR_CALM = 0xB


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing (short names and values only)."""
    assert len(name) < 127
    assert len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


class RawH2:
    """A bare HTTP/2 connection: writes frames, reads them until GOAWAY or EOF."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read_exact(self, n: int) -> bytes | None:
        while len(self.buffer) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def goaway(self, within_s: float) -> tuple[int, bytes, float] | None:
        """(error code, debug data, seconds waited) of the GOAWAY the server sends, None on
        EOF first;
        acks the server's SETTINGS and PINGs like a well-behaved peer meanwhile."""
        started = time.monotonic()
        self.sock.settimeout(within_s)
        while (head := self._read_exact(9)) is not None:
            length = int.from_bytes(head[:3], "big")
            kind, flags = head[3], head[4]
            payload = self._read_exact(length)
            if payload is None:
                return None
            if kind == GOAWAY:
                code = struct.unpack(">II", payload[:8])[1]
                return code, payload[8:], time.monotonic() - started
            if kind == SETTINGS and not flags & 1:
                self.send(frame(SETTINGS, 1, 0))
        return None

    def closed_within(self, seconds: float) -> bool:
        """True once the server closes the socket (EOF or reset) within ``seconds``."""
        self.sock.settimeout(seconds)
        try:
            while self.sock.recv(65536):
                pass
        except TimeoutError:
            return False
        except ConnectionResetError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


async def test_should_goaway_a_connection_without_calls_after_max_connection_idle(tmp_path):
    config = make_config(tmp_path / "store", grpc_max_connection_idle_s=0.5)
    async with grpc_serving(config) as (_, served):
        raw = RawH2(served.port)
        try:
            got = await asyncio.to_thread(raw.goaway, 10)
            assert got is not None, "closed without GOAWAY"
            _, debug, waited = got
            assert b"idle" in debug
            assert 0.3 <= waited < 5
        finally:
            raw.close()


async def test_should_close_a_connection_holding_a_half_sent_call_after_age_and_grace(
        tmp_path):
    """A unary call whose message never comes never reaches the servicer, so no stream
    idle limit sees it: the connection's age and grace bound it instead."""
    config = make_config(tmp_path / "store", grpc_max_connection_age_s=0.5,
                         grpc_max_connection_age_grace_s=0.5)
    async with grpc_serving(config) as (_, served):
        raw = RawH2(served.port)
        try:
            headers = b"".join([
                literal(b":method", b"POST"), literal(b":scheme", b"http"),
                literal(b":path", b"/icefloe.v1.Ingest/Publish"),
                literal(b":authority", b"localhost"),
                literal(b"content-type", b"application/grpc"), literal(b"te", b"trailers")])
            raw.send(frame(HEADERS, 0x4, 1, headers))  # END_HEADERS, no END_STREAM
            started = time.monotonic()
            got = await asyncio.to_thread(raw.goaway, 10)
            assert got is not None, "closed without GOAWAY"
            assert await asyncio.to_thread(raw.closed_within, 10)
            assert time.monotonic() - started < 6
        finally:
            raw.close()


async def test_should_goaway_enhance_your_calm_on_a_ping_flood(tmp_path):
    config = make_config(tmp_path / "store", grpc_max_ping_strikes=2)
    async with grpc_serving(config) as (_, served):
        raw = RawH2(served.port)
        try:
            raw.send(b"".join(frame(PING, 0, 0, struct.pack(">Q", n)) for n in range(50)))
            got = await asyncio.to_thread(raw.goaway, 10)
            assert got is not None
            assert got[0] == ENHANCE_YOUR_CALM
            assert await asyncio.to_thread(raw.closed_within, 10)
        finally:
            raw.close()


# -- memory, measured in a separate server process ----------------------------------------------

SERVER_CONFIG = """
[store]
url = "file://store"
[ingestor]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
grpc_stream_idle_s = 0.5
[[streams]]
name = "pageviews"
table = "web.pageviews"
columns = [{ name = "user_id", type = "string" }]
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def open_idle_streams(port: int, channels: int, per_channel: int) -> list[str]:
    """Open ``channels`` x ``per_channel`` PublishStreams that send nothing; the reasons the
    server gave for ending each one."""
    own_connection = [("grpc.use_local_subchannel_pool", 1)]  # channels share one otherwise
    chans = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=own_connection)
             for _ in range(channels)]
    try:
        calls = [ingest_pb2_grpc.IngestStub(c).PublishStream() for c in chans
                 for _ in range(per_channel)]
        return await asyncio.gather(*(ended_by_server(call, 20) for call in calls))
    finally:
        await asyncio.gather(*(c.close() for c in chans))


@contextlib.contextmanager
def ingestor_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``icefloe ingestor`` in a child process (its RSS is its own): the process and its
    gRPC port."""
    (tmp_path / "icefloe.toml").write_text(textwrap.dedent(SERVER_CONFIG))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, whatever is installed
    proc = subprocess.Popen([sys.executable, "-m", "icefloe", "ingestor", "--config",
                             str(tmp_path / "icefloe.toml"), "--log-level", "warning"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, proc.stderr.read()  # type: ignore[union-attr]
        yield proc, json.loads(line)["grpc_port"]
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_server_memory_stays_bounded_under_waves_of_idle_streams(tmp_path):
    with ingestor_process(tmp_path) as (proc, port):
        rss = []
        for _ in range(5):  # 1,000 idle streams per wave (20 connections x 50)
            reasons = asyncio.run(open_idle_streams(port, 20, 50))
            assert len(reasons) == 1000
            assert set(reasons) == {"stream_idle"}
            rss.append(rss_mb(proc.pid))
        # the first wave warms allocator arenas; later ones must not pile up: 5,000
        # streams held open would cost ~120 MB (3,000 cost 73 MB before they were ended)
        assert max(rss) - rss[0] < 25, f"RSS after each wave (MB): {rss}"


async def refused_calls(port: int, n: int) -> set[grpc.StatusCode]:
    """``n`` unary Publish calls the server refuses (an unknown stream): their codes."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        request = ingest_pb2.PublishRequest(stream="no-such-stream")

        async def one() -> grpc.StatusCode:
            try:
                await stub.Publish(request, timeout=30)
            except grpc.aio.AioRpcError as error:
                return error.code()
            return grpc.StatusCode.OK

        codes: set[grpc.StatusCode] = set()
        for _ in range(n // 100):
            codes.update(await asyncio.gather(*(one() for _ in range(100))))
        return codes


@pytest.mark.timeout(120)
def test_server_memory_stays_bounded_under_a_flood_of_refused_calls(tmp_path):
    """Refusals are what a hostile client makes most of: 10,000 of them must not pile up
    memory (measured here: +8-10 MB over the first wave's level, allocator arenas, with
    either way of ending the call)."""
    with ingestor_process(tmp_path) as (proc, port):
        rss = []
        for _ in range(5):
            assert asyncio.run(refused_calls(port, 2000)) == {grpc.StatusCode.NOT_FOUND}
            rss.append(rss_mb(proc.pid))
        assert max(rss) - rss[0] < 25, f"RSS after each 2,000 refusals (MB): {rss}"


# -- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "keys"), [
    ({"grpc_keepalive_time_s": 10, "grpc_keepalive_timeout_s": 10},
     ("ingestor.grpc_keepalive_timeout_s", "ingestor.grpc_keepalive_time_s")),
    ({"grpc_max_connection_age_grace_s": 5, "flush_timeout_s": 10},
     ("ingestor.grpc_max_connection_age_grace_s", "ingestor.flush_timeout_s")),
    ({"grpc_stream_idle_s": 0}, ("ingestor.grpc_stream_idle_s",)),
    ({"grpc_max_ping_strikes": 0}, ("ingestor.grpc_max_ping_strikes",)),
])
def test_config_should_refuse_lifetimes_that_defeat_each_other(tmp_path, settings, keys):
    lines = ["[ingestor]", *(f"{k} = {v}" for k, v in settings.items())]
    (tmp_path / "icefloe.toml").write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "icefloe.toml", env={})
    for key in keys:
        assert key in str(info.value)


def test_config_defaults_bound_every_lifetime():
    ing = IngestorSection()
    assert (ing.grpc_keepalive_time_s, ing.grpc_keepalive_timeout_s,
            ing.grpc_min_ping_interval_s, ing.grpc_max_ping_strikes,
            ing.grpc_max_connection_idle_s, ing.grpc_max_connection_age_s,
            ing.grpc_max_connection_age_grace_s, ing.grpc_stream_idle_s) == (
        60, 20, 10, 2, 300, 3600, 60, 60)
