"""Bulkheads: a table whose own commits keep failing is parked, so the others go on.

Why: every run commits all of its tables, and a failed run is retried, never skipped (the
entries stay unacknowledged). Without bulkheads a failure that belongs to ONE table — its
type or schema changed by another engine, its commit refused, an upsert its rows cannot
take — fails every run, and every other table's events wait in the shared queue until the
ingestors refuse with ``queue_full``.

The rule: a failure is counted against the table whose step raised it (evolving, writing,
committing), and the run goes on with its other tables before it fails (their commits
record the run's sequence, so its retry skips them: they never wait for the failing one).
Failures of what all tables share — the object store, the catalog's connection, being
fenced — are not counted: they stop the run at once, which is retried, as before.
After ``collector.park_after_failures`` failed attempts in a row a table is **parked**:
from the next attempt on, its rows go to its staging area in the object store (the same
Parquet files and compare-and-swap state as a sink with import conditions,
:mod:`collector.staging`), so the run commits every other table, is acknowledged, and the
manifest moves on. Exactly once holds as for any staged sink: the staging state records how
far each shard is staged, and the import commits with the staged sequences.

A parked table is retried by itself: its staged rows are imported after
``collector.park_retry_s``, then at doubling intervals (capped at ten times that), and at
once after the stream registry changes (a fix through the admin API). An import that
commits unparks it; its staged rows are then in the table exactly once, and new rows take
the normal path again once nothing is staged. A restart retries too (the parked state is
not stored: the staged files are, and rows keep going behind them until they import).

Staged rows of a parked table are bounded by ``collector.park_max_bytes``: beyond it, its
rows are not staged any more and the run fails at its end (the other tables still commit,
their rows never wait), so its entries wait in the queue, whose own bound then applies.
Why not dead letters past the bound: a replay after a crash may find the table fixed and
commit the same rows to it, and the dead letters could not take them back. An evolving
sink's rows are staged as they came (undeclared fields kept) and the import evolves the
table first; rows that evolution would refuse stop the import, naming them.

Users see it: ``icefloe_collector_table_parked{table}`` (1 while parked),
``icefloe_collector_table_failures_total{table,kind}``, the alert ``IcefloeTableParked``,
and ``/readyz``'s ``parked`` object (table → reason); the collector stays ready, since it
keeps committing every other table.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from icefloe.errors import FencedError, IcefloeError, TableFencedError, TransientStoreError

log = logging.getLogger("icefloe.collector")

RETRY_GROWTH_CAP = 10
"""A parked table's retry interval doubles up to this many times ``park_retry_s``."""


INJECTED = "icefloe_injected_crash"
"""Attribute set on an exception a crash-injection hook raised (:func:`crash_marking`)."""


def crash_marking(hook: Callable[[str], None]) -> Callable[[str], None]:
    """``hook`` (tests' and the simulator's crash injection) whose exceptions are marked:
    a crash stops the run at once, never counted against a table nor deferred."""
    def call(stage: str) -> None:
        try:
            hook(stage)
        except Exception as exc:
            setattr(exc, INJECTED, True)
            raise
    call.__wrapped__ = hook  # type: ignore[attr-defined]  # functools' convention
    return call


