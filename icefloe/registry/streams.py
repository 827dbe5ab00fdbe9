"""From registry to what ingestors and the collector run: one stream per source, and the
sinks each manifest entry goes to.

Why one *union* stream per source: the ingestor validates and normalizes an event once,
when it is accepted, whatever sinks it will reach; the collector decodes a source's events
once per run and hands each sink its own columns. So a source's accepted shape is the union
of its sinks' columns: a column has one type and one mapping across the sinks (a clash is
refused when the sink is created), it is required if any sink requires it, unknown fields
are rejected only if every sink rejects them.

Without a registry object (nobody ran ``icefloe admin``), :func:`config_registry` turns the
config's ``[[streams]]`` into an equivalent registry at version 0, so the same code serves
both modes and a stream's entries route to its one table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from icefloe.config import Column, Config, StreamConfig
from icefloe.errors import RegistryError
from icefloe.registry.model import Registry, Sink, Source, expression


def union_stream(source: Source, sinks: Sequence[Sink], *, lenient: bool = False,
                 expression_texts: bool = True) -> StreamConfig:
    """The stream an ingestor validates ``source``'s events against (see module doc).

    Raises :class:`RegistryError` (409 ``column_conflict``) when two sinks declare a
    column differently, naming both sinks — unless ``lenient``, where the later sink's
    declaration wins (the collector's decode over deleted and live sinks alike).
    Without ``expression_texts``, two ``sql`` or two ``template`` columns of one name agree
    whatever their expression (sinks of different versions: each event takes its own
    version's, :meth:`Sink.expression_at`); live sinks must agree on it, since one event
    gets one value per column.
    """
    columns: dict[str, Column] = {}
    owner: dict[str, str] = {}
    id_field: str | None = None
    for sink in sinks:
        for column in sink.columns:
            seen = columns.get(column.name)
            if seen is None:
                columns[column.name], owner[column.name] = column, sink.name
                continue
            differ = _shape(seen, expression_texts) != _shape(column, expression_texts)
            if differ and lenient:
                columns[column.name], owner[column.name] = column, sink.name
                continue
            if differ:
                raise RegistryError(409, "column_conflict", f"column {column.name!r} is "
                                    f"declared differently by sinks {owner[column.name]!r} and "
                                    f"{sink.name!r} of source {source.id!r}; a source's sinks "
                                    "must agree on the type and mapping of shared columns",
                                    [{"field": f"columns.{column.name}",
                                      "reason": "differs from another sink"}])
            if column.required and not seen.required:
                columns[column.name] = msgspec.structs.replace(seen, required=True)
        if sink.event_id_field is not None:
            if id_field is not None and id_field != sink.event_id_field and not lenient:
                raise RegistryError(409, "column_conflict", f"sinks of source {source.id!r} "
                                    f"name different event id fields ({id_field!r}, "
                                    f"{sink.event_id_field!r})",
                                    [{"field": "event_id_field", "reason": "differs"}])
            id_field = sink.event_id_field
    reject = bool(sinks) and all(s.unknown_fields == "reject" for s in sinks)
    evolve = any(s.unknown_fields == "evolve" for s in sinks)  # kept if any sink adds them
    table = sinks[0].table if sinks else f"icefloe.{source.id.replace('.', '_')}"
    return StreamConfig(name=source.id, table=table, columns=tuple(columns.values()),
                        unknown_fields="evolve" if evolve else "reject" if reject
                        else "ignore", tokens=source.tokens, event_id_field=id_field,
                        rate_limit=source.rate_limit,
                        payload="bytes" if source.payload == "bytes" else "json",
                        on_invalid="dead_letter" if source.on_invalid == "dead_letter"
                        else "reject", format=_format(source.format), schema=source.schema,
                        kafka_partitions=source.kafka_partitions,
                        cdc=next((s.cdc for s in sinks if s.cdc is not None), None))


def _format(value: str) -> Literal["json", "protobuf", "avro"]:
    if value == "protobuf":
        return "protobuf"
    return "avro" if value == "avro" else "json"


def _shape(column: Column, expression_texts: bool = True) -> tuple[object, ...]:
    computed = expression(column)
    kind = computed if expression_texts or computed is None else computed.kind
    return (column.type, column.path, column.header, column.source, column.default,
            column.raw, kind)


def source_streams(registry: Registry) -> list[StreamConfig]:
    """One union stream per live source: what an ingestor accepts. A source without live
    sinks has nothing to validate against or deliver to, so it is left out (404)."""
    out = []
    for source in registry.live_sources():
        sinks = source.live_sinks()
        if sinks:
            out.append(union_stream(source, sinks))
    return out


def routing_streams(registry: Registry) -> list[StreamConfig]:
    """One stream per source id over *every* sink any of its records ever had (tombstones
    included): what the collector decodes, since queued entries may predate a deletion or
    a re-creation. Live sinks come last, so on a clash their declaration wins."""
    records: dict[str, list[Source]] = {}
    for source in sorted(registry.sources, key=lambda s: (s.live, s.created_version)):
        records.setdefault(source.id, []).append(source)
    streams = []
    for group in records.values():
        sinks = sorted((sink for source in group for sink in source.sinks),
                       key=lambda s: (s.live, s.created_version))
        if sinks:
            streams.append(union_stream(group[-1], sinks, lenient=True,
                                        expression_texts=False))
    return streams


def config_registry(streams: Iterable[StreamConfig]) -> Registry:
    """The registry equivalent of config-only streams (version 0, everything since 0)."""
    sources = tuple(Source(id=s.name, tokens=s.tokens, rate_limit=s.rate_limit,
                           unrouted=s.unrouted, payload=s.payload, on_invalid=s.on_invalid,
                           format=s.format, schema=s.schema,
                           kafka_partitions=s.kafka_partitions, sinks=(
        Sink(name=s.name, table=s.table, columns=s.columns, unknown_fields=s.unknown_fields,
             event_id_field=s.event_id_field, partition=s.partition, partition_by=s.partition_by,
             sort_by=s.sort_by, table_properties=s.table_properties,
             primary_key=s.primary_key, tombstone_field=s.tombstone_field,
             where=s.where, evolve_quota=s.evolve_quota, cdc=s.cdc,
             dynamic_tables=s.dynamic_tables),)) for s in streams)
    return Registry(version=0, sources=sources)


def effective_config(config: Config, registry: Registry | None) -> Config:
    """``config`` with the registry's sources as its streams (unchanged without one)."""
    if registry is None or registry.version == 0:
        return config
    return msgspec.structs.replace(config, streams=tuple(source_streams(registry)))
