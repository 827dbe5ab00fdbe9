"""Changes to the registry as pure functions: ``(registry, request) -> next registry``.

Why pure: the store applies them inside a compare-and-swap loop, so after a lost race the
same function runs again on the newer document and its checks (a table owned by another
sink, a 21st sink, a source id taken) always see the latest state. Nothing here touches
the store, the catalog or the network. Every refusal is a :class:`RegistryError` with the
HTTP status, a stable code and the offending fields.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Set
from typing import Any

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Column, RateLimit, validate_stream
from icefloe.config.security import check_hash, validate_rate_limit
from icefloe.errors import ConfigError, RegistryError
from icefloe.registry.model import (
    AGE_RANGE_S,
    BYTES_RANGE,
    EVENTS_RANGE,
    MAX_SINKS,
    Conditions,
    Registry,
    Sink,
    Source,
    Toggle,
    mapping_changes,
    unversioned_change,
    with_change,
)
from icefloe.registry.streams import union_stream
from icefloe.streams.dynamic_tables import is_template, split_template
from icefloe.streams.model import DynamicTables, EvolveQuota
from icefloe.streams.where import UNROUTED

UNSET: Any = msgspec.UNSET
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class SinkSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/sources/{id}/sinks``: a new sink (``name`` left out: made from the table,
    see :func:`named_sink`)."""

    table: str
    name: str = ""
    columns: tuple[Column, ...]
    unknown_fields: str = "ignore"
    event_id_field: str | None = None
    partition: str = "day"
    conditions: Conditions = msgspec.field(default_factory=Conditions)
    enabled: bool = True
    partition_by: tuple[str, ...] | None = None
    sort_by: tuple[str, ...] = ()
    table_properties: dict[str, str] = msgspec.field(default_factory=dict)
    primary_key: tuple[str, ...] = ()
    tombstone_field: str | None = None
    where: str | None = None
    evolve_quota: EvolveQuota | None = None
    cdc: Any = None
    """Refused when given (:func:`refuse_cdc`): change streams are icefloe.toml's, so far."""
    dynamic_tables: DynamicTables | None = None
    """A table template's limits (``table`` a template: checked as icefloe.toml's are)."""


class ConditionsPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A sink PATCH's ``conditions``: only the conditions given change; the others keep
    the sink's values at write time (merged inside the registry's compare-and-swap, so two
    operators changing different conditions keep both changes)."""

    max_age_s: float = UNSET
    max_bytes: int = UNSET
    max_events: int = UNSET

    @classmethod
    def of(cls, conditions: Conditions) -> ConditionsPatch:
        """All three of ``conditions``: a patch that sets them whatever they were."""
        return cls(max_age_s=conditions.max_age_s, max_bytes=conditions.max_bytes,
                   max_events=conditions.max_events)


class SinkPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``PATCH .../sinks/{sink}``: only the fields given change (of ``conditions`` too:
    :class:`ConditionsPatch`). The table and ``partition`` of an existing sink are fixed
    (create another sink to write elsewhere); ``partition_by``, ``sort_by`` and
    ``table_properties`` may change: the collector evolves the table."""

    columns: tuple[Column, ...] = UNSET
    unknown_fields: str = UNSET
    event_id_field: str | None = UNSET
    conditions: ConditionsPatch = UNSET
    enabled: bool = UNSET
    table: str = UNSET
    partition: str = UNSET
    partition_by: tuple[str, ...] | None = UNSET
    sort_by: tuple[str, ...] = UNSET
    table_properties: dict[str, str] = UNSET
    primary_key: tuple[str, ...] = UNSET
    tombstone_field: str | None = UNSET
    where: str | None = UNSET
    evolve_quota: EvolveQuota | None = UNSET
    cdc: Any = UNSET
    dynamic_tables: DynamicTables | None = UNSET


class SourceSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/sources``: a new source, optionally with its first sinks. ``id`` left
    out: made from ``name`` (:func:`named_source`)."""

    id: str = ""
    name: str = ""
    description: str = ""
    tokens: tuple[str, ...] = ()
    rate_limit: RateLimit | None = None
    sinks: tuple[SinkSpec, ...] = ()
    unrouted: str = "drop"
    payload: str = "json"
    on_invalid: str = "reject"
    kafka_partitions: int = 1


class SourcePatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``PATCH /v1/sources/{id}``."""

    description: str = UNSET
    tokens: tuple[str, ...] = UNSET
    rate_limit: RateLimit | None = UNSET
    unrouted: str = UNSET


def _given(patch: msgspec.Struct) -> dict[str, Any]:
    """The fields a PATCH body set (left-out ones stay ``UNSET``)."""
    return {k: getattr(patch, k) for k in patch.__struct_fields__
            if getattr(patch, k) is not UNSET}


def refuse_cdc(value: Any, field: str) -> None:
    """A sink's ``cdc`` through the admin API: refused by name rather than dropped (a
    change stream is declared in icefloe.toml; docs/cdc.md)."""
    if value is not None and value is not UNSET:
        raise invalid(field, "change streams (cdc) are declared in icefloe.toml only, so "
                      "far; the admin API does not create or change them (docs/cdc.md)")


def invalid(field: str, reason: str) -> RegistryError:
    return RegistryError(400, "invalid", f"{field}: {reason}",
                         [{"field": field, "reason": reason}])


def from_config_error(exc: ConfigError) -> RegistryError:
    """``sinks[0].columns[1].type: unknown type 'x' ...`` → field + reason."""
    text = str(exc)
    field, _, reason = text.partition(": ")
    return invalid(field, reason) if reason else invalid("body", text)


def not_found(what: str, name: str) -> RegistryError:
    return RegistryError(404, "not_found", f"no {what} {name!r}")


def check_conditions(conditions: Conditions, at: str) -> None:
    for key, (low, high), unit in (("max_age_s", AGE_RANGE_S, "s"),
                                   ("max_bytes", BYTES_RANGE, "bytes"),
                                   ("max_events", EVENTS_RANGE, "events")):
        value = getattr(conditions, key)
        if not low <= value <= high:
            shown = str(value) if len(str(value)) <= 24 else f"{str(value)[:20]}..."
            raise invalid(f"{at}.conditions.{key}",
                          f"{shown} is out of range ({low:g} to {high:g} {unit})")


def check_sink(source_id: str, sink: Sink, at: str) -> None:
    if not _ID.fullmatch(sink.name):
        raise invalid(f"{at}.name", f"{sink.name!r} must be 1-128 letters, digits, '_', '-' "
                      "or '.'")
    if sink.unknown_fields not in ("ignore", "reject", "evolve"):
        raise invalid(f"{at}.unknown_fields",
                      f"{sink.unknown_fields!r} must be 'ignore', 'reject' or 'evolve'")
    try:  # a table template and its limits: the checks (and messages) of icefloe.toml
        validate_stream(sink.stream(source_id), at)
    except ConfigError as exc:
        raise from_config_error(exc) from None
    check_conditions(sink.conditions, at)


MAX_TOKENS = 20
MAX_DESCRIPTION = 1000


