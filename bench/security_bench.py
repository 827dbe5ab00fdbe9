"""Security benchmark: what TLS, token checks, rate limits and redaction cost the ingestor.

Runs, side by side in one run, on this machine:

* transport: a real ``icefloe ingestor`` answering ``GET /healthz`` on keep-alive
  connections, plaintext vs TLS (the request cost without the store), and full TLS
  handshakes per second (connect, handshake, one request, close). The load comes from a
  separate process (``--load``: raw asyncio sockets, so the client stays cheap);
* in-process costs per request: a token check on an open stream vs a cached token, the
  first (scrypt) verification of a token, a rate-limit admission, the slow-loris guard's
  body registration, and the redacting log filter per line;
* rate limits under load: a real ingestor with streams limited to 2,000 events/s and to
  400 kB/s (``burst_s`` 1), each driven for 5 s (``--quick``) or 20 s by 16 keep-alive
  HTTP clients posting 50-event batches from a separate process (``--rate-load``), far
  above the limit: *greedy* clients resend at once after a 429, *polite* ones wait out
  ``Retry-After`` and resend the same batch. Reported against the configured limit (the
  baseline): accepted events or bytes per second in the steady state (requests sent after
  the first second, when the full initial bucket is spent) and over the whole run (where
  the bucket's initial ``burst_s`` worth adds ``1/run`` to the ratio), the share of
  requests answered 429, and for polite clients the ``Retry-After`` they got and how many
  of their retries after waiting it out were accepted;
* the HTTP front's own limits (issue #29: head bytes and header count counted as they
  arrive, HTTP version and transfer-coding checks, connections per process, ``body_max_s``):
  durable single-event POSTs on 512 keep-alive connections from a separate process
  (``--limits-load``), against a real ingestor from this tree with the limits as shipped
  and, running at the same time, one with their per-request code taken out
  (``bench/_limits_ingestor.py off``); the load alternates between the two, 5 rounds of
  6 s each (3 of 2.5 s with ``--quick``), medians reported. In process, the same POST fed
  through the protocol's parser callbacks with and without the limits' code (best of 9).

Usage: python bench/security_bench.py [--quick] [--limits-only] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's icefloe first
from _common import Result, print_table, write_json

PYTHON = sys.executable
ICEFLOE = str(Path(PYTHON).parent / "icefloe")
REQUEST = b"GET /healthz HTTP/1.1\r\nhost: bench\r\n\r\n"


# -- the load process ---------------------------------------------------------------------------

async def _keepalive(port: int, context: ssl.SSLContext | None, seconds: float,
                     connections: int) -> int:
    done = 0
    stop_at = time.monotonic() + seconds

    async def one() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                       server_hostname="localhost"
                                                       if context else None)
        while time.monotonic() < stop_at:
            writer.write(REQUEST)
            await reader.readuntil(b'{"status":"ok"}')
            done += 1
        writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return done


async def _handshakes(port: int, context: ssl.SSLContext, seconds: float,
                      connections: int) -> int:
    done = 0
    stop_at = time.monotonic() + seconds

    async def one() -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context,
                                                           server_hostname="localhost")
            writer.write(REQUEST)
            await reader.readuntil(b'{"status":"ok"}')
            writer.close()
            done += 1

    await asyncio.gather(*(one() for _ in range(connections)))
    return done


def load_main(argv: list[str]) -> None:
    """``--load MODE PORT SECONDS CONNECTIONS [CA]``: print requests/s as JSON."""
    mode, port, seconds, connections = argv[0], int(argv[1]), float(argv[2]), int(argv[3])
    context = ssl.create_default_context(cafile=argv[4]) if len(argv) > 4 else None
    import uvloop

    started = time.monotonic()
    if mode == "handshakes":
        assert context is not None
        count = uvloop.run(_handshakes(port, context, seconds, connections))
    else:
        count = uvloop.run(_keepalive(port, context, seconds, connections))
    print(json.dumps({"rate": count / (time.monotonic() - started)}))


def run_load(mode: str, port: int, seconds: float, connections: int,
             ca: Path | None = None) -> float:
    args = [PYTHON, __file__, "--load", mode, str(port), str(seconds), str(connections)]
    out = subprocess.run(args + ([str(ca)] if ca else []), capture_output=True, text=True,
                         check=True).stdout
    return float(json.loads(out)["rate"])


# -- the ingestor under test -------------------------------------------------------------------

CONFIG = """
[store]
url = "file://store"
[ingestor]
host = "127.0.0.1"
http_port = {http_port}
grpc_port = 0
{tls}
[[streams]]
name = "pageviews"
table = "web.pageviews"
columns = [{{ name = "url", type = "string" }}]
"""


def start_ingestor(folder: Path, tls: str, template: str = CONFIG
                   ) -> tuple[subprocess.Popen[str], int]:
    path = folder / "icefloe.toml"
    path.write_text(textwrap.dedent(template.format(http_port=0, tls=tls)))
    proc = subprocess.Popen([ICEFLOE, "ingestor", "--config", str(path), "--log-level",
                             "warning"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    ready = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    return proc, int(ready["http_port"])


def transport(quick: bool) -> list[Result]:
    from security_support import Authority  # type: ignore[import-not-found]  # tests/

    seconds = 3.0 if quick else 8.0
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ca = Authority.create(folder, "bench")
        cert, key = ca.write("server", server=True)
        rates = {}
        for name, tls in (("plaintext", ""),
                          ("tls", f'tls_cert_file = "{cert}"\ntls_key_file = "{key}"')):
            proc, port = start_ingestor(folder, tls)
            try:
                rates[name] = run_load("keepalive", port, seconds, 32,
                                       ca.ca_file if tls else None)
                if tls:
                    rates["handshakes"] = run_load("handshakes", port, seconds, 8, ca.ca_file)
            finally:
                proc.terminate()
                proc.wait(30)
    plain, tls_rate = rates["plaintext"], rates["tls"]
    results.append(Result("GET /healthz keep-alive, plaintext (requests/s)", plain, "req/s"))
    results.append(Result("GET /healthz keep-alive, TLS (requests/s)", tls_rate, "req/s",
                          baseline=plain))
    results.append(Result("TLS cost per request (server + client, µs)",
                          (1 / tls_rate - 1 / plain) * 1e6, "µs"))
    results.append(Result("new TLS connections: handshake + 1 request (per s)",
                          rates["handshakes"], "conn/s", baseline=tls_rate))
    return results


# -- rate limits under load ------------------------------------------------------------------

EVENTS_LIMIT = 2_000.0  # events/s
BYTES_LIMIT = 400_000.0  # bytes/s of canonical event JSON
RATE_CLIENTS = 16
BATCH = 50
WARMUP_S = 1.0  # the initial bucket (burst_s = 1) is spent well within this
RATE_COLUMNS = (("user_id", "string"), ("url", "string"), ("duration_ms", "long"),
                ("ref", "string"))


def _rate_stream(name: str, measure: str, limit: float) -> str:
    columns = "".join(f'[[streams.columns]]\nname = "{c}"\ntype = "{t}"\n'
                      for c, t in RATE_COLUMNS)
    return (f'[[streams]]\nname = "{name}"\ntable = "bench.{name}"\n{columns}'
            f"[streams.rate_limit]\n{measure}_per_s = {limit}\nburst_s = 1\n")


RATE_CONFIG = CONFIG.split("[[streams]]")[0] + "".join((
    _rate_stream("events_limited", "events", EVENTS_LIMIT),
    _rate_stream("polite", "events", EVENTS_LIMIT),
    _rate_stream("bytes_limited", "bytes", BYTES_LIMIT)))
"""The config template (``{http_port}``, ``{tls}``) of the rate-limit runs: three streams."""
RATE_EVENT = ('{"user_id":"user-%05d","url":"https://example.com/products/%d?ref=campaign-7",'
              '"duration_ms":%d,"ref":"newsletter-2026-11"}')


def rate_body() -> bytes:
    return ("[" + ",".join(RATE_EVENT % (i, i % 997, i * 7 % 60000)
                           for i in range(BATCH)) + "]").encode()


def canonical_bytes(body: bytes) -> int:
    """What the bytes bucket counts for ``body``: its events as canonical JSON."""
    from icefloe.config import Column, StreamConfig
    from ingestor.validate import CompiledStream

    stream = StreamConfig("b", "bench.b", tuple(Column(c, t) for c, t in RATE_COLUMNS))
    return sum(map(len, CompiledStream(stream).from_json(body).payloads))


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines[1:] if b": " in line)
    await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return int(lines[0].split(b" ", 2)[1]), headers


async def _rate_load(port: int, stream: str, seconds: float, connections: int,
                     polite: bool) -> dict[str, float]:
    """``connections`` clients posting one batch at a time for ``seconds``; a polite client
    waits ``Retry-After`` after a 429 and resends the same batch, the others resend at once."""
    body = rate_body()
    request = (b"POST /v1/streams/%s/events HTTP/1.1\r\nhost: bench\r\n"
               b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
               % (stream.encode(), len(body), body))
    loop = asyncio.get_running_loop()
    started = loop.time()
    stop_at = started + seconds
    totals = {"requests": 0, "accepted": 0, "steady": 0, "refused": 0, "retry_after_sum": 0.0,
              "retries": 0, "retries_accepted": 0}

    async def client() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        waited = False
        while loop.time() < stop_at:
            sent = loop.time() - started  # ~ when admitted (the 202 waits for the flush)
            writer.write(request)
            status, headers = await _response(reader)
            totals["requests"] += 1
            totals["retries"] += waited
            if status == 202:
                totals["accepted"] += 1
                totals["retries_accepted"] += waited
                if sent >= WARMUP_S:
                    totals["steady"] += 1
                waited = False
            elif status == 429:
                totals["refused"] += 1
                retry_after = float(headers[b"retry-after"])
                totals["retry_after_sum"] += retry_after
                waited = polite and loop.time() + retry_after < stop_at
                if waited:
                    await asyncio.sleep(retry_after)
                elif polite:
                    break
            else:
                raise RuntimeError(f"unexpected HTTP {status}")
        writer.close()

    await asyncio.gather(*(client() for _ in range(connections)))
    return totals


def rate_load_main(argv: list[str]) -> None:
    """``--rate-load PORT STREAM SECONDS CONNECTIONS polite|greedy``: totals as JSON."""
    import uvloop

    port, stream, seconds, connections, mode = (int(argv[0]), argv[1], float(argv[2]),
                                                int(argv[3]), argv[4])
    print(json.dumps(uvloop.run(_rate_load(port, stream, seconds, connections,
                                           mode == "polite"))))


def run_rate_load(port: int, stream: str, seconds: float, polite: bool) -> dict[str, float]:
    args = [PYTHON, __file__, "--rate-load", str(port), stream, str(seconds),
            str(RATE_CLIENTS), "polite" if polite else "greedy"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def rate_limits(quick: bool) -> list[Result]:
    seconds = 5.0 if quick else 20.0
    steady_s = seconds - WARMUP_S
    per_request = {"events": float(BATCH), "bytes": float(canonical_bytes(rate_body()))}
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_ingestor(Path(tmp), "", RATE_CONFIG)
        try:
            for stream, polite in (("events_limited", False), ("polite", True),
                                   ("bytes_limited", False)):
                runs[stream] = run_rate_load(port, stream, seconds, polite)
        finally:
            proc.terminate()
            proc.wait(30)
    results = []
    for stream, measure, limit, who in (("events_limited", "events", EVENTS_LIMIT, "greedy"),
                                        ("polite", "events", EVENTS_LIMIT, "polite"),
                                        ("bytes_limited", "bytes", BYTES_LIMIT, "greedy")):
        got, unit = runs[stream], f"{measure}/s"
        size = per_request[measure]
        label = f"{measure}/s limit, {RATE_CLIENTS} {who} clients"
        if stream != "polite":
            results.append(Result(f"{label}: offered", got["requests"] * size / seconds, unit,
                                  baseline=limit))
        results.append(Result(f"{label}: accepted, steady (sent after {WARMUP_S:g} s)",
                              got["steady"] * size / steady_s, unit, baseline=limit))
        results.append(Result(f"{label}: accepted, whole {seconds:g} s run",
                              got["accepted"] * size / seconds, unit, baseline=limit))
        results.append(Result(f"{label}: requests answered 429 (%)",
                              100 * got["refused"] / max(1, got["requests"]), "%"))
        if stream == "polite":
            results.append(Result(f"{label}: mean Retry-After (s)",
                                  got["retry_after_sum"] / max(1, got["refused"]), "s"))
            results.append(Result(f"{label}: retries after Retry-After accepted (%)",
                                  100 * got["retries_accepted"] / max(1, got["retries"]), "%"))
    return results


# -- the HTTP front's limits at 512 connections -----------------------------------------------

LIMITS_CONNECTIONS = 512
LIMITS_POST = (b"POST /v1/streams/pageviews/events HTTP/1.1\r\nhost: bench\r\n"
               b"user-agent: security-bench/1\r\naccept: application/json\r\n"
               b"content-type: application/json\r\ncontent-length: 14\r\n\r\n"
               b'{"url":"/b/1"}')


async def _limits_load(port: int, seconds: float, connections: int) -> dict[str, float]:
    """``connections`` keep-alive clients, one single-event POST in flight each."""
    loop = asyncio.get_running_loop()
    totals = {"accepted": 0, "other": 0}
    latencies: list[float] = []

    async def client(stop_at: float) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while loop.time() < stop_at:
            sent = loop.time()
            writer.write(LIMITS_POST)
            status, _ = await _response(reader)
            latencies.append(loop.time() - sent)
            totals["accepted" if status == 202 else "other"] += 1
        writer.close()

    started = loop.time()
    await asyncio.gather(*(client(started + seconds) for _ in range(connections)))
    elapsed = loop.time() - started
    latencies.sort()
    return {"rate": totals["accepted"] / elapsed, "other": totals["other"], "seconds": elapsed,
            "p50_ms": 1e3 * latencies[len(latencies) // 2],
            "p99_ms": 1e3 * latencies[int(len(latencies) * 0.99)]}


def limits_load_main(argv: list[str]) -> None:
    """``--limits-load PORT SECONDS CONNECTIONS``: rate and latency as JSON."""
    import uvloop

    print(json.dumps(uvloop.run(_limits_load(int(argv[0]), float(argv[1]), int(argv[2])))))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _limits_server(folder: Path, mode: str) -> tuple[subprocess.Popen[str], int]:
    """An ingestor from this tree, limits ``on`` or ``off``, with its own store."""
    (folder / mode).mkdir()
    path = folder / mode / "icefloe.toml"
    path.write_text(textwrap.dedent(CONFIG.format(http_port=0, tls="")))
    helper = Path(__file__).resolve().parent / "_limits_ingestor.py"
    proc = subprocess.Popen([PYTHON, str(helper), str(path), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=folder / mode)
    return proc, int(json.loads(proc.stdout.readline())["http_port"])  # type: ignore[union-attr]


def _limits_run(proc: subprocess.Popen[str], port: int, seconds: float) -> dict[str, float]:
    cpu = cpu_seconds(proc.pid)
    out = subprocess.run([PYTHON, __file__, "--limits-load", str(port), str(seconds),
                          str(LIMITS_CONNECTIONS)], capture_output=True, text=True,
                         check=True).stdout
    run = json.loads(out)
    run["cpu_us"] = (cpu_seconds(proc.pid) - cpu) / (run["rate"] * run["seconds"]) * 1e6
    return run


def http_limits(quick: bool) -> list[Result]:
    """Limits as shipped vs their per-request code taken out: both servers up at once, the
    load alternating between them, so a neighbour's burst hits both sides alike."""
    seconds, rounds = (2.5, 3) if quick else (6.0, 5)
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        servers = {mode: _limits_server(Path(tmp), mode) for mode in ("on", "off")}
        try:
            for _ in range(rounds):
                for mode, (proc, port) in servers.items():
                    runs[mode].append(_limits_run(proc, port, seconds))
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)

    def median(mode: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[mode])

    label = f"durable 1-event POST, {LIMITS_CONNECTIONS} conns"
    if any(run["other"] for mode in runs.values() for run in mode):
        print("  warning: some POSTs were not answered 202", file=sys.stderr)
    return [
        Result(f"{label}, limits on (requests/s, median of {rounds})", median("on", "rate"),
               "req/s", baseline=median("off", "rate")),
        Result(f"{label}, limits on: ingestor CPU per request (µs)", median("on", "cpu_us"),
               "µs", baseline=median("off", "cpu_us")),
        Result(f"{label}, limits on: p50 (ms)", median("on", "p50_ms"), "ms",
               baseline=median("off", "p50_ms")),
        Result(f"{label}, limits on: p99 (ms)", median("on", "p99_ms"), "ms",
               baseline=median("off", "p99_ms")),
    ]


