"""Start-up that waits for the object store, unready, instead of exiting.

Why: an ingestor starts by reading the store (its conditional-write probe, the shard count,
the registry). An ingestor restarted during a store brownout used to exit once those reads
spent their retry budget, and a supervisor restarting it gave up after ten exits in a row
(a chaos run on a busy machine, #36). Now the process listens at once and, while it
retries the start with jittered exponential backoff on the injected clock, answers:

* ``/healthz`` 200 (the process is alive: a liveness probe must not kill it for the store)
  and ``/metrics``;
* ``/readyz`` and every other path 503 ``not_ready`` with ``Retry-After`` and the reason
  (ingest requests included: refused at once, never held, never acknowledged);
* gRPC health ``NOT_SERVING`` (overall and ``icefloe.v1.Ingest``), every other call
  ``UNAVAILABLE``.

Each failed attempt is logged with its reason and the next delay. The HTTP server is the
real one from the start (its protocol, limits and slow-client guard): only its app and
fast lane switch to the ingest app once the runtime stands (:class:`HttpFront`,
:class:`LateLane`), so no connection is dropped or left waiting at the switch. The gRPC
stand-in gives its port to the real server then (for that moment new gRPC connections are
refused, at once). Only a store that does not answer
(:class:`~icefloe.errors.TransientStoreError`) is waited out: a permanent error
(credentials, a missing bucket, a store without conditional writes) or a config error
still stops the process at once, with its reason.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc
import msgspec
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.errors import TransientStoreError
from icefloe.server_tls import CertificateReloader
from ingestor.grpc_app import SERVICE_NAME, bind_port, server_options
from ingestor.runtime import IngestorRuntime

log = logging.getLogger("icefloe.ingestor")

FIRST_DELAY_S: Final = 0.5
"""The wait after the first failed start; it doubles per failure up to :data:`MAX_DELAY_S`."""
MAX_DELAY_S: Final = 15.0
"""The longest wait between two starts (a store back after an outage is found within it)."""
_HEALTHY: Final = b'{"status":"ok"}'


def start_delay(failures: int, rng: random.Random | None = None) -> float:
    """The wait after ``failures`` failed starts: half the capped exponential, plus up to
    as much again at random (equal jitter: never zero, so a crowd of ingestors restarted
    together spreads out without hammering a store that is coming back)."""
    cap = min(MAX_DELAY_S, FIRST_DELAY_S * 2 ** (failures - 1))
    return cap / 2 + (rng or random).uniform(0, cap / 2)


@dataclass
class Starting:
    """What the stand-in fronts report while the start is retried."""

    reason: str = "starting: reading the object store"
    failures: int = 0


Starter = Callable[[], Awaitable[IngestorRuntime]]


async def start_waiting(start: Starter, state: Starting, stop: asyncio.Event, *,
                        clock: Clock = SYSTEM) -> IngestorRuntime | None:
    """``start()`` until it succeeds, waiting out an unreachable store; None if ``stop``
    is set first. Anything but a :class:`TransientStoreError` propagates."""
    while not stop.is_set():
        try:
            return await start()
        except TransientStoreError as exc:
            state.failures += 1
            delay = start_delay(state.failures)
            state.reason = (f"waiting for the object store: start attempt {state.failures} "
                            f"failed ({type(exc).__name__}: {_first_line(exc)}); next in "
                            f"{delay:.1f}s")
            log.warning("ingestor not ready: %s", state.reason,
                        extra={"attempt": state.failures, "retry_in_s": round(delay, 3)})
        waiting = asyncio.ensure_future(clock.sleep(delay))
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({waiting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (waiting, stopped):
                task.cancel()
    return None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] if text else type(exc).__name__


# -- the HTTP front: unready, then the ingest app ---------------------------------------------


class HttpFront:
    """ASGI app: until :attr:`target` is set, ``/healthz`` alive, ``/metrics``, everything
    else 503 ``not_ready`` with the reason; then every request goes to ``target``."""

    def __init__(self, state: Starting, retry_after_s: float,
                 metrics: CollectorRegistry | None = None) -> None:
        self.state = state
        self.retry_after = str(max(1, round(retry_after_s))).encode()
        self.metrics = metrics
        self.target: Any = None
        """The ingest app (:class:`ingestor.http.app.HttpApp`) once the runtime stands."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        target = self.target
        if target is not None:
            await target(scope, receive, send)
        elif scope["type"] == "http":
            await self._unready(scope, send)

    async def _unready(self, scope: Any, send: Any) -> None:
        path, get = scope["path"], scope["method"] == "GET"
        kind = b"application/json"
        extra: list[tuple[bytes, bytes]]
        if get and path in ("/healthz", "/health"):
            status, body, extra = 200, _HEALTHY, []
        elif get and path == "/metrics" and self.metrics is not None:
            status, body, extra = 200, generate_latest(self.metrics), []
            kind = CONTENT_TYPE_LATEST.encode()
        else:
            status, extra = 503, [(b"retry-after", self.retry_after)]
            body = msgspec.json.encode({"error": "not_ready", "message": self.state.reason,
                                        "details": [], "may_be_stored": False})
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", kind), (b"content-length", str(len(body)).encode()), *extra]})
        await send({"type": "http.response.body", "body": body})


class LateLane:
    """The HTTP fast lane (:class:`ingestor.http.fast.FastLane`) once the runtime stands;
    until then every request takes the ASGI path (and :class:`HttpFront` answers it)."""

    def __init__(self) -> None:
        self.target: Any = None

    def begin(self, connection: Any, default_headers: Any) -> Any:
        target = self.target
        return None if target is None else target.begin(connection, default_headers)


# -- the stand-in gRPC front ------------------------------------------------------------------


class _Unavailable(grpc.GenericRpcHandler):
    """Every call but health: UNAVAILABLE with the reason (clients retry elsewhere)."""

    def __init__(self, state: Starting) -> None:
        self.state = state

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler:
        async def refuse(request: Any, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"not ready: {self.state.reason}")
        return grpc.unary_unary_rpc_method_handler(refuse)


async def _serve_grpc(config: Config, state: Starting, tls: CertificateReloader | None
                      ) -> tuple[grpc.aio.Server, int]:
    ing = config.ingestor
    server = grpc.aio.server(options=[("grpc.so_reuseport", int(ing.reuse_port)),
                                      *server_options(ing)])
    servicer = health.aio.HealthServicer()
    for name in (health.OVERALL_HEALTH, SERVICE_NAME):
        await servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((_Unavailable(state),))
    bound = await bind_port(server, ing.host, ing.grpc_port, tls)
    await server.start()
    return server, bound


STANDIN_GRACE_S = 2.0
"""How long the gRPC stand-in's stop lets calls it is answering finish. Why: stopped with
no grace, grpc cancels them, and a client that reached the stand-in just as the real server
took over got CANCELLED, which clients do not retry (a chaos run caught one at an
ingestor's restart) instead of the UNAVAILABLE it retries elsewhere. The stand-in answers
at once, so the stop waits only for calls already in its hands; new ones are refused by
the stopping server itself."""


class StartingGrpc:
    """The gRPC stand-in: health NOT_SERVING, every other call UNAVAILABLE, on the
    ingestor's gRPC port until the real server needs it."""

    def __init__(self, config: Config, state: Starting, tls: CertificateReloader | None
                 ) -> None:
        self.config, self.state, self.tls = config, state, tls
        self.port = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> int:
        self._server, self.port = await _serve_grpc(self.config, self.state, self.tls)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(STANDIN_GRACE_S)
