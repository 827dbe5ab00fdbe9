"""One ingestor process: the HTTP and gRPC servers over one shared runtime.

Why both in one process: they share the buffer and the manifest producer, so requests of
both transports are group-committed together. Shutdown order matters for "never ack what is
not durable": on SIGTERM/SIGINT the health service turns NOT_SERVING, both servers stop
accepting, in-flight requests finish (their flushes keep running), then the runtime drains
what is left and answers every waiting request, and the process exits 0 — all within
``shutdown_timeout_s``.

Before anything binds, the transport policy is applied (:func:`ingestor.tls.server_tls`):
TLS from files (reloaded on change), or plaintext on loopback, or plaintext elsewhere only
with ``[ingestor] plaintext = true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import uvicorn

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.errors import ConfigError
from icefloe.formats import speedups
from icefloe.redact import mask_uri
from ingestor.grpc_app import GrpcServer, start_grpc_server
from ingestor.http.app import HttpApp
from ingestor.http.fast import FastLane
from ingestor.http.server import http_config, slow_client_guard
from ingestor.http.slow_clients import SlowClientGuard
from ingestor.kafka.listener import KafkaServer, start_kafka_server
from ingestor.metrics import IngestMetrics
from ingestor.otlp.grpc import add_otlp_services
from ingestor.runtime import IngestorRuntime
from ingestor.starting import HttpFront, LateLane, Starting, StartingGrpc, start_waiting
from ingestor.tls import RELOAD_CHECK_S, CertificateReloader, server_tls

log = logging.getLogger("icefloe.ingestor")


@dataclass(frozen=True)
class BoundPorts:
    http: int
    grpc: int
    kafka: int | None = None
    """The Kafka listener's port (None: ``kafka_port`` unset, no listener)."""
    otlp_http: int | None = None
    """The dedicated OTLP/HTTP port (None: ``otlp_http_port`` unset; OTLP/HTTP is still
    served on ``http``)."""
    otlp_grpc: int | None = None
    """The dedicated OTLP/gRPC port (None: ``otlp_grpc_port`` unset; still on ``grpc``)."""


LISTEN_BACKLOG = 2048


