"""Keep selected SQL models fresh from the collector: run them right after the commits
that feed them.

Why in the collector, between runs: it already knows the moment new rows land in a table
(no polling of the catalog), it holds the only long-lived SparkSession, and a model run
placed between two of its own runs never overlaps a commit to a source table, so the
model reads one settled snapshot per source. A model run is crash-safe on its own (its
watermark and source snapshots commit with its rows, see :mod:`pipeline.models.state`), so
a collector killed mid-run leaves the model to be recomputed from its last committed state.

A model that fails does not stop ingestion: it is logged, counted, and retried with
backoff of its own on the next runs (the models reading it wait with it, the others go on);
ingest freshness always comes first. While the queue has a
backlog, models wait (at most ``BACKLOG_DEFER_S``) so the raw tables catch up first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from pipeline.models import ModelError, check_tables, load_models, plan_project, run_models

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from collector.metrics import CollectorMetrics
    from pipeline.models import Outcome, Project, WriteFence

log = logging.getLogger("icefloe.collector")

ALL = "*"
BACKLOG_DEFER_S = 30.0
"""Longest a due model run waits while the collector drains a backlog."""


def plan_refresh(config: Config) -> tuple[Project, list[str]] | None:
    """Load and order ``collector.models`` from ``collector.models_dir``: the project and the
    models to run each time (the named ones and every model they read, in run order).
    None when no model is configured. Raises :class:`ModelError` (a bad file, a cycle, an
    unknown name) before anything starts; table existence is checked later
    (:meth:`ModelRefresh.check_tables`), once the collector has created its tables."""
    names = list(config.collector.models)
    if not names:
        return None

    folder = Path(config.collector.models_dir)
    if not folder.is_dir():
        raise ModelError(f"collector.models_dir: {folder} is not a folder of *.sql models "
                         f"(needed for collector.models = {names})")
    project = plan_project(load_models(folder), config)
    wanted = list(project.models) if ALL in names else names
    selected = project.select(wanted)  # unknown names raise here
    closure = with_upstream(project, [m.name for m in selected])
    return project, [n for n in project.models if n in closure]


def with_upstream(project: Project, names: Iterable[str]) -> set[str]:
    """``names`` and every model they read, transitively."""
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(project.upstream(name))
    return seen


def source_tables(project: Project, names: Iterable[str]) -> frozenset[str]:
    """The icefloe tables (not models) the given models read, without time-travel suffixes:
    a commit to one of these makes the models stale."""
    tables: set[str] = set()
    for name in names:
        for ref in project.refs[name]:
            if ref.kind == "table":
                tables.add(ref.name.split("@", 1)[0])
    return frozenset(tables)


class _Pending:
    """One model's wait for a run: since when it is stale, and its own retry schedule."""

    __slots__ = ("failures", "retry_at", "since")

    def __init__(self, since: float) -> None:
        self.since = since
        self.failures = 0
        self.retry_at = since


