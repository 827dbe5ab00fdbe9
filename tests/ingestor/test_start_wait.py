"""An ingestor started while its object store does not answer: it waits, unready, and
serves once the store answers (#36). It used to exit when its start-up reads spent their
retries, and a supervisor restarting it gave up after ten exits in a row.

A real ``icefloe ingestor`` process against a moto S3 server that is started late (the
endpoint refuses connections first), and the wait loop itself on a manual clock."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from icefloe.clock import ManualClock
from icefloe.errors import PermanentStoreError, TransientStoreError
from ingestor.starting import MAX_DELAY_S, Starting, start_delay, start_waiting
from testing.chaos.moto_server import MotoServer

ICEFLOE = str(Path(sys.executable).parent / "icefloe")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="icefloe.v1.Ingest"), timeout=5).status


def until(check: Any, what: str, proc: subprocess.Popen[str], timeout: float = 60) -> Any:
    """Poll ``check()`` until it returns something truthy; the process must stay up."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"the ingestor exited: {proc.stderr.read()}"  # type: ignore[union-attr]
        try:
            got = check()
        except (httpx.TransportError, grpc.RpcError):
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_an_ingestor_started_while_the_store_is_down_waits_unready_then_serves(
        s3_bucket: Any, tmp_path: Path) -> None:
    store_port, http_port, grpc_port = free_port(), free_port(), free_port()
    config = tmp_path / "icefloe.toml"
    config.write_text(textwrap.dedent(f"""
        [store]
        url = "{s3_bucket.url}"
        endpoint_url = "http://127.0.0.1:{store_port}"
        region = "us-east-1"
        [ingestor]
        host = "127.0.0.1"
        http_port = {http_port}
        grpc_port = {grpc_port}
        [[streams]]
        name = "clicks"
        table = "web.clicks"
        columns = [{{ name = "id", type = "string", required = true }}]
        """))
    proc = subprocess.Popen([ICEFLOE, "ingestor", "--config", str(config), "--log-format",
                             "text", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{http_port}"
    server: MotoServer | None = None
    try:
        until(lambda: httpx.get(f"{url}/healthz").status_code == 200, "/healthz", proc)

        def failed_once() -> httpx.Response | None:
            ready = httpx.get(f"{url}/readyz")
            return ready if "start attempt" in ready.text else None
        ready = until(failed_once, "a failed start attempt", proc)
        assert ready.status_code == 503
        assert ready.json()["error"] == "not_ready"
        assert "waiting for the object store" in ready.json()["message"]
        assert int(ready.headers["retry-after"]) >= 1
        refused = httpx.post(f"{url}/v1/streams/clicks/events", json=[{"id": "early"}])
        assert (refused.status_code, refused.json()["error"]) == (503, "not_ready")
        assert health(grpc_port) == health_pb2.HealthCheckResponse.NOT_SERVING

        server = MotoServer(port=store_port)  # the store answers now (same buckets)
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(90)
        assert line, f"no ready line: {proc.poll()}"
        assert line[0], f"no ready line: {proc.poll()}"
        assert json.loads(line[0])["http_port"] == http_port
        assert httpx.get(f"{url}/readyz").status_code == 200
        accepted = httpx.post(f"{url}/v1/streams/clicks/events", json=[{"id": "late"}])
        assert accepted.status_code == 202, accepted.text
        assert health(grpc_port) == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if server is not None:
            server.stop()
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    assert "ingestor not ready: waiting for the object store: start attempt 1 failed" \
        in stderr, stderr


async def test_the_wait_backs_off_on_the_injected_clock_and_ends_when_the_store_answers(
        ) -> None:
    clock = ManualClock()
    began = clock.monotonic()
    calls: list[float] = []
    sentinel: Any = object()

    async def start() -> Any:
        calls.append(clock.monotonic() - began)
        if len(calls) <= 6:
            raise TransientStoreError("connection refused", op="get", key="manifest/queue")
        return sentinel

    state = Starting()
    assert await start_waiting(start, state, asyncio.Event(), clock=clock) is sentinel
    assert state.failures == 6
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    caps = [min(MAX_DELAY_S, 0.5 * 2 ** n) for n in range(6)]
    assert all(cap / 2 <= gap <= cap for gap, cap in zip(gaps, caps, strict=True)), gaps
    assert "start attempt 6 failed (TransientStoreError: connection refused" in state.reason
    assert start_delay(40) <= MAX_DELAY_S


async def test_a_permanent_store_error_still_stops_the_start_and_stop_ends_the_wait(
        ) -> None:
    async def denied() -> Any:
        raise PermanentStoreError("access denied", op="put", key="probe")

    with pytest.raises(PermanentStoreError):
        await start_waiting(denied, Starting(), asyncio.Event(), clock=ManualClock())

    stop = asyncio.Event()

    async def down() -> Any:
        stop.set()  # SIGTERM arrives during the outage
        raise TransientStoreError("connection refused", op="get", key="manifest/queue")

    assert await start_waiting(down, Starting(), stop, clock=ManualClock()) is None


def test_should_answer_a_call_the_stand_in_holds_as_it_stops_not_cancel_it(tmp_path,
                                                                           monkeypatch):
    """The real server takes the port from the stand-in: a call the stand-in is answering
    at that moment still gets its UNAVAILABLE, which clients retry elsewhere, not CANCELLED,
    which they do not (a chaos run caught one at an ingestor's restart)."""
    from ingest_support import make_config

    from ingestor import starting

    async def scenario() -> None:
        arrived, release = asyncio.Event(), asyncio.Event()

        def held(self: Any, details: Any) -> grpc.RpcMethodHandler:
            async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
                arrived.set()
                await release.wait()  # still in the stand-in's hands when it stops
                await context.abort(grpc.StatusCode.UNAVAILABLE, "not ready: starting")
            return grpc.unary_unary_rpc_method_handler(refuse)

        monkeypatch.setattr(starting._Unavailable, "service", held)
        standin = starting.StartingGrpc(make_config(tmp_path / "store"), Starting(), None)
        port = await standin.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            publish = channel.unary_unary("/icefloe.v1.Ingest/Publish")
            call = publish(b"")
            await asyncio.wait_for(arrived.wait(), 10)
            stopping = asyncio.create_task(standin.stop())
            await asyncio.sleep(0.2)  # the stop is under way
            assert not stopping.done()
            release.set()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            await asyncio.wait_for(stopping, 10)

    asyncio.run(scenario())