def _check_source_fields(source: Source, at: str) -> None:
    if len(source.description) > MAX_DESCRIPTION:
        raise invalid(f"{at}description", f"at most {MAX_DESCRIPTION} characters")
    if len(source.tokens) > MAX_TOKENS:
        raise invalid(f"{at}tokens", f"at most {MAX_TOKENS} tokens per source")
    if source.unrouted not in UNROUTED:
        raise invalid(f"{at}unrouted", f"{source.unrouted!r} must be one of "
                      f"{', '.join(UNROUTED)}")
    for key, allowed in (("payload", ("json", "bytes")),
                         ("on_invalid", ("reject", "dead_letter"))):
        if getattr(source, key) not in allowed:
            raise invalid(f"{at}{key}", f"{getattr(source, key)!r} must be one of "
                          f"{', '.join(allowed)}")
    if not 1 <= source.kafka_partitions <= 10_000:
        raise invalid(f"{at}kafka_partitions", f"{source.kafka_partitions} is not 1-10000 "
                      "(the partitions Kafka producers see for this source's topic)")
    if not _ID.fullmatch(source.id):
        raise invalid(f"{at}id", f"{source.id!r} must be 1-128 letters, digits, '_', '-' or '.'")
    try:
        for i, entry in enumerate(source.tokens):
            check_hash(entry, f"{at}tokens[{i}]")
        if source.rate_limit is not None:
            validate_rate_limit(source.rate_limit, f"{at}rate_limit")
    except ConfigError as exc:
        raise from_config_error(exc) from None


def _check_owner(registry: Registry, table: str, source_id: str, sink: str, at: str) -> None:
    owner = registry.owner_of(table)
    if owner is not None and owner != (source_id, sink):
        raise RegistryError(409, "table_owned", f"{at}.table: {table} is written by sink "
                            f"{owner[1]!r} of source {owner[0]!r} already",
                            [{"field": f"{at}.table", "reason": "owned by another sink"}])


def _check_namespace(registry: Registry, table: str, source_id: str, sink: str,
                     at: str) -> None:
    """A table template's namespace is its own, as icefloe.toml's check says
    (:func:`icefloe.config.validate.check_template_namespaces`): in ``registry`` (with the
    change applied), no other live sink may write a table in the namespace of a template,
    the sink's own or another's (so a value never lands in another sink's table, and
    ``max_tables`` counts the template's tables only)."""
    namespace = table.partition(".")[0]
    for source in registry.live_sources():
        for other in source.live_sinks():
            if (source.id, other.name) == (source_id, sink) or \
                    other.table.partition(".")[0] != namespace:
                continue
            if is_template(other.table):
                owner = (f"belongs to the table template {other.table!r} of sink "
                         f"{other.name!r} of source {source.id!r}")
            elif is_template(table):
                owner = (f"holds table {other.table!r} of sink {other.name!r} of source "
                         f"{source.id!r} already")
            else:
                continue
            raise RegistryError(409, "namespace_owned", f"{at}.table: namespace "
                                f"{namespace!r} {owner}; a template's namespace holds its "
                                "tables only: choose another namespace",
                                [{"field": f"{at}.table", "reason": "namespace owned"}])


def _check_count(source: Source, at: str) -> None:
    if len(source.live_sinks()) > MAX_SINKS:
        raise RegistryError(409, "too_many_sinks", f"{at}: a source has at most {MAX_SINKS} "
                            "sinks; delete one first",
                            [{"field": at, "reason": f"more than {MAX_SINKS} sinks"}])


def _check_union(registry: Registry, source: Source) -> None:
    """The live sinks must agree on shared columns (see :mod:`icefloe.registry.streams`),
    and so must every sink this source id ever had: queued events of a deleted sink (or
    of an earlier source with this id) are decoded with the same column types as the new
    ones, so a column name keeps its type and mapping for the life of the source id."""
    if source.live_sinks():
        union_stream(source, source.live_sinks())
    history = [s for record in registry.sources if record.id == source.id
               and record is not registry.source(source.id) for s in record.sinks]
    history += [s for s in source.sinks if not s.live]
    current = source.live_sinks()
    if history and current:
        try:
            union_stream(source, [*history, *current], expression_texts=False)
        except RegistryError as exc:
            raise RegistryError(409, "column_conflict", f"{exc} (a deleted sink of source "
                                f"{source.id!r} declared it: its events may still be queued "
                                "and are decoded with the same types; use another column "
                                "name, or another source id)", exc.details) from None


def matches(sink: Sink, spec: SinkSpec) -> bool:
    """Whether ``sink`` is what ``spec`` asked for: a create whose write landed but whose
    answer was lost finds its own sink on the retry, which is success, not a conflict."""
    return all(getattr(sink, k) == getattr(spec, k) for k in spec.__struct_fields__)


