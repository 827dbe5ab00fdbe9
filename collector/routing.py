"""Which table each decoded row goes to: the registry's sinks, by the version each manifest
entry was accepted under.

Why by entry version and not by the registry of the moment: routing must be a pure function
of what is in the queue, or a replay after a crash could send the same events elsewhere. An
entry accepted at version V goes to exactly the sinks live and enabled at V — so a sink
created at version N gets every event accepted at N or later and none before, a disabled
sink misses what was accepted while it was off, and a deleted source's queued events still
reach its sinks (its tombstone keeps them).

Config-only mode (no registry object) is the same code over
:func:`icefloe.registry.streams.config_registry`: version 0, one sink per stream.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collector.dedup import with_source
from collector.where import WHERE_ERROR
from icefloe.config import Column, Config, StreamConfig
from icefloe.manifest.model import Entry
from icefloe.registry.model import Expression, Registry, Sink, Source
from icefloe.registry.streams import routing_streams
from icefloe.streams.dynamic_tables import is_template
from icefloe.streams.evolution import CLIENT_FIELD, EXTRA_FIELD
from icefloe.streams.mappings import sql_expression, sql_references
from pipeline.iceberg import ARROW_TYPES, DEAD_LETTER_TABLE
from pipeline.load import (
    SqlCase,
    TemplateCase,
    WhereCase,
    WhereSpec,
    judge,
    sequence_ranges,
    where_error_messages,
)

ENVELOPE_COLUMNS = ("_event_id", "_received_at", "_sequence")

log = logging.getLogger("icefloe.collector")


@dataclass(frozen=True)
class Target:
    """One sink of one source record: where some of that source's rows land."""

    source: Source
    sink: Sink

    @property
    def table(self) -> str:
        return self.sink.table

    @property
    def stream(self) -> StreamConfig:
        """The sink as a stream: its table's columns (created and evolved from this), and
        its source's payload format (a Protobuf table keeps columns by field number)."""
        stream = self.sink.stream(self.source.id)
        if self.source.format == "json":
            return stream
        return msgspec.structs.replace(stream, format=_typed(self.source.format),
                                       schema=self.source.schema)

    def receives_at(self, version: int) -> bool:
        record = self.source
        if version < record.created_version:
            return False
        if record.deleted_version is not None and version >= record.deleted_version:
            return False
        return self.sink.receives_at(version)