def bind_http(host: str, port: int, *, reuse_port: bool = False, what: str = "HTTP",
              flag: str = "--http-port, ICEFLOE_INGESTOR_HTTP_PORT") -> socket.socket:
    """Bind the HTTP socket ourselves so "port in use" is a clear error, not an exit.

    ``reuse_port`` lets several ingestor processes listen on one port (``SO_REUSEPORT``).
    The socket is bound, not listening: :func:`serve` listens only with a server behind
    it — the stand-in fronts of :mod:`ingestor.starting` first, which answer every request
    at once (``/healthz`` alive, the rest 503 with the reason while the start waits on a
    slow store), then the real front. Connections never wait unanswered in the backlog
    until their clients time out.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(f"{what} port {port} on {host} is already in use: stop the "
                              f"other process or choose another port ({flag})") from None
        raise ConfigError(f"cannot bind {what} to {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


@dataclass
class _Fronts:
    """What one ingestor serves before and after its runtime stands: the HTTP server (its
    app is the starting front, then the real one), the stand-in gRPC server, and what they
    share (TLS, slow-client guard, fast lane, metrics)."""

    config: Config
    tls: CertificateReloader | None
    http_socket: socket.socket
    state: Starting
    metrics: IngestMetrics
    guard: SlowClientGuard
    front: HttpFront
    lane: LateLane | None
    http: uvicorn.Server
    standin: StartingGrpc
    otlp_socket: socket.socket | None = None
    """``otlp_http_port``'s socket: the HTTP server serves it too (OTLP's routes are the
    HTTP app's)."""
    http_task: asyncio.Task[None] | None = None

    @classmethod
    def open(cls, config: Config, tls_reload_s: float) -> _Fronts:
        """Apply the transport policy, bind the HTTP port and build the servers (nothing
        listens yet)."""
        ing = config.ingestor
        tls = server_tls(config, tls_reload_s)
        http_socket = bind_http(ing.host, ing.http_port, reuse_port=ing.reuse_port)
        otlp_socket = None
        if ing.otlp_http_port is not None:
            try:
                otlp_socket = bind_http(
                    ing.host, ing.otlp_http_port, reuse_port=ing.reuse_port, what="OTLP/HTTP",
                    flag="--otlp-http-port, ICEFLOE_INGESTOR_OTLP_HTTP_PORT")
            except ConfigError:
                http_socket.close()
                raise
        state, metrics, guard = Starting(), IngestMetrics(), slow_client_guard(ing)
        front = HttpFront(state, ing.retry_after_s, metrics.registry)
        lane = LateLane() if ing.http_fast_lane else None
        http = uvicorn.Server(http_config(front, ing, guard, tls, lane=lane,
                                          refused=metrics.http_refused))
        # SIGTERM is `stop`'s: uvicorn must not take it over. (It used to clear
        # `install_signal_handlers`, a hook uvicorn no longer has: mypy found the dead line.)
        http.capture_signals = contextlib.nullcontext  # type: ignore[assignment]
        return cls(config, tls, http_socket, state, metrics, guard, front, lane, http,
                   StartingGrpc(config, state, tls), otlp_socket)

    @property
    def shared(self) -> bool:
        """A port shared with other ingestor processes (SO_REUSEPORT, as ``icefloe up
        --ingestors N`` runs them): the kernel spreads connections over every LISTENING
        socket, so an unready process must not listen, or it would answer 503 to requests
        the ready ones would take. It waits for its store unseen and listens once ready."""
        return self.config.ingestor.reuse_port

    async def serve_http(self) -> None:
        """Listen, and serve HTTP until told to stop."""
        sockets = [self.http_socket, *([self.otlp_socket] if self.otlp_socket else [])]
        for sock in sockets:
            sock.listen(LISTEN_BACKLOG)
        if self.tls is not None:
            self.tls.start()
        task = asyncio.create_task(self.http.serve(sockets=sockets), name="http")
        while not self.http.started and not task.done():
            await asyncio.sleep(0.01)
        self.http_task = task

    async def start_runtime(self, stop: asyncio.Event, clock: Clock,
                            on_starting: Callable[[BoundPorts, Starting], None] | None
                            ) -> IngestorRuntime | None:
        """Serve the unready fronts (unless the port is shared) while the runtime starts;
        None when ``stop`` came first. On failure, what was serving stops."""
        try:
            if not self.shared:
                await self.serve_http()
                await self.standin.start()  # /healthz alive, the rest 503 until ready
                if on_starting is not None:
                    on_starting(BoundPorts(self.http_socket.getsockname()[1],
                                           self.standin.port), self.state)
            runtime = await start_waiting(
                lambda: IngestorRuntime.start(self.config, clock=clock,
                                              metrics=self.metrics),
                self.state, stop, clock=clock)
            await self.standin.stop()  # the real gRPC server takes its port
        except BaseException:
            await self.stop_unready()
            raise
        if runtime is None:  # stopped while waiting for the store: nothing was accepted
            await self.stop_unready()
        return runtime

    async def stop_unready(self) -> None:
        await _stop_unready(self.http, self.http_task, self.http_socket, self.standin,
                            self.tls if self.http_task is not None else None)
        if self.otlp_socket is not None:
            self.otlp_socket.close()
        self.guard.close()

    async def go_live(self, runtime: IngestorRuntime, clock: Clock) -> _Live:
        """The real servers over ``runtime``: gRPC on the stand-in's port, the HTTP front's
        target swapped (the same server, its connections and limits: nothing dropped)."""
        ing = self.config.ingestor
        grpc = await start_grpc_server(
            runtime, ing.host, ing.grpc_port if self.shared else self.standin.port,
            reuse_port=ing.reuse_port, tls=self.tls, clock=clock, otlp_port=ing.otlp_grpc_port,
            services=lambda server: add_otlp_services(runtime, server))
        kafka = None
        if ing.kafka_port is not None:
            try:
                kafka = await start_kafka_server(runtime, ing.host, ing.kafka_port,
                                                 tls=self.tls, reuse_port=ing.reuse_port,
                                                 clock=clock)
            except BaseException:
                await grpc.server.stop(None)
                raise
        app = HttpApp(runtime, self.guard)
        if self.lane is not None:
            self.lane.target = FastLane(app)
        self.front.target = app
        if self.shared:  # ready: now this process may take connections on the shared port
            await self.serve_http()
        ports = BoundPorts(
            self.http_socket.getsockname()[1], grpc.port, kafka.port if kafka else None,
            self.otlp_socket.getsockname()[1] if self.otlp_socket else None, grpc.otlp_port)
        tls = self.tls
        log.info("ingestor listening", extra={
            "http_port": ports.http, "grpc_port": ports.grpc, "kafka_port": ports.kafka,
            "otlp_http_port": ports.otlp_http, "otlp_grpc_port": ports.otlp_grpc,
            "store": mask_uri(runtime.store.url),
            "tls": "none" if tls is None else "mutual" if tls.mutual else "server",
            "speedups": speedups.compiled is not None})
        return _Live(grpc, ports, kafka)

    async def shut_down(self, runtime: IngestorRuntime, live: _Live) -> bool:
        """Stop accepting, finish requests in flight, then drain the buffer."""
        ing = self.config.ingestor
        log.info("shutting down: no new requests; draining the buffer")
        await live.grpc.health.enter_graceful_shutdown()
        if live.kafka is not None:  # no new connections; the open ones end below
            live.kafka.server.close()
        self.http.should_exit = True
        await asyncio.gather(live.grpc.server.stop(ing.shutdown_timeout_s),
                             *([self.http_task] if self.http_task else []),
                             return_exceptions=True)
        self.guard.close()
        if self.tls is not None:
            await self.tls.stop()
        drained = await runtime.close(ing.shutdown_timeout_s)
        log.info("ingestor stopped", extra={"drained": drained})
        return drained


