"""``icefloe replay``: run kept batch files again into one sink's table, exactly once.

How exactly-once is recorded: the way the collector records it (:mod:`pipeline.iceberg.commit`).
A replay first commits a **start marker** to the sink's table, in one atomic commit that
also empties the table when ``--truncate`` is given: ``icefloe.sequence`` set to just before
the range and ``icefloe.replay`` naming the replay (a hash of table and range). Every later
chunk goes through :func:`pipeline.iceberg.commit.commit_rows`, which drops what the table
already holds and advances ``icefloe.sequence``. A replay interrupted anywhere and started
again with the same range finds its marker and goes on where the table's sequence says;
nothing is recommitted.

Why the sink must be paused: the live collector commits to the same table with the same
offset property. While it holds the lease and the sink takes events, a replay is refused
(disable the sink, or stop the collector). Should a collector commit to the table anyway
during a replay (a config-only stream with a collector started mid-replay), the table's
current offset no longer carries this replay's marker: every commit checks it on the very
table object it appends to, and the replay stops with an error instead of skipping or
doubling anything. The live collector only ever commits entries newer than the manifest's
acknowledged sequence, and a replay only indexed (acknowledged) ones, so once the sink is
enabled again the two never overlap. Other sinks are never touched: the replay routes
through a registry of this one sink alone.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.table import Table

from collector.commit import versions_of
from collector.dedup import DedupWindow, source_runs, without_source
from collector.replay_range import ReplayConflict, ReplayRefused
from collector.routing import Routes, Target
from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.manifest.model import Entry
from icefloe.registry.model import Conditions, Registry
from icefloe.retention import IndexedEntry
from icefloe.streams.dynamic_tables import is_template
from pipeline.iceberg import (
    REPLAY_PROP,
    SOURCES_PROP,
    CommitResult,
    WriteThenAdd,
    carried_version,
    commit_rows,
    committed_state,
    covers,
    encode_sources,
    ensure_stream_table,
    position,
    replay_marker,
    summary_props,
)
from pipeline.load import run_spec, with_sql_cases, with_template_cases, with_wheres

log = logging.getLogger("icefloe.replay")


def find_target(registry: Registry, name: str) -> Target:
    """The sink called ``name`` (``source/sink``, a sink name, or its table), refused
    when unknown or ambiguous, or when replay cannot run it exactly like the collector."""
    found = [Target(src, sink) for src in registry.sources if src.live for sink in src.sinks
             if sink.live and name in (sink.name, f"{src.id}/{sink.name}", sink.table)]
    if not found:
        known = sorted(f"{s.id}/{k.name}" for s in registry.sources if s.live
                       for k in s.sinks if k.live)
        raise ReplayRefused(f"unknown sink {name!r}: no live sink has that name or table "
                            f"(known: {', '.join(known) or 'none'})")
    if len(found) > 1:
        names = ", ".join(f"{t.source.id}/{t.sink.name}" for t in found)
        raise ReplayRefused(f"sink {name!r} is ambiguous ({names}): name it as source/sink")
    target = found[0]
    unsupported = {"primary_key (upserts)": bool(target.sink.primary_key),
                   "unknown_fields = 'evolve'": target.sink.unknown_fields == "evolve",
                   "import conditions": target.sink.conditions != Conditions(),
                   "format = 'avro'": target.source.format == "avro",
                   f"a table template ({target.sink.table})": is_template(target.sink.table)}
    for what, present in unsupported.items():
        if present:
            raise ReplayRefused(f"sink {target.source.id}/{target.sink.name} has {what}, "
                                "which replay does not support yet")
    return target


def replay_routes(target: Target) -> Routes:
    """Routes of this one sink as it is defined now, taking every event of its source (a
    new sink gets the events accepted before it existed; a disabled one those of its pause).

    Why as it is now, not as each event was routed then: a replay refills a table after
    its sink was created or fixed (a ``where``, an ``sql`` or ``template`` column changed
    by a PATCH), so every event goes through the sink's current ``where`` and expressions;
    their history, which the live collector reads per event version, is dropped here."""
    sink = msgspec.structs.replace(target.sink, created_version=0, deleted_version=None,
                                   toggles=(), enabled=True, wheres=(), mappings=())
    source = msgspec.structs.replace(target.source, created_version=0, deleted_version=None,
                                     sinks=(sink,), unrouteds=())
    return Routes(Registry(version=0, sources=(source,)))


def replay_id(table: str, entries: Sequence[IndexedEntry]) -> str:
    """Names one replay: the same table and range give the same id (and resume)."""
    text = f"{table}|{entries[0].shard}:{entries[0].sequence}|{entries[-1].shard}:" \
           f"{entries[-1].sequence}|{len(entries)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class ReplayProgress:
    """What a replay did so far (the CLI prints it after every chunk)."""

    entries_total: int
    bytes_total: int
    entries_done: int = 0
    bytes_done: int = 0
    rows: int = 0
    skipped_entries: int = 0
    duplicates: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """Events of the range the sink's pipeline refused this time, by reason (a payload
    that does not fit a type the sink declares, a ``where`` that raised): not in the table
    and not dead-lettered by the replay (the CLI names them in its summary)."""
    resumed: bool = False
    chunks: list[CommitResult] = field(default_factory=list)


class Replay:
    """One replay of ``entries`` into ``target``'s table (blocking: run in a thread)."""

    def __init__(self, config: Config, catalog: object, engine: object, target: Target,
                 entries: Sequence[IndexedEntry], *, clock: Clock = SYSTEM,
                 on_chunk: Callable[[ReplayProgress], None] | None = None,
                 hook: Callable[[str], None] | None = None) -> None:
        self.config, self.catalog, self.engine = config, catalog, engine
        self.target, self.entries = target, list(entries)
        self.table = target.table
        self.routes = replay_routes(target)
        self.id = replay_id(self.table, self.entries)
        self.clock, self.on_chunk = clock, on_chunk
        self.hook = hook or (lambda _stage: None)
        self.progress = ReplayProgress(len(self.entries),
                                       sum(e.entry.size for e in self.entries))
        cfg = config.collector
        self.window = DedupWindow(cfg.dedup_window_s, cfg.dedup_max_ids, name=self.table,
                                  clock=clock)

    def start(self, *, truncate: bool) -> bool:
        """Create the table if missing and commit the start marker (emptying the table
        with ``truncate``); True when this replay's marker is there already (resume)."""
        table = ensure_stream_table(self.catalog, self.target.stream)  # type: ignore[arg-type]
        if self._marker(table) == self.id:
            self.progress.resumed = True
            return True
        rows = _row_count(table)
        if rows and not truncate:
            raise ReplayRefused(f"table {self.table} holds {rows} rows: replay fills a new or "
                                "emptied sink; pass --truncate to empty it first")
        state = committed_state(table)
        before: dict[int, int] = {}
        for item in self.entries:
            before.setdefault(item.shard, item.sequence - 1)
        props = summary_props(before.get(0, -1), state.epoch, int(self.clock.time() * 1000),
                              before, carried_version(table))
        props[REPLAY_PROP] = self.id
        with table.transaction() as tx:
            if truncate and rows:
                tx.delete(AlwaysTrue(), snapshot_properties=props)
            tx.append(table.schema().as_arrow().empty_table(), snapshot_properties=props)
        self.hook("after_start")
        return False

    def run(self) -> ReplayProgress:
        """Every chunk in order; a chunk the table already covers is skipped unread."""
        cfg = self.config.collector
        chunk: list[IndexedEntry] = []
        size = 0
        for item in self.entries:
            if chunk and (len(chunk) >= cfg.max_run_entries
                          or size + item.entry.size > cfg.max_run_bytes):
                self._chunk(chunk)
                chunk, size = [], 0
            chunk.append(item)
            size += item.entry.size
        if chunk:
            self._chunk(chunk)
        return self.progress

    def _chunk(self, chunk: list[IndexedEntry]) -> None:
        through: dict[int, int] = {}
        for item in chunk:
            through[item.shard] = max(through.get(item.shard, -1), item.sequence)
        table = self.catalog.load_table(self.table)  # type: ignore[attr-defined]
        self._check_marker(table)
        state = committed_state(table)
        if covers(state.sequences, through):
            self.progress.skipped_entries += len(chunk)
        else:
            rows = self._rows(chunk)
            if rows is not None and rows.num_rows:
                self._commit(rows, through, state.epoch)
        self.progress.entries_done += len(chunk)
        self.progress.bytes_done += sum(e.entry.size for e in chunk)
        self.hook("after_chunk")
        if self.on_chunk is not None:
            self.on_chunk(self.progress)

    def _commit(self, rows: pa.Table, through: dict[int, int], epoch: int) -> None:
        """Commit one chunk's rows as the collector does (written, then added, with the
        rows' sources recorded), on the condition that the offset is still this replay's."""
        writer = WriteThenAdd(self.target.source.id)

        def append(table: Table, committed: pa.Table, props: dict[str, str]) -> None:
            self._check_marker(table)
            writer(table, committed, props)

        props = {REPLAY_PROP: self.id, SOURCES_PROP: encode_sources(source_runs(rows))}
        try:
            result = commit_rows(self.catalog, self.table,  # type: ignore[arg-type]
                                 without_source(rows), sequence=through.get(0, -1),
                                 sequences=through, epoch=epoch, append=append, props=props,
                                 clock=self.clock)
        finally:
            writer.cleanup(self.catalog, self.table,  # type: ignore[arg-type]
                           sequence=through.get(0, -1), epoch=epoch)
        self._check_marker(self.catalog.load_table(self.table))  # type: ignore[attr-defined]
        self.progress.rows += result.rows
        self.progress.chunks.append(result)

    def _rows(self, chunk: list[IndexedEntry]) -> pa.Table | None:
        """The chunk's rows for the sink, through the collector's pipeline, deduplicated
        by event id as the collector's window did (reaching back from the chunk)."""
        entries = [_positioned(item) for item in chunk]
        versions = versions_of(entries)
        spec = run_spec(self.routes.decode_config(self.config), entries,
                        partitions=getattr(self.engine, "partitions", 4))
        spec = with_sql_cases(spec, self.routes.sql_cases(versions))
        spec = with_template_cases(spec, self.routes.template_cases(versions))
        spec = with_wheres(spec, self.routes.where_specs(versions))
        output = self.engine.run(spec)  # type: ignore[attr-defined]
        routed, _, erred = self.routes.route_run(output.tables, versions)
        self._count_refused(output.dead, erred.get(self.target.source.id))
        if self.table not in routed:
            return None
        rows = routed[self.table][1]
        # the window as the collector had it then: ids are stamped with their chunk's
        # ingest time (not now), so they are forgotten dedup_window_s of ingest time later
        first = chunk[0].entry.ingested_at
        last = max(first, chunk[-1].entry.ingested_at)
        self.window.hold_s = first
        self.window.expire(now_s=first)
        fresh, dropped = self.window.filter_in_sequence_order(rows)
        self.window.remember(fresh, now_s=last)
        self.progress.duplicates += dropped
        return fresh

    def _count_refused(self, dead: pa.Table | None, erred: pa.Table | None) -> None:
        """Count what the pipeline refused of this sink's source, by reason (see
        :attr:`ReplayProgress.refused`)."""
        refused = self.progress.refused
        if dead is not None and dead.num_rows:
            mine = dead.filter(pc.equal(dead.column("stream"), self.target.source.id))
            for reason in mine.column("reason").to_pylist():
                refused[str(reason)] = refused.get(str(reason), 0) + 1
        if erred is not None and erred.num_rows:
            refused["where_error"] = refused.get("where_error", 0) + erred.num_rows

    def _marker(self, table: Table) -> str | None:
        """The replay id on the snapshot that holds the table's offset (None: none)."""
        return replay_marker(table)

    def _check_marker(self, table: Table) -> None:
        if self._marker(table) != self.id:
            raise ReplayConflict(
                f"table {self.table} was committed to by something else during the replay "
                f"(its offset no longer carries replay {self.id}): the sink was not paused. "
                "Pause it (icefloe sinks disable, or stop the collector), then replay again "
                "with --truncate")


def _positioned(item: IndexedEntry) -> Entry:
    """The entry as a run carries it: position as sequence, registry version 0 (the
    replay's one-sink registry)."""
    return msgspec.structs.replace(item.entry, sequence=position(item.shard, item.sequence),
                                   registry_version=0)


def _row_count(table: Table) -> int:
    snapshot = table.current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.additional_properties.get("total-records", 0) or 0)
