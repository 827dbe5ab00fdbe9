"""Dead-letter redrive: after a config fix, land dead-lettered rows in their tables, once.

Which rows can come back: ``payload_mismatch`` (the payload did not fit the table then) and
``unknown_stream`` (the stream was not configured then) keep the canonical JSON payload in
``raw``, so they are decoded again with today's stream config. ``bad_envelope`` and
``corrupt_batch`` rows hold no usable payload (the quarantined batch file is the way back
for those) and are reported as not redrivable.

Why exactly once without a cross-table transaction: each redriven row is appended to its
table with its original ``_event_id`` and ``_sequence``, and only then recorded in the
``icefloe.redriven`` ledger (keyed by the dead letter's ``location`` and ``record_index``).
A redrive first drops dead letters already in the ledger, then checks the target table for
rows with the same ``(_event_id, _sequence)`` — those were appended by a redrive that
crashed before writing the ledger, so they are only recorded, never appended again. Both
appends are plain Iceberg commits with retries off; a conflict (the collector committed
meanwhile) reloads the table and checks again. A redrive commit carries no
``icefloe.sequence``: the collector's commit protocol reads its offset from the newest
snapshot that has one, so redrives never move it.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, In
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from icefloe.config import Config
from icefloe.errors import CommitConflictError, IcefloeError
from pipeline.columns import DEAD_LETTER_TABLE, table_arrow_schema
from pipeline.iceberg.data_files import delete_files
from pipeline.iceberg.errors import iceberg_errors, load_table_or_none
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.tables import TABLE_PROPERTIES, ensure_stream_table
from pipeline.load.decode import decode_payload_rows
from pipeline.load.mapped import add_derived
from pipeline.load.spec import StreamPlan, TypedPlan, stream_specs

log = logging.getLogger("icefloe.redrive")

LEDGER_TABLE = "icefloe.redriven"
REDRIVABLE = ("payload_mismatch", "unknown_stream")
_ATTEMPTS = 5
_LEDGER_SCHEMA = Schema(
    NestedField(1, "location", StringType(), required=False),
    NestedField(2, "record_index", LongType(), required=False),
    NestedField(3, "event_id", StringType(), required=False),
    NestedField(4, "stream", StringType(), required=False),
    NestedField(5, "target", StringType(), required=False),
    NestedField(6, "redrive_id", StringType(), required=False),
    NestedField(7, "redriven_at", TimestamptzType(), required=False),
)


@dataclass(frozen=True)
class Filters:
    stream: str | None = None
    reason: str | None = None
    since: dt.datetime | None = None


@dataclass
class RedriveReport:
    """What a redrive did (or, with ``dry_run``, would do)."""

    redrive_id: str
    dry_run: bool
    selected: int = 0  # dead letters matching the filters, not yet redriven
    landed: Counter[str] = field(default_factory=Counter)  # table -> rows appended
    recovered: Counter[str] = field(default_factory=Counter)  # found already appended
    still_bad: Counter[str] = field(default_factory=Counter)  # stream -> rows that still fail
    not_redrivable: Counter[str] = field(default_factory=Counter)  # reason -> rows
    unknown_stream: Counter[str] = field(default_factory=Counter)  # still not configured
    samples: list[dict[str, Any]] = field(default_factory=list)  # a few still-bad rows

    def as_dict(self) -> dict[str, Any]:
        return {"redrive_id": self.redrive_id, "dry_run": self.dry_run,
                "selected": self.selected, "landed": dict(self.landed),
                "recovered": dict(self.recovered), "still_bad": dict(self.still_bad),
                "not_redrivable": dict(self.not_redrivable),
                "unknown_stream": dict(self.unknown_stream), "samples": self.samples}


def read_dead_letters(catalog: Catalog, filters: Filters) -> pa.Table:
    """The dead letters matching ``filters`` (all of them, redriven or not)."""
    table = load_table_or_none(catalog, DEAD_LETTER_TABLE)
    if table is None:
        return pa.table({})
    expression: Any = None
    for part in (
        EqualTo("stream", filters.stream) if filters.stream else None,
        EqualTo("reason", filters.reason) if filters.reason else None,
        GreaterThanOrEqual("received_at", filters.since.isoformat()) if filters.since
        else None,
    ):
        if part is not None:
            expression = part if expression is None else And(expression, part)
    scan = table.scan(row_filter=expression) if expression is not None else table.scan()
    return scan.to_arrow()


def redriven_keys(catalog: Catalog) -> set[tuple[str, int]]:
    """``(location, record_index)`` of every dead letter already redriven."""
    table = load_table_or_none(catalog, LEDGER_TABLE)
    if table is None:
        return set()
    ledger = table.scan(selected_fields=("location", "record_index")).to_arrow()
    return set(zip(ledger.column("location").to_pylist(),
                   ledger.column("record_index").to_pylist(), strict=True))


def pending(catalog: Catalog, filters: Filters) -> pa.Table:
    """Dead letters matching ``filters`` that no redrive has landed yet."""
    rows = read_dead_letters(catalog, filters)
    if not rows.num_rows:
        return rows
    done = redriven_keys(catalog)
    keep = [(loc, idx) not in done for loc, idx in zip(
        rows.column("location").to_pylist(), rows.column("record_index").to_pylist(),
        strict=True)]
    return rows.filter(pa.array(keep, pa.bool_()))


def redrive(config: Config, catalog: Catalog, filters: Filters, *,
            dry_run: bool = False) -> RedriveReport:
    """Decode pending dead letters with today's config and land the ones that fit."""
    report = RedriveReport(uuid.uuid4().hex[:12], dry_run)
    rows = pending(catalog, filters)
    report.selected = rows.num_rows
    if not rows.num_rows:
        return report
    for reason, count in Counter(rows.column("reason").to_pylist()).items():
        if reason not in REDRIVABLE:
            report.not_redrivable[reason] += count
    rows = rows.filter(pc.is_in(rows.column("reason"), pa.array(REDRIVABLE)))
    for stream_name in sorted(set(rows.column("stream").to_pylist())):
        mine = rows.filter(pc.equal(rows.column("stream"), stream_name))
        stream = config.stream(stream_name)
        if stream is None:
            report.unknown_stream[stream_name] += mine.num_rows
            continue
        if stream.format != "json":  # binary dead letters: a redrive would need their
            # writer schema ids, which the dead-letter table does not keep yet
            report.not_redrivable["typed_stream"] += mine.num_rows
            continue
        if stream.primary_key:  # an append beside the key's current row would duplicate
            # it, and a late row is not "the latest": redrive into upsert tables is not done
            report.not_redrivable["primary_key_table"] += mine.num_rows
            continue
        _redrive_stream(config, catalog, stream, mine, report)
    return report