def is_shared_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure of what every table shares (the store, the catalog's
    connection, a fence), which stops the run instead of counting against one table. The
    causes count too: a commit that gave up wraps what made it fail."""
    shared: tuple[type[BaseException], ...] = (
        FencedError, TableFencedError, TransientStoreError, ConnectionError, TimeoutError)
    try:  # the SQL catalog's database unreachable or locked
        from sqlalchemy.exc import InterfaceError, OperationalError  # optional dep
        shared += (OperationalError, InterfaceError)
    except ImportError:  # pragma: no cover - sqlalchemy comes with the SQL catalog
        pass
    if getattr(exc, INJECTED, False):
        return True  # an injected crash: the process "dies" here
    seen: BaseException | None = exc
    for _ in range(8):  # a cause chain is short; never loop on a cycle
        if seen is None:
            return False
        if isinstance(seen, shared):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@dataclass
class TableFailures:
    """The tables of one run that failed on their own: the run goes on with the others
    (their commits are recorded by sequence, so the retry replays only what failed) and
    fails at its end with the first failure, so its entries are retried, not acked."""

    tables: dict[str, Exception] = field(default_factory=dict)

    @contextmanager
    def of(self, table: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            if is_shared_failure(exc):
                raise
            self.tables.setdefault(table, exc)

    def raise_first(self) -> None:
        for exc in self.tables.values():
            raise exc


@dataclass
class Parked:
    """One parked table: why, since when, and when its staged rows are retried next."""

    reason: str
    since: float
    next_retry: float
    interval: float
    retries: int = 0


@dataclass
class Bulkheads:
    """Failure counts and parked tables of one collector. Why a lock: a run commits its
    tables ``commit_workers`` at a time, so two tables may fail (and park) at once in
    different threads, while the HTTP threads read ``parked`` for ``/readyz``."""

    park_after: int
    retry_s: float
    max_bytes: int
    monotonic: Callable[[], float]
    on_change: Callable[[str, Parked | None], None] = lambda table, parked: None
    """Called when a table is parked (with its :class:`Parked`) or unparked (``None``)."""
    on_failure: Callable[[str, str], None] = lambda table, kind: None
    """Called with the table and the exception's kind at each failure of its own."""
    failures: dict[str, int] = field(default_factory=dict)
    parked: dict[str, Parked] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def is_parked(self, table: str) -> bool:
        return table in self.parked

    @contextmanager
    def guard(self, table: str) -> Iterator[None]:
        """Run one table's step: a failure of its own is counted (and may park it), then
        re-raised, so the run stops and is retried (parked, the table is staged then)."""
        try:
            yield
        except Exception as exc:
            if not is_shared_failure(exc):
                self.failed(table, exc)
            raise

    def failed(self, table: str, exc: BaseException) -> bool:
        """Count a failure of ``table``'s own; returns whether it is parked now."""
        with self._lock:
            return self._failed(table, exc)

    def _failed(self, table: str, exc: BaseException) -> bool:
        count = self.failures.get(table, 0) + 1
        self.failures[table] = count
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        self.on_failure(table, type(exc).__name__)
        if table in self.parked:
            return True
        if count < self.park_after:
            log.warning("table %s failed (%d of %d before it is parked): %s", table, count,
                        self.park_after, reason, extra={"table": table})
            return False
        now = self.monotonic()
        parked = Parked(reason=reason, since=now, next_retry=now + self.retry_s,
                        interval=self.retry_s)
        self.parked[table] = parked
        log.error("table %s parked after %d failed attempts: %s; its rows are staged until "
                  "it commits again (retried in %.0f s, and after a registry change)", table,
                  count, reason, self.retry_s, extra={"table": table, "reason": reason})
        self.on_change(table, parked)
        return True

    def park_now(self, table: str, exc: BaseException) -> None:
        """Park ``table`` at once: it cannot even be loaded (at start, or when a new sink
        needs it), so it is prepared — fenced, its offsets and dedup window read — only
        once its staged rows are retried."""
        with self._lock:
            self._park_now(table, exc)

    def _park_now(self, table: str, exc: BaseException) -> None:
        self.on_failure(table, type(exc).__name__)
        if table in self.parked:
            return
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        now = self.monotonic()
        self.parked[table] = parked = Parked(reason=reason, since=now,
                                             next_retry=now + self.retry_s,
                                             interval=self.retry_s)
        log.error("table %s parked: it cannot be loaded (%s); its rows are staged until it "
                  "can (retried in %.0f s, and after a registry change)", table, reason,
                  self.retry_s, extra={"table": table, "reason": reason})
        self.on_change(table, parked)

    def succeeded(self, table: str) -> None:
        """A step of ``table`` went through: its failures are forgotten."""
        with self._lock:
            self.failures.pop(table, None)

    def due(self, table: str) -> bool:
        """Whether a parked table's staged rows should be tried now."""
        parked = self.parked.get(table)
        return parked is not None and self.monotonic() >= parked.next_retry

    def retry_failed(self, table: str, exc: BaseException) -> None:
        """A parked table's import failed again: try later (doubling, capped)."""
        parked = self.parked[table]
        parked.retries += 1
        parked.reason = f"{type(exc).__name__}: {_first_line(exc)}"
        parked.interval = min(parked.interval * 2, self.retry_s * RETRY_GROWTH_CAP)
        parked.next_retry = self.monotonic() + parked.interval
        log.warning("parked table %s still fails (retry %d; next in %.0f s): %s", table,
                    parked.retries, parked.interval, parked.reason, extra={"table": table})

    def unpark(self, table: str) -> None:
        """``table``'s staged rows committed: it takes part in runs again."""
        with self._lock:
            if self.parked.pop(table, None) is not None:
                self.failures.pop(table, None)
                log.info("table %s unparked: its staged rows are committed", table,
                         extra={"table": table})
                self.on_change(table, None)

    def retry_all_now(self) -> None:
        """Try every parked table at the next chance (the registry changed: maybe a fix)."""
        now = self.monotonic()
        with self._lock:
            for parked in self.parked.values():
                parked.next_retry = now

    def reasons(self) -> dict[str, str]:
        """Table → why it is parked (for ``/readyz``)."""
        with self._lock:
            return {table: parked.reason for table, parked in sorted(self.parked.items())}


class ParkFullError(IcefloeError):
    """A parked table's staging area holds ``collector.park_max_bytes``: its rows are
    not staged any more, so the run fails (the other tables still commit) and its
    entries wait in the queue, as before bulkheads."""


class ImportRefusedError(IcefloeError):
    """Staged rows of a parked table cannot be committed as they are (their schema
    evolution refuses some): the table stays parked, the rows staged."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
