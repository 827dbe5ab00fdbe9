"""What a model run records in its target's snapshot summary, and reading it back.

Why the snapshot summary: the run's bookkeeping (which source snapshots it read, how far
into each source's ``_sequence`` it got) is committed in the same atomic catalog operation
as the rows it describes. A crash before the commit leaves the previous state in place, so
the rerun recomputes exactly the uncommitted part: nothing is counted twice or lost.

Watermarks are ``_sequence`` values (manifest sequences, monotonic per table), never
snapshot ids: compaction rewrites snapshots and expiry removes them. Source snapshot ids are
recorded only for change detection ("same inputs, same SQL: nothing to do").

The same summary describes the commit for people and other tools (DuckLake records the
like): the model's kind, the sha256 of its normalized SQL, its column definitions
(``["name:type", ...]`` as the table stores them after this commit), the rows written, how
long computing and auditing took, and the run id every model of one ``models run`` (or one
collector model pass) shares. ``select`` (output column → its expression) is what the next
run compares its SQL with to tell a renamed column from a dropped one plus an added one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.table import Table

PREFIX = "icefloe.model."
NAME = PREFIX + "name"
SQL_HASH = PREFIX + "sql-hash"
ROWS = PREFIX + "rows"
RUN_ID = PREFIX + "run-id"
SOURCES = PREFIX + "sources"  # JSON {identifier: snapshot id or null}
WATERMARKS = PREFIX + "watermarks"  # JSON {identifier: max _sequence processed}
KIND = PREFIX + "kind"  # view | table | append | merge (only stored kinds commit)
SQL_SHA256 = PREFIX + "sql-sha256"  # sha256 hex of the normalized SQL
COLUMNS = PREFIX + "columns"  # compact JSON ["name:type", ...] after this commit
DURATION_MS = PREFIX + "duration-ms"  # compute + audits, up to the commit
SELECT = PREFIX + "select"  # compact JSON {output column: expression as Spark SQL}
REDRIVE = "icefloe.redrive"  # "true": pipeline.redrive; "overflow": collector.evolve


@dataclass(frozen=True)
class RunState:
    """One committed model run, as its snapshot summary describes it."""

    name: str
    sql_hash: str
    rows: int
    run_id: str
    sources: dict[str, int | None] = field(default_factory=dict)
    watermarks: dict[str, int] = field(default_factory=dict)
    snapshot_id: int | None = None
    timestamp_ms: int | None = None
    kind: str = ""
    sql_sha256: str = ""
    duration_ms: int | None = None
    select: dict[str, str] = field(default_factory=dict)
    columns: tuple[str, ...] = ()  # written by pipeline.models.write, from the table

    def properties(self) -> dict[str, str]:
        """The snapshot summary properties that record this run (the writer adds
        :data:`COLUMNS`, known only once the table's schema is settled)."""
        props = {NAME: self.name, SQL_HASH: self.sql_hash, ROWS: str(self.rows),
                 RUN_ID: self.run_id, SOURCES: json.dumps(self.sources, sort_keys=True),
                 WATERMARKS: json.dumps(self.watermarks, sort_keys=True),
                 KIND: self.kind, SQL_SHA256: self.sql_sha256,
                 SELECT: compact_json(self.select)}
        if self.duration_ms is not None:
            props[DURATION_MS] = str(self.duration_ms)
        return props


def compact_json(value: object) -> str:
    """JSON without spaces (summary values are stored on every snapshot)."""
    return json.dumps(value, separators=(",", ":"))


def last_run(table: Table) -> RunState | None:
    """The newest snapshot that records a model run (walking past foreign commits, such
    as a compaction by another tool); None if the table never had one."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        state = last_run_properties(props, snapshot.snapshot_id, snapshot.timestamp_ms)
        if state is not None:
            return state
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return None


def last_run_properties(props: dict[str, str], snapshot_id: int | None = None,
                        timestamp_ms: int | None = None) -> RunState | None:
    """The run one snapshot summary records (None: not a model commit)."""
    if NAME not in props:
        return None
    return RunState(name=props[NAME], sql_hash=props.get(SQL_HASH, ""),
                    rows=int(props.get(ROWS, 0)), run_id=props.get(RUN_ID, ""),
                    sources=json.loads(props.get(SOURCES, "{}")),
                    watermarks=json.loads(props.get(WATERMARKS, "{}")),
                    snapshot_id=snapshot_id, timestamp_ms=timestamp_ms,
                    kind=props.get(KIND, ""), sql_sha256=props.get(SQL_SHA256, ""),
                    duration_ms=_int(props.get(DURATION_MS)),
                    select=json.loads(props.get(SELECT, "{}")),
                    columns=tuple(json.loads(props.get(COLUMNS, "[]"))))


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def redriven_since(table: Table, snapshot_id: int | None) -> bool:
    """Whether a redrive committed to ``table`` after ``snapshot_id``: a dead-letter
    redrive (``icefloe.redrive = "true"``), an overflow redrive (``"overflow"``,
    :func:`collector.evolve.redrive_overflow`) or any other value a redrive sets.

    Why it matters: a redrive writes rows with their *original* ``_sequence``, below any
    watermark taken since (a dead-letter redrive appends them, an overflow redrive rewrites
    rows with their fields moved into columns), so an incremental model would never see
    them. The walk stops at ``snapshot_id`` or where expiry cut the log (then only the
    walked part is known).
    """
    snapshot = table.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != snapshot_id:
        props = snapshot.summary.additional_properties if snapshot.summary else {}
        if props.get(REDRIVE, "false").lower() not in ("", "false"):
            return True
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return False