def head_parsing_cost(count: int) -> list[Result]:
    """In process, no sockets: one POST fed through the protocol's parser callbacks, with the
    limits' code (counting ``data_received``, ``on_header``, the framing check) and with
    uvicorn's own methods; what follows the headers is left out of both."""
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from ingestor.http.server import guarded_protocol
    from ingestor.http.slow_clients import SlowClientGuard

    class LimitedHead(guarded_protocol(SlowClientGuard(10, 20, 1024))):  # type: ignore[misc]
        def on_headers_complete(self) -> None:
            self.head_pending = False
            self.head_bytes = 0
            self._check_framing()

        def on_body(self, body: bytes) -> None:
            return None

        def on_message_complete(self) -> None:
            self.head_pending = True
            self.head_bytes = 0

    class PlainHead(HttpToolsProtocol):
        def on_message_begin(self) -> None:  # the guarded protocol's, minus the limits
            self.url = b""
            self.expect_100_continue = False
            self.headers = []
            self.idle_since = None

        def on_headers_complete(self) -> None:
            self.parser.get_http_version()  # the fast lane read it itself before the limits

        def on_body(self, body: bytes) -> None:
            return None

        def on_message_complete(self) -> None:
            return None

    def fed(cls: type[HttpToolsProtocol]) -> Callable[[], object]:
        protocol = object.__new__(cls)
        protocol.parser = httptools.HttpRequestParser(protocol)
        protocol.timeout_keep_alive_task = None
        protocol.headers_since = 0.0  # type: ignore[attr-defined]
        return lambda: protocol.data_received(LIMITS_POST)

    plain, limited = fed(PlainHead), fed(LimitedHead)
    runs: dict[str, list[float]] = {"plain": [], "limited": []}
    for _ in range(9):  # interleaved, best of 9: the cost, not the neighbours' load
        runs["plain"].append(per_call_us(plain, count))
        runs["limited"].append(per_call_us(limited, count))
    return [Result("one POST through the parser callbacks, limits on (µs, best of 9)",
                   min(runs["limited"]), "µs", baseline=min(runs["plain"]))]


