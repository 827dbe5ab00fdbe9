"""A source's and a sink's settings as flat ``key``/``value`` pairs (the admin API's
``/settings`` resources).

Why a second view of the same fields: tools written for Keboola's Data Streams read and
patch settings as a list of dotted keys (``conditions.max_age_s``), each with its type,
default and whether it was changed. Here a settings patch becomes the ordinary
:class:`~icefloe.registry.ops.SourcePatch` / :class:`~icefloe.registry.ops.SinkPatch`
*inside* the compare-and-swap function, so a partial change (one condition of three) is
merged with the sink as it is in the registry at write time, and every check of the
create/update paths applies unchanged. A ``null`` value resets a key to its default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.config import RateLimit
from icefloe.errors import RegistryError
from icefloe.registry import ops
from icefloe.registry.model import Conditions, Registry, Sink, Source


class SettingPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``{"key": ..., "value": ...}`` of a settings PATCH (``value`` null: default)."""

    key: str
    value: Any = None


class SettingsPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``PATCH /v1/sources/{id}/settings`` and ``.../sinks/{sink}/settings``."""

    settings: tuple[SettingPatch, ...]


@dataclass(frozen=True)
class Key:
    """A setting: its JSON type (``number``, ``integer``, ``string``, ``boolean``), what it
    does and its default."""

    name: str
    type: str
    description: str
    default: Any


SOURCE_KEYS = (
    Key("description", "string", "free text shown with the source", ""),
    Key("rate_limit.events_per_s", "number",
        "events per second per ingestor (null: unbounded)", None),
    Key("rate_limit.bytes_per_s", "number",
        "canonical event bytes per second per ingestor (null: unbounded)", None),
    Key("rate_limit.burst_s", "number", "seconds' worth of rate a quiet client may send "
        "at once", 1.0),
    Key("unrouted", "string", "an event no sink's where takes: drop or dead_letter (always "
        "counted)", "drop"),
)
SINK_KEYS = (
    Key("conditions.max_age_s", "number", "import when the oldest waiting event is this "
        "old (1 s to 24 h)", Conditions().max_age_s),
    Key("conditions.max_bytes", "integer", "import when waiting data reaches this many "
        "bytes (100 B to 500 MB)", Conditions().max_bytes),
    Key("conditions.max_events", "integer", "import when this many events wait (1 to 10 M)",
        Conditions().max_events),
    Key("unknown_fields", "string", "fields the sink does not declare: ignore, reject, or evolve "
        "(add them as columns)",
        "ignore"),
    Key("enabled", "boolean", "deliver to this sink", True),
    Key("where", "string", "SQL predicate: only events it holds for reach this sink (null: "
        "every event)", None),
)
_PY_TYPES: dict[str, tuple[type, ...]] = {"number": (int, float), "integer": (int,),
                                          "string": (str,), "boolean": (bool,)}


def _value(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = None if obj is None else getattr(obj, part)
    return obj


def _listing(keys: tuple[Key, ...], obj: Any) -> list[dict[str, Any]]:
    out = []
    for key in keys:
        value = _value(obj, key.name)
        out.append({"key": key.name, "type": key.type, "description": key.description,
                    "value": value, "default": key.default,
                    "overwritten": value != key.default})
    return out


def source_settings(source: Source) -> list[dict[str, Any]]:
    return _listing(SOURCE_KEYS, source)


def sink_settings(sink: Sink) -> list[dict[str, Any]]:
    return _listing(SINK_KEYS, sink)


def _checked(patch: SettingsPatch, keys: tuple[Key, ...]) -> dict[str, Any]:
    """``{key: value}`` of the patch, with unknown keys, repeats and wrong types refused
    (400 naming ``settings[i].key`` or the key itself)."""
    known = {k.name: k for k in keys}
    out: dict[str, Any] = {}
    for i, item in enumerate(patch.settings):
        key = known.get(item.key)
        if key is None:
            raise ops.invalid(f"settings[{i}].key", f"unknown setting {item.key!r} (known: "
                              f"{', '.join(known)})")
        if item.key in out:
            raise ops.invalid(f"settings[{i}].key", f"{item.key!r} is given twice")
        value = key.default if item.value is None else item.value
        wrong_bool = isinstance(value, bool) and key.type != "boolean"
        if value is not None and (wrong_bool or not isinstance(value, _PY_TYPES[key.type])):
            raise ops.invalid(item.key, f"expected a {key.type}, got {value!r:.40}")
        out[item.key] = value
    if not out:
        raise ops.invalid("settings", "give at least one {\"key\", \"value\"}")
    return out


def _renamed(exc: RegistryError) -> RegistryError:
    """Errors of the update paths name ``sink.conditions.x``; settings name ``conditions.x``."""
    details = [{**d, "field": d["field"].removeprefix("sink.")} for d in exc.details]
    return RegistryError(exc.status, exc.code, str(exc).removeprefix("sink."), details)


def update_source_settings(registry: Registry, source_id: str, patch: SettingsPatch, *,
                           clock: Clock = SYSTEM) -> Registry:
    values = _checked(patch, SOURCE_KEYS)
    source = registry.source(source_id)
    if source is None:
        raise ops.not_found("source", source_id)
    changes: dict[str, Any] = {}
    for key in ("description", "unrouted"):
        if key in values:
            changes[key] = values[key]
    limits = {k.removeprefix("rate_limit."): v for k, v in values.items()
              if k.startswith("rate_limit.")}
    for key, value in limits.items():
        if value is not None and not value > 0:
            raise ops.invalid(f"rate_limit.{key}", f"{value!r} must be > 0")
    if limits:
        base = source.rate_limit or RateLimit()
        limit = msgspec.structs.replace(base, **limits)
        changes["rate_limit"] = None if limit.events_per_s is None and \
            limit.bytes_per_s is None else limit
    return ops.update_source(registry, source_id, ops.SourcePatch(**changes), clock=clock)


def update_sink_settings(registry: Registry, source_id: str, name: str,
                         patch: SettingsPatch, *, clock: Clock = SYSTEM) -> Registry:
    values = _checked(patch, SINK_KEYS)
    source = registry.source(source_id)
    if source is None:
        raise ops.not_found("source", source_id)
    sink = source.sink(name)
    if sink is None:
        raise ops.not_found("sink", f"{source_id}/{name}")
    changes: dict[str, Any] = {k: v for k, v in values.items() if "." not in k}
    conditions = {k.removeprefix("conditions."): v for k, v in values.items()
                  if k.startswith("conditions.")}
    if conditions:
        changes["conditions"] = msgspec.structs.replace(sink.conditions, **conditions)
    try:
        return ops.update_sink(registry, source_id, name, ops.SinkPatch(**changes),
                               clock=clock)
    except RegistryError as exc:
        raise _renamed(exc) from None
