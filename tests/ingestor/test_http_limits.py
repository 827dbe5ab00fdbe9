"""The HTTP front's own limits (issue #29) on real servers, driven by raw sockets.

Header bytes and count (431), HTTP versions (505), transfer codings (501), open
connections per process, the overall cap on one body's upload (``body_max_s``), and a
client that half-closes after its request. The memory test runs the ingestor in a child
process, so its RSS can be read from ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from ingest_support import PAGEVIEWS, make_config
from prometheus_client.parser import text_string_to_metric_families
from security_support import ingestor

from icefloe.clock import ManualClock
from icefloe.config import Config, IngestorSection, load_config
from icefloe.errors import ConfigError
from ingestor.http.slow_clients import SlowClientGuard

ROOT = Path(__file__).resolve().parents[2]
BODY = b'{"user_id":"u1","url":"/limits"}'
GIVE_UP_S = 10.0
MIB = 1024 * 1024
LANES = pytest.mark.parametrize("fast_lane", [True, False], ids=["fast-lane", "asgi-only"])


def post(body: bytes = BODY, *, extra: bytes = b"") -> bytes:
    return (b"POST /v1/streams/pageviews/events HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\n%scontent-length: %d\r\n\r\n%s"
            % (extra, len(body), body))


def config(tmp_path: Path, **ingestor_settings: object) -> Config:
    return make_config(tmp_path / "store", (PAGEVIEWS,), **ingestor_settings)


async def exchange(port: int, data: bytes, *, half_close: bool = False) -> bytes:
    """Send ``data``; everything the server answers until it closes (bounded)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        if half_close:
            writer.write_eof()
        return await asyncio.wait_for(reader.read(), GIVE_UP_S)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def status_and_body(reply: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body) if body else {}


def refused_total(metrics_text: str, reason: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "icefloe_ingest_http_refused_total" \
                    and sample.labels.get("reason") == reason:
                return sample.value
    return 0.0


# -- header limits: count (in process) and bytes (child process, RSS measured) ---------------

async def test_should_refuse_more_header_fields_than_max_headers(tmp_path):
    fields = b"".join(b"x-f%d: v\r\n" % i for i in range(9))  # + host, type, length = 12
    async with ingestor(config(tmp_path, max_headers=12)) as ports:
        ok = await exchange(ports.http, post(extra=fields), half_close=True)
        refused = await exchange(ports.http, post(extra=fields + b"x-one-more: v\r\n"))
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"http://127.0.0.1:{ports.http}/metrics")).text
    assert status_and_body(ok)[0] == 202
    status, body = status_and_body(refused)
    assert (status, body["error"]) == (431, "too_many_headers")
    assert b"connection: close" in refused
    assert refused_total(metrics, "header_count") == 1


