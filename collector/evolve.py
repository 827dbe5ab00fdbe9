"""Schema evolution from the data, table side: a run's undeclared fields become columns.

Why in the collector and before the data commit: ingestors have no table access, so they
only keep an evolving stream's undeclared fields (in
:data:`~icefloe.streams.evolution.EXTRA_FIELD`); the collector is the one process that sees
the table. Per run and table it reads the table's *current* schema (so a collector that took
over, or the same one after a crash, starts from what is committed), plans with the pure
rules of :mod:`icefloe.streams.evolution`, and commits the new or widened columns through the
shared :mod:`pipeline.iceberg.evolution` *before* the rows that need them. A crash between
the two is harmless: the re-run finds the columns and plans nothing. A schema commit that
loses a race (``commit.retry.num-retries=0``) is re-planned on the reloaded table. Events
the rules refuse become dead letters with the reason; the rest keep their new values as
Arrow columns of the table's types. A run's undeclared fields are read once
(:func:`_decode`): Arrow parses the table's flat evolved columns and names the other fields,
and only those reach Python objects, so the Python work of a run grows with what is new,
not with how many columns the data has already added.

A ``json`` column is a string in Iceberg; its field ``doc`` (:data:`JSON_DOC`) says it holds
JSON text, so a later run keeps taking any value there instead of only strings.

Quotas (:mod:`icefloe.streams.evolve_quota`): each new column is charged to the first
client of the run, in run order, that carries the field and has room; the ledger is a table
property committed with the columns. A field no client may add, or one past
``evolve_max_columns``, never costs its event the rest: the row lands, and those fields go
to the table's :data:`~icefloe.streams.evolution.OVERFLOW` json column (added with the
first such run), from which :func:`redrive_overflow` moves them into columns once a limit
allows it.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import NotNull
from pyiceberg.schema import Schema
from pyiceberg.types import IcebergType, ListType, NestedField, StructType

from icefloe.clock import SYSTEM, Clock
from icefloe.config import StreamConfig
from icefloe.errors import CatalogError, CommitConflictError
from icefloe.streams import evolve_quota
from icefloe.streams.evolution import (
    CLIENT_FIELD,
    EXTRA_FIELD,
    OVERFLOW,
    RESERVED,
    ColumnChange,
    EvolveLimits,
    RunPlan,
    overflow_part,
    parse_extras,
    plan_run,
)
from icefloe.streams.model import EvolveQuota
from icefloe.streams.typespec import TypeSpec, parse_type
from pipeline.iceberg import (
    ARROW_TYPES,
    AddColumn,
    PromoteColumn,
    apply_changes,
    describe,
    iceberg_errors,
    iceberg_type,
    replace_rows,
    shape,
)
from pipeline.load import AS_IS, DeadLetters, EntryFile, column_of

log = logging.getLogger("icefloe.evolve")

JSON_DOC = "icefloe: JSON text (added from the data)"
ADDED_DOC = "icefloe: added from the data"
DEAD_REASON = "schema_evolution"
_ATTEMPTS = 5
_AS_IS = AS_IS
_EMPTY: dict[str, object] = {}


def evolve_rows(catalog: Catalog, identifier: str, stream: StreamConfig, rows: pa.Table,
                locations: Mapping[int, str], limits: EvolveLimits, *,
                hook: Callable[[str], None] | None = None, clock: Clock = SYSTEM
                ) -> tuple[pa.Table, pa.Table | None]:
    """``rows`` of an evolving sink with its undeclared fields as table columns (the
    table's schema evolved first, committed), and the refused rows as dead letters (or None).

    ``locations`` maps a run position to its batch file (named in the dead letters).
    Fields with no room (over ``evolve_max_columns`` or their clients' quotas, read on
    ``clock``) go to the :data:`OVERFLOW` column, never to the dead letters with the row.
    """
    if EXTRA_FIELD not in rows.column_names:
        return rows, None
    texts = rows.column(EXTRA_FIELD).to_pylist()
    declared = {c.name for c in stream.columns} | RESERVED
    clients = _clients(rows, stream.name)
    quota = stream.evolve_quota or evolve_quota.DEFAULT_QUOTA
    plan, parsed, extras = _evolve_schema(catalog, identifier, declared, texts, limits, hook,
                                          _Quota(clients, quota, clock))
    keep = [i for i in range(rows.num_rows) if i not in plan.refused]
    dead = _dead_letters(rows, plan, texts, locations, stream.name) if plan.refused else None
    kept = rows.drop_columns([n for n in (EXTRA_FIELD, CLIENT_FIELD) if n in rows.column_names])
    if len(keep) < rows.num_rows:
        kept = kept.take(pa.array(keep, pa.int64()))
        if parsed.num_columns:
            parsed = parsed.take(pa.array(keep, pa.int64()))
    at = kept.column_names.index("_event_id")
    kept_extras = [extras[i] or _EMPTY for i in keep]
    for name, kind in plan.columns.items():
        if name in parsed.column_names:
            kept = kept.add_column(at, name, parsed.column(name))
            at += 1
            continue
        kept = kept.add_column(at, name, column_of(kept_extras, name, kind))
        at += 1
    if plan.overflow_column or _adds_overflow(plan):
        kept = kept.add_column(at, OVERFLOW, _overflow_texts(kept_extras, plan.over))
    return kept, dead


def _clients(rows: pa.Table, source: str) -> list[str]:
    """Each row's quota client (``<source>/<token name or ->``)."""
    sources = rows.column("_source").to_pylist() if "_source" in rows.column_names \
        else [source] * rows.num_rows
    tokens = rows.column(CLIENT_FIELD).to_pylist() if CLIENT_FIELD in rows.column_names \
        else [None] * rows.num_rows
    return [evolve_quota.client_key(s or source, t) for s, t in zip(sources, tokens,
                                                                     strict=True)]


class _Quota:
    """The quota side of one run's plan: who carries each new field, and the ledger the
    columns are charged to (re-read from the table on every planning attempt)."""

    def __init__(self, clients: list[str], quota: EvolveQuota,
                 clock: Clock) -> None:
        self.clients = clients
        self.quota = quota
        self.clock = clock

    def admit(self, extras: list[dict | None], properties: Mapping[str, str]
              ) -> tuple[Callable[[str], str | None], evolve_quota.Ledger]:
        """An ``admit`` for :func:`plan_run` over this run's ``extras``, and its ledger."""
        ledger = evolve_quota.load(properties.get(evolve_quota.PROPERTY), self.clock.time())
        carriers: dict[str, list[str]] = {}
        for extra, client in zip(extras, self.clients, strict=True):
            for name, value in (extra or _EMPTY).items():
                if value is not None:
                    who = carriers.setdefault(name, [])
                    if client not in who:
                        who.append(client)

        def admit(name: str) -> str | None:
            reasons = []
            for client in carriers.get(name, ()):
                why = ledger.over(client, self.quota)
                if why is None:
                    ledger.charge(client)
                    return None
                reasons.append(why)
            return f"field {name!r}: " + "; ".join(reasons or ["no client may add it"])

        return admit, ledger


def _adds_overflow(plan: RunPlan) -> bool:
    return any(c.action == "add" and c.name == OVERFLOW for c in plan.changes)


def _overflow_texts(extras: list[dict], over: frozenset[str]) -> pa.Array:
    """The :data:`OVERFLOW` cells of kept rows: their fields with no room, as JSON text."""
    parts = [overflow_part(e, over) for e in extras]
    return pa.array([None if p is None else msgspec.json.encode(p).decode() for p in parts],
                    pa.string())


def _evolve_schema(catalog: Catalog, identifier: str, declared: set[str],
                   texts: list[str | None], limits: EvolveLimits,
                   hook: Callable[[str], None] | None, quota: _Quota | None = None
                   ) -> tuple[RunPlan, pa.Table, list[dict | None]]:
    """Plan against the table's current schema (and quota ledger) and commit the changes;
    re-plan after a lost race. Returns the plan the table now matches and the run's fields
    as :func:`_decode` split them (columns already parsed, the rest per row)."""
    decoded: list[tuple[pa.Table, list[dict | None]]] = []

    def make_plan(columns: dict[str, str], fixed: set[str],
                  properties: Mapping[str, str]) -> RunPlan:
        evolved = {n: t for n, t in columns.items() if n not in fixed}
        decoded[:] = [_decode(texts, evolved)]
        extras = decoded[0][1]
        admit, ledger = quota.admit(extras, properties) if quota is not None else (None, None)
        plan = plan_run(extras, columns, fixed, limits, table=identifier, admit=admit,
                        overflow=True)
        plan.overflow_column = OVERFLOW in columns
        if ledger is not None and ledger.charged:
            plan.properties[evolve_quota.PROPERTY] = ledger.dump()
        if OVERFLOW not in columns and any(
                overflow_part(e, plan.over) for i, e in enumerate(extras)
                if i not in plan.refused):
            plan.changes.append(ColumnChange("add", OVERFLOW, "json"))
        return plan

    plan = commit_plan(catalog, identifier, declared, make_plan, hook)
    parsed, extras = decoded[0]
    return plan, parsed, extras


def commit_plan(catalog: Catalog, identifier: str, declared: set[str],
                make_plan: Callable[[dict[str, str], set[str], Mapping[str, str]], RunPlan],
                hook: Callable[[str], None] | None = None) -> RunPlan:
    """Plan against the table's current schema — ``make_plan(columns, fixed, properties)``,
    see :func:`table_columns` — and commit the plan's changes, with its
    :attr:`~icefloe.streams.evolution.RunPlan.properties` in the same metadata commit;
    re-plan after a lost race. Returns the plan the table now matches (runs, and the
    overflow redrive, evolve through this)."""
    for _ in range(_ATTEMPTS):
        try:
            table = catalog.load_table(identifier)
        except Exception as exc:  # catalog down: the collector retries the run
            raise CatalogError(f"cannot load table {identifier}: {exc}") from exc
        columns, fixed = table_columns(table.schema().fields, declared)
        plan = make_plan(columns, fixed, table.properties)
        if not plan.changes:
            return plan
        changes = [_change(c) for c in plan.changes]
        try:
            with iceberg_errors(CommitConflictError), table.transaction() as txn:
                apply_changes(txn, changes)
                if plan.properties:  # the quota ledger: charged with the columns, or not
                    txn.set_properties(plan.properties)
        except CommitConflictError:
            continue  # someone committed in between: re-read the schema and plan again
        for change in changes:
            log.info("table %s: %s (schema evolution from the data)", identifier,
                     describe(change))
        if hook is not None:
            hook(f"after_evolve:{identifier}")
        # The commit asserted the schema it planned against, so the plan holds as is.
        return plan
    raise CatalogError(f"schema evolution of {identifier} lost {_ATTEMPTS} races in a row; "
                       "the collector will retry the run")


def _decode(texts: list[str | None], evolved: Mapping[str, str]
            ) -> tuple[pa.Table, list[dict | None]]:
    """A run's undeclared fields, read once: the table's flat evolved columns (long,
    double, string, boolean) parsed columnar, and per row a dict of only the other
    fields (new ones, and evolved columns of other types), for the rules to check.

    When the columnar read fails (a value misfits its column, or a new field's shape
    varies between rows) nothing is taken columnar: every field of every row goes through
    the rules, which name the misfit. A run whose fields are all flat columns the table
    has builds no dicts at all."""
    read = _read_columnar(texts, {n: k for n, k in evolved.items() if k in _AS_IS})
    if read is None:
        return pa.table({}), parse_extras(texts)
    parsed, others = read
    if not others:
        return parsed, [None] * len(texts)
    return parsed, parse_extras(texts, only=others)


def _read_columnar(texts: list[str | None], flat: Mapping[str, str]
                   ) -> tuple[pa.Table, list[str]] | None:
    """``flat`` columns of every row, parsed by Arrow's strict JSON reader, and the names
    of the fields outside them (any row's); None if the reader refuses the run.

    Arrow's reader refuses a string in a number column, a fraction or an integer beyond
    the long range in a long column, a number in a boolean one, so a parse that succeeds
    is the rules' verdict on those columns, ~20 times cheaper than a look at each value.
    Fields outside ``flat`` are inferred only to learn their names (Arrow's inference
    would guess timestamps and turn big integers into doubles, so their values are taken
    from msgspec instead)."""
    schema = pa.schema([(name, ARROW_TYPES[kind]) for name, kind in flat.items()])
    ndjson = "\n".join(text or "{}" for text in texts).encode() + b"\n"
    try:
        parsed = pajson.read_json(
            io.BytesIO(ndjson),
            read_options=pajson.ReadOptions(use_threads=False,
                                            block_size=max(len(ndjson), 1 << 16)),
            parse_options=pajson.ParseOptions(explicit_schema=schema,
                                              unexpected_field_behavior="infer"))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    if parsed.num_rows != len(texts):
        return None
    others = [name for name in parsed.column_names if name not in flat]
    return parsed.select(schema.names).combine_chunks(), others


def table_columns(fields: tuple[NestedField, ...], declared: set[str]
                  ) -> tuple[dict[str, str], set[str]]:
    """(every column → icefloe type string, the names evolution must leave alone): the
    declared columns, icefloe's own, and columns of a type evolution does not produce."""
    columns: dict[str, str] = {}
    fixed = set(declared)
    for field in fields:
        kind = _type_string(field.field_type, field.doc)
        try:
            parse_type(kind)
        except ValueError:
            fixed.add(field.name)
        columns[field.name] = kind
    return columns, fixed


def _type_string(kind: IcebergType, doc: str | None) -> str:
    """An Iceberg type in icefloe's vocabulary, ``json`` where the doc says so."""
    if doc == JSON_DOC:
        return "json"
    if isinstance(kind, StructType):
        return "struct<" + ",".join(f"{f.name}:{_type_string(f.field_type, f.doc)}"
                                    for f in kind.fields) + ">"
    if isinstance(kind, ListType):
        return f"list<{_type_string(kind.element_type, None)}>"
    return shape(kind)


def _change(change: ColumnChange) -> AddColumn | PromoteColumn:
    if change.action == "widen":
        return PromoteColumn(change.name, iceberg_type(change.type))
    doc = JSON_DOC if change.type == "json" else ADDED_DOC
    return AddColumn(change.name, _iceberg(parse_type(change.type)), doc)


def _iceberg(spec: TypeSpec, ids: Iterator[int] | None = None) -> IcebergType:
    """:func:`pipeline.iceberg.tables.iceberg_type`, with :data:`JSON_DOC` on nested
    ``json`` fields, so a later run reads them back as ``json`` (ids are placeholders:
    adding the column assigns fresh ones)."""
    ids = ids if ids is not None else iter(range(10_000, 1_000_000))
    if spec.name == "list" and spec.element is not None:
        return ListType(next(ids), _iceberg(spec.element, ids), element_required=False)
    if spec.name == "struct":
        return StructType(*(NestedField(next(ids), name, _iceberg(kind, ids), required=False,
                                        doc=JSON_DOC if kind.name == "json" else None)
                            for name, kind in spec.fields))
    return iceberg_type(spec.name)


def _dead_letters(rows: pa.Table, plan: RunPlan, texts: list[str | None],
                  locations: Mapping[int, str], source: str) -> pa.Table:
    """The refused rows as dead letters: the reason, and the undeclared fields as ``raw``
    (the declared ones are in the row's other columns, already parsed)."""
    dead = DeadLetters()
    ids = rows.column("_event_id").to_pylist()
    positions = rows.column("_sequence").to_pylist()
    received = pc.divide(rows.column("_received_at").cast(pa.int64()), 1000).to_pylist()
    source_ids = rows.column("_source").to_pylist() if "_source" in rows.column_names \
        else [source] * rows.num_rows
    for index, reason in sorted(plan.refused.items()):
        position = positions[index]
        text = texts[index]
        dead.add(EntryFile(position, locations.get(position, ""), 0, 0), reason=DEAD_REASON,
                 message=reason, stream=source_ids[index], event_id=ids[index],
                 raw=text.encode() if text else None, received_at_ms=received[index])
    return dead.to_arrow()


# --------------------------------------------------------------------------- overflow redrive


@dataclass
class OverflowRedrive:
    """What :func:`redrive_overflow` did to one table (or, ``dry_run``, would do)."""

    table: str
    dry_run: bool = False
    rows: int = 0
    """Rows that held overflow fields."""
    added: list[str] = dc_field(default_factory=list)
    """Columns the redrive added."""
    moved: int = 0
    """Rows whose overflow fields all moved into columns."""
    left: int = 0
    """Rows that still hold overflow fields (no room yet, or a value that does not fit)."""

    def as_dict(self) -> dict[str, object]:
        return {"table": self.table, "dry_run": self.dry_run, "rows": self.rows,
                "added": self.added, "moved": self.moved, "left": self.left}


def redrive_overflow(catalog: Catalog, identifier: str, stream: StreamConfig,
                     limits: EvolveLimits, *, dry_run: bool = False,
                     hook: Callable[[str], None] | None = None) -> OverflowRedrive:
    """Move the fields kept in ``identifier``'s :data:`OVERFLOW` column into columns, now
    that a limit moved (``evolve_max_columns`` raised, a quota raised or its hour past).

    The same rules as a run (names, depth, types, ``evolve_max_columns``); the per-client
    quotas do not apply: the operator runs this on purpose. The columns are committed
    first (as a run does); then every row holding overflow is rewritten in one
    copy-on-write commit, one snapshot (rows whose ``_overflow`` is not null: replaced,
    with the fields moved and ``_overflow`` left with what still has no room, null
    when nothing). Retries are off: a commit that loses a race to the collector re-reads
    and starts again. Rerunning is harmless: a row whose overflow is gone is not read.
    """
    report = OverflowRedrive(identifier, dry_run)
    declared = {c.name for c in stream.columns} | RESERVED
    for _ in range(_ATTEMPTS):
        table = catalog.load_table(identifier)
        if OVERFLOW not in {f.name for f in table.schema().fields}:
            return report
        scanned = table.current_snapshot()
        rows = table.scan(row_filter=NotNull(OVERFLOW)).to_arrow()
        report.rows = rows.num_rows
        if not rows.num_rows:
            return report
        extras = parse_extras(rows.column(OVERFLOW).to_pylist())

        def make_plan(columns: dict[str, str], fixed: set[str], _: Mapping[str, str],
                      extras: list[dict | None] = extras) -> RunPlan:
            return plan_run(extras, columns, fixed, limits, table=identifier, overflow=True)

        if dry_run:
            columns, fixed = table_columns(table.schema().fields, declared)
            plan = make_plan(columns, fixed, {})
            report.added = [c.name for c in plan.changes if c.action == "add"]
            _count(report, extras, plan)
            return report
        plan = commit_plan(catalog, identifier, declared, make_plan, hook)
        report.added = report.added or [c.name for c in plan.changes if c.action == "add"]
        table = catalog.load_table(identifier)
        now = table.current_snapshot()
        if (now and now.snapshot_id) != (scanned and scanned.snapshot_id):
            continue  # a run committed since the scan: its rows must be read too
        rewritten = _moved(table.schema(), rows, extras, plan)
        try:
            with iceberg_errors(CommitConflictError), \
                    table.transaction() as txn:  # one snapshot: no version shows the middle
                replace_rows(txn, rewritten, NotNull(OVERFLOW), {"icefloe.redrive": "overflow"})
        except CommitConflictError:
            continue
        _count(report, extras, plan)
        log.info("table %s: moved overflow fields of %d rows into columns (%s added)",
                 identifier, report.moved, ", ".join(report.added) or "none")
        return report
    raise CatalogError(f"redrive of {identifier}'s overflow lost {_ATTEMPTS} races in a row; "
                       "it is safe to run again")


def _count(report: OverflowRedrive, extras: list[dict | None], plan: RunPlan) -> None:
    left = sum(1 for i, e in enumerate(extras)
               if i in plan.refused or overflow_part(e, plan.over))
    report.left = left
    report.moved = len(extras) - left


def _moved(iceberg_schema: Schema, rows: pa.Table, extras: list[dict | None], plan: RunPlan
           ) -> pa.Table:
    """``rows`` (scanned before the schema commit, no data committed since) in the table's
    current schema, with the overflow fields the plan takes moved into their columns."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow  # lazy: pandas

    schema = schema_to_pyarrow(iceberg_schema, include_field_ids=False)
    taken = [None if i in plan.refused else e for i, e in enumerate(extras)]
    out = []
    for column in schema:
        name = column.name
        old = rows.column(name) if name in rows.column_names \
            else pa.nulls(rows.num_rows, column.type)
        if name == OVERFLOW:
            cells = [e if e is None else (overflow_part(e, plan.over) if i not in plan.refused
                                          else e) for i, e in enumerate(extras)]
            old = pa.array([None if c is None else msgspec.json.encode(c).decode()
                            for c in cells], pa.string())
        elif name in plan.columns and any(e and name in e for e in taken):
            new = column_of([{name: e[name]} if e and name in e else None for e in taken],
                            name, plan.columns[name]).cast(column.type)
            old = pc.if_else(pc.is_valid(new), new, old.cast(column.type))
        out.append(old.cast(column.type) if old.type != column.type else old)
    return pa.Table.from_arrays(out, schema=schema)