# -- in-process costs -------------------------------------------------------------------------

def per_call_us(call: Callable[[], object], count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - started) / count * 1e6


async def _auth_costs(count: int) -> list[Result]:
    import msgspec

    from icefloe.config import Column, Config, RateLimit, StoreSection, StreamConfig
    from icefloe.tokens import hash_token
    from ingestor.auth import TokenAuthority
    from ingestor.http.slow_clients import SlowClientGuard
    from ingestor.metrics import IngestMetrics
    from ingestor.ratelimit import RateLimiter

    token = "ifl_bench-token-0123456789abcdefghijklmnopqrstuv"
    columns = (Column("url", "string"),)
    config = Config(store=StoreSection(url="file:///tmp/unused"), streams=(
        StreamConfig("open", "web.open", columns),
        StreamConfig("locked", "web.locked", columns, tokens=(hash_token(token),),
                     rate_limit=RateLimit(events_per_s=1e12, bytes_per_s=1e15))))
    authority = TokenAuthority(config)
    started = time.perf_counter()
    await authority.authorize("locked", token)
    first_ms = (time.perf_counter() - started) * 1e3

    async def many(stream: str, presented: str | None) -> float:
        began = time.perf_counter()
        for _ in range(count):
            await authority.authorize(stream, presented)
        return (time.perf_counter() - began) / count * 1e6

    open_us = await many("open", None)
    cached_us = await many("locked", token)
    limits = RateLimiter(msgspec.structs.replace(config), IngestMetrics())
    admit_us = per_call_us(lambda: limits.admit("locked", None, None, 1, 200), count)
    guard = SlowClientGuard(10, 20, 1024)

    def body_read() -> None:
        guard.end_body(guard.begin_body())

    guard_us = per_call_us(body_read, count)
    guard.close()
    return [
        Result("token check, open stream (µs)", open_us, "µs"),
        Result("token check, cached token (µs)", cached_us, "µs", baseline=open_us),
        Result("first verification of a token, scrypt N=2^14 (ms)", first_ms, "ms"),
        Result("rate-limit admission, events + bytes buckets (µs)", admit_us, "µs"),
        Result("slow-loris guard, body registration (µs)", guard_us, "µs"),
    ]


