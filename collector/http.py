"""The collector's own small HTTP server: ``/metrics``, ``/healthz`` and ``/readyz``.

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
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

HANDSHAKE_TIMEOUT_S = 10.0
"""A TLS handshake, and then each read of a request, must finish within this."""
FAILING_AFTER = 3
"""Consecutive failed runs after which ``/readyz`` reports the collector as not ready."""


@dataclass
class Health:
    """What the probes report; written by the runner, read by the HTTP threads."""

    role: str = "starting"  # starting | standby | active | stopping
    failures: int = 0
    last_error: str = ""
    since: float = field(default_factory=time.time)

    def set_role(self, role: str) -> None:
        self.role, self.since = role, time.time()

    def run_failed(self, reason: str) -> None:
        self.failures += 1
        self.last_error = reason

    def run_ok(self) -> None:
        self.failures, self.last_error = 0, ""

    def ready(self) -> tuple[bool, str]:
        if self.role == "starting":
            return False, "starting: opening the catalog and starting Spark"
        if self.role == "stopping":
            return False, "stopping"
        if self.failures >= FAILING_AFTER:
            return False, f"{self.failures} runs failed in a row; last: {self.last_error}"
        return True, self.role

    def body(self) -> dict[str, object]:
        ready, reason = self.ready()
        return {"role": self.role, "ready": ready, "reason": reason,
                "failed_runs_in_a_row": self.failures, "role_since": self.since}


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
                 health: Health, context: ssl.SSLContext | None = None) -> None:
        self.registry = registry
        self.health = health
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
                 health: Health, context: ssl.SSLContext | None = None) -> None:
        self._server = _Server((host, port), registry, health, context)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="collector-http", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