class Routes:
    """The routing view of one registry version."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.version = registry.version
        self.decode_streams = [with_extra(s) for s in routing_streams(registry)]
        self.decoded = {s.name: frozenset(c.name for c in s.columns)
                        for s in self.decode_streams}
        """Per source: the columns the decode holds (what a ``sql`` mapping can read)."""
        self._warned: set[tuple[str, str, str, int]] = set()
        self.targets: dict[str, list[Target]] = {}
        for source in registry.sources:
            for sink in source.sinks:
                self.targets.setdefault(source.id, []).append(Target(source, sink))
        self.dynamic: dict[str, StreamConfig] = {}
        """Tables of table templates this collector has met, with their streams
        (:mod:`collector.dynamic`): tables like any other from then on."""

    def tables(self) -> dict[str, StreamConfig]:
        """Every table a target writes, with its stream (the live sink's, if any); a table
        template's tables as far as met (:attr:`dynamic`), never the template itself."""
        every = [t for targets in self.targets.values() for t in targets]
        out: dict[str, StreamConfig] = dict(self.dynamic)
        for target in sorted(every, key=lambda t: (t.sink.live and t.source.live,
                                                   t.sink.updated_version)):
            if not is_template(target.table):
                out[target.table] = target.stream  # live and newest last: they win
        return out

    def live_tables(self) -> list[str]:
        """The tables the collector maintains (compacts, expires, sweeps): every live
        sink's table, every table of a template met so far, and last the dead letters,
        which the collector commits to like a stream table (a snapshot per run with dead
        letters, carrying ``icefloe.sequence``) and maintains the same way."""
        tables = {t.table for ts in self.targets.values() for t in ts
                  if t.sink.live and t.source.live and not is_template(t.table)}
        return [*sorted((tables | set(self.dynamic)) - {DEAD_LETTER_TABLE}), DEAD_LETTER_TABLE]

    def decode_config(self, config: Config) -> Config:
        return msgspec.structs.replace(config, streams=tuple(self.decode_streams))

    def split(self, source: str, rows: pa.Table, versions: Mapping[int, int]
              ) -> list[tuple[Target, pa.Table]]:
        """``rows`` of ``source`` (with ``_sequence``) cut per target; ``versions`` maps
        each entry's sequence to the registry version it was accepted under."""
        return self.route(source, rows, versions)[0]

    def route(self, source: str, rows: pa.Table, versions: Mapping[int, int]
              ) -> tuple[list[tuple[Target, pa.Table]], pa.Table | None]:
        """:meth:`split`, and the rows no target's ``where`` took although some target
        received their entry's version (None when there are none): the unrouted events.

        Each target takes the rows of the entries it receives whose predicate — the
        ``where`` of *that entry's* version (:meth:`Sink.where_at`) — is TRUE; NULL and
        FALSE are not taken. A pure function of the rows and their versions, so a replay
        routes the same way."""
        routed, unrouted, _ = self.route_all(source, rows, versions)
        return routed, unrouted

    def route_all(self, source: str, rows: pa.Table, versions: Mapping[int, int]
                  ) -> tuple[list[tuple[Target, pa.Table]], pa.Table | None,
                             pa.Table | None]:
        """:meth:`route`, and the rows on which a target's ``where`` raised an error
        (integer overflow, division by zero: :func:`pipeline.where.judge`), with the
        first such error per row in :data:`WHERE_ERROR` (None when there are none). Such
        a row is not taken by that target and is not unrouted: it is a mapping error."""
        out: list[tuple[Target, pa.Table]] = []
        sequences = rows.column("_sequence")
        receivable: pa.Array | None = None  # rows some target receives, by version
        taken: pa.Array | None = None  # rows some target takes
        errors: pa.Array | None = None  # per row, the first where error
        filtered = False
        for target in self.targets.get(source, []):
            allowed = [s for s, v in versions.items() if target.receives_at(v)]
            if not allowed:
                continue
            mask = None if len(allowed) == len(versions) else pc.is_in(
                sequences, pa.array(allowed, pa.int64()))
            receivable = _union(receivable, mask, rows.num_rows)
            chosen, failed = where_verdict(target, rows, {s: versions[s] for s in allowed})
            errors = errors if failed is None else failed if errors is None else \
                pc.coalesce(errors, failed)
            filtered = filtered or chosen is not None
            mask = chosen if mask is None else mask if chosen is None else pc.and_(mask,
                                                                                   chosen)
            taken = _union(taken, mask, rows.num_rows)
            part = rows if mask is None else rows.filter(mask)
            out.append((target, project(part, target)))
        failed_rows = None
        if errors is not None:
            failed_rows = rows.filter(pc.is_valid(errors)).append_column(
                WHERE_ERROR, errors.filter(pc.is_valid(errors)))
        if not filtered or receivable is None or taken is None:
            return out, None, failed_rows
        left = pc.and_(pc.invert(taken), receivable)
        if errors is not None:
            left = pc.and_(left, pc.is_null(errors))
        unrouted = rows.filter(left)
        return out, unrouted if unrouted.num_rows else None, failed_rows

    def unrouted_mode(self, source: str, version: int) -> str:
        """``drop`` or ``dead_letter``: the ``unrouted`` of the source record that took
        events at ``version``."""
        for target in self.targets.get(source, []):
            record = target.source
            if record.created_version <= version and (
                    record.deleted_version is None or version < record.deleted_version):
                return record.unrouted_at(version)
        return "drop"

    def per_table(self, tables: Mapping[str, pa.Table],
                  versions: Mapping[str, Mapping[int, int]]
                  ) -> dict[str, tuple[Target, pa.Table]]:
        """Each table's rows of a run, whichever sink records route them there.

        Why per table and not per sink: a table can be written by a deleted sink and, later,
        by a new one (a sink renamed, a source re-created) while a run still holds entries
        of both versions. Committing them separately would record the run's sequence with
        the first commit and drop the second's rows as a replay; one commit per table per
        run keeps "the table's sequence covers exactly what it holds". The target returned
        is the one whose conditions apply (the live sink, if any). Rows carry their source
        in a ``_source`` column (dedup is keyed by it; dropped before the commit)."""
        return self.route_run(tables, versions)[0]

    def route_run(self, tables: Mapping[str, pa.Table],
                  versions: Mapping[str, Mapping[int, int]]
                  ) -> tuple[dict[str, tuple[Target, pa.Table]], dict[str, pa.Table],
                             dict[str, pa.Table]]:
        """:meth:`per_table`, each source's unrouted rows (see :meth:`route`) and each
        source's rows a ``where`` erred on (see :meth:`route_all`)."""
        parts: dict[str, list[pa.Table]] = {}
        owner: dict[str, Target] = {}
        unrouted: dict[str, pa.Table] = {}
        failed: dict[str, pa.Table] = {}
        for source, rows in tables.items():
            routed, left, erred = self.route_all(source, rows, versions.get(source, {}))
            if left is not None:
                unrouted[source] = left
            if erred is not None:
                failed[source] = erred
            for target, part in routed:
                parts.setdefault(target.table, []).append(with_source(part, source))
                current = owner.get(target.table)
                if current is None or (target.sink.live and target.source.live):
                    owner[target.table] = target
        return {table: (owner[table], chunks[0] if len(chunks) == 1 else
                        pa.concat_tables(chunks, promote_options="permissive"))
                for table, chunks in parts.items()}, unrouted, failed

    def sql_cases(self, versions: Mapping[str, Mapping[int, int]]
                  ) -> dict[str, dict[str, tuple[SqlCase, ...]]]:
        """Per source and ``sql`` column: each expression the sinks routed at the run's
        entry versions declared *at those versions*, with the sequences of the entries it
        applies to (see :meth:`expression_cases`)."""
        return {source: {name: tuple(SqlCase(text, dialect, ranges)
                                     for (text, dialect), ranges in exprs.items())
                         for name, exprs in columns.items()}
                for source, columns in self.expression_cases(versions, "sql").items()}

    def template_cases(self, versions: Mapping[str, Mapping[int, int]]
                       ) -> dict[str, dict[str, tuple[TemplateCase, ...]]]:
        """Per source and ``template`` column: each Jsonnet the sinks routed at the run's
        entry versions declared *at those versions*, with the sequences of the entries it
        applies to (see :meth:`expression_cases`)."""
        return {source: {name: tuple(TemplateCase(text, ranges)
                                     for (text, _), ranges in exprs.items())
                         for name, exprs in columns.items()}
                for source, columns in self.expression_cases(versions, "template").items()}

    def expression_cases(self, versions: Mapping[str, Mapping[int, int]], kind: str
                         ) -> dict[str, dict[str, dict[tuple[str, str],
                                                       tuple[tuple[int, int], ...]]]]:
        """Per source and column: each ``kind`` expression (``sql``, ``template``) the sinks
        routed at the run's entry versions declared at those versions
        (:meth:`Sink.expression_at`), as ``(text, dialect)``, with the ``_sequence`` ranges
        of the entries it applies to.

        Why by version: the collector computes these columns after the events were
        accepted, and the decode holds a source's union of columns (tombstones included);
        each entry must be projected with the mappings of the version it carries, so a sink
        PATCH, or a sink deleted (and re-created), changes the values of the events
        accepted afterwards only — and a replay computes the same values.

        An older version's ``sql`` that reads a column no sink of the source declares any
        more (a sink PATCH removed it, and changed the expression) is left out: its entries
        get null in that column, as for a value Spark cannot compute, with a warning naming
        the sink, column, version and missing column. Spark could not resolve the column,
        so the expression would fail the run's job, and the per-column fallback would then
        lose the column's values of *every* entry of the run (one expression per column)."""
        out: dict[str, dict[str, dict[tuple[str, str], tuple[tuple[int, int], ...]]]] = {}
        for source, seen in versions.items():
            found: dict[str, dict[tuple[str, str], list[int]]] = {}
            decoded = self.decoded.get(source, frozenset())
            for sequence, version in seen.items():
                for target in self.targets.get(source, []):
                    if not target.receives_at(version):
                        continue
                    for name in target.sink.expression_columns():
                        value = target.sink.expression_at(name, version)
                        if value is None or value.kind != kind:
                            continue
                        if kind == "sql" and self._unreadable(target, name, version, value,
                                                              decoded):
                            continue
                        found.setdefault(name, {}).setdefault(
                            (value.text, value.dialect), []).append(sequence)
            out[source] = {name: {key: sequence_ranges(seqs) for key, seqs in exprs.items()}
                           for name, exprs in found.items()}
        return out

    def _unreadable(self, target: Target, column: str, version: int, value: Expression,
                    decoded: frozenset[str]) -> bool:
        """Whether the ``sql`` ``value`` of ``column`` at ``version`` reads a column the
        decode does not hold (see :meth:`expression_cases`); warned once per routing view."""
        missing = sql_reads(value.text, value.dialect) - decoded - set(ENVELOPE_COLUMNS)
        if not missing:
            return False
        key = (target.source.id, target.sink.name, column, version)
        if key not in self._warned:
            self._warned.add(key)
            log.warning("sql column %s of sink %s/%s is null for events of registry version "
                        "%d: its expression of that version (%r) reads %s, which no sink "
                        "of the source declares any more", column, target.source.id,
                        target.sink.name, version, value.text[:200],
                        ", ".join(repr(n) for n in sorted(missing)),
                        extra={"column": column, "sink": target.sink.name,
                               "registry_version": version})
        return True

    def where_specs(self, versions: Mapping[str, Mapping[int, int]]
                    ) -> tuple[WhereSpec, ...]:
        """Per source and target table of a run: the predicates that decide which rows the
        target takes, each with the entries whose version declares it — what
        :func:`where_mask` applies on the driver, as plain data for the executors (the
        cluster output path). Targets that route by no predicate at these versions are
        left out (they take every row of the entries they receive)."""
        out: list[WhereSpec] = []
        for source, seen in versions.items():
            for target in self.takers(source, seen):
                groups: dict[str | None, list[int]] = {}
                for sequence, version in seen.items():
                    if target.receives_at(version):
                        groups.setdefault(target.sink.where_at(version), []).append(sequence)
                if list(groups) == [None]:
                    continue
                columns = tuple((c.name, c.type) for c in target.sink.columns)
                out.append(WhereSpec(source, target.table, columns, tuple(
                    WhereCase(sql, sequence_ranges(seqs)) for sql, seqs in groups.items()),
                    sink=target.sink.name))
        return tuple(out)

    def takers(self, source: str, versions: Mapping[int, int]) -> list[Target]:
        """The targets that take any of ``source``'s rows of a run."""
        return [t for t in self.targets.get(source, [])
                if any(t.receives_at(v) for v in versions.values())]

    def single_target(self, source: str, versions: Mapping[int, int]) -> Target | None:
        """The one target that takes all of ``source``'s rows of a run, if routing is that
        simple; None otherwise."""
        takers = self.takers(source, versions)
        if len(takers) == 1 and all(takers[0].receives_at(v) for v in versions.values()):
            return takers[0]
        return None


@lru_cache(maxsize=256)
def sql_reads(text: str, dialect: str) -> frozenset[str]:
    """The columns a ``sql`` mapping reads (none when it does not even check: a registry
    not written by this icefloe, whose column the pipeline leaves null itself)."""
    try:
        return frozenset(sql_references(sql_expression(
            Column("_", "string", sql=text, dialect=dialect))))
    except ValueError:
        return frozenset()


def where_mask(target: Target, rows: pa.Table, versions: Mapping[int, int]
               ) -> pa.Array | None:
    """Which of ``rows`` (of the entries in ``versions``, which ``target`` receives) its
    ``where`` takes, each entry judged by the predicate of its own registry version; None
    when no predicate applies (every row is taken)."""
    return where_verdict(target, rows, versions)[0]


def where_verdict(target: Target, rows: pa.Table, versions: Mapping[int, int]
                  ) -> tuple[pa.Array | None, pa.Array | None]:
    """:func:`where_mask`, and per row the error the predicate raised on it, named with
    the sink, its table and its ``where`` (None: no row erred)."""
    groups: dict[str | None, list[int]] = {}
    for sequence, version in versions.items():
        groups.setdefault(target.sink.where_at(version), []).append(sequence)
    if list(groups) == [None]:
        return None, None
    sequences = rows.column("_sequence")
    columns = target.sink.columns
    out: pa.Array | None = None
    errors: pa.Array | None = None
    for sql, seqs in groups.items():
        mine = pc.is_in(sequences, pa.array(seqs, pa.int64())) if len(groups) > 1 else None
        if sql is None:
            chosen = pa.array(np.ones(rows.num_rows, dtype=bool))
        else:
            verdict = judge(sql, columns, rows)
            chosen = verdict.taken
            if verdict.errors is not None:
                failed = where_error_messages(target.sink.name, target.table, sql,
                                              verdict.errors)
                if mine is not None:
                    failed = pc.if_else(mine, failed, pa.scalar(None, pa.string()))
                errors = failed if errors is None else pc.coalesce(errors, failed)
        if mine is not None:
            chosen = pc.and_(chosen, mine)
        out = chosen if out is None else pc.or_(out, chosen)
    return out, errors


def _union(mask: pa.Array | None, more: pa.Array | None, rows: int) -> pa.Array:
    """Rows in the accumulated ``mask`` (None: no row yet) or in ``more`` (None: every
    row)."""
    if more is None:
        return pa.array(np.ones(rows, dtype=bool))
    return more if mask is None else pc.or_(mask, more)


def project(rows: pa.Table, target: Target) -> pa.Table:
    """The sink's columns (and the envelope) out of a source's decoded rows; a column the
    decode did not produce (a sink of an older version) is all nulls, never an error."""
    arrays, names = [], []
    for column in target.sink.columns:
        if column.name in rows.column_names:
            arrays.append(rows.column(column.name))
        else:
            arrays.append(pa.nulls(rows.num_rows, ARROW_TYPES[column.type]))
        names.append(column.name)
    if target.sink.unknown_fields == "evolve" and EXTRA_FIELD in rows.column_names:
        for name in (EXTRA_FIELD, CLIENT_FIELD):  # turned into columns before the commit
            if name in rows.column_names:
                arrays.append(rows.column(name))
                names.append(name)
    for name in ENVELOPE_COLUMNS:
        arrays.append(rows.column(name))
        names.append(name)
    return pa.Table.from_arrays(arrays, names=names)


def with_extra(stream: StreamConfig) -> StreamConfig:
    """An evolving stream as the collector decodes it: its undeclared fields (kept by the
    ingestor in :data:`~icefloe.streams.evolution.EXTRA_FIELD`) read as one more ``json``
    column, which :mod:`collector.evolve` turns into table columns, and the client that
    sent them (:data:`~icefloe.streams.evolution.CLIENT_FIELD`, for the quotas)."""
    if stream.unknown_fields != "evolve":
        return stream
    extra = Column(name=EXTRA_FIELD, type="json")
    client = Column(name=CLIENT_FIELD, type="string")
    return msgspec.structs.replace(stream, columns=(*stream.columns, extra, client))


RouteKey = tuple[tuple[int, str, int, str], ...]
"""Which sink records take a source's events at one version: (source record, sink name,
sink record, table) per target, sorted — equal keys mean identical routing."""


def route_key(routes: Routes, source: str, version: int) -> RouteKey:
    return tuple(sorted((t.source.created_version, t.sink.name, t.sink.created_version,
                         t.table) for t in routes.targets.get(source, [])
                        if t.receives_at(version)))


def cut_by_routing(routes: Routes, entries: Sequence[Entry]) -> list[Entry]:
    """The longest prefix of ``entries`` in which each source has one routing and no table
    is written by two sources: the run ends at the first entry whose routing differs from
    what the run already holds (the first entry is always taken).

    Why this is safe for exactly-once: a run is any prefix of the unacknowledged queue,
    and nothing downstream depends on where a run ends — each table's commit records the
    run's last sequence, a replay drops rows at or below what a table holds and the dedup
    windows are per table, whatever the run boundaries were before a crash. A shorter run
    only means one more commit. The cut itself is a pure function of the entries'
    registry versions and the registry's history, so a replay cuts the same way.
    """
    routing: dict[str, RouteKey] = {}
    owners: dict[str, str] = {}
    for index, entry in enumerate(entries):
        for source in entry.streams:
            key = route_key(routes, source, entry.registry_version)
            tables = {table for *_, table in key}
            clash = routing.get(source, key) != key or any(
                owners.get(table, source) != source for table in tables)
            if clash and index:
                return list(entries[:index])
            routing[source] = key
            owners.update(dict.fromkeys(tables, source))
    return list(entries)


def embedded_reason(routes: Routes, entries: Sequence[Entry]) -> str | None:
    """Why the cluster output path does not write this run itself (None: it does).

    ``shared-table``: two sources (or two sinks) write one table in this run, which the
    cluster path would commit as two appends of one run. ``evolve``: a sink that takes
    part of the run evolves its table from the data (``unknown_fields = "evolve"``; a
    change stream's too).
    Why the embedded shape for those: evolution needs the rows' undeclared fields on the
    driver — the evolution quotas charge each new column to a client in run order and an
    over-quota field goes to the table's ``_overflow`` column, never the whole event to
    the dead letters; a parked table's rows are staged as they came, its table evolved
    only when it imports (:meth:`collector.embedded_path.EmbeddedPath.commit_routed`). One code
    path for all of it, on the same Spark session. Such a run takes the embedded path
    there; fan-out (several sinks, a sink that misses part of the run), routing by content
    (``where``, evaluated on the executors), upserts, change streams, table templates and
    staged sinks are written by the cluster path itself
    (:class:`collector.cluster_path.ClusterPath`).
    """
    versions: dict[str, dict[int, int]] = {}
    for entry in entries:
        for source in entry.streams:
            versions.setdefault(source, {})[entry.sequence] = entry.registry_version
    owners: set[str] = set()
    evolves = False
    for source, seen in versions.items():
        for target in routes.takers(source, seen):
            if target.table in owners:
                return "shared-table"
            owners.add(target.table)
            evolves = evolves or target.sink.unknown_fields == "evolve"
    return "evolve" if evolves else None


def _typed(value: str) -> Literal["protobuf", "avro"]:
    return "protobuf" if value == "protobuf" else "avro"
