"""The collector's own small HTTP server: ``/metrics``, ``/healthz``, ``/readyz`` and
``POST /v1/run`` (admin token: commit the queue and run the models now, see
:mod:`collector.run_now`).

Transport: the same TLS / mutual TLS and plaintext policy as the ingestor and the admin API
(:func:`icefloe.server_tls.section_tls` on ``[collector]``), applied by the runner; each
accepted connection is wrapped by the current (reloadable) context and shakes hands in its
own thread within ``HANDSHAKE_TIMEOUT_S``, so a silent peer never blocks the accept loop.

Why not just prometheus' ``start_http_server``: orchestrators need probes too. Liveness
(``/healthz``, alias ``/health`` as the ingestor and admin API have) says only that the
process answers, so a store outage never gets a healthy
collector restarted into a crash loop; readiness (``/readyz``) says whether it is doing its
job — starting Spark, a standby waiting for the lease, active, or active but failing runs —
with the reason in a JSON body, so ``kubectl describe`` shows *why*.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

HANDSHAKE_TIMEOUT_S = 10.0
"""A TLS handshake, and then each read of a request, must finish within this."""
FAILING_AFTER = 3
"""Consecutive failed runs after which ``/readyz`` reports the collector as not ready."""
MAX_BODY = 4096
"""Largest ``POST /v1/run`` body read."""
STALL_INTERVALS = 5
"""Commit intervals without a finished run, while entries wait, after which the collector
reports itself stalled (``/readyz`` 503, ``icefloe_collector_stalled``): a run that hangs
(a Spark job out of memory, say) fails no run, so ``FAILING_AFTER`` alone never fires."""


class RunNow(Protocol):
    """What serves ``POST /v1/run`` (:class:`collector.run_now.RunNow`; a protocol here so
    this module imports nothing of the collector)."""

    def handle(self, header: str | None, body: bytes) -> tuple[int, dict[str, object]]: ...


@dataclass
class Health:
    """What the probes report; written by the runner, read by the HTTP threads."""

    role: str = "starting"  # starting | standby | active | stopping
    failures: int = 0
    last_error: str = ""
    since: float = field(default_factory=time.time)
    parked: dict[str, str] = field(default_factory=dict)
    """Parked tables → why (:mod:`collector.bulkhead`): reported, not a reason to be
    unready, since every other table keeps committing."""
    monotonic: Callable[[], float] = time.monotonic
    """The collector's clock (the runner sets it), for the stall check."""
    stall_after_s: float = 5.0
    progress_at: float | None = None
    """When a run last finished, or the queue was last seen empty (``None``: not active)."""
    waiting: bool = False
    """Whether entries were waiting at the last look (a run in flight counts)."""

    def set_role(self, role: str) -> None:
        self.role, self.since = role, time.time()

    def run_started(self) -> None:
        if self.progress_at is None:
            self.progress_at = self.monotonic()

    def run_failed(self, reason: str) -> None:
        self.failures += 1
        self.last_error = reason
        self.waiting = True

    def run_ok(self, entries: int = 0) -> None:
        """A run finished (``entries`` 0: the queue was empty)."""
        self.failures, self.last_error = 0, ""
        self.progress_at, self.waiting = self.monotonic(), entries > 0

    def run_begins(self, entries: int) -> None:
        """A run with ``entries`` is under way: entries wait until it finishes."""
        if entries:
            self.waiting = True

    def stalled(self) -> bool:
        """Entries wait and no run finished for ``stall_after_s``."""
        if self.role != "active" or self.progress_at is None or not self.waiting:
            return False
        return self.monotonic() - self.progress_at > self.stall_after_s

    def ready(self) -> tuple[bool, str]:
        if self.role == "starting":
            return False, "starting: opening the catalog and starting Spark"
        if self.role == "stopping":
            return False, "stopping"
        if self.failures >= FAILING_AFTER:
            return False, f"{self.failures} runs failed in a row; last: {self.last_error}"
        if self.stalled():
            assert self.progress_at is not None
            return False, (f"stalled: no run finished for "
                           f"{self.monotonic() - self.progress_at:.0f} s while entries wait "
                           "(a run hangs: see the collector's log and Spark's)")
        return True, self.role

    def body(self) -> dict[str, object]:
        ready, reason = self.ready()
        return {"role": self.role, "ready": ready, "reason": reason,
                "failed_runs_in_a_row": self.failures, "role_since": self.since,
                "parked": dict(self.parked)}


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = HANDSHAKE_TIMEOUT_S  # per socket read: a slow or silent client is dropped

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/health"):
            self._json(200, {"status": "ok", **self.server.health.body()})
        elif path == "/readyz":
            ready, _ = self.server.health.ready()
            self._json(200 if ready else 503, self.server.health.body())
        else:
            self._json(404, {"error": "not_found",
                             "message": "try /metrics, /healthz, /health or /readyz"})

    def do_POST(self) -> None:
        """``POST /v1/run``: handled by :class:`collector.run_now.RunNow` (waits for the
        runner's answer in this connection's thread)."""
        run_now = self.server.run_now
        if self.path.split("?", 1)[0] != "/v1/run" or run_now is None:
            self._json(404, {"error": "not_found", "message": "POST only /v1/run (served "
                             "by a collector with its HTTP port on)"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self._json(400, {"error": "bad_request", "message": "Content-Length is not a "
                             "whole number of bytes"})
            return
        if not 0 <= length <= MAX_BODY:
            self._json(413, {"error": "too_large", "message": f"at most {MAX_BODY} bytes"})
            return
        body = self.rfile.read(length)
        try:
            status, answer = run_now.handle(self.headers.get("Authorization"), body)
        except Exception as exc:  # a bug must still answer, not drop the connection
            status, answer = 500, {"error": "internal", "message": f"{type(exc).__name__}: "
                                   f"{exc}"[:300]}
        self._json(status, answer)

    def _json(self, status: int, body: dict[str, object]) -> None:
        self._send(status, msgspec.json.encode(body), "application/json")

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        """Probes every few seconds would flood the log; say nothing."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry,
                 health: Health, context: ssl.SSLContext | None = None,
                 run_now: RunNow | None = None) -> None:
        self.registry = registry
        self.health = health
        self.run_now = run_now
        self.context = context
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the connection's own thread: the TLS handshake first (bounded), then HTTP."""
        if self.context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            wrapped = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):  # no TLS, a refused client certificate, a timeout
            return  # the caller closes ``request``
        try:
            super().finish_request(wrapped, client_address)
        finally:
            with contextlib.suppress(OSError):
                wrapped.close()  # ``request`` gave its descriptor to ``wrapped``

    def shutdown_request(self, request: socket.socket | Any) -> None:
        with contextlib.suppress(OSError):
            super().shutdown_request(request)


class HttpServer:
    """Serves in a daemon thread; ``port`` is the bound one (0 in the config picks any).

    ``context``: serve TLS with it (a reloading context is read per connection); None:
    plaintext, which the caller's transport policy allowed.
    """

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
                 health: Health, context: ssl.SSLContext | None = None, *,
                 run_now: RunNow | None = None) -> None:
        self._server = _Server((host, port), registry, health, context, run_now)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="collector-http", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
