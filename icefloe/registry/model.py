"""The stream registry document: sources, their sinks, and the history routing needs.

Why one versioned document that keeps history: every manifest entry will record the
registry version its events were accepted under, and the collector routes an entry by
*that* version. So the document must answer "which sinks of source S were live and enabled
at version V" for any V still in the queue — a sink carries the version that created it,
the version that deleted it (a tombstone, kept while older entries may still need it) and
the versions at which it was disabled or enabled. Everything fits one object updated by
compare-and-swap, like the manifest: no second store, no lock service.

Encoding: JSON (``msgspec``), ``format`` 1; unknown fields are refused so an older process
never silently drops what a newer one wrote.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Column, RateLimit, StreamConfig
from icefloe.streams.mappings import KAFKA_SOURCES
from icefloe.streams.model import CdcConfig, DynamicTables, EvolveQuota, TypedSchema

FORMAT = 1
MAX_SINKS = 20

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

AGE_RANGE_S = (1.0, 86_400.0)
BYTES_RANGE = (100, 500 * 1000 * 1000)
EVENTS_RANGE = (1, 10_000_000)


class Conditions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """When a sink's pending rows are committed: as soon as the oldest is ``max_age_s`` old,
    or they reach ``max_bytes`` or ``max_events`` — whichever comes first. The defaults keep
    the collector's usual rhythm (about a second)."""

    max_age_s: float = 1.0
    max_bytes: int = 64 * 1024 * 1024
    max_events: int = 1_000_000


