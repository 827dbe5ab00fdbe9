"""Slow admin operations as tasks: the table first, then the registry change.

Why this order: a sink must never exist in the registry without its Iceberg table, and a
column change the table cannot take (an incompatible type) must fail without touching the
registry. So a task creates or evolves the table (in a worker thread: a catalog round trip
can take seconds on S3; a table template's tables are the collector's to make, on first
use) and only then applies the registry change by compare-and-swap —
re-running that change's checks against the newest registry. ``GET /v1/tasks/{id}``
reports its state, progress, result or error.

Tasks live in the admin process's memory (the last ``MAX_TASKS``): a restart forgets them,
but never half-applies one — the registry change is the last, atomic step, and creating a
table that exists already is a no-op, so the client can simply retry.

A task whose registry change is refused at that last step (a racing change declared a
column differently: ``column_conflict``) drops the tables it created itself, if they hold
no rows and no live sink names them: an orphan would be fenced by every collector start.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ulid import ULID

from icefloe.clock import SYSTEM, Clock
from icefloe.config import StreamConfig
from icefloe.errors import IcefloeError, RegistryError
from icefloe.streams.dynamic_tables import is_template

log = logging.getLogger("icefloe.admin")

MAX_TASKS = 1000
TableMaker = Callable[[StreamConfig], bool | None]
"""Creates or evolves one sink's table (``pipeline.iceberg.tables.ensure_stream_table``);
True when this call created it."""
TableDropper = Callable[[str], bool]
"""Drops a table if it holds no rows (``pipeline.iceberg.tables.drop_if_empty``); True if
dropped."""


async def _unowned(table: str) -> bool:
    return True


@dataclass
class Task:
    id: str
    kind: str
    target: str
    state: str = "pending"  # pending | running | succeeded | failed
    progress: str = "queued"
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created_at: float = 0.0
    finished_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "target": self.target, "state": self.state,
                "progress": self.progress, "result": self.result, "error": self.error,
                "created_at": self.created_at, "finished_at": self.finished_at}


class Tasks:
    """Runs and remembers tasks; one instance per admin process (one event loop)."""

    def __init__(self, make_table: TableMaker, *, drop_table: TableDropper | None = None,
                 clock: Clock = SYSTEM) -> None:
        self.make_table = make_table
        self.drop_table = drop_table
        self.clock = clock
        """Stamps the tasks' ``created_at``/``finished_at``."""
        self.on_finish: Callable[[Task], None] = lambda task: None
        self.unowned: Callable[[str], Awaitable[bool]] = _unowned
        """Whether no live sink of the current registry writes a table (the admin API
        sets it): a failed task never drops a table another change has claimed since."""
        self._tasks: OrderedDict[str, Task] = OrderedDict()
        self._running: set[asyncio.Task[None]] = set()

    def get(self, task_id: str) -> Task | None:
        return self._tasks.get(task_id)

    def remember(self, task: Task) -> None:
        """Keep a task finished at once (a change that needed no table), so that its id
        can be looked up like the others'."""
        self._tasks[task.id] = task
        while len(self._tasks) > MAX_TASKS:
            self._tasks.popitem(last=False)

    def start(self, kind: str, target: str, tables: list[StreamConfig],
              commit: Callable[[], Awaitable[dict[str, Any]]]) -> Task:
        """Make ``tables`` ready, then ``commit`` (the registry change); returns at once."""
        task = Task(str(ULID()), kind, target, created_at=self.clock.time())
        self._tasks[task.id] = task
        while len(self._tasks) > MAX_TASKS:
            self._tasks.popitem(last=False)
        job = asyncio.create_task(self._run(task, tables, commit), name=f"task-{task.id}")
        self._running.add(job)
        job.add_done_callback(self._running.discard)
        return task

    async def _run(self, task: Task, tables: list[StreamConfig],
                   commit: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        """Make the tables, then the registry change. A failed task shows ``failed`` only
        once the tables it created are dropped again (a client that sees the end sees the
        catalog as it stays)."""
        task.state = "running"
        created: list[str] = []
        outcome = ("succeeded", "done")
        try:
            for i, stream in enumerate(tables, 1):
                task.progress = f"table {i}/{len(tables)}: {stream.table}"
                if is_template(stream.table):  # its tables: made by the collector on
                    continue  # first use, each with the sink's columns and layout
                if await asyncio.to_thread(self.make_table, stream):
                    created.append(stream.table)
            task.progress = "updating the registry"
            task.result = await commit()
        except RegistryError as exc:
            outcome = ("failed", "refused")
            task.error = {"error": exc.code, "message": str(exc), "details": exc.details}
        except IcefloeError as exc:
            outcome = ("failed", "refused")
            task.error = {"error": "table", "message": str(exc).splitlines()[0],
                          "details": []}
        except Exception as exc:  # the catalog or store failed: retrying the call is safe
            outcome = ("failed", "error")
            task.error = {"error": "internal",
                          "message": f"{type(exc).__name__}: {str(exc).strip()[:300]}; "
                                     "nothing was changed in the registry, retry the call",
                          "details": []}
            log.warning("task %s (%s %s) failed: %s", task.id, task.kind, task.target, exc)
        finally:
            if outcome[0] == "failed" and created:
                task.progress = "dropping the tables this task created"
                await self._drop_created(task, created)
            task.finished_at = self.clock.time()
            task.state, task.progress = outcome
            self.on_finish(task)
        log.info("task %s %s %s: %s", task.id, task.kind, task.target, task.state,
                 extra={"task": task.id, "state": task.state})

    async def _drop_created(self, task: Task, created: list[str]) -> None:
        """Undo the tables this failed task created (empty, unclaimed ones); the task's
        error says which went and which stayed."""
        dropped: list[str] = []
        for table in created:
            try:
                if self.drop_table is not None and await self.unowned(table) and \
                        await asyncio.to_thread(self.drop_table, table):
                    dropped.append(table)
            except Exception as exc:  # the refusal stands; the table stays (and says so)
                log.warning("task %s: cannot drop table %s it created: %s", task.id, table,
                            exc)
        if task.error is not None:
            task.error["dropped_tables"] = dropped
            kept = [t for t in created if t not in dropped]
            if dropped:
                task.error["message"] += f" (table{'s' if len(dropped) > 1 else ''} " \
                    f"{', '.join(dropped)}, created by this task, dropped again)"
            if kept:
                task.error["message"] += f" (table{'s' if len(kept) > 1 else ''} " \
                    f"{', '.join(kept)}, created by this task, kept: it holds rows or a " \
                    "sink writes it)"

    async def wait_all(self) -> None:
        """Let running tasks finish (a clean shutdown, and tests)."""
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