async def test_should_refuse_a_head_over_max_header_bytes_as_it_arrives(tmp_path):
    """The limit counts the head as it arrives: the request line alone can pass it."""
    async with ingestor(config(tmp_path, max_header_bytes=4096)) as ports:
        fits = await exchange(ports.http, post(extra=b"x-pad: " + b"a" * 3000 + b"\r\n"),
                              half_close=True)
        long_url = await exchange(ports.http, b"GET /healthz?" + b"q" * 8000 + b" HTTP/1.1\r\n")
        big_body = await exchange(ports.http, post(b"[" + b",".join([BODY] * 400) + b"]"),
                                  half_close=True)
    assert status_and_body(fits)[0] == 202
    status, body = status_and_body(long_url)
    assert (status, body["error"]) == (431, "header_too_large")
    assert status_and_body(big_body)[0] == 202  # a body in the same reads never counts


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@contextlib.contextmanager
def child_ingestor(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """``icefloe ingestor`` from this tree in a child process; yields it and its HTTP port."""
    path = tmp_path / "icefloe.toml"
    path.write_text(f'[store]\nurl = "{(tmp_path / "store").as_uri()}"\n[ingestor]\n'
                    'host = "127.0.0.1"\nhttp_port = 0\ngrpc_port = 0\n[[streams]]\n'
                    'name = "pageviews"\ntable = "web.pageviews"\ncolumns = [{ name = '
                    '"user_id", type = "string" }, { name = "url", type = "string" }]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "icefloe", "ingestor", "--config", str(path),
                             "--log-level", "warning"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        yield proc, int(ready["http_port"])
    finally:
        proc.terminate()
        proc.wait(30)


async def huge_header(port: int, size: int) -> bytes:
    """Try to send one header of ``size`` bytes; stop once the server answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = asyncio.create_task(asyncio.wait_for(reader.read(), 30))
    try:
        writer.write(b"POST /v1/streams/pageviews/events HTTP/1.1\r\nhost: x\r\nx-big: ")
        chunk = b"a" * MIB
        with contextlib.suppress(ConnectionError):
            for _ in range(size // MIB):
                if answer.done():
                    break
                writer.write(chunk)
                await writer.drain()
            else:
                writer.write(b"\r\ncontent-length: %d\r\n\r\n%s" % (len(BODY), BODY))
                await writer.drain()
        return await answer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_should_refuse_64_mib_headers_with_431_and_keep_memory_bounded(tmp_path):
    """8 connections each try a 64 MiB header: each gets 431 long before it is sent, the
    server's peak RSS grows by less than 50 MB, and a client posting meanwhile is served."""
    with child_ingestor(tmp_path) as (proc, port):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            assert (await client.post("/v1/streams/pageviews/events", content=BODY,
                                      headers={"content-type": "application/json"})
                    ).status_code == 202  # warm: the first flush has allocated its buffers
            before = rss_kib(proc.pid)
            attack = asyncio.gather(*(huge_header(port, 64 * MIB) for _ in range(8)))
            served = []
            while not attack.done():  # others keep being answered, each within 5 s
                started = time.monotonic()
                r = await client.post("/v1/streams/pageviews/events", content=BODY,
                                      headers={"content-type": "application/json"})
                served.append((r.status_code, time.monotonic() - started))
            replies = await attack
            peak = rss_kib(proc.pid, "VmHWM")
    for reply in replies:
        status, body = status_and_body(reply)
        assert (status, body["error"]) == (431, "header_too_large")
    assert served
    assert all(status == 202 for status, _ in served)
    print(f"RSS {before} KiB, peak {peak} KiB, {len(served)} requests served meanwhile")
    assert (peak - before) / 1024 < 50, f"RSS {before} KiB → peak {peak} KiB"


# -- framing: HTTP versions and transfer codings -------------------------------------------

@pytest.mark.parametrize("request_line", [
    b"POST /v1/streams/pageviews/events HTTP/2.0\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # the HTTP/2 connection preface
], ids=["http2-request-line", "http2-preface"])
async def test_should_answer_505_to_http2_on_the_http1_port(tmp_path, request_line):
    async with ingestor(config(tmp_path)) as ports:
        reply = await exchange(ports.http, request_line)
    status, body = status_and_body(reply)
    assert (status, body["error"]) == (505, "http_version_not_supported")


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/streams/pageviews/events HTTP/1.1\r\nhost: x\r\nbad\x01name: v\r\n\r\n",
    b"NOT AN HTTP REQUEST\r\n\r\n",
    b"POST /v1/streams/pageviews/events HTTP/1.1\r\nhost: x\r\n"
    b"content-length: 2\r\ncontent-length: 3\r\n\r\n{}",
], ids=["control-char-in-name", "no-request-line", "two-content-lengths"])
async def test_should_answer_json_400_to_what_is_not_http(tmp_path, caplog, request_bytes):
    """What the parser cannot read gets the same JSON error shape as every refusal, is
    counted, and logs nothing (a client's mistake must not flood the log)."""
    async with ingestor(config(tmp_path)) as ports:
        reply = await exchange(ports.http, request_bytes)
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(f"http://127.0.0.1:{ports.http}/metrics")).text
    status, body = status_and_body(reply)
    assert (status, body["error"]) == (400, "malformed_request"), reply
    assert "not valid HTTP/1.1" in str(body["message"])
    assert refused_total(metrics, "malformed_request") == 1
    assert not [r for r in caplog.records if "Invalid HTTP" in r.getMessage()]


@LANES
@pytest.mark.parametrize("coding", [b"gzip, chunked", b"deflate, chunked", b"identity, chunked"])
async def test_should_refuse_transfer_codings_other_than_chunked(tmp_path, fast_lane, coding):
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    head = (b"POST /v1/streams/pageviews/events HTTP/1.1\r\nhost: x\r\n"
            b"content-type: application/json\r\ntransfer-encoding: %s\r\n\r\n")
    async with ingestor(config(tmp_path, http_fast_lane=fast_lane)) as ports:
        refused = await exchange(ports.http, head % coding + chunked)
        plain = await exchange(ports.http, head % b"chunked" + chunked, half_close=True)
    status, body = status_and_body(refused)
    assert (status, body["error"]) == (501, "unsupported_transfer_encoding")
    assert status_and_body(plain)[0] == 202


# -- a client that half-closes after its request -------------------------------------------

@LANES
async def test_should_answer_a_client_that_half_closes_after_its_request(tmp_path, fast_lane):
    async with ingestor(config(tmp_path, http_fast_lane=fast_lane)) as ports:
        with socket.create_connection(("127.0.0.1", ports.http)) as sock:
            sock.sendall(post())
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(GIVE_UP_S)
            reply = b""
            while chunk := await asyncio.to_thread(sock.recv, 65536):
                reply += chunk
    assert status_and_body(reply) == (202, {"accepted": 1})


# -- the cap on one body's upload ------------------------------------------------------------