def _new_sink(spec: SinkSpec, version: int) -> Sink:
    return Sink(name=spec.name, table=spec.table, columns=spec.columns,
                unknown_fields=spec.unknown_fields, event_id_field=spec.event_id_field,
                partition=spec.partition, conditions=spec.conditions, enabled=spec.enabled,
                partition_by=spec.partition_by, sort_by=spec.sort_by,
                table_properties=spec.table_properties,
                primary_key=spec.primary_key, tombstone_field=spec.tombstone_field,
                created_version=version, updated_version=version,
                toggles=() if spec.enabled else (Toggle(version, False),), where=spec.where,
                evolve_quota=spec.evolve_quota, dynamic_tables=spec.dynamic_tables)


def _replace_source(registry: Registry, source: Source) -> tuple[Source, ...]:
    """The sources with the live one of ``source.id`` replaced (or ``source`` added)."""
    out = [source if (s.id == source.id and s.live) else s for s in registry.sources]
    if not any(s.id == source.id and s.live for s in registry.sources):
        out.append(source)
    return tuple(out)


def _live_source(registry: Registry, source_id: str) -> Source:
    source = registry.source(source_id)
    if source is None:
        raise not_found("source", source_id)
    return source


# ------------------------------------------------------------------------- ids from names

_NOT_ID = re.compile(r"[^a-z0-9]+")


def slug(name: str) -> str:
    """The id made from a name: accents folded to ASCII, lower case, every run of other
    characters one ``-``, no ``-`` at either end, at most 128 characters
    (``"Web Events (EU)"`` → ``web-events-eu``). Empty when nothing is left."""
    folded = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    return _NOT_ID.sub("-", folded.lower()).strip("-")[:128].rstrip("-")


def named_source(spec: SourceSpec) -> SourceSpec:
    """``spec`` with its id: the given one, else made from ``name``; a ``name`` also
    becomes the description, unless one is given (with an id too: never dropped without a
    word). Its sinks get theirs too."""
    sinks = tuple(named_sink(s, f"sinks[{i}]") for i, s in enumerate(spec.sinks))
    if spec.id:
        return msgspec.structs.replace(spec, sinks=sinks,
                                       description=spec.description or spec.name)
    if not spec.name:
        raise invalid("id", "give an id, or a name to make it from")
    made = slug(spec.name)
    if not made:
        raise invalid("name", f"{spec.name[:40]!r} has no letter or digit to make an id "
                      "from; give an id")
    return msgspec.structs.replace(spec, id=made, description=spec.description or spec.name,
                                   sinks=sinks)


def named_sink(spec: SinkSpec, at: str = "sink") -> SinkSpec:
    """``spec`` with its name (the sink's id): the given one, else made from the table
    (``web.page_views`` stays ``web.page_views``; other characters as :func:`slug`)."""
    if spec.name:
        return spec
    made = spec.table if _ID.fullmatch(spec.table) else slug(spec.table)
    if not made:
        raise invalid(f"{at}.name", "give a name, or a table to make it from")
    return msgspec.structs.replace(spec, name=made)


def _taken(spec: SourceSpec) -> RegistryError:
    made = bool(spec.name) and spec.id == slug(spec.name)
    how = f" (made from name {spec.name!r}; give another name or an explicit id)" \
        if made else ""
    return RegistryError(409, "exists", f"source {spec.id!r} exists already{how}",
                         [{"field": "name" if made else "id", "reason": "taken"}])


# ------------------------------------------------------------------------------ sources