def redaction_cost(count: int) -> list[Result]:
    from icefloe.logs import JsonFormatter, RedactingFilter

    record = logging.LogRecord("icefloe.bench", logging.INFO, __file__, 1,
                               "flushed %d events to %s", (1000, "s3://bucket/prefix"), None)
    formatter, redactor = JsonFormatter(), RedactingFilter()

    def plain() -> None:
        formatter.format(record)

    def redacted() -> None:
        fresh = logging.makeLogRecord(record.__dict__)
        redactor.filter(fresh)
        formatter.format(fresh)

    base = per_call_us(plain, count)
    return [Result("log line, JSON formatter + redacting filter (µs)", per_call_us(
        redacted, count), "µs", baseline=base)]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--load":
        load_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--rate-load":
        rate_load_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--limits-load":
        limits_load_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="3 s per transport run, 5 s per rate-limit run")
    parser.add_argument("--json", metavar="PATH", help="also write results as JSON")
    parser.add_argument("--limits-only", action="store_true",
                        help="only the HTTP limits at 512 connections")
    args = parser.parse_args()
    limited = head_parsing_cost(20_000 if args.quick else 100_000) + http_limits(args.quick)
    print_table("HTTP front limits at 512 connections (baseline: their per-request code "
                "taken out)", limited)
    if args.limits_only:
        write_json(args.json, limited)
        return
    count = 20_000 if args.quick else 200_000
    results = transport(args.quick)
    results += asyncio.run(_auth_costs(count))
    results += redaction_cost(count)
    print_table("security costs (ingestor)", results)
    limits = rate_limits(args.quick)
    print_table("rate limits under load (baseline: the configured limit)", limits)
    write_json(args.json, limited + results + limits)


if __name__ == "__main__":
    main()