@LANES
async def test_should_cut_a_steady_body_at_body_max_s(tmp_path, fast_lane):
    """400 bytes/s is far above body_min_bytes_per_s (10), so only the cap can stop it."""
    settings = {"body_timeout_s": 0.5, "body_max_s": 1.0, "body_min_bytes_per_s": 10,
                "http_fast_lane": fast_lane}
    async with ingestor(config(tmp_path, **settings)) as ports:
        reader, writer = await asyncio.open_connection("127.0.0.1", ports.http)
        writer.write(post(b" " * 100_000)[:-100_000])

        async def steady() -> None:
            with contextlib.suppress(ConnectionError):
                while True:
                    writer.write(b" " * 40)
                    await writer.drain()
                    await asyncio.sleep(0.1)

        sender = asyncio.create_task(steady())
        started = time.monotonic()
        try:
            reply = await asyncio.wait_for(reader.read(), GIVE_UP_S)
        finally:
            sender.cancel()
            writer.close()
    status, body = status_and_body(reply)
    assert (status, body["error"]) == (408, "request_timeout")
    assert "ingestor.body_max_s" in str(body["message"])
    assert time.monotonic() - started < 3


@LANES
async def test_should_keep_the_answer_readable_while_the_client_still_sends(tmp_path,
                                                                             fast_lane):
    """A 408 cuts a body that is still coming: the connection shuts its write side and
    lingers, dropping what arrives, instead of closing on it (a close with data arriving
    resets the connection, and the client loses the answer it has not read yet)."""
    settings = {"body_timeout_s": 0.3, "body_max_s": 10.0, "body_min_bytes_per_s": 10,
                "http_fast_lane": fast_lane}
    async with ingestor(config(tmp_path, **settings)) as ports:
        reader, writer = await asyncio.open_connection("127.0.0.1", ports.http)
        writer.write(post(b" " * 100_000)[:-100_000])  # the head, then nothing: 408
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GIVE_UP_S)
        for _ in range(5):  # the client goes on sending after the answer
            writer.write(b" " * 1000)
            await writer.drain()
            await asyncio.sleep(0.05)
        rest = await asyncio.wait_for(reader.read(), GIVE_UP_S)  # no reset: EOF
        writer.close()
    status, body = status_and_body(head + rest)
    assert (status, body["error"]) == (408, "request_timeout")


async def test_should_expire_a_body_at_body_max_s_on_the_injected_clock():
    clock = ManualClock()
    guard = SlowClientGuard(header_timeout_s=10, body_timeout_s=20, body_min_bytes_per_s=1,
                            body_max_s=300, clock=clock)
    expired: list[bool] = []
    read = guard.begin_body(lambda: expired.append(True))
    loop = asyncio.get_running_loop()
    for _ in range(29):  # 290 s at 1 MB per 10 s: the rate rule alone would never cut it
        clock.advance(10)
        read.received += 1_000_000
        guard._sweep(loop)
    assert expired == []
    clock.advance(11)
    guard._sweep(loop)
    assert expired == [True]
    assert read.capped
    guard.close()


# -- open connections per process --------------------------------------------------------------

async def test_should_close_connections_above_max_connections_at_accept(tmp_path):
    async with ingestor(config(tmp_path, max_connections=3)) as ports:
        held = [await asyncio.open_connection("127.0.0.1", ports.http) for _ in range(3)]
        reader, writer = await asyncio.open_connection("127.0.0.1", ports.http)
        writer.write(post())
        with contextlib.suppress(ConnectionError):
            assert await asyncio.wait_for(reader.read(), GIVE_UP_S) == b""  # closed, unread
        writer.close()
        first_reader, first_writer = held[0]
        first_writer.write(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(first_reader.readuntil(b"\r\n\r\n"), GIVE_UP_S)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        metrics = (await first_reader.readexactly(length)).decode()
        for _, held_writer in held:
            held_writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")  # the connections within the limit are served
    assert refused_total(metrics, "max_connections") == 1


# -- config ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "error"), [
    ("body_max_s = 10", "ingestor.body_max_s (10) must be >= ingestor.body_timeout_s (20)"),
    ("max_header_bytes = 512", "ingestor.max_header_bytes (512) must be >= 1024"),
    ("max_headers = 0", "ingestor.max_headers must be > 0"),
    ("max_connections = 0", "ingestor.max_connections must be > 0"),
])
def test_should_refuse_http_limits_that_leave_no_room(tmp_path, text, error):
    path = tmp_path / "icefloe.toml"
    path.write_text(f'[store]\nurl = "file://store"\n[ingestor]\n{text}\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert error in str(info.value)


def test_defaults_of_the_http_limits():
    ing = IngestorSection()
    assert (ing.max_header_bytes, ing.max_headers, ing.max_connections, ing.body_max_s) == (
        64 * 1024, 100, 10_000, 300.0)
    assert msgspec.json.decode(b"{}", type=IngestorSection).body_max_s == 300.0