class ModelRefresh:
    """Decides when the configured models run and runs them (from a worker thread).

    Why each model keeps its own state: a model that fails (a bad join, a unique key
    broken by new rows) backs off on its own, with the models that read it; the others
    still run after every commit that feeds them. One shared backoff let one broken model
    hold every other model's freshness back by up to ``retry_max_delay_s``.
    """

    def __init__(self, config: Config, project: Project, names: Sequence[str],
                 spark: Callable[[], SparkSession], metrics: CollectorMetrics, *,
                 clock: Clock = SYSTEM, fence: WriteFence | None = None) -> None:
        self.config = config
        self.project = project
        self.names = list(names)
        self._spark = spark
        self.metrics = metrics
        self.clock = clock
        self.fence = fence
        """The collector's epoch: model commits are refused once another one took over."""
        self.interval_s = config.collector.models_interval_s
        # each model with the models it reads, transitively, and all their tables
        self._reads = {name: with_upstream(project, [name]) for name in self.names}
        self._feeds = {name: source_tables(project, reads)
                       for name, reads in self._reads.items()}
        now = clock.monotonic()
        # a (re)start runs them all once: rows may have landed while down
        self.pending: dict[str, _Pending] = {name: _Pending(now) for name in self.names}
        self.next_at = now
        """The earliest next run (``models_interval_s`` after the last one)."""

    @property
    def stale(self) -> bool:
        """Some model waits for a run."""
        return bool(self.pending)

    def failures(self, name: str) -> int:
        """Failed attempts in a row of one model (0: not failing)."""
        waiting = self.pending.get(name)
        return waiting.failures if waiting is not None else 0

    def targets(self) -> list[str]:
        """The tables the stored models write (fenced on takeover with the others)."""
        return [m.target for m in self.project.select(self.names) if m.stored]

    def check_tables(self) -> None:
        """Every table the models read exists (after the collector created its own)."""
        check_tables(self.project, self.config)

    def note_commits(self, rows: dict[str, int]) -> None:
        """Record one run's committed rows per table: new rows in a table a model reads
        (itself or through the models it reads) make that model stale."""
        changed = {table for table, count in rows.items() if count}
        if not changed:
            return
        now = self.clock.monotonic()
        for name in self.names:
            if name not in self.pending and self._feeds[name] & changed:
                self.pending[name] = _Pending(now)

    def runnable(self, now: float) -> list[str]:
        """The stale models that may run now, in run order: past their own retry time,
        and reading no model that still backs off (it would read that model's old
        rows, and run again once it recovers)."""
        waiting = [n for n in self.names if n in self.pending]
        held = {n for n in waiting if self.pending[n].retry_at > now}
        return [n for n in waiting if not self._reads[n] & held]

    def due(self, *, backlog: bool) -> bool:
        now = self.clock.monotonic()
        if now < self.next_at:
            return False
        ready = self.runnable(now)
        if not ready:
            return False
        # during a backlog the raw tables catch up first, but not for ever
        return not backlog or any(now - self.pending[n].since >= BACKLOG_DEFER_S
                                  for n in ready)

    def run(self) -> list[Outcome]:
        """Run the models that may run now, once (blocking: call it in a thread). Never
        raises: a failure is logged and counted, and that model (with the models that
        read it) backs off."""
        started = self.clock.monotonic()
        names = self.runnable(started)
        if not names:
            return []
        self.next_at = started + self.interval_s
        waiting = {name: self.pending.pop(name) for name in names}
        try:
            outcomes = run_models(self._spark(), self.project, self.config, names,
                                  fence=self.fence, clock=self.clock)
        except Exception as exc:  # the catalog or Spark itself: every one of them waits
            reason = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            for name in names:
                self._failed(name, waiting[name], started, reason)
            return []
        for outcome in outcomes:
            self.metrics.model_runs.labels(outcome.name, outcome.state).inc()
            if outcome.state == "ran":
                self.metrics.model_rows.labels(outcome.name).inc(outcome.rows or 0)
                self.metrics.model_last_run.labels(outcome.name).set(self.clock.time())
            self.metrics.model_seconds.labels(outcome.name).observe(outcome.seconds)
            level = logging.WARNING if outcome.state in ("failed", "skipped") else logging.INFO
            log.log(level, "model %s %s%s rows=%s %.3fs", outcome.name, outcome.state,
                    f" ({outcome.reason})" if outcome.reason else "", outcome.rows,
                    outcome.seconds, extra={"model": outcome.name, "state": outcome.state,
                                            "rows": outcome.rows,
                                            "seconds": round(outcome.seconds, 4)})
            if outcome.state == "failed":
                self._failed(outcome.name, waiting[outcome.name], started, outcome.reason)
            elif outcome.state == "skipped":
                # its upstream failed: it waits for that one's retry, not a backoff of its own
                self.pending[outcome.name] = waiting[outcome.name]
        return outcomes

    def _failed(self, name: str, waiting: _Pending, started: float, reason: str) -> None:
        """Stay stale and try again after a backoff (capped like failed collector runs)."""
        waiting.failures += 1
        cap = self.config.collector.retry_max_delay_s
        delay = max(self.interval_s, min(cap, 2.0 ** min(waiting.failures, 10)))
        waiting.retry_at = started + delay
        self.pending[name] = waiting
        log.warning("model %s failed (attempt %d); retrying it in %.0f s: %s", name,
                    waiting.failures, delay, reason)