def _redrive_stream(config: Config, catalog: Catalog, stream: Any, dead: pa.Table,
                    report: RedriveReport) -> None:
    received_ms = dead.column("received_at").cast(pa.timestamp("ms", tz="UTC")) \
        .cast(pa.int64()).to_pylist()
    plan = stream_specs([stream])[0].plan()
    assert not isinstance(plan, TypedPlan), "typed streams are not redriven (see above)"
    decoded, bad = decode_payload_rows(
        [r or b"" for r in dead.column("raw").to_pylist()],
        dead.column("event_id").to_pylist(), received_ms,
        dead.column("sequence").to_pylist(),
        plan.payload if isinstance(plan, StreamPlan) else plan)
    if isinstance(plan, StreamPlan):
        decoded = _with_derived(decoded, plan)
    report.still_bad[stream.name] += len(bad)
    for index, reason in bad[:5]:
        report.samples.append({"stream": stream.name,
                               "event_id": dead.column("event_id")[index].as_py(),
                               "reason": reason})
    if report.dry_run:
        report.landed[stream.table] += decoded.num_rows
        return
    if not decoded.num_rows:
        return
    ensure_stream_table(catalog, stream)  # created or evolved to today's columns
    target = table_arrow_schema(stream)
    failed = {index for index, _ in bad}
    shards = [shard for index, shard in enumerate(_shards(dead)) if index not in failed]
    rows = decoded.select(target.names).cast(target)
    rows = rows.add_column(rows.column_names.index("_sequence") + 1, "_shard",
                           pa.array(shards, pa.int32()))
    appended, recovered = _append_missing(catalog, stream.table, rows)
    report.landed[stream.table] += appended
    report.recovered[stream.table] += recovered
    _record(catalog, dead.filter(pa.array([i not in failed for i in range(dead.num_rows)])),
            stream, report.redrive_id)


def _shards(dead: pa.Table) -> list[int]:
    """The manifest shard of each dead letter (null or no column: written before shards,
    so shard 0): a redriven row keeps its ``(_shard, _sequence)``."""
    if "shard" not in dead.column_names:
        return [0] * dead.num_rows
    return [s or 0 for s in dead.column("shard").to_pylist()]


