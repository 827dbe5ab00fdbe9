"""The per-process buffer and flusher: group commit with durable acks and backpressure.

Why it works this way:

* **Ack only when durable.** A request's events enter the open batch and the request waits
  on a future that resolves only after the batch file PUT *and* the manifest append
  succeeded. A failed flush fails every waiting request (503): they were never acked.
* **Latency is the product.** The age limit is a maximum, not a tick: when nothing is being
  flushed, a waiting request is flushed at once; requests arriving during a flush ride the
  next one (group commit). *At once* means inside the request's own call, not at the end
  of the event-loop turn: 256 HTTP connections answered by one flush send their next
  requests together, and the loop reads them all in one turn. Sealed at the turn's end,
  every connection would wait for one flush of all of them and the loop would idle while
  it is written (lock-step, ~33 % of the time); sealed at the first request that finds the
  flusher idle, the rest of the turn rides the next flush while this one is written
  (+8-13 % single-event HTTP throughput at 256 connections). While flushes are in
  flight, the open batch is sealed when it reaches the size/count limit or its age limit,
  and up to ``max_inflight`` flushes overlap (a PUT and a manifest CAS each cost tens of
  ms on S3). ``min_interval_s`` bounds PUTs/s (``min_flush_interval_ms``, 4 ms by
  default: back to back, a local store's flushes cost more CPU in fsyncs and wake-ups
  than they saved in latency; an isolated request still flushes at once) — unless
  ``early_requests`` requests (64) already wait: then the PUT is cheap per request, and
  every one of those clients would otherwise sit out the rest of the interval (HTTP single
  events at 256 connections: 31k → 38k/s; a 32-call gRPC load never reaches it).
* **Bounded memory.** Bytes buffered plus bytes being flushed never exceed
  ``max_bytes``; a request that would cross it is refused at once with 429, never queued
  without bound and never dropped silently.
* **All or nothing.** A request's events are framed into one segment and land in one batch
  file, so a request is either wholly durable or wholly refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import DeadlineExceededError, QueueFullError, StoreError
from icefloe.formats.batch import BatchBuilder, Compression
from ingestor.errors import IngestError, Overloaded, PayloadTooLarge, Unavailable
from ingestor.metrics import IngestMetrics
from ingestor.publish import Publisher

log = logging.getLogger("icefloe.ingestor.buffer")


@dataclass(frozen=True)
class FlushSettings:
    """When to flush and how much to hold. Sizes in bytes, times in seconds."""

    age_s: float = 0.1
    max_batch_bytes: int = 8 * 1024 * 1024
    max_batch_events: int = 100_000
    min_interval_s: float = 0.0
    early_requests: int = 0
    """Start a flush before ``min_interval_s`` is over once this many requests wait (0:
    never)."""
    max_bytes: int = 256 * 1024 * 1024
    max_inflight: int = 4
    timeout_s: float = 30.0
    zstd_level: int = 1
    retry_after_s: float = 1.0
    compression: Compression = Compression.ZSTD
    """The batch files' block codec (``[ingestor] batch_compression``)."""


@dataclass
class _OpenBatch:
    builder: BatchBuilder = field(default_factory=BatchBuilder)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    streams: set[str] = field(default_factory=set)
    opened_at: float = 0.0
    sealed_at: float = 0.0
    size: int = 0
    registry_version: int = 0