def create_source(registry: Registry, spec: SourceSpec, *, clock: Clock = SYSTEM) -> Registry:
    spec = named_source(spec)
    version = registry.version + 1
    if registry.source(spec.id) is not None:
        raise _taken(spec)
    for i, given in enumerate(spec.sinks):
        refuse_cdc(given.cdc, f"sinks[{i}].cdc")
    sinks = tuple(_new_sink(s, version) for s in spec.sinks)
    source = Source(id=spec.id, sinks=sinks, tokens=spec.tokens, rate_limit=spec.rate_limit,
                    description=spec.description, created_version=version,
                    updated_version=version, unrouted=spec.unrouted, payload=spec.payload,
                    on_invalid=spec.on_invalid, kafka_partitions=spec.kafka_partitions)
    _check_source_fields(source, "")
    _check_count(source, "sinks")
    _check_union(registry, source)
    names: set[str] = set()
    tables: set[str] = set()
    for i, sink in enumerate(sinks):
        at = f"sinks[{i}]"
        check_sink(source.id, sink, at)
        if sink.name in names:
            raise invalid(f"{at}.name", f"duplicate sink {sink.name!r}")
        if sink.table in tables:
            raise RegistryError(409, "table_owned", f"{at}.table: {sink.table} is written "
                                "by another sink of this source already")
        names.add(sink.name)
        tables.add(sink.table)
        _check_owner(registry, sink.table, source.id, sink.name, at)
    made = registry.next(_replace_source(registry, source), clock=clock)
    for i, sink in enumerate(sinks):
        _check_namespace(made, sink.table, source.id, sink.name, f"sinks[{i}]")
    return made


def update_source(registry: Registry, source_id: str, patch: SourcePatch, *,
                  clock: Clock = SYSTEM) -> Registry:
    source = _live_source(registry, source_id)
    changes = _given(patch)
    if not changes:
        return registry
    version = registry.version + 1
    if "unrouted" in changes and changes["unrouted"] != source.unrouted:
        changes["unrouteds"] = with_change(source.unrouteds, source.unrouted,
                                           changes["unrouted"], source.created_version,
                                           version)
    updated = msgspec.structs.replace(source, updated_version=version, **changes)
    _check_source_fields(updated, "")
    return registry.next(_replace_source(registry, updated), clock=clock)


def delete_source(registry: Registry, source_id: str, *, clock: Clock = SYSTEM) -> Registry:
    """Tombstone the source and its sinks: events accepted before this version are still
    routed to them, none after (the caller checks for undelivered data first)."""
    source = _live_source(registry, source_id)
    version = registry.version + 1
    now = clock.time()
    sinks = tuple(s if not s.live else msgspec.structs.replace(s, deleted_version=version,
                                                               deleted_at=now)
                  for s in source.sinks)
    gone = msgspec.structs.replace(source, sinks=sinks, deleted_version=version,
                                   updated_version=version, tokens=(), deleted_at=now)
    return registry.next(tuple(gone if s is source else s for s in registry.sources),
                         clock=clock)


def set_tokens(registry: Registry, source_id: str, hashes: tuple[str, ...], *,
               clock: Clock = SYSTEM) -> Registry:
    return update_source(registry, source_id, SourcePatch(tokens=hashes), clock=clock)


# -------------------------------------------------------------------------------- sinks


def create_sink(registry: Registry, source_id: str, spec: SinkSpec, *,
                clock: Clock = SYSTEM) -> Registry:
    source = _live_source(registry, source_id)
    spec = named_sink(spec)
    version = registry.version + 1
    if source.sink(spec.name) is not None:
        raise RegistryError(409, "exists", f"source {source_id!r} has a sink {spec.name!r} "
                            "already", [{"field": "name", "reason": "taken"}])
    refuse_cdc(spec.cdc, "sink.cdc")
    sink = _new_sink(spec, version)
    check_sink(source_id, sink, "sink")
    _check_owner(registry, sink.table, source_id, sink.name, "sink")
    updated = msgspec.structs.replace(source, sinks=(*source.sinks, sink),
                                      updated_version=version)
    _check_count(updated, "sinks")
    _check_union(registry, updated)
    made = registry.next(_replace_source(registry, updated), clock=clock)
    _check_namespace(made, sink.table, source_id, sink.name, "sink")
    return made


