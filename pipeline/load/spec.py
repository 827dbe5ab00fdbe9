"""What one pipeline run reads: the store, the streams, and the batch files, as plain data.

Why a separate, JSON-serializable spec: a Spark Python data source receives only string
options on the driver and pickled partitions on the workers, and the same spec also drives
the no-Spark decode path (tests, the benchmark baseline). Keeping it free of live objects
(stores, catalogs, sessions) makes it cheap to ship to any executor.

The columns a stream derives rather than reads from its payload (:class:`Derived`) are
part of that plain data; :mod:`pipeline.load.mapped` evaluates them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import msgspec
import pyarrow as pa

from icefloe.config import Config, StreamConfig
from icefloe.manifest.model import Entry
from icefloe.streams.mappings import KAFKA_SOURCES
from icefloe.streams.model import DynamicTables
from pipeline.columns import ARROW_TYPES

DERIVED_KINDS = ("ip", "header", "headers", "datetime", "id", "sql", "template",
                 *KAFKA_SOURCES)
PAYLOAD_KINDS = ("template",)
"""Derived kinds whose column is also read from the payload: a ``template`` column's field
holds the event's JSON text, which the decode replaces with the template's value."""


@dataclass(frozen=True, slots=True)
class EntryFile:
    """The batch file of one manifest entry, as a worker fetches and checks it (picklable).

    Not :class:`icefloe.manifest.BatchRef`, the producer's description of a file it is
    about to append: this one is read back from an entry, with the entry's sequence.
    """

    sequence: int
    location: str
    size: int
    crc32c: int


class SqlCase(msgspec.Struct, frozen=True):
    """One expression of a ``sql`` column and the ``_sequence`` ranges (inclusive) of the
    entries it applies to."""

    sql: str
    dialect: str
    ranges: tuple[tuple[int, int], ...]


class TemplateCase(msgspec.Struct, frozen=True):
    """One Jsonnet of a ``template`` column and the ``_sequence`` ranges (inclusive) of the
    entries it applies to: those accepted under a registry version that declares it."""

    template: str
    ranges: tuple[tuple[int, int], ...]

    def covers(self, sequence: int) -> bool:
        return any(first <= sequence <= last for first, last in self.ranges)


class Derived(msgspec.Struct, frozen=True):
    """A column the pipeline fills (not read from the payload): its mapping, as plain data.

    ``arg`` is the lower-case header name of a ``header`` mapping, the SQL of a ``sql``,
    the Jsonnet of a ``template``.
    ``cases`` (``sql`` only): None computes ``arg`` on every row of the stream; otherwise
    each case's expression on the rows of its sequences, and null elsewhere (see the module
    doc).
    """

    column: str
    type: str
    kind: str
    arg: str = ""
    dialect: str = "spark"
    cases: tuple[SqlCase, ...] | None = None
    templates: tuple[TemplateCase, ...] | None = None
    """(``template`` only) None evaluates ``arg`` on every row; otherwise each row takes
    the template of the case covering its entry's sequence, and is null in none."""

    def template_for(self, sequence: int) -> str | None:
        """The Jsonnet the rows of entry ``sequence`` are evaluated with (None: null)."""
        if self.templates is None:
            return self.arg
        return next((c.template for c in self.templates if c.covers(sequence)), None)


def derived_columns(stream: StreamConfig) -> tuple[Derived, ...]:
    out: list[Derived] = []
    for column in stream.columns:
        kind = column.mapping
        if kind not in DERIVED_KINDS:
            continue
        arg = (column.header or "").lower() if kind == "header" else \
            column.template or "" if kind == "template" else column.sql or ""
        out.append(Derived(column.name, column.type, kind, arg, column.dialect))
    return tuple(out)


class TypedSpec(msgspec.Struct, frozen=True):
    """A ``format = "protobuf"`` or ``"avro"`` stream's type as plain data (#39): what the
    executors decode its binary payloads with. ``text`` is the config's (base64 descriptor
    set, or the Avro reader schema); ``writers`` the Avro writer schemas by the schema id
    the envelope names: the schema registry's (:func:`with_avro_writers`), which is also
    where an ingestor keeps the schema of every single-object record it accepts, so each
    record is read with the exact schema it was written with. 0 is ``text`` itself: what
    ingestors before that wrote for a single-object record (read with the stream's schema
    of the moment, right only while it has not changed), and what tools that frame records
    themselves (benchmarks) write."""

    format: str
    text: str
    message: str = ""
    enums: str = "string"
    writers: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True, slots=True)
class TypedPlan:
    """What the decode needs for a typed stream: the payload schema its type's columns
    make, and the type."""

    payload: pa.Schema
    typed: TypedSpec