def _with_derived(decoded: pa.Table, plan: StreamPlan) -> pa.Table:
    """Mapped columns of redriven rows: ``id`` and ``datetime`` come back from the dead
    letter; ``ip`` and header values were not kept with it, ``sql`` columns need Spark,
    and a ``template`` needs both the request data and its registry version's Jsonnet, so
    those are null (a template column's payload field holds the event's JSON text, the
    template's input: never stored as its value)."""
    meta = ["_event_id", "_received_at", "_sequence"]
    received = decoded.column("_received_at").cast(pa.timestamp("ms", tz="UTC")) \
        .cast(pa.int64()).to_numpy(zero_copy_only=False)
    full = add_derived(decoded.drop_columns(meta), plan,
                       decoded.column("_event_id").combine_chunks(), received, None)
    for d in plan.derived:
        if d.kind == "template":
            position = full.column_names.index(d.column)
            full = full.set_column(position, full.schema.field(position),
                                   pa.nulls(full.num_rows, full.schema.field(position).type))
    return pa.Table.from_arrays(full.columns + [decoded.column(name) for name in meta],
                                names=full.column_names + meta)


def _append_missing(catalog: Catalog, identifier: str, rows: pa.Table) -> tuple[int, int]:
    """Append the rows the table does not hold yet (by ``_event_id``, ``_shard`` and
    ``_sequence``; a null ``_shard`` is shard 0); (appended, already there)."""
    for attempt in range(1, _ATTEMPTS + 1):
        table = catalog.load_table(identifier)
        ids = rows.column("_event_id").to_pylist()
        present = table.scan(row_filter=In("_event_id", set(ids)),
                             selected_fields=("_event_id", "_sequence", "_shard")).to_arrow()
        there = set(zip(present.column("_event_id").to_pylist(),
                        [s or 0 for s in present.column("_shard").to_pylist()],
                        present.column("_sequence").to_pylist(), strict=True))
        keep = [key not in there for key in zip(
            ids, rows.column("_shard").to_pylist(), rows.column("_sequence").to_pylist(),
            strict=True)]
        fresh = rows.filter(pa.array(keep, pa.bool_()))
        if not fresh.num_rows:
            return 0, rows.num_rows
        # icefloe's own writer (as the collector's appends: no uuid statistics unless the
        # table asks for them, see pipeline.iceberg.data_files.uuid_statistics)
        add = WriteThenAdd(identifier)
        try:
            with iceberg_errors(CommitConflictError):
                add(table, fresh, {"icefloe.redrive": "true"})
            return fresh.num_rows, rows.num_rows - fresh.num_rows
        except CommitConflictError as exc:  # the collector committed meanwhile: re-check
            for attempt_files in add.attempts:  # refused: certainly not in the table
                delete_files(table.io, attempt_files.files.paths)
            log.warning("redrive into %s conflicted (attempt %d): %s", identifier, attempt,
                        exc)
            time.sleep(0.2 * attempt)
    raise IcefloeError(f"redrive into {identifier}: {_ATTEMPTS} commits conflicted; the "
                       "rows are safe to redrive again")


def _ledger(catalog: Catalog) -> Any:
    table = load_table_or_none(catalog, LEDGER_TABLE)
    if table is None:
        return catalog.create_table(LEDGER_TABLE, _LEDGER_SCHEMA, properties=TABLE_PROPERTIES)
    return table


def _record(catalog: Catalog, dead: pa.Table, stream: Any, redrive_id: str) -> None:
    """Write the ledger rows for ``dead`` (after their rows landed)."""
    now = dt.datetime.now(dt.UTC)
    n = dead.num_rows
    entries = pa.table({
        "location": dead.column("location"), "record_index": dead.column("record_index"),
        "event_id": dead.column("event_id"),
        "stream": pa.array([stream.name] * n, pa.string()),
        "target": pa.array([stream.table] * n, pa.string()),
        "redrive_id": pa.array([redrive_id] * n, pa.string()),
        "redriven_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
    })
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            with iceberg_errors(CommitConflictError):
                _ledger(catalog).append(entries)
            return
        except CommitConflictError:
            time.sleep(0.2 * attempt)
    raise IcefloeError("could not record the redrive in icefloe.redriven; the rows landed "
                       "and a second redrive will only record them")