def update_sink(registry: Registry, source_id: str, name: str, patch: SinkPatch, *,
                clock: Clock = SYSTEM) -> Registry:
    source = _live_source(registry, source_id)
    sink = source.sink(name)
    if sink is None:
        raise not_found("sink", f"{source_id}/{name}")
    changes = _given(patch)
    refuse_cdc(changes.pop("cdc", None), "sink.cdc")
    if "conditions" in changes:  # the given ones (a full Conditions: all three)
        changes["conditions"] = msgspec.structs.replace(sink.conditions,
                                                        **_given(changes["conditions"]))
    for fixed in ("table", "partition"):
        if fixed in changes and changes[fixed] != getattr(sink, fixed):
            raise invalid(f"sink.{fixed}", f"the {fixed} of a sink cannot change; create a "
                          "new sink (and delete this one) instead")
    for keyed in ("primary_key", "tombstone_field"):
        if keyed in changes and changes[keyed] != getattr(sink, keyed):
            raise RegistryError(409, "primary_key_fixed", f"sink.{keyed}: the upsert key of "
                                "a live table cannot change: rows already committed were "
                                "made unique by the old key, and queued entries would be "
                                "applied by the new one; create a new sink (and table) "
                                "instead", [{"field": keyed, "reason": "fixed"}])
    version = registry.version + 1
    toggles = sink.toggles
    if "enabled" in changes and changes["enabled"] != sink.enabled:
        toggles = (*toggles, Toggle(version, changes["enabled"]))
    if all(changes.get(k, getattr(sink, k)) == getattr(sink, k) for k in changes):
        return registry  # nothing changes: no new version
    if "where" in changes and changes["where"] != sink.where:
        changes["wheres"] = with_change(sink.wheres, sink.where, changes["where"],
                                        sink.created_version, version)
    if "columns" in changes and changes["columns"] != sink.columns:
        _check_mappings(sink, changes["columns"])
        changes["mappings"] = mapping_changes(sink.mappings, sink.columns,
                                              changes["columns"], sink.created_version,
                                              version)
    updated = msgspec.structs.replace(sink, updated_version=version, toggles=toggles,
                                      **changes)
    check_sink(source_id, updated, "sink")
    sinks = tuple(updated if s is sink else s for s in source.sinks)
    changed = msgspec.structs.replace(source, sinks=sinks, updated_version=version)
    _check_union(registry, changed)
    return registry.next(_replace_source(registry, changed), clock=clock)


def _check_mappings(sink: Sink, columns: tuple[Column, ...]) -> None:
    """Refuse a PATCH that changes how the collector computes a column in a way the sink
    cannot keep by version (:func:`unversioned_change`): the events already queued would
    silently get the new mapping's value (another ``from``, another header, an expression
    turned into a field)."""
    old = {c.name: c for c in sink.columns}
    for column in columns:
        before = old.get(column.name)
        if before is not None and unversioned_change(before, column):
            raise RegistryError(409, "mapping_fixed", f"sink.columns.{column.name}: its "
                                f"mapping ({before.mapping or 'field'}) cannot become "
                                f"{column.mapping or 'a field'}: the collector computes it "
                                "from events already queued, which were accepted under the "
                                "old mapping; only a sql or template expression can change "
                                "(each event keeps its version's); add a column with "
                                "another name instead",
                                [{"field": f"columns.{column.name}",
                                  "reason": "mapping cannot change"}])


def set_sink_enabled(registry: Registry, source_id: str, name: str, enabled: bool, *,
                     clock: Clock = SYSTEM) -> Registry:
    return update_sink(registry, source_id, name, SinkPatch(enabled=enabled), clock=clock)


def nudge(registry: Registry, *, clock: Clock = SYSTEM) -> Registry:
    """The same registry one version later: nothing routes differently, but every collector
    that reads the version retries its parked tables' staged rows at once (an operator's
    "I fixed it outside icefloe": a restored metadata file, a dropped column put back)."""
    return msgspec.structs.replace(registry, version=registry.version + 1,
                                   updated_at=clock.time())