class Batcher:
    """Buffers framed requests and flushes them as batch files plus manifest appends.

    ``clock`` (:mod:`icefloe.clock`) measures batch ages, flush intervals and deadlines;
    the waits between them are still the event loop's timers.
    """

    def __init__(self, publisher: Publisher, settings: FlushSettings,
                 metrics: IngestMetrics, *, clock: Clock = SYSTEM) -> None:
        self.publisher = publisher
        self.clock = clock
        # batch ages, flush intervals and deadlines are durations on this clock (bound
        # once: it is read on every request)
        self._monotonic = clock.monotonic
        self.settings = settings
        self.metrics = metrics
        self._open: _OpenBatch | None = None
        self._sealed: deque[_OpenBatch] = deque()
        self._held_bytes = 0
        self._inflight = 0
        self._last_start = 0.0
        self._wake = asyncio.Event()
        self._closing = False
        self._loop_task: asyncio.Task[None] | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        # asyncio.get_running_loop() costs a getpid() syscall per call in CPython 3.11:
        # cached once rather than paid on every request
        self._loop: asyncio.AbstractEventLoop | None = None
        metrics.buffer_limit_bytes.set(settings.max_bytes)
        # read when scraped: nothing to update per request
        metrics.buffer_bytes.set_function(lambda: self._held_bytes)

    @property
    def held_bytes(self) -> int:
        """Bytes buffered or being flushed: not yet acknowledged."""
        return self._held_bytes

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._run(), name="ingest-flusher")

    def enqueue(self, framed: bytes, count: int, stream: str,
                registry_version: int = 0, also: tuple[str, ...] = ()) -> asyncio.Future[None]:
        """Buffer one request's framed records; the future resolves once they are durable
        (or fails with the :class:`Unavailable` that says why they are not). A client that
        hangs up cancels only its own future: the flush is its own task, and it skips
        waiters that are already done.

        ``registry_version`` is the stream-registry version the events were accepted under;
        a batch holds one version only (a change seals the open batch), because the manifest
        entry records it and the collector routes the whole entry by it. ``also``: other
        envelope stream names in ``framed`` (dead-lettered invalid events).

        Raises :class:`Overloaded` (buffer full), :class:`Unavailable` (flush failed, or
        shutting down). In both cases none of the request's events were acknowledged.
        """
        size = len(framed)
        task = self._loop_task
        if self._closing or (task is not None and task.done()) \
                or self._held_bytes + size > self.settings.max_bytes:
            raise self._refusal(size)
        batch = self._open
        if batch is not None and batch.registry_version != registry_version:
            self._seal()
            batch = None
        if batch is None:
            batch = self._open = _OpenBatch(registry_version=registry_version,
                                            opened_at=self._monotonic())
        batch.builder.add_framed(framed, count)
        batch.streams.add(stream)
        if also:
            batch.streams.update(also)
        batch.size += size
        self._held_bytes += size
        waiters = batch.waiters
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiters.append(future)
        if (batch.builder.block_size >= self.settings.max_batch_bytes
                or batch.builder.record_count >= self.settings.max_batch_events):
            self._seal()
            self._wake.set()
        elif self._inflight == 0 and not self._sealed:
            if self._may_start(len(waiters), self._monotonic()):
                # at once means in this call, not at the end of the event-loop turn: when
                # many connections' requests are ready together, the ones read after this
                # ride the next flush while this one is being written, instead of every
                # connection waiting for one flush of all of them (see the docstring)
                self._seal()
                self._start_flush(self._sealed.popleft())
            else:  # the flusher seals it when the minimum interval is over
                self._wake.set()
        elif len(waiters) == 1:
            # the flusher must learn the batch's age deadline; requests joining a batch
            # that waits for a flush in flight change nothing
            self._wake.set()
        return future

    def _refusal(self, size: int) -> IngestError:
        """Why a request of ``size`` bytes cannot be buffered (called only when one of the
        checks in :meth:`enqueue` says so; the first that applies, in this order)."""
        retry_after_s, max_bytes = self.settings.retry_after_s, self.settings.max_bytes
        if self._closing:
            return Unavailable("this ingestor is shutting down; retry against another one",
                               code="shutting_down", retry_after_s=retry_after_s)
        if self._loop_task is not None and self._loop_task.done():
            # never let a request wait on a flusher that is gone: it would hang forever
            return Unavailable("this ingestor's flusher stopped; it needs a restart (see "
                               "its log)", code="flusher_stopped", retry_after_s=retry_after_s)
        if size > max_bytes:  # could never fit: retrying cannot help
            return PayloadTooLarge(
                f"the request needs {size} bytes of buffer, more than this ingestor's whole "
                f"buffer ({max_bytes} bytes, ingestor.buffer_max_bytes); "
                "split it into smaller requests", code="payload_too_large")
        return Overloaded(
            f"ingest buffer full ({self._held_bytes} of {max_bytes} bytes "
            "waiting for the object store); retry after the indicated delay",
            code="buffer_full", retry_after_s=retry_after_s)

    # -- flush scheduling ------------------------------------------------------------------

    def _seal(self) -> None:
        if self._open is not None and self._open.waiters:
            self._open.sealed_at = self._monotonic()
            self._sealed.append(self._open)
        self._open = None

    def _expire_queued(self, now: float) -> None:
        """Fail sealed batches that waited for a flush slot past their deadline.

        Why: ``flush_timeout_s`` bounds a request's wait from the moment its batch is
        sealed, not from the moment its flush starts. With a stalled store every flush slot
        is busy for up to the timeout, and a batch queued behind them would otherwise wait
        several timeouts in a row — a client would see a hang instead of a 503.
        """
        while self._sealed and now - self._sealed[0].sealed_at >= self.settings.timeout_s:
            batch = self._sealed.popleft()
            self._held_bytes -= batch.size
            self.metrics.flushes.labels("store_timeout").inc()
            log.warning("%d events waited %.1f s for a flush slot: the object store is too "
                        "slow; answering 503", batch.builder.record_count,
                        now - batch.sealed_at)
            error = Unavailable(
                f"the object store is too slow: these events waited "
                f"{self.settings.timeout_s:g}s for a flush (ingestor.flush_timeout_s)",
                code="store_timeout", retry_after_s=self.settings.retry_after_s)
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_exception(error)

    async def _run(self) -> None:
        settings = self.settings
        while True:
            now = self._monotonic()
            batch = self._open
            # group commit: seal when a flush can start now (nothing in flight, minimum
            # interval over or enough requests waiting); until then arrivals keep joining
            # the open batch
            if batch is not None and (
                    (self._inflight == 0 and self._may_start(len(batch.waiters), now))
                    or self._closing or now - batch.opened_at >= settings.age_s):
                self._seal()
            self._expire_queued(now)
            while (self._sealed and self._inflight < settings.max_inflight
                   and self._may_start(len(self._sealed[0].waiters), now)):
                self._start_flush(self._sealed.popleft())
                now = self._monotonic()
            if self._closing and not self._sealed and self._open is None \
                    and self._inflight == 0:
                return
            self._wake.clear()
            timeout = self._next_deadline(now)
            # asyncio.timeout, not wait_for: no task made per wake-up (3.11's wait_for
            # wraps the awaitable in one)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    def _may_start(self, waiting: int, now: float) -> bool:
        """A flush of a batch ``waiting`` requests wait on may start now: the minimum
        interval since the last start is over, or that many requests make it worth a PUT
        at once (``early_requests``)."""
        settings = self.settings
        return (now - self._last_start >= settings.min_interval_s
                or 0 < settings.early_requests <= waiting)

    def _next_deadline(self, now: float) -> float | None:
        waits: list[float] = []
        if self._open is not None:
            waits.append(self._open.opened_at + self.settings.age_s - now)
            if self._inflight == 0:  # wake to seal it when the minimum interval is over
                waits.append(self._last_start + self.settings.min_interval_s - now)
        if self._sealed and self._inflight < self.settings.max_inflight:
            waits.append(self._last_start + self.settings.min_interval_s - now)
        if self._sealed:  # wake to expire the oldest queued batch at its deadline
            waits.append(self._sealed[0].sealed_at + self.settings.timeout_s - now)
        return max(0.0, min(waits)) if waits else None

    def _start_flush(self, batch: _OpenBatch) -> None:
        """Hand ``batch`` to the publisher now (the helper starts writing it before this
        loop turn ends) and let a task wait for the answer."""
        self._inflight += 1
        self._last_start = started = self._monotonic()
        # compressed where the publisher writes: in the local store's helper process, off
        # this loop
        try:
            pending = self.publisher.dispatch(
                batch.builder.to_block(self.settings.compression, self.settings.zstd_level),
                streams=batch.streams, registry_version=batch.registry_version)
        except Exception as exc:  # answered by the flush task like any failed flush
            pending = _raise(exc)
        task = asyncio.create_task(self._flush(batch, pending, started), name="ingest-flush")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    # -- one flush -------------------------------------------------------------------------

    async def _flush(self, batch: _OpenBatch, pending: Awaitable[tuple[int | None, int]],
                      started: float) -> None:
        error: IngestError | None = None
        # the deadline runs from sealing: time spent queued for a slot counts
        remaining = batch.sealed_at + self.settings.timeout_s - started if batch.sealed_at \
            else self.settings.timeout_s
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                await self._write(batch, pending)
        except QueueFullError as exc:
            error = Overloaded(str(exc), code="queue_full",
                               retry_after_s=self.settings.retry_after_s)
        except DeadlineExceededError as exc:
            error = Unavailable(str(exc), code="flush_deadline",
                                retry_after_s=self.settings.retry_after_s)
        except StoreError as exc:
            error = Unavailable(f"the object store is unavailable: {exc}",
                                code="store_unavailable",
                                retry_after_s=self.settings.retry_after_s,
                                may_be_stored=exc.ambiguous)
        except TimeoutError:  # the write goes on: it may still land
            error = Unavailable(f"flushing to the object store took longer than "
                                f"{self.settings.timeout_s:g}s", code="store_timeout",
                                retry_after_s=self.settings.retry_after_s, may_be_stored=True)
        except Exception as exc:  # never leave a client hanging on an unexpected bug
            log.exception("flush failed unexpectedly")
            error = Unavailable(f"internal error while flushing: {exc}", code="internal",
                                retry_after_s=self.settings.retry_after_s, may_be_stored=True)
        finally:
            self._inflight -= 1
            self._held_bytes -= batch.size
            self._wake.set()
        self.metrics.flushes.labels("ok" if error is None else error.code).inc()
        self.metrics.flush_seconds.observe(self._monotonic() - started)
        if error is not None:
            log.warning("flush of %d events failed: %s", batch.builder.record_count, error)
        for waiter in batch.waiters:
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    async def _write(self, batch: _OpenBatch,
                     pending: Awaitable[tuple[int | None, int]]) -> None:
        builder = batch.builder
        _, size = await pending
        self.metrics.batch_bytes.observe(size)
        self.metrics.batch_events.observe(builder.record_count)

    # -- shutdown --------------------------------------------------------------------------

    async def close(self, timeout_s: float) -> bool:
        """Refuse new work, flush what is buffered, answer every waiter; True if drained."""
        self._closing = True
        self._wake.set()
        if self._loop_task is None:
            return True
        if self._loop_task.done():  # the flusher died: answer whoever still waits
            stranded = bool(self._sealed or self._open)
            self._fail_remaining()
            return not stranded
        try:
            await asyncio.wait_for(asyncio.shield(self._loop_task), timeout_s)
            return True
        except TimeoutError:
            self._fail_remaining()
            return False

    def _fail_remaining(self) -> None:
        error = Unavailable("the ingestor shut down before these events were flushed",
                            code="shutting_down", retry_after_s=self.settings.retry_after_s)
        pending = list(self._sealed) + ([self._open] if self._open else [])
        for batch in pending:
            for waiter in batch.waiters:
                if not waiter.done():
                    waiter.set_exception(error)
        if self._loop_task is not None:
            self._loop_task.cancel()


async def _raise(exc: Exception) -> tuple[int | None, int]:
    """An awaitable that fails with ``exc``: a publisher that refused a batch outright."""
    raise exc