class Toggle(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """From registry ``version`` on, the sink is ``enabled`` (or not)."""

    version: int
    enabled: bool


class Change(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """From registry ``version`` on, a versioned setting (a sink's ``where``, a source's
    ``unrouted``) is ``value``: routing reads the value of each entry's version, so a
    change applies to events accepted from then on and a replay routes exactly as before."""

    version: int
    value: str | None


class _Versioned(Protocol[T_co]):
    """A change of a versioned setting (:class:`Change`, :class:`MappingChange`)."""

    @property
    def version(self) -> int: ...
    @property
    def value(self) -> T_co: ...


def value_at(changes: Sequence[_Versioned[T]], current: T, version: int) -> T:
    """The setting's value at ``version``: the last change at or before it; ``current``
    when there is no history (a record written before the setting was versioned)."""
    if not changes:
        return current
    value = changes[0].value
    for change in changes:
        if change.version <= version:
            value = change.value
    return value


def with_change(changes: tuple[Change, ...], old: str | None, new: str | None,
                created: int, version: int) -> tuple[Change, ...]:
    """``changes`` after the value went from ``old`` to ``new`` at ``version``."""
    base = changes or (Change(created, old),)
    return (*base, Change(version, new))


EXPRESSION_KINDS = ("sql", "template")
"""Mappings the collector evaluates from an expression long after the event was accepted,
so a sink keeps every expression they had by version (:class:`MappingChange`)."""


class Expression(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A column's ``sql`` (with its ``dialect``) or ``template`` (:data:`EXPRESSION_KINDS`)."""

    kind: str
    text: str
    dialect: str = "spark"


def expression(column: Column) -> Expression | None:
    """The expression ``column`` is computed by (None: it is read or taken, not computed)."""
    if column.template is not None:
        return Expression("template", column.template)
    if column.sql is not None:
        return Expression("sql", column.sql, column.dialect)
    return None


COLLECTOR_SOURCES = ("ip", "id", "datetime", "headers", *KAFKA_SOURCES)
"""``from`` values the collector takes from the envelope (``body`` is read at acceptance;
the ``kafka_*`` ones from the Kafka record's metadata in the envelope meta)."""


def computed_later(column: Column) -> bool:
    """Whether the collector computes ``column``'s value from the queued event (an
    expression, a ``header``, a ``from`` of :data:`COLLECTOR_SOURCES`) rather than reading
    what the ingestor stored when it accepted the event (a field, a ``path``, the body)."""
    return (expression(column) is not None or column.header is not None
            or column.source in COLLECTOR_SOURCES)


def unversioned_change(old: Column, new: Column) -> bool:
    """Whether changing ``old`` into ``new`` would reach queued events and cannot be
    versioned: the mapping changes, the collector computes either, and it is not an
    expression changed within its kind (those are kept by version: :class:`MappingChange`)."""
    def mapping(c: Column) -> tuple[object, ...]:
        return (c.path, c.header, c.source, c.sql, c.dialect, c.template, c.default, c.raw)

    if mapping(old) == mapping(new) or not (computed_later(old) or computed_later(new)):
        return False
    was, now = expression(old), expression(new)
    return was is None or now is None or was.kind != now.kind


class MappingChange(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """From registry ``version`` on, the sink's ``column`` is computed by the expression
    ``value`` (None: by none then). Why versioned: the collector evaluates ``sql`` and
    ``template`` columns long after the event was accepted, and a change (a sink PATCH)
    must reach only the events accepted from then on, as a ``where`` change does."""

    version: int
    column: str
    value: Expression | None


def mapping_changes(changes: tuple[MappingChange, ...], old: tuple[Column, ...],
                    new: tuple[Column, ...], created: int, version: int
                    ) -> tuple[MappingChange, ...]:
    """``changes`` after the sink's columns went from ``old`` to ``new`` at ``version``:
    one change per column whose expression was added, changed or removed."""
    before = {c.name: expression(c) for c in old}
    after = {c.name: expression(c) for c in new}
    out = list(changes)
    for name in sorted(set(before) | set(after)):
        was, now = before.get(name), after.get(name)
        if was == now:
            continue
        if not any(c.column == name for c in out):
            out.append(MappingChange(created, name, was))
        out.append(MappingChange(version, name, now))
    return tuple(out)


class Sink(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One target table of a source, with its own columns and import conditions."""

    name: str
    table: str
    columns: tuple[Column, ...]
    unknown_fields: str = "ignore"
    event_id_field: str | None = None
    partition: str = "day"
    conditions: Conditions = msgspec.field(default_factory=Conditions)
    enabled: bool = True
    partition_by: tuple[str, ...] | None = None
    sort_by: tuple[str, ...] = ()
    table_properties: dict[str, str] = msgspec.field(default_factory=dict)
    created_version: int = 0
    updated_version: int = 0
    deleted_version: int | None = None
    toggles: tuple[Toggle, ...] = ()
    deleted_at: float | None = None
    primary_key: tuple[str, ...] = ()
    tombstone_field: str | None = None
    where: str | None = None
    wheres: tuple[Change, ...] = ()
    """Every value ``where`` had, by version (empty while it never changed)."""
    evolve_quota: EvolveQuota | None = None
    """New columns per client (``unknown_fields = "evolve"``); None: the defaults."""
    mappings: tuple[MappingChange, ...] = ()
    """Every expression (``sql``, ``template``) a column had, by version (empty while none
    changed)."""
    cdc: CdcConfig | None = None
    """A change stream's settings (config-file streams only, so far: docs/cdc.md)."""
    dynamic_tables: DynamicTables | None = None
    """A table template's limits (``table`` a template; None: the defaults)."""

    @property
    def live(self) -> bool:
        return self.deleted_version is None

    def expression_columns(self) -> list[str]:
        """The columns that have (or had, at some version) an expression."""
        names = [c.name for c in self.columns if expression(c) is not None]
        return names + sorted({c.column for c in self.mappings} - set(names))

    def expression_at(self, column: str, version: int) -> Expression | None:
        """The expression of ``column`` for events accepted at registry ``version`` (None:
        the column had none then)."""
        history = tuple(c for c in self.mappings if c.column == column)
        current = next((expression(c) for c in self.columns if c.name == column), None)
        return value_at(history, current, version)

    def where_at(self, version: int) -> str | None:
        """The predicate that applies to events accepted at registry ``version``."""
        return value_at(self.wheres, self.where, version)

    def receives_at(self, version: int) -> bool:
        """Whether events accepted at registry ``version`` go to this sink."""
        if version < self.created_version:
            return False
        if self.deleted_version is not None and version >= self.deleted_version:
            return False
        enabled = True
        for toggle in self.toggles:
            if toggle.version <= version:
                enabled = toggle.enabled
        return enabled

    def stream(self, source: str) -> StreamConfig:
        """The sink as a stream config: what the existing validation, table creation and
        decode understand."""
        return StreamConfig(name=source, table=self.table, columns=self.columns,
                            # (the `in` test below narrows it: the checker does not follow)
                            unknown_fields=self.unknown_fields  # type: ignore[arg-type]
                            if self.unknown_fields in ("reject", "evolve") else "ignore",
                            event_id_field=self.event_id_field,
                            partition=self.partition, partition_by=self.partition_by,
                            sort_by=self.sort_by, table_properties=self.table_properties,
                            primary_key=self.primary_key,
                            tombstone_field=self.tombstone_field, where=self.where,
                            evolve_quota=self.evolve_quota, cdc=self.cdc,
                            dynamic_tables=self.dynamic_tables)


class Source(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An endpoint that accepts events (``/v1/streams/{id}/events``, the gRPC stream name),
    with the hashes of its write tokens and its sinks (tombstones included)."""

    id: str
    sinks: tuple[Sink, ...] = ()
    tokens: tuple[str, ...] = ()
    rate_limit: RateLimit | None = None
    description: str = ""
    created_version: int = 0
    updated_version: int = 0
    deleted_version: int | None = None
    deleted_at: float | None = None
    unrouted: str = "drop"
    unrouteds: tuple[Change, ...] = ()
    """Every value ``unrouted`` had, by version (empty while it never changed)."""
    payload: str = "json"
    """``json`` events, or opaque ``bytes`` entries (see ``StreamConfig.payload``)."""
    on_invalid: str = "reject"
    """Invalid events of a request: ``reject`` it whole, or ``dead_letter`` them."""
    format: str = "json"
    """``json`` events, or a producer's own type: ``protobuf`` or ``avro`` (see
    ``StreamConfig.format``; config-file streams only, so far)."""
    schema: TypedSchema | None = None
    """The type of a ``protobuf`` or ``avro`` source (``StreamConfig.schema``)."""
    kafka_partitions: int = 1
    """The partitions Kafka producers see for this source's topic
    (``StreamConfig.kafka_partitions``)."""

    @property
    def live(self) -> bool:
        return self.deleted_version is None

    def unrouted_at(self, version: int) -> str:
        """What happens to an event accepted at ``version`` that no sink takes."""
        return value_at(self.unrouteds, self.unrouted, version) or "drop"

    def live_sinks(self) -> list[Sink]:
        return [s for s in self.sinks if s.live]

    def sink(self, name: str) -> Sink | None:
        return next((s for s in self.sinks if s.name == name and s.live), None)

    def routes(self, version: int) -> list[Sink]:
        """The sinks events accepted at registry ``version`` are delivered to."""
        return [s for s in self.sinks if s.receives_at(version)]


class Registry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole registry. ``version`` 0 is the empty registry before any write."""

    format: int = FORMAT
    version: int = 0
    updated_at: float = 0.0
    seeded_from: str | None = None
    sources: tuple[Source, ...] = ()

    def encode(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> Registry:
        registry = msgspec.json.decode(data, type=cls)
        if registry.format != FORMAT:
            raise ValueError(f"registry format {registry.format} is not supported (this "
                             f"icefloe reads format {FORMAT}); upgrade icefloe")
        return registry

    def source(self, source_id: str) -> Source | None:
        return next((s for s in self.sources if s.id == source_id and s.live), None)

    def live_sources(self) -> list[Source]:
        return [s for s in self.sources if s.live]

    def owner_of(self, table: str) -> tuple[str, str] | None:
        """``(source, sink)`` of the live sink that writes ``table``, if any."""
        for source in self.live_sources():
            for sink in source.live_sinks():
                if sink.table == table:
                    return source.id, sink.name
        return None

    def next(self, sources: tuple[Source, ...], *, clock: Clock = SYSTEM) -> Registry:
        """The following version with ``sources``, stamped with ``clock``'s time; every
        write changes the bytes."""
        return msgspec.structs.replace(self, version=self.version + 1,
                                       updated_at=clock.time(), sources=sources)