def delete_sink(registry: Registry, source_id: str, name: str, *,
                clock: Clock = SYSTEM) -> Registry:
    source = _live_source(registry, source_id)
    sink = source.sink(name)
    if sink is None:
        raise not_found("sink", f"{source_id}/{name}")
    version = registry.version + 1
    now = clock.time()
    sinks = tuple(msgspec.structs.replace(s, deleted_version=version, deleted_at=now)
                  if s is sink else s for s in source.sinks)
    return registry.next(_replace_source(registry, msgspec.structs.replace(
        source, sinks=sinks, updated_version=version)), clock=clock)


# ------------------------------------------------------------------------------ pruning


def prune(registry: Registry, *, now: float, grace_s: float, clock: Clock = SYSTEM,
          oldest_pending: Mapping[str, int], staged_tables: Set[str]) -> Registry:
    """Drop tombstones nothing can need any more, so the registry stays small under churn.

    A deleted sink (or source) is kept while an unacknowledged manifest entry of its source
    was accepted before the deletion (``oldest_pending``: source id → lowest registry
    version among its pending entries), while its table has staged rows, and for
    ``grace_s`` after the deletion — an ingestor that has not yet seen the deletion may
    still accept events under the older version for a moment. Returns ``registry`` itself
    when nothing can go (no new version).
    """
    def needed(source_id: str, deleted_version: int | None, deleted_at: float | None,
               tables: list[str]) -> bool:
        if deleted_version is None:
            return True
        if deleted_at is None or now - deleted_at < grace_s:
            return True
        pending = oldest_pending.get(source_id)
        if pending is not None and pending < deleted_version:
            return True
        return any(_stages(t, staged_tables) for t in tables)

    changed = False
    sources: list[Source] = []
    for source in registry.sources:
        sinks = tuple(s for s in source.sinks
                      if needed(source.id, s.deleted_version, s.deleted_at, [s.table]))
        if len(sinks) != len(source.sinks):
            changed = True
        if source.live or sinks or needed(source.id, source.deleted_version,
                                          source.deleted_at, []):
            sources.append(msgspec.structs.replace(source, sinks=sinks))
        else:
            changed = True
    return registry.next(tuple(sources), clock=clock) if changed else registry


def _stages(table: str, staged_tables: Set[str]) -> bool:
    """Whether ``table`` has staged rows: itself, or for a table template any table of it
    (staging is per concrete table, ``tenants.events_acme`` of ``tenants.events_{tenant}``)."""
    if not is_template(table):
        return table in staged_tables
    try:
        template = split_template(table)
    except ValueError:
        return True  # a template this icefloe cannot read: keep its tombstone
    pattern = template.pattern()
    prefix = template.namespace + "."
    return any(t.startswith(prefix) and pattern.fullmatch(t[len(prefix):]) is not None
               for t in staged_tables)


# ------------------------------------------------------------------------------ seeding


def seed_specs(streams: Any) -> list[SourceSpec]:
    """One source per configured stream, with one sink (named after the stream) that has
    the stream's table and columns: what ``icefloe.toml`` puts into an empty registry."""
    return [SourceSpec(id=s.name, tokens=s.tokens, rate_limit=s.rate_limit,
                       unrouted=s.unrouted, payload=s.payload, on_invalid=s.on_invalid,
                       kafka_partitions=s.kafka_partitions, sinks=(
        SinkSpec(name=s.name, table=s.table, columns=s.columns,
                 unknown_fields=s.unknown_fields, event_id_field=s.event_id_field,
                 partition=s.partition, partition_by=s.partition_by, sort_by=s.sort_by,
                 table_properties=s.table_properties, primary_key=s.primary_key,
                 tombstone_field=s.tombstone_field, where=s.where,
                 evolve_quota=s.evolve_quota, dynamic_tables=s.dynamic_tables),))
            for s in streams]