def typed_spec(stream: StreamConfig) -> TypedSpec | None:
    """The type of a typed stream (None for JSON streams)."""
    schema = stream.schema
    if stream.format == "json" or schema is None:
        return None
    writers = ((0, schema.text),) if stream.format == "avro" else ()
    return TypedSpec(stream.format, schema.text, schema.message or "", schema.enums, writers)


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """What the decode needs for one stream: the payload schema and the derived columns,
    and the order of the table's columns."""

    payload: pa.Schema
    derived: tuple[Derived, ...]
    order: tuple[str, ...]



class StreamSpec(msgspec.Struct, frozen=True):
    """A stream's table columns, and which of them the pipeline derives (not the payload)."""

    name: str
    columns: tuple[tuple[str, str], ...]  # (name, icefloe type)
    derived: tuple[Derived, ...] = ()
    keys: tuple[str, ...] = ()
    """Columns the cluster output path collects to the driver with each row's keys: the
    primary-key and tombstone columns of the stream's upsert sinks (:func:`with_key_columns`)."""
    typed: TypedSpec | None = None
    """A Protobuf or Avro stream's type (None: JSON payloads)."""

    def payload_schema(self) -> pa.Schema:
        skip = {d.column for d in self.derived if d.kind not in PAYLOAD_KINDS}
        return pa.schema([pa.field(name, ARROW_TYPES[kind]) for name, kind in self.columns
                          if name not in skip])

    def plan(self) -> pa.Schema | StreamPlan | TypedPlan:
        """What the decode needs: the payload schema, a plan with derived columns, or a
        typed stream's type."""
        if self.typed is not None:
            return TypedPlan(self.payload_schema(), self.typed)
        if not self.derived:
            return self.payload_schema()
        return StreamPlan(self.payload_schema(), self.derived,
                          tuple(name for name, _ in self.columns))


class WhereCase(msgspec.Struct, frozen=True):
    """One predicate of a sink (None: every row) and the ``_sequence`` ranges (inclusive)
    of the entries whose registry version declares it."""

    sql: str | None
    ranges: tuple[tuple[int, int], ...]

    def sequences(self) -> list[int]:
        return [s for first, last in self.ranges for s in range(first, last + 1)]


class WhereSpec(msgspec.Struct, frozen=True):
    """Which of ``stream``'s rows of a run the sink writing ``table`` takes by content.

    ``columns`` are the sink's (name, icefloe type), what its predicate is checked against;
    a row of an entry in no case is not taken (its sink does not receive that entry). The
    cluster output path evaluates it on the executors (:mod:`pipeline.load.wheres`),
    with the embedded path's evaluator (:mod:`pipeline.where`)."""

    stream: str
    table: str
    columns: tuple[tuple[str, str], ...]
    cases: tuple[WhereCase, ...]
    sink: str = ""
    """The sink's name (what a ``where_error`` dead letter names)."""


class TableSpec(msgspec.Struct, frozen=True):
    """The table template a sink of ``stream`` names its tables by: the cluster output path
    evaluates it on the executors (:mod:`pipeline.load.named`), so only each row's table
    name (or the rule it broke) reaches the driver with the keys, never the values it is
    made of. ``columns`` are the sink's (name, icefloe type), ``limits`` its
    ``dynamic_tables``."""

    stream: str
    template: str
    columns: tuple[tuple[str, str], ...]
    limits: DynamicTables = DynamicTables()


