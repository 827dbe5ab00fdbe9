"""Keep selected SQL models fresh from the collector: run them right after the commits
that feed them.

Why in the collector, between runs: it already knows the moment new rows land in a table
(no polling of the catalog), it holds the only long-lived SparkSession, and a model run
placed between two of its own runs never overlaps a commit to a source table, so the
model reads one settled snapshot per source. A model run is crash-safe on its own (its
watermark and source snapshots commit with its rows, see :mod:`pipeline.models.state`), so
a collector killed mid-run leaves the model to be recomputed from its last committed state.

A model that fails does not stop ingestion: it is logged, counted, and retried with
backoff on the next runs; ingest freshness always comes first. While the queue has a
backlog, models wait (at most ``BACKLOG_DEFER_S``) so the raw tables catch up first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

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
    closure: set[str] = set()
    stack = [m.name for m in selected]
    while stack:
        name = stack.pop()
        if name not in closure:
            closure.add(name)
            stack.extend(project.upstream(name))
    return project, [n for n in project.models if n in closure]


def source_tables(project: Project, names: Iterable[str]) -> frozenset[str]:
    """The icefloe tables (not models) the given models read, without time-travel suffixes:
    a commit to one of these makes the models stale."""
    tables: set[str] = set()
    for name in names:
        for ref in project.refs[name]:
            if ref.kind == "table":
                tables.add(ref.name.split("@", 1)[0])
    return frozenset(tables)


class ModelRefresh:
    """Decides when the configured models run and runs them (from a worker thread)."""

    def __init__(self, config: Config, project: Project, names: Sequence[str],
                 spark: Callable[[], SparkSession], metrics: CollectorMetrics, *,
                 clock: Callable[[], float] = time.monotonic,
                 fence: WriteFence | None = None) -> None:
        self.config = config
        self.project = project
        self.names = list(names)
        self.sources = source_tables(project, self.names)
        self._spark = spark
        self.metrics = metrics
        self.clock = clock
        self.fence = fence
        """The collector's epoch: model commits are refused once another one took over."""
        self.interval_s = config.collector.models_interval_s
        self.stale = True  # a (re)start runs them once: rows may have landed while down
        self.stale_since = clock()
        self.failures = 0
        self.next_at = clock()

    def targets(self) -> list[str]:
        """The tables the stored models write (fenced on takeover with the others)."""
        return [m.target for m in self.project.select(self.names) if m.stored]

    def check_tables(self) -> None:
        """Every table the models read exists (after the collector created its own)."""
        check_tables(self.project, self.config)

    def note_commits(self, rows: dict[str, int]) -> None:
        """Record one run's committed rows per table: new rows in a source make the models
        stale."""
        if not self.stale and any(rows.get(t, 0) for t in self.sources):
            self.stale = True
            self.stale_since = self.clock()

    def due(self, *, backlog: bool) -> bool:
        now = self.clock()
        if not self.stale or now < self.next_at:
            return False
        return not backlog or now - self.stale_since >= BACKLOG_DEFER_S

    def run(self) -> list[Outcome]:
        """Run the models once (blocking: call it in a thread). Never raises: a failure is
        logged and counted, and the next attempt backs off."""
        started = self.clock()
        self.stale = False
        try:
            outcomes = run_models(self._spark(), self.project, self.config, self.names,
                                  fence=self.fence)
        except Exception as exc:  # the catalog or Spark itself: retry later
            outcomes = []
            self._failed(started, f"{type(exc).__name__}: {str(exc).strip()[:300]}")
            return outcomes
        for outcome in outcomes:
            self.metrics.model_runs.labels(outcome.name, outcome.state).inc()
            if outcome.state == "ran":
                self.metrics.model_rows.labels(outcome.name).inc(outcome.rows or 0)
                self.metrics.model_last_run.labels(outcome.name).set(time.time())
            self.metrics.model_seconds.labels(outcome.name).observe(outcome.seconds)
            level = logging.WARNING if outcome.state in ("failed", "skipped") else logging.INFO
            log.log(level, "model %s %s%s rows=%s %.3fs", outcome.name, outcome.state,
                    f" ({outcome.reason})" if outcome.reason else "", outcome.rows,
                    outcome.seconds, extra={"model": outcome.name, "state": outcome.state,
                                            "rows": outcome.rows,
                                            "seconds": round(outcome.seconds, 4)})
        bad = [o for o in outcomes if o.state in ("failed", "skipped")]
        if bad:
            self._failed(started, f"{bad[0].name}: {bad[0].reason}")
        else:
            self.failures = 0
            self.next_at = started + self.interval_s
        return outcomes

    def _failed(self, started: float, reason: str) -> None:
        """Stay stale and try again after a backoff (capped like failed collector runs)."""
        self.failures += 1
        self.stale = True
        cap = self.config.collector.retry_max_delay_s
        delay = max(self.interval_s, min(cap, 2.0 ** min(self.failures, 10)))
        self.next_at = started + delay
        log.warning("models failed (attempt %d); retrying in %.0f s: %s", self.failures,
                    delay, reason)