@dataclass(frozen=True)
class _Live:
    """The ready ingestor's gRPC server (with its health service) and the ports served."""

    grpc: GrpcServer
    ports: BoundPorts
    kafka: KafkaServer | None = None


async def serve(config: Config, *, on_ready: Callable[[BoundPorts], None] | None = None,
                stop: asyncio.Event | None = None,
                on_runtime: Callable[[IngestorRuntime], None] | None = None,
                tls_reload_s: float = RELOAD_CHECK_S,
                on_starting: Callable[[BoundPorts, Starting], None] | None = None,
                clock: Clock = SYSTEM) -> bool:
    """Run until SIGTERM/SIGINT (or ``stop``); return True if every buffered event drained.

    ``on_runtime`` sees the running ingestor (e.g. to report its metrics' totals);
    ``tls_reload_s`` is how often the TLS files are checked for a new certificate;
    ``on_starting`` sees the ports and the start-up state as soon as the unready fronts
    answer (:mod:`ingestor.starting`: the start waits out an unreachable store);
    ``clock`` times that wait and runs the ingestor.

    Raises:
        ConfigError: the transport policy refuses the bind address, TLS files cannot be
            loaded, or a port is taken.
    """
    fronts = _Fronts.open(config, tls_reload_s)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    runtime = await fronts.start_runtime(stop, clock, on_starting)
    if runtime is None:
        log.info("ingestor stopped before it was ready")
        return True
    live = await fronts.go_live(runtime, clock)
    if on_runtime is not None:
        on_runtime(runtime)
    if on_ready is not None:
        on_ready(live.ports)
    await stop.wait()
    return await fronts.shut_down(runtime, live)


async def _stop_unready(http: uvicorn.Server, http_task: asyncio.Task[None] | None,
                        http_socket: socket.socket, standin: StartingGrpc,
                        tls: CertificateReloader | None) -> None:
    """Stop what a start that never became ready had serving, and close its socket."""
    http.should_exit = True
    await asyncio.gather(standin.stop(), *([http_task] if http_task else []),
                         return_exceptions=True)
    http_socket.close()  # uvicorn closed it if it served it; closing twice is harmless
    if tls is not None:
        await tls.stop()


def tune_gc() -> None:
    """Raise the cyclic GC's thresholds: batch decoding creates many short-lived objects.

    Measured here (CEILINGS.md): with default thresholds the GC halves batch throughput;
    ``gc.freeze()`` moves start-up objects out of every future collection.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def run(config: Config, on_ready: Callable[[BoundPorts], None] | None = None,
        on_runtime: Callable[[IngestorRuntime], None] | None = None) -> int:
    """Blocking entry point with uvloop; exit code 0 when drained cleanly."""
    tune_gc()
    runner: Callable[[Coroutine[Any, Any, bool]], bool]
    try:
        import uvloop  # optional dep

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency of uvicorn[standard]
        runner = asyncio.run
    drained = runner(serve(config, on_ready=on_ready, on_runtime=on_runtime))
    return 0 if drained else 1