class RunSpec(msgspec.Struct, frozen=True):
    store_url: str
    endpoint_url: str | None
    region: str | None
    streams: tuple[StreamSpec, ...]
    batches: tuple[tuple[int, str, int, int], ...]  # (sequence, location, size, crc32c)
    partitions: int = 4
    wheres: tuple[WhereSpec, ...] = ()
    sql_max_value_bytes: int = 16 * 1024 * 1024
    """Per row: a larger ``sql`` value is an error of that row (see :mod:`pipeline.load.mapped`)."""
    sql_max_run_s: float = 60.0
    """Per run: the evaluation time the ``sql`` mappings may take (driver side)."""
    tables: tuple[TableSpec, ...] = ()
    """The run's table templates (cluster output path: named on the executors)."""

    def refs(self) -> list[EntryFile]:
        return [EntryFile(*batch) for batch in self.batches]

    def encode(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def decode(cls, text: str) -> RunSpec:
        return msgspec.json.decode(text, type=cls)


def stream_specs(streams: Iterable[StreamConfig]) -> tuple[StreamSpec, ...]:
    return tuple(StreamSpec(s.name, tuple((c.name, c.type) for c in s.columns),
                            derived_columns(s), typed=typed_spec(s))
                 for s in streams)


def run_spec(config: Config, entries: Sequence[Entry], partitions: int = 4) -> RunSpec:
    return RunSpec(
        store_url=config.store.url, endpoint_url=config.store.endpoint_url,
        region=config.store.region, streams=stream_specs(config.streams),
        batches=tuple((e.sequence, e.location, e.size, e.crc32c) for e in entries),
        partitions=partitions, sql_max_value_bytes=config.collector.sql_max_value_bytes,
        sql_max_run_s=config.collector.sql_max_run_s)


def with_key_columns(spec: RunSpec, keys: Mapping[str, tuple[str, ...]]) -> RunSpec:
    """``spec`` with each stream's :attr:`StreamSpec.keys` set from ``keys`` (by stream)."""
    if not keys:
        return spec
    streams = tuple(msgspec.structs.replace(s, keys=keys.get(s.name, ())) for s in spec.streams)
    return msgspec.structs.replace(spec, streams=streams)


def with_sql_cases(spec: RunSpec,
                   cases: dict[str, dict[str, tuple[SqlCase, ...]]]) -> RunSpec:
    """``spec`` with each ``sql`` column of each stream limited to the entries whose
    registry version declares it, with the expression that version declares (``cases``:
    by stream, then column; a column absent there is computed on no row). See
    :mod:`pipeline.load.mapped`."""
    streams = []
    for stream in spec.streams:
        mine = cases.get(stream.name, {})
        derived = tuple(msgspec.structs.replace(d, cases=mine.get(d.column, ()))
                        if d.kind == "sql" else d for d in stream.derived)
        streams.append(msgspec.structs.replace(stream, derived=derived))
    return msgspec.structs.replace(spec, streams=tuple(streams))


def with_template_cases(spec: RunSpec,
                        cases: dict[str, dict[str, tuple[TemplateCase, ...]]]) -> RunSpec:
    """``spec`` with each ``template`` column evaluated, per entry, with the Jsonnet of the
    registry version that entry was accepted under (``cases``: by stream, then column; a
    column absent there is null on every row), never with the sink's content of the
    moment: changing a template must not change the values of events already queued."""
    streams = []
    for stream in spec.streams:
        mine = cases.get(stream.name, {})
        derived = tuple(msgspec.structs.replace(d, templates=mine.get(d.column, ()))
                        if d.kind == "template" else d for d in stream.derived)
        streams.append(msgspec.structs.replace(stream, derived=derived))
    return msgspec.structs.replace(spec, streams=tuple(streams))


def with_avro_writers(spec: RunSpec, writers: Mapping[int, str]) -> RunSpec:
    """``spec`` with every Avro stream able to read records written with any of
    ``writers`` (the schema registry's Avro schemas by id, read after the run's entries:
    an ingestor accepted a record only with an id it had read or written, the stream's own
    schema of its single-object records included, so every id a run holds is among them;
    one that is not is dead-lettered as ``unknown_schema``, never read with another
    schema). Id 0 stays the stream's own schema (see :class:`TypedSpec`)."""
    if not writers:
        return spec
    extra = tuple(sorted(writers.items()))
    streams = tuple(
        msgspec.structs.replace(s, typed=msgspec.structs.replace(
            s.typed, writers=((0, s.typed.text), *extra)))
        if s.typed is not None and s.typed.format == "avro" else s
        for s in spec.streams)
    return msgspec.structs.replace(spec, streams=streams)


def with_wheres(spec: RunSpec, wheres: tuple[WhereSpec, ...]) -> RunSpec:
    """``spec`` with the ``where`` predicates its sinks route by (see :class:`WhereSpec`)."""
    return msgspec.structs.replace(spec, wheres=wheres)


def with_tables(spec: RunSpec, tables: tuple[TableSpec, ...]) -> RunSpec:
    """``spec`` with the table templates its sinks name tables by (see :class:`TableSpec`)."""
    return msgspec.structs.replace(spec, tables=tables)


def group_refs(refs: Sequence[EntryFile], partitions: int) -> list[list[EntryFile]]:
    """Split files into ≤ ``partitions`` groups of similar total size.

    Why not one partition per file: every Spark task costs ~35 ms of Python worker overhead,
    which dominated a probe with 100 files (see CEILINGS.md); a few balanced groups keep
    both cores busy without it.
    """
    count = max(1, min(partitions, len(refs)))
    groups: list[list[EntryFile]] = [[] for _ in range(count)]
    sizes = [0] * count
    for ref in sorted(refs, key=lambda r: -r.size):
        smallest = sizes.index(min(sizes))
        groups[smallest].append(ref)
        sizes[smallest] += ref.size
    return [sorted(group, key=lambda r: r.sequence) for group in groups if group]
