"""Run a collector until stopped: lease renewal, the run loop, retries, GC and maintenance.

Why the loop looks like this: a failed run (store throttling, a missing batch file, a
catalog timeout, a Spark task failure) is retried with exponential backoff and never
skipped — the entries stay unacknowledged, so nothing can be lost by retrying. Only being
replaced ends the loop with an error. GC and table maintenance run *between* runs, in the
same task, so they never race this collector's own commits. Time comes from the
collector's clock and blocking steps go through its ``offload`` seam (see
:mod:`collector.hops`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from collector.bulkhead import is_shared_failure
from collector.gc import collect_garbage
from collector.hops import Offload, sleep_or_stop
from collector.http import HttpServer
from collector.metrics import CollectorMetrics
from collector.models import ModelRefresh, plan_refresh
from collector.overlap import Overlap
from collector.run_now import Refusal, RunNow, TokenCheck, answer, drain
from collector.run_now import run_models as run_models_now
from collector.service import Collector, Engine, Fenced, Hook
from collector.spark_bridge import SparkBridge, SparkStartError, bridgeable
from icefloe.backoff import run_retry_delay
from icefloe.clock import SYSTEM, Clock
from icefloe.collector_address import Address
from icefloe.collector_address import publish as publish_address
from icefloe.config import Config
from icefloe.errors import (
    ConfigError,
    FencedError,
    ManifestMismatchError,
    OffsetLostError,
    TableFencedError,
)
from icefloe.manifest.model import Entry
from icefloe.registry.model import Registry
from icefloe.registry.watch import RegistryWatch
from icefloe.retention import Segment
from icefloe.server_tls import section_tls
from icefloe.store import open_async_store, options_for
from icefloe.store.base import AsyncObjectStore
from icefloe.streams.dynamic_tables import is_template
from pipeline.iceberg import (
    MaintenanceSettings,
    load_table_or_none,
    open_catalog,
    run_maintenance,
)
from pipeline.load import SparkClusterEngine, SparkEngine, check_on_spark, get_spark, run_spec
from pipeline.models import ModelError, WriteFence

log = logging.getLogger("icefloe.collector")

EXIT_OK = 0
EXIT_FENCED = 3


@dataclass
class Ready:
    """Announced once the collector is active: its epoch and its metrics port."""

    epoch: int
    metrics_port: int | None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def spark_settings(config: Config) -> dict[str, Any]:
    """The collector's Spark settings: ``[collector] spark_conf`` (checked at load: it
    holds none icefloe owns) and the driver memory."""
    cfg = config.collector
    return {**cfg.spark_conf, "spark.driver.memory": cfg.spark_driver_memory}


def default_engine(config: Config) -> Engine:
    """Spark with the configured output path: ``embedded`` (default) or ``cluster``."""
    cfg = config.collector
    spark = get_spark(cfg.spark_master, "icefloe-collector", spark_settings(config))
    spec = run_spec(config, [])
    check_on_spark(spark, spec.streams)  # a sql mapping Spark cannot compile: fail now
    # Either way, start the Python workers now so the first run is not ~5 s slower.
    SparkEngine(spark, cfg.spark_partitions).warm_up(spec)
    if cfg.output == "cluster":
        return SparkClusterEngine(spark, cfg.spark_partitions)
    return SparkEngine(spark, cfg.spark_partitions)


def _spark_of(engine: Engine, config: Config) -> Callable[[], Any]:
    """The engine's SparkSession for model runs; an engine without one (tests, the no-Spark
    baseline) gets a session of its own when the models first run."""
    if isinstance(engine, SparkBridge):  # icefloe up: the models wait for its start
        return engine.wait_spark
    session = getattr(engine, "spark", None)
    if session is not None:
        return lambda: session

    def start() -> Any:
        return get_spark(config.collector.spark_master, "icefloe-collector",
                         spark_settings(config))
    return start


def maintenance_settings(config: Config) -> MaintenanceSettings:
    cfg = config.collector
    return MaintenanceSettings(keep_last=cfg.snapshot_keep_last,
                               max_snapshot_age_s=cfg.snapshot_max_age_s,
                               target_file_bytes=cfg.compact_target_bytes,
                               min_input_files=cfg.compact_min_files,
                               orphan_age_s=cfg.orphan_age_s)


WARM_EVERY_S = 20.0
"""How often a standby touches Spark and the catalog: well inside Spark's one-minute
timeout for idle Python workers, so the first run after a takeover finds them started."""
DRY_RUN_ENTRIES = 2
DRY_RUN_BYTES = 1 << 20
"""The standby's dry job: at most this many queued entries and bytes (a few hundred
rows), enough to have run every step of a real run once."""
DRY_RUN_POLL_S = 2.0
"""Until its first dry job, how often a standby looks for queued entries (manifest reads
only; the full warming pass stays every :data:`WARM_EVERY_S`)."""


class StandbyWarmth:
    """What a standby does while it waits for the lease: keep the SparkSession's Python
    workers started (an empty run of the data source), run a dry job on a few queued
    entries (``sample``: read, decode and bring the rows to the driver, as a real run does,
    then drop them), and check the catalog (load every configured table that exists), every
    :data:`WARM_EVERY_S`; the store is checked by the lease reads themselves.

    Why the dry job: an empty run starts the workers, but the first job with data still
    pays for everything else a run does the first time (measured in the chaos run: 20 s
    for the standby's first run after a takeover, 2-5 s for the next ones); the dry job
    pays it while waiting. It commits, acks and writes nothing, so it cannot affect what is
    committed. Nothing here is kept for after the epoch bump either: tables, committed
    sequences, dedup windows and staging states are read then (they may change until the
    old collector is fenced), so warming only saves start-up time, never state."""

    def __init__(self, config: Config, engine: Engine, catalog: Any, *, offload: Offload,
                 clock: Clock = SYSTEM,
                 sample: Callable[[], Awaitable[list[Entry]]] | None = None) -> None:
        self.config = config
        self.engine = engine
        self.catalog = catalog
        self.offload = offload
        self.clock = clock
        self.sample = sample
        self.dry_runs = 0
        """Dry jobs run (on a queue that had entries)."""
        self.dry_attempts = 0
        """Dry jobs begun (a failing one is retried at the full pass's pace only)."""
        self._task: asyncio.Task[None] | None = None
        self._halt = asyncio.Event()
        self.warmed = asyncio.Event()
        """Set after the first warming pass that succeeded."""
        self.dried = asyncio.Event()
        """Set after the first pass whose dry job ran."""
        self.tables = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._forever(), name="standby-warmth")

    async def stop(self) -> None:
        """Stop warming (a warm-up already running finishes in its thread, harmlessly)."""
        self._halt.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _forever(self) -> None:
        logged = False
        last = float("-inf")  # when the last full pass began
        while not self._halt.is_set():
            started = self.clock.monotonic()
            try:
                entries = await self._queued()
                if started - last >= WARM_EVERY_S or (entries and not self.dry_attempts):
                    last = started
                    self.tables = await self.offload(self.warm, entries)
                    self.warmed.set()
                    if self.dry_runs and not self.dried.is_set():
                        self.dried.set()
                        log.info("standby: dry job on %d queued entries done (%.1f s with "
                                 "the pass)", len(entries), self.clock.monotonic() - started)
                    if not logged:
                        log.info("standby: warm (Spark, store and catalog checked; %d "
                                 "tables in %.1f s)", self.tables,
                                 self.clock.monotonic() - started)
                        logged = True
            except Exception as exc:  # the takeover will show the real error, if lasting
                log.warning("standby: warming failed (will retry): %s", _first_line(exc))
            # until the first dry job, look at the queue often: a standby started on an
            # empty queue (the usual case) gets its dry job soon after events arrive
            pause = DRY_RUN_POLL_S if self._dry_runs_wanted() and not self.dry_attempts \
                else WARM_EVERY_S
            await sleep_or_stop(self.clock, pause, self._halt)

    async def once(self) -> None:
        """One warming pass with its dry job, now: a ``--takeover`` collector's, before its
        epoch bump. The collector it replaces keeps committing meanwhile, so this costs no
        freshness and spares the first run Spark's first job with data (8 s vs 3-4 s in
        the chaos run). A failure is only logged: the takeover goes on."""
        try:
            self.tables = await self.offload(self.warm, await self._queued())
        except Exception as exc:
            log.warning("takeover: warming failed (taking over all the same): %s",
                        _first_line(exc))

    async def _queued(self) -> list[Entry]:
        """The entries to run the dry job on ([] without a dry job, or if the manifest
        cannot be read now: the pass warms the rest all the same)."""
        if self.sample is None or not self._dry_runs_wanted():
            return []
        try:
            return await self.sample()
        except Exception as exc:
            log.debug("standby: no dry job this time (queue unreadable): %s",
                      _first_line(exc))
            return []

    def _dry_runs_wanted(self) -> bool:
        """A dry job needs a queue to sample and a SparkSession to warm."""
        return self.sample is not None and getattr(self.engine, "spark", None) is not None

    def warm(self, entries: Sequence[Entry] = ()) -> int:
        """One warming pass (blocking), with a dry job on ``entries`` if there are any;
        returns how many configured tables exist."""
        spark = getattr(self.engine, "spark", None)
        if spark is not None:
            engine = SparkEngine(spark, self.config.collector.spark_partitions)
            engine.warm_up(run_spec(self.config, []))
            if entries:  # the embedded shape: rows to the driver, no files written
                self.dry_attempts += 1
                engine.run(run_spec(self.config, list(entries),
                                    partitions=self.engine.partitions))
                self.dry_runs += 1
        found = 0
        for stream in self.config.streams:
            if not is_template(stream.table) and load_table_or_none(self.catalog, stream.table):
                found += 1
        return found


class Runner:
    """The long-running part of ``icefloe collector``."""

    def __init__(self, collector: Collector, stop: asyncio.Event,
                 models: ModelRefresh | None = None,
                 watch: RegistryWatch | None = None, *, once: bool = False,
                 run_now: RunNow | None = None,
                 spark: Callable[[], Any] | None = None) -> None:
        self.collector = collector
        self.run_now = run_now
        """``POST /v1/run`` requests, served between runs (:mod:`collector.run_now`)."""
        self.spark = spark
        self.once = once  # stop when the queue is empty (``icefloe run``)
        self.stop = stop
        self.models = models
        self.watch = watch
        self._next_registry = 0.0
        self.fenced: str | None = None
        cfg = collector.config.collector
        self.clock = collector.clock
        self._next_gc = self.clock.monotonic() + cfg.gc_interval_s
        self._index_cache: dict[str, Segment] = {}  # retention segments GC has read
        self._next_maintenance = self.clock.monotonic() + cfg.maintenance_interval_s
        self._maintaining: list[str] = []
        """Tables the current maintenance pass has yet to maintain (see :meth:`maintain_some`)."""
        self._renew: asyncio.Task[None] | None = None
        self.side_tasks: list[asyncio.Task[None] | None] = []
        """Background work of this active collector (publishing its address), cancelled
        when it stops."""
        self.overlap = Overlap(collector) if cfg.overlap else None
        """The runs overlapped (``collector.overlap``): read ahead, acks in the background."""

    async def _run_one(self) -> Any:
        self.collector.metrics.health.run_started()
        if self.overlap is not None:
            return await self.overlap.run()
        return await self.collector.run_once()

    async def _renew_forever(self) -> None:
        consumer = self.collector.consumer
        lease_s = consumer.config.lease_s
        interval = lease_s / 3
        failures = 0
        renewed = self.clock.monotonic()  # the lease was taken (or last renewed) about now
        while not self.stop.is_set():
            await self._sleep(interval)
            try:
                began = self.clock.monotonic()
                await consumer.renew_lease()
                failures = 0
                renewed = self._renewed(renewed, began, lease_s)
            except FencedError as exc:
                self.fenced = str(exc)
                self.collector.metrics.fenced.inc()
                self.stop.set()
                return
            except Exception as exc:  # transient: keep trying; the lease may lapse
                failures += 1
                log.warning("lease renewal failed (%d in a row): %s", failures, exc)

    def _renewed(self, previous: float, began: float, lease_s: float) -> float:
        """After a renewal: say so when it landed late. A renewal meant every third of the
        lease that lands after two thirds is a lease close to lapsing, and a lapsed lease
        lets the standby take over a healthy collector; the warning tells a post-mortem
        whether the wait was for a turn of this process (``began`` late: a starved event
        loop or machine) or for the store (the renewal call itself slow)."""
        now = self.clock.monotonic()
        if now - previous > lease_s * 2 / 3:
            log.warning("lease renewed %.1f s after the last renewal (lease %.1f s; the "
                        "renewal began %.1f s late and took %.1f s): a standby takes over "
                        "once the lease lapses", now - previous, lease_s,
                        max(0.0, began - previous - lease_s / 3), now - began)
        return now

    async def _sleep(self, seconds: float) -> None:
        await sleep_or_stop(self.clock, seconds, self.stop)

    def start_renewal(self) -> None:
        """Renew the lease from now on. Called right after becoming active, *before* the
        slow start-up work (creating tables, rebuilding dedup windows): a start-up longer
        than the lease must not let a standby take over, or two collectors would take
        turns fencing each other without ever committing."""
        if self._renew is None:
            self._renew = asyncio.create_task(self._renew_forever(), name="lease-renewal")

    async def run(self) -> int:
        self.start_renewal()
        if self.run_now is not None:
            self.run_now.attach()
        try:
            code = await self._loop()
        finally:
            await self.stop_renewal()
            for task in self.side_tasks:
                if task is not None:
                    task.cancel()
            if self.run_now is not None:
                self.run_now.close(self._closing())
        await self._release_lease()  # a clean stop only: a crash keeps its lease
        return code

    async def _release_lease(self) -> None:
        """Hand the lease back on the way out, so a warm standby takes over at once
        instead of after ``lease_s`` (best effort: a failure only costs that wait)."""
        if self.fenced is not None:
            return
        try:
            if await self.collector.consumer.release_lease():
                log.info("lease released")
        except Exception as exc:
            log.warning("lease not released (a standby waits until it lapses): %s", exc)

    async def stop_renewal(self) -> None:
        if self._renew is not None:
            self._renew.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renew

    async def _apply_registry(self, registry: Registry) -> None:
        await self.collector.offload(self.collector.apply_registry, registry)

    async def _loop(self) -> int:
        collector = self.collector
        cfg = collector.config.collector
        failures = 0
        if self.watch is not None:  # from now on a new version is applied (start-up set it)
            self.watch.on_change = self._apply_registry
        while not self.stop.is_set():
            if self.run_now is not None and await self._serve_run_now():
                break  # fenced while serving it
            started = self.clock.monotonic()
            try:
                await self._follow_registry()
                result = await self._run_one()
                failures = 0
                collector.metrics.health.run_ok(result.entries)
            except Fenced as exc:
                self.fenced = str(exc)
                break
            except SparkStartError:  # nothing to retry: the collector stops with the reason
                raise
            except Exception as exc:
                failures += 1
                kind = type(exc).__name__
                collector.metrics.run_errors.labels(kind).inc()
                collector.metrics.health.run_failed(f"{kind}: {_first_line(exc)}")
                delay = run_retry_delay(failures, cfg.retry_max_delay_s)
                log.error("run failed (%s, attempt %d); retrying in %.1f s: %s", kind,
                          failures, delay, _first_line(exc))
                # staged sinks still commit when due (a drain may be what unblocks the run)
                await self._commit_due_staged()
                await self._sleep_or_run_now(delay)  # a request gets this failure at once
                continue
            await self._housekeeping()  # when due: also during a backlog, or metadata grows
            staged = await self._commit_due_staged()
            backlog = result.cut or (bool(result.entries)
                                     and result.entries >= cfg.max_run_entries)
            if self.models is not None:
                self.models.note_commits({**result.rows, **staged})
                if self.models.due(backlog=backlog) and not self.stop.is_set():
                    await collector.offload(self.models.run)
            if self.once and not result.entries:
                break  # ``icefloe run``: everything queued is committed
            if backlog:
                continue  # a backlog: go straight on
            wait = cfg.poll_interval_s if not result.entries else \
                cfg.commit_interval_s - (self.clock.monotonic() - started)
            await self._sleep_or_run_now(wait)
        collector.metrics.health.set_role("stopping")
        if self.overlap is not None:  # acks in flight land; the run read ahead is dropped
            await self.overlap.close()
        if self.fenced:
            log.error("%s", self.fenced)
            return EXIT_FENCED
        with contextlib.suppress(Exception):  # a clean stop leaves a tidy manifest
            await collector.dequeue()
        return EXIT_OK

    async def _sleep_or_run_now(self, seconds: float) -> None:
        """The pause between runs, cut short by a ``POST /v1/run`` request."""
        wake = self.run_now.wake if self.run_now is not None else None
        if wake is None:
            await self._sleep(seconds)
            return
        either = asyncio.Event()
        waiters = [asyncio.ensure_future(e.wait()) for e in (self.stop, wake)]
        for waiter in waiters:
            waiter.add_done_callback(lambda _: either.set())
        try:
            await sleep_or_stop(self.clock, seconds, either)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    async def _serve_run_now(self) -> bool:
        """Serve queued ``POST /v1/run`` requests: drain what is queued, run the models,
        answer. True when this collector was fenced meanwhile (the loop ends)."""
        assert self.run_now is not None
        requests = self.run_now.take()
        if not requests:
            return False
        collector, run_now = self.collector, self.run_now
        health = collector.metrics.health
        started = self.clock.monotonic()
        try:
            run_now.doing = "committing the queue"
            health.run_started()
            if self.overlap is not None:  # the drain reads after the acks: all written
                await self.overlap.settle()
            runs = await drain(collector, self._after_drain_run, self.clock)
            run_now.doing = "running the models"
            models = await collector.offload(
                run_models_now, collector, self.spark or _no_spark, run_now.models_dir,
                any(r.full_refresh for r in requests))
        except (Fenced, FencedError, TableFencedError) as exc:
            self.fenced = str(exc)
            answer(requests, self._closing())
            return True
        except Refusal as refusal:  # bad model files: the commits stand
            answer(requests, refusal)
            return False
        except Exception as exc:
            kind = type(exc).__name__
            collector.metrics.run_errors.labels(kind).inc()
            health.run_failed(f"{kind}: {_first_line(exc)}")
            answer(requests, Refusal(500, "run_failed", f"{kind}: {_first_line(exc)}",
                                     retriable=True))
            return False
        finally:
            run_now.doing = "idle"
        answer(requests, {
            "holder": collector.consumer.holder, "epoch": collector.epoch, "runs": runs,
            "models": models, "failed": [m["name"] for m in models
                                         if m["state"] in ("failed", "skipped")],
            # tables whose rows wait in their staging area, not in the table: the queue
            # is committed, but these tables (and models reading them) are not current
            "parked": collector.bulkheads.reasons(),
            "seconds": round(self.clock.monotonic() - started, 3)})
        return False

    def _after_drain_run(self, result: Any) -> None:
        """A drain's run counts as the loop's own (health, model staleness)."""
        self.collector.metrics.health.run_ok(result.entries)
        if self.models is not None:
            self.models.note_commits(result.rows)

    def _closing(self) -> Refusal:
        """What queued requests get when the loop ends: fenced or stopping (retriable:
        the next lease holder answers)."""
        if self.fenced is not None:
            return Refusal(503, "fenced", f"this collector was fenced ({self.fenced}); "
                           "retry: the new lease holder answers", retriable=True)
        return Refusal(503, "stopping", "this collector is stepping down (its lease is "
                       "released); retry: the next lease holder answers", retriable=True)

    async def _commit_due_staged(self) -> dict[str, int]:
        """Commit staged sinks whose import conditions hold (also while the queue is idle:
        an age condition fires without new events). A failure is retried next time."""
        try:
            return await self.collector.offload(self.collector.commit_due_staged)
        except (Fenced, FencedError, TableFencedError) as exc:
            self.fenced = str(exc)
            self.stop.set()
        except Exception as exc:
            self.collector.metrics.run_errors.labels(type(exc).__name__).inc()
            log.warning("commit of staged rows failed (will retry): %s", _first_line(exc))
        return {}

    async def _follow_registry(self) -> None:
        """Between runs, at most every ``registry_poll_s``: apply a new registry version."""
        if self.watch is None or self.clock.monotonic() < self._next_registry:
            return
        self._next_registry = self.clock.monotonic() + self.watch.poll_s
        try:
            await self.watch.check()
        except Exception as exc:  # keep routing by the last good version; retried
            self.collector.metrics.run_errors.labels("RegistryUnreadable").inc()
            log.warning("cannot apply the stream registry; keeping version %d: %s",
                        self.collector.routes.version, _first_line(exc))

    async def _housekeeping(self) -> None:
        collector = self.collector
        cfg = collector.config.collector
        now = self.clock.monotonic()
        if now >= self._next_gc:
            self._next_gc = now + cfg.gc_interval_s
            try:
                gc = await collect_garbage(collector.store, collector.consumer.config.key,
                                           grace_s=collector.consumer.config.gc_grace_s,
                                           clock=collector.consumer.clock,
                                           keep_s=cfg.keep_batches_s,
                                           index_cache=self._index_cache)
                collector.metrics.gc_deleted.inc(gc.deleted)
                collector.metrics.gc_retained.set(gc.retained)
            except Exception as exc:
                log.warning("batch-file GC failed (will retry): %s", exc)
            for table in list(collector.staging.states):
                try:
                    await collector.staging.sweep(table, cfg.orphan_age_s)
                except Exception as exc:
                    log.warning("sweep of staged files of %s failed (will retry): %s",
                                table, exc)
        if not self._maintaining and now >= self._next_maintenance:
            self._next_maintenance = now + cfg.maintenance_interval_s
            self._maintaining = list(collector.routes.live_tables())
        if self._maintaining:
            await collector.offload(self.maintain_some, cfg.commit_interval_s)

    def maintain(self) -> None:
        """Compact, expire and clean every table now, as one whole pass (between runs,
        never during a commit)."""
        self._maintaining = list(self.collector.routes.live_tables())
        self.maintain_some(float("inf"))

    def maintain_some(self, budget_s: float) -> None:
        """Maintain the pass's next tables until ``budget_s`` is spent (at least one).

        Why a budget: maintenance runs between runs, so it holds the next run back. One
        pass over every table at once held runs for the sum of all tables' maintenance
        (an orphan-file listing alone can take seconds per table; with hundreds of
        tables, minutes), and the freshness of every table paid for it. A pass now
        spreads over the gaps between runs, about a commit interval each, and a table is
        still maintained once per ``maintenance_interval_s`` while the pass keeps up."""
        settings = maintenance_settings(self.collector.config)
        live = set(self.collector.routes.live_tables())
        started = self.clock.monotonic()
        while self._maintaining:
            name = self._maintaining.pop(0)
            if name not in live:  # dropped or disabled since the pass began
                continue
            self._maintain_table(name, settings)
            if self.clock.monotonic() - started >= budget_s:
                break

    def _maintain_table(self, name: str, settings: MaintenanceSettings) -> None:
        collector = self.collector
        try:
            table = load_table_or_none(collector.catalog, name)
            if table is None:  # not made yet (the dead letters before the first)
                log.debug("maintenance of %s: no such table yet", name)
                return
            report = run_maintenance(table, epoch=collector.epoch or 0, settings=settings,
                                     clock=collector.consumer.store_clock)
            collector.metrics.maintenance.labels(name, "ok").inc()
            log.info("maintenance %s: %s", name, report)
        except Exception as exc:
            collector.metrics.maintenance.labels(name, "error").inc()
            log.warning("maintenance of %s failed (will retry): %s", name, exc)


def _no_spark() -> Any:
    raise RuntimeError("no SparkSession for the models")


def _run_now(config: Config, metrics: CollectorMetrics) -> RunNow:
    """``POST /v1/run``'s side of the collector (answers 503 until it is active)."""
    return RunNow(TokenCheck(config.admin.tokens), metrics,
                  config.collector.models_dir or None)


def _serve(config: Config, metrics: CollectorMetrics, tls: Any,
           run_now: RunNow | None = None) -> HttpServer:
    """Serve ``/metrics``, ``/healthz``, ``/readyz`` and ``POST /v1/run`` from the start
    (TLS if configured)."""
    server = HttpServer(config.collector.host, config.collector.metrics_port,
                        metrics.registry, metrics.health,
                        tls.http_context if tls is not None else None, run_now=run_now)
    if tls is not None:
        tls.start()
    return server


def _model_refresh(config: Config, refresh_plan: Any, engine: Engine,
                   collector: Collector) -> ModelRefresh | None:
    """The models the collector keeps fresh (None: none configured); their targets are
    fenced on takeover like the collector's own tables."""
    if refresh_plan is None:
        return None
    assert collector.epoch is not None
    project, names = refresh_plan
    models = ModelRefresh(config, project, names, spark=_spark_of(engine, config),
                          metrics=collector.metrics, clock=collector.clock, fence=WriteFence(
                              collector.epoch, collector.confirm_epoch_sync))
    collector.model_tables = models.targets()
    return models


async def _prepare(config: Config, runner: Runner, collector: Collector,
                   watch: RegistryWatch, models: ModelRefresh | None) -> None:
    """Once active: renew the lease from now on, route by the registry, prepare the
    tables, verify the offsets and check the models' tables (the lease renewal stops if
    any of it fails)."""
    runner.start_renewal()
    failures = 0
    try:
        while True:
            try:
                await _prepare_once(config, collector, watch, models)
                return
            except Exception as exc:
                if not _transient(exc) or runner.stop.is_set():
                    raise
                failures += 1  # a store or catalog outage: retried like a failed run
                delay = run_retry_delay(failures, config.collector.retry_max_delay_s)
                log.error("start-up failed (%s, attempt %d); retrying in %.1f s: %s",
                          type(exc).__name__, failures, delay, _first_line(exc))
                await sleep_or_stop(collector.clock, delay, runner.stop)
    except BaseException:
        await runner.stop_renewal()
        raise


def _transient(exc: BaseException) -> bool:
    """A start-up failure worth retrying: the store or the catalog failing for now, not a
    fence, a lost offset or a bad configuration. Why retry: a standby that takes over in a
    store outage (its lease lapsed because renewals failed) and then exits leaves no
    collector at all until one boots Spark (31 s of no commits in a chaos run)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if isinstance(seen, (FencedError, TableFencedError, Fenced, OffsetLostError,
                             ManifestMismatchError, ConfigError)):
            return False
        if seen is None:
            break
        seen = seen.__cause__ or seen.__context__
    return is_shared_failure(exc)


async def _prepare_once(config: Config, collector: Collector, watch: RegistryWatch,
                        models: ModelRefresh | None) -> None:
    """Route by the registry, prepare the tables, verify the offsets, check the models'
    tables: each step re-reads what it needs, so a failed attempt is simply repeated."""
    registry = await watch.check()
    if registry is not None:  # route by the registry from the first run on
        collector.route_by(registry)
    await collector.offload(collector.prepare_tables)
    await collector.verify_offsets()
    if models is not None:
        try:
            await collector.offload(models.check_tables)
        except ModelError as exc:
            raise ConfigError(f"{config.source or 'config'}: collector.models: "
                              f"{exc}") from None


async def _engine(given: Engine | None, config: Config, metrics: CollectorMetrics,
                  offload: Offload, bridge: bool) -> Engine:
    """``given``, or Spark started now; or, with ``bridge`` and a configuration the
    in-process engine decodes as Spark does, a :class:`SparkBridge` that commits while
    Spark starts (``icefloe_collector_spark_ready`` says when it is up)."""
    if given is None and bridge and bridgeable(config):
        return SparkBridge(lambda: default_engine(config),
                           on_ready=lambda: metrics.spark_ready.set(1))
    engine = given or await offload(default_engine, config)
    if getattr(engine, "spark", None) is not None:
        metrics.spark_ready.set(1)
    return engine


ADDRESS_RETRY_MAX_S = 30.0
"""The longest wait between two tries at publishing the collector's address."""


def _publish_address(config: Config, collector: Collector, port: int | None
                     ) -> asyncio.Task[None] | None:
    """Publish where this (now active) collector answers, for ``icefloe run``
    (:mod:`icefloe.collector_address`), in the background: a slow store must not hold up
    the first commit. A store that fails it (past its own retries) is tried again, waits
    doubling up to :data:`ADDRESS_RETRY_MAX_S`, until it lands, a newer holder's record is
    there, or the collector stops: until then ``icefloe run`` asks the config's address,
    and a standby serving on a free port would stay unreachable for this whole term."""
    if port is None or collector.epoch is None:
        return None
    address = Address(holder=collector.consumer.holder, epoch=collector.epoch,
                      scheme="https" if config.collector.tls_cert_file else "http",
                      host=config.collector.host, port=port)

    async def publish_it() -> None:
        await publish_until_done(collector.store, address, collector.clock)
    return asyncio.create_task(publish_it(), name="publish-address")


async def publish_until_done(store: AsyncObjectStore, address: Address, clock: Clock,
                             first_wait_s: float = 1.0) -> bool:
    """:func:`~icefloe.collector_address.publish` until it is done (True) or a newer
    holder's record makes it moot (False); see :func:`_publish_address`."""
    failures = 0
    while True:
        try:
            published = await publish_address(store, address)
        except Exception as exc:
            failures += 1
            wait = min(ADDRESS_RETRY_MAX_S, first_wait_s * 2 ** (failures - 1))
            if failures == 1:  # once, not every retry: the store's own errors say the rest
                log.warning("collector address not published (icefloe run asks the "
                            "config's [collector] host and metrics_port until it is); "
                            "trying again in the background: %s", _first_line(exc))
            await clock.sleep(wait)
            continue
        if not published:
            log.info("collector address not published: a newer holder's is in the store")
        elif failures:
            log.info("collector address published after %d failed tries", failures)
        return published


def _warmth(collector: Collector, offload: Offload) -> StandbyWarmth:
    """The collector's warming while it waits on the lease (or before a ``--takeover``),
    its dry jobs on the head of its queue."""
    return StandbyWarmth(collector.config, collector.engine, collector.catalog,
                         offload=offload, clock=collector.clock,
                         sample=lambda: collector.queue_sample(DRY_RUN_ENTRIES,
                                                               DRY_RUN_BYTES))


async def run_collector(config: Config, *, takeover: bool = False,
                        stop: asyncio.Event | None = None,
                        store: AsyncObjectStore | None = None,
                        engine: Engine | None = None, hook: Hook | None = None,
                        serve_metrics: bool = True,
                        on_ready: Callable[[Ready], None] | None = None,
                        metrics: CollectorMetrics | None = None,
                        clock: Clock = SYSTEM, offload: Offload = asyncio.to_thread,
                        once: bool = False, bridge: bool = False) -> int:
    """Open everything from ``config``, become active (or wait as standby), run until
    ``stop`` is set or this collector is fenced. Returns the exit code.

    ``once`` (``icefloe run``): become active only if no other collector holds a live lease
    (else :class:`~icefloe.errors.LeaseHeldError`, unless ``takeover``), and stop once the
    queue is empty, everything in it committed.

    ``/metrics``, ``/healthz`` and ``/readyz`` are served from the start (unless
    ``serve_metrics`` is off), under the ``[collector]`` TLS and plaintext policy (a
    non-loopback ``host`` without TLS files nor ``plaintext = true`` raises ConfigError);
    pass ``metrics`` to read them in-process (``icefloe up``).
    ``clock`` and ``offload`` go to the collector (see :mod:`collector.hops`); ``bridge``
    (``icefloe up``): commit in-process while Spark starts (:mod:`collector.spark_bridge`)."""
    stop = stop or asyncio.Event()
    try:  # a bad model file, a cycle or an unknown name: refused before anything starts
        refresh_plan = plan_refresh(config)
    except ModelError as exc:
        raise ConfigError(f"{config.source or 'config'}: collector.models: {exc}") from None
    # refused before anything opens: a non-loopback host needs TLS or plaintext = true
    tls = section_tls(config, "collector", what="/metrics, /healthz and /readyz",
                      secrets="metrics and health details") if serve_metrics else None
    store = store or open_async_store(config.store.url, options_for(
        config.store.endpoint_url, config.store.region), control_url=config.store.control_url)
    metrics = metrics or CollectorMetrics()
    run_now = _run_now(config, metrics) if serve_metrics else None
    server = _serve(config, metrics, tls, run_now) if serve_metrics else None
    port = server.port if server is not None else None
    try:
        catalog = await offload(open_catalog, config.catalog)
        engine = await _engine(engine, config, metrics, offload, bridge)
        if stop.is_set():  # stopped while Spark was starting: leave the queue untouched
            return EXIT_OK
        collector = Collector(config, store, catalog, engine, metrics=metrics, hook=hook,
                              clock=clock, offload=offload)
        warmth = _warmth(collector, offload)
        if takeover and not once:  # the collector it fences commits meanwhile
            await warmth.once()
        try:
            await collector.acquire(takeover=takeover, stop=stop, on_standby=warmth.start,
                                    wait=not once)
        except asyncio.CancelledError:
            return EXIT_OK  # stopped while on standby
        finally:
            await warmth.stop()
        models = _model_refresh(config, refresh_plan, engine, collector)
        watch = RegistryWatch(store, config.admin.registry_key, lambda registry: None,
                              poll_s=config.admin.registry_poll_s,
                              config_streams=config.streams, clock=collector.clock)
        runner = Runner(collector, stop, models, watch, once=once, run_now=run_now,
                        spark=_spark_of(engine, config))
        runner.side_tasks.append(_publish_address(config, collector, port))
        await _prepare(config, runner, collector, watch, models)
        if on_ready is not None:
            on_ready(Ready(collector.epoch or 0, port))
        return await runner.run()
    finally:
        if server is not None:
            server.shutdown()
        if tls is not None:
            await tls.stop()
        await store.close()
