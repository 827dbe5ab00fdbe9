"""``POST /v1/run`` on the collector's HTTP port: commit what is queued now, run the models
now, and answer when both are done (what ``icefloe run`` asks a live collector for).

Why the collector does it, on its own loop: it holds the lease, a warm SparkSession and the
only right to commit; a second process starting Spark to do the same would pay a JVM start
(seconds to minutes) and then have to fence the collector. So the HTTP thread only *queues*
a request and waits for its answer; the runner serves queued requests between its own runs
(:meth:`collector.runner.Runner._serve_run_now`), so there are never two runs at once and
every commit goes through the same :meth:`~collector.service.Collector.run_once` (lease,
fencing and exactly-once rules unchanged). Requests that arrive together share one drain.

"What is queued now" is each manifest shard's last issued sequence when the runner picks
the request up: it runs until every shard is acknowledged through it (a run that finds the
queue empty ends it too), then runs every model of ``[collector] models_dir`` once, as
``icefloe run`` would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from icefloe.clock import Clock
from icefloe.tokens import TokenHash, TokenHashError, parse_hash

if TYPE_CHECKING:
    from collector.commit import RunResult
    from collector.metrics import CollectorMetrics
    from collector.service import Collector

DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 3600.0


class Refusal(Exception):
    """An answer other than 200: its HTTP status, code and message (``retriable``: the same
    request may succeed later, at this collector or at the next lease holder)."""

    def __init__(self, status: int, code: str, message: str, *, retriable: bool = False,
                 **extra: object) -> None:
        super().__init__(message)
        self.status, self.code, self.retriable, self.extra = status, code, retriable, extra

    def body(self) -> dict[str, object]:
        return {"error": self.code, "message": str(self), "retriable": self.retriable,
                **self.extra}


class TokenCheck:
    """Admin bearer tokens against ``[admin] tokens`` (the admin API's hashes), for the
    collector's threaded HTTP server. Why a cache keyed by a MAC and one lock: a scrypt
    verification costs tens of ms, so each distinct token is verified once (the outcome kept
    under a keyed BLAKE2b of it, never the token), and verifications never run in parallel,
    so a flood of wrong tokens costs at most one core."""

    def __init__(self, hashes: Sequence[str]) -> None:
        self._hashes: list[TokenHash] = []
        for text in hashes:
            try:
                self._hashes.append(parse_hash(text))
            except TokenHashError:  # refused at config load already; never echo it
                continue
        self._key = secrets.token_bytes(32)
        self._known: dict[bytes, bool] = {}
        self._lock = threading.Lock()

    def check(self, header: str | None) -> None:
        """Raise :class:`Refusal` (401/403) unless ``header`` carries an admin token."""
        if not self._hashes:
            raise Refusal(403, "no_admin_tokens", "this collector's config has no [admin] "
                          "tokens, so POST /v1/run is off: add a token hash (`icefloe token "
                          "hash`) to [admin] tokens and restart the collector")
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refusal(401, "unauthenticated", "send 'Authorization: Bearer <admin "
                          "token>' (a token whose hash is in [admin] tokens)")
        mac = hashlib.blake2b(token.strip().encode(), key=self._key, digest_size=32).digest()
        with self._lock:
            known = self._known.get(mac)
            if known is None:
                known = any(h.verify(token.strip()) for h in self._hashes)
                if len(self._known) >= 256:
                    self._known.clear()
                self._known[mac] = known
        if not known:
            raise Refusal(403, "forbidden", "this token is not an admin token of this "
                          "collector ([admin] tokens)")


@dataclass
class Request:
    """One queued ``POST /v1/run``; the HTTP thread waits on ``answer``."""

    full_refresh: bool = False
    answer: concurrent.futures.Future[dict[str, object]] = field(
        default_factory=concurrent.futures.Future)


class RunNow:
    """The queue between the HTTP threads and the runner, and the drain + model run."""

    def __init__(self, tokens: TokenCheck, metrics: CollectorMetrics,
                 models_dir: str | None) -> None:
        self.tokens = tokens
        self.metrics = metrics
        self.models_dir = models_dir
        self._lock = threading.Lock()
        self._pending: list[Request] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.wake: asyncio.Event | None = None
        self.doing = "idle"
        """What the runner does for the requests it serves (for a 504's body)."""

    def attach(self) -> None:
        """Accept requests from now on (called on the runner's loop once it is active)."""
        self._loop, self.wake = asyncio.get_running_loop(), asyncio.Event()

    def submit(self, full_refresh: bool) -> Request:
        """Queue a request for the runner (from an HTTP thread)."""
        request = Request(full_refresh)
        with self._lock:
            loop, wake = self._loop, self.wake
            if loop is None or wake is None:
                raise Refusal(503, "not_active", "this collector does not hold the queue's "
                              "lease (starting, standby or stopping): retry, or ask the "
                              "lease holder", retriable=True)
            self._pending.append(request)
        loop.call_soon_threadsafe(wake.set)
        return request

    def take(self) -> list[Request]:
        """Every queued request (on the runner's loop): they share the next drain."""
        with self._lock:
            taken, self._pending = self._pending, []
            if self.wake is not None:
                self.wake.clear()
        return taken

    def close(self, refusal: Refusal) -> None:
        """Stop accepting, and answer what is queued with ``refusal`` (fenced, stopping)."""
        with self._lock:
            self._loop, self.wake = None, None
            taken, self._pending = self._pending, []
        answer(taken, refusal)

    def handle(self, header: str | None, body: bytes) -> tuple[int, dict[str, object]]:
        """One ``POST /v1/run`` (in an HTTP thread): status and JSON body."""
        started = time.monotonic()
        outcome = "refused"
        try:
            self.tokens.check(header)
            full_refresh, timeout = _options(body)
            request = self.submit(full_refresh)
            try:
                report = request.answer.result(timeout)
            except concurrent.futures.TimeoutError:
                outcome = "timeout"
                raise Refusal(504, "timeout", f"not done after {timeout:g} s; the collector "
                              "goes on with it (the next run answers when it is done)",
                              retriable=True, running=self.doing) from None
            outcome = "model_failed" if report.get("failed") else "ok"
            return 200, report
        except Refusal as refusal:
            if refusal.code in ("fenced", "stopping", "run_failed", "not_active"):
                outcome = refusal.code
            return refusal.status, refusal.body()
        finally:
            self.metrics.run_now_requests.labels(outcome).inc()
            self.metrics.run_now_seconds.observe(time.monotonic() - started)


def _options(body: bytes) -> tuple[bool, float]:
    """``{"full_refresh": bool, "timeout_s": seconds}`` (both optional)."""
    try:
        raw = msgspec.json.decode(body) if body.strip() else {}
    except msgspec.DecodeError as exc:
        raise Refusal(400, "bad_request", f"the body is not JSON: {exc}") from None
    if not isinstance(raw, dict) or set(raw) - {"full_refresh", "timeout_s"}:
        raise Refusal(400, "bad_request", "the body is a JSON object with at most "
                      "full_refresh (true/false) and timeout_s (seconds)")
    full_refresh, timeout = raw.get("full_refresh", False), raw.get("timeout_s",
                                                                   DEFAULT_TIMEOUT_S)
    if not isinstance(full_refresh, bool) or isinstance(timeout, bool) or \
            not isinstance(timeout, int | float) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise Refusal(400, "bad_request", "full_refresh must be true or false and "
                      f"timeout_s a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    return full_refresh, float(timeout)


def answer(requests: list[Request], outcome: dict[str, object] | Refusal) -> None:
    """Give every request its answer (a report or a refusal)."""
    for request in requests:
        if request.answer.done():
            continue
        if isinstance(outcome, Refusal):
            request.answer.set_exception(outcome)
        else:
            request.answer.set_result(outcome)


async def drain(collector: Collector, on_run: Callable[[RunResult], None],
                clock: Clock) -> list[dict[str, object]]:
    """Run until every shard is acknowledged through what it had issued when called (or a
    run finds nothing); one summary per run."""
    shards = await collector.queue_heads()
    target = {n: issued - 1 for n, (issued, _) in shards.items()}
    acked = {n: acked for n, (_, acked) in shards.items()}
    runs: list[dict[str, object]] = []
    while any(acked.get(n, -1) < t for n, t in target.items()):
        started = clock.monotonic()
        result = await collector.run_once()
        on_run(result)
        if not result.entries:
            break
        acked.update(result.through or {0: result.last_sequence})
        runs.append({"entries": result.entries, "rows": dict(result.rows),
                     "duplicates": result.duplicates, "dead_letters": result.dead_letters,
                     "through": {str(k): v for k, v in result.sequences.items()},
                     "catalog_version": collector.commits.run_version,
                     "seconds": round(clock.monotonic() - started, 3)})
    return runs


def run_models(collector: Collector, spark: Callable[[], Any], models_dir: str | None,
               full_refresh: bool) -> list[dict[str, object]]:
    """Every model of ``models_dir`` once, in DAG order, fenced by the collector's epoch
    (blocking: call in a thread); ``[]`` without a models folder."""
    if not models_dir or not Path(models_dir).is_dir():
        return []
    from pipeline.models import ModelError, WriteFence, prepare  # why: read per request
    from pipeline.models import run_models as run_all  # why: as above

    try:  # a bad file, a cycle, a table not there: nothing runs, and retrying cannot help
        project = prepare(Path(models_dir), collector.config)
    except ModelError as exc:
        raise Refusal(422, "bad_models", f"{models_dir}: {exc}; fix the model files (the "
                      "queue was committed)") from None
    if not project.models:
        return []
    assert collector.epoch is not None
    outcomes = run_all(spark(), project, collector.config, [], full_refresh=full_refresh,
                       fence=WriteFence(collector.epoch, collector.confirm_epoch_sync))
    return [{"name": o.name, "state": o.state, "rows": o.rows,
             "seconds": round(o.seconds, 3), "reason": o.reason} for o in outcomes]
