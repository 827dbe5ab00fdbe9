"""The engine of a collector whose SparkSession is still starting (``icefloe up``).

Why: the first answer after ``make up`` waited for the JVM. On a quiet 2-core machine a
bare ``SparkSession`` takes about as long to start as the whole first-answer target
(``bench/results/cold_start.json``), and the collector could not commit anything before
it. Yet a run's rows do not need Spark: the in-process engine
(:class:`pipeline.load.run.LocalEngine`) fetches and decodes the same batch files into the
same rows, and both engines' outputs go through the same commits, dedup windows and
sequences (the collector already mixes engines per run: see
:meth:`collector.service.Collector._route_run`). So :class:`SparkBridge` answers runs
in-process while the session starts in a thread of its own, and every run after the
session is up goes to Spark. Exactly-once is untouched: which engine decoded a run's rows
does not change what is committed with them.

Where it is used: only ``icefloe up``'s collector, and only for configurations the
in-process engine decodes exactly as Spark (:func:`bridgeable`: no ``sql`` mapping
columns, which only Spark computes; the embedded output path; a local master). A sink the
admin API adds later with ``sql`` columns fails its runs in-process until Spark is up,
retried as any failed run, and commits then. A session
that fails to start fails the next run with :class:`SparkStartError`, which the run loop
does not retry: the collector stops with the reason, as it did when Spark failed before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from collector.service import Engine
from icefloe.config import Config
from icefloe.errors import IcefloeError
from pipeline.load import LocalEngine, RunSpec, run_spec

log = logging.getLogger("icefloe.collector")


class SparkStartError(IcefloeError):
    """The collector's SparkSession did not start (the run loop stops on it)."""


def bridgeable(config: Config) -> bool:
    """Whether runs of ``config`` may be decoded in-process until Spark is up: the same
    rows as Spark (no ``sql`` mapping column), on the embedded output path, local master."""
    cfg = config.collector
    if cfg.output != "embedded" or not cfg.spark_master.startswith("local"):
        return False
    return not any(d.kind == "sql" for s in run_spec(config, []).streams for d in s.derived)


class SparkBridge:
    """An engine that runs in-process until ``start`` (in a thread) returns the Spark
    engine, then hands every run to it."""

    name = "local-until-spark"

    def __init__(self, start: Callable[[], Engine],
                 on_ready: Callable[[], None] | None = None) -> None:
        self._local = LocalEngine()
        self.partitions = self._local.partitions
        """The current engine's (Spark's once it is up)."""
        self._spark: Engine | None = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._on_ready = on_ready
        self._thread = threading.Thread(target=self._start, args=(start,),
                                        name="icefloe-spark-start", daemon=True)
        self._thread.start()

    def _start(self, start: Callable[[], Engine]) -> None:
        began = time.monotonic()
        try:
            self._spark = start()
            self.partitions = self._spark.partitions
            log.info("Spark is up (%.1f s): runs go to it from now on",
                     time.monotonic() - began)
        except BaseException as exc:  # reported by the next run
            self._error = exc
            log.error("Spark did not start: %s", exc)
        finally:
            self._ready.set()
            if self._spark is not None and self._on_ready is not None:
                self._on_ready()

    @property
    def engine(self) -> Engine:
        """The engine for the next run: in-process until Spark is up, then Spark."""
        if not self._ready.is_set():
            return self._local
        if self._spark is None:
            raise SparkStartError(f"the collector's SparkSession did not start: "
                                  f"{self._error}; check Java and collector.spark_* "
                                  "settings, then start the collector again")
        return self._spark

    @property
    def spark(self) -> Any:
        """The SparkSession once it is up (None before: no dry jobs, no models yet)."""
        return getattr(self._spark, "spark", None)

    def run(self, spec: RunSpec) -> Any:
        return self.engine.run(spec)

    def wait_spark(self) -> Any:
        """The SparkSession, waiting for it to start (models need it)."""
        self._ready.wait()
        self.engine  # noqa: B018 - raises SparkStartError when the start failed
        return self.spark
