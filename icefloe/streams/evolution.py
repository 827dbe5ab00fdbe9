"""Schema evolution from the data: which columns a run's unknown fields add, and which
events cannot land.

Why here, pure and apart from any table library: the ingestor only *keeps* the fields a
stream with ``unknown_fields = "evolve"`` does not declare (it has no table access), and
the collector decides per run, against the table's current schema, what to add. The rules
are a documented table, so they live in one place both the collector and the tests read:

===========================  =====================================================
JSON value                   column type
===========================  =====================================================
integer                      ``long`` (beyond the long range: refused)
other number                 ``double``
``true``/``false``           ``boolean``
string                       ``string`` (no date guessing)
object                       ``struct<...>`` (``json`` if a key is not an identifier)
array                        ``list<T>`` (``json`` if the elements' shapes differ)
``null`` only                no column yet: it waits for a non-null value
===========================  =====================================================

Within one run, integers and other numbers merge to ``double``; objects or arrays whose
shape varies between events become ``json``. A value that does not fit its column (a string
in a ``long`` column, a fraction in a ``long`` column, a member a ``struct`` column lacks) is
never cast: its event is refused with the reason, and the collector dead-letters it. Only
the widenings Iceberg allows happen: an ``int`` column meeting a larger integer becomes
``long``, a ``float`` column meeting a value a float cannot hold becomes ``double``.

An event is refused (dead-lettered), never half-kept, when one of its new fields breaks a
rule: a name that is not an identifier, longer than :attr:`EvolveLimits.max_name_length`,
reserved, or equal to another column's name but for case (Spark ignores case); a value
nested deeper than :attr:`EvolveLimits.max_depth`.

A new field that finds no room — a column that would take the table past
:attr:`EvolveLimits.max_columns`, or one its client's evolution quota does not allow (the
``admit`` callback of :func:`plan_observed`, see :mod:`icefloe.streams.evolve_quota`) — does
not refuse the event when the caller keeps an overflow (``plan_run(..., overflow=True)``):
the event lands with its declared and already-evolved columns, and such fields go to the
table's :data:`OVERFLOW` json column. Why: one client filling the table must never cost
another client its declared columns.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import msgspec

from icefloe.streams.typespec import TypeSpec, parse_type

EXTRA_FIELD = "_icefloe_extra"
"""The payload member in which an ingestor keeps an evolving stream's undeclared fields:
a JSON string holding one JSON object (``"{\\"plan\\":\\"pro\\"}"``). The collector reads it
as a ``json`` column, so the decode needs no change; it never reaches a table."""
CLIENT_FIELD = "_icefloe_client"
"""The payload member in which an ingestor names the write token (its config name, never
the token) of an event it kept undeclared fields of; absent without a token. The collector
charges the columns such an event adds to that client (:mod:`icefloe.streams.evolve_quota`)."""
OVERFLOW = "_overflow"
"""The ``json`` column an evolving table gets when a run has new fields with no room (over
``evolve_max_columns`` or a client's quota): per row the JSON object of those fields, null
when none. ``icefloe deadletters redrive --overflow`` moves them into columns later."""
RESERVED = frozenset({EXTRA_FIELD, CLIENT_FIELD, OVERFLOW, "_event_id", "_received_at",
                      "_sequence", "_shard", "_source"})
"""Names a new column may not take (compared without case): icefloe's own columns."""
_RESERVED_LOWER = frozenset(name.lower() for name in RESERVED)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LONG = (-(2**63), 2**63 - 1)
_INT = (-(2**31), 2**31 - 1)

# An inferred shape: a flat type name, ("list", element) or ("struct", ((name, shape), ...));
# None where only nulls (or empty arrays) were seen.
Shape = Any
_CONFLICT = object()


@dataclass(frozen=True, slots=True)
class EvolveLimits:
    """Bounds on what the data may add. Why: a misbehaving client could otherwise grow a
    table to thousands of columns (every reader pays for them) or nest without end."""

    max_columns: int = 1000
    """Columns of a table, its declared and icefloe's own included."""
    max_name_length: int = 128
    max_depth: int = 8
    """Levels of objects and arrays in one new field's value (a scalar is 0)."""


@dataclass(frozen=True, slots=True)
class ColumnChange:
    """One schema change a run needs: ``add`` a column, or ``widen`` one to ``type``."""

    action: str
    name: str
    type: str


@dataclass(slots=True)
class RunPlan:
    """What a run's unknown fields do to a table: ``changes`` to commit before its data,
    ``columns`` (every evolved column afterwards, name → type, table order), and
    ``refused`` (row index → reason)."""

    changes: list[ColumnChange] = field(default_factory=list)
    columns: dict[str, str] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    verdicts: dict[Observation, str] = field(default_factory=dict)
    """Why each refused :class:`Observation` is refused by its names, depth or an integer
    beyond the long range: a row with one of these is refused whatever its other values."""
    over: frozenset[str] = frozenset()
    """New fields that found no room under :attr:`EvolveLimits.max_columns` or a quota."""
    over_reasons: dict[str, str] = field(default_factory=dict)
    """Why each field of :attr:`over` found no room."""
    properties: dict[str, str] = field(default_factory=dict)
    """Table properties to commit with :attr:`changes` (the quota ledger)."""
    overflow_column: bool = False
    """Whether the table has its :data:`OVERFLOW` column already."""


def parse_extras(texts: Sequence[str | None], only: Sequence[str] | None = None
                 ) -> list[dict[str, Any] | None]:
    """The :data:`EXTRA_FIELD` texts of a run's rows as dicts (None where a row had none),
    in one decode. Big integers stay ints (msgspec), so the long range is checked here.

    ``only``: keep just these members (a member present with ``null`` is kept, an absent
    one left out, as in the full dicts). Why: when a columnar reader has already taken the
    table's own columns, only the rest need Python objects; msgspec skips the others
    without building them, several times cheaper than whole dicts on wide rows."""
    joined = "[" + ",".join(text or "null" for text in texts) + "]"
    if only is None:
        return msgspec.json.decode(joined, type=list[dict[str, Any] | None])
    attrs = [f"m{i}" for i in range(len(only))]
    members = msgspec.defstruct("Members", [(a, Any, msgspec.UNSET) for a in attrs],
                                rename=dict(zip(attrs, only, strict=True)))
    # to_builtins leaves UNSET members out: absent stays absent, null stays null
    decoded = msgspec.json.decode(joined, type=list[members | None])  # type: ignore[valid-type]
    # (members is a class built at run time: mypy cannot check a type made of it)
    rows: list[dict[str, Any] | None] = msgspec.to_builtins(decoded)
    return rows


Observation = tuple[tuple[str, int, Any], ...]
"""What the planning rules need of one row's undeclared fields, without the values:
per field (in the row's order) its name, its nesting depth when beyond the limit (else
0), and a tag — None for a null, ``("have", wider)`` for a column the table has (``wider``
the type an ``int``/``float`` column must widen to, or None), ``("new", shape)`` for a new
field, ``("beyond", value)`` for an integer beyond the long range.

Why: rows with equal observations get equal verdicts and change nothing the second time
(shapes only ever merge upwards), so a run plans over its *distinct* observations in
first-seen order, and a run of many alike rows costs one judgement per distinct shape."""


def observe(extra: Mapping[str, Any], existing: Mapping[str, str], max_depth: int
            ) -> Observation:
    """One row's :data:`Observation`; ``existing``: the table's evolved columns (name →
    type), as the plan sees them."""
    out = []
    for name, value in extra.items():
        depth = 0
        if value.__class__ in (dict, list):
            depth = _depth(value)
            depth = depth if depth > max_depth else 0
        if value is None:
            tag: Any = None
        elif name in existing:
            kind = existing[name]
            tag = ("have", _widening(kind, value) if kind in ("int", "float") else None)
        else:
            inferred = _infer(value)
            tag = ("beyond", value) if inferred is _CONFLICT else ("new", inferred)
        out.append((name, depth, tag))
    return tuple(out)


def distinct(observations: Iterable[Observation | None]) -> list[Observation]:
    """The distinct non-empty observations, in first-seen order (what a plan needs)."""
    return list(dict.fromkeys(o for o in observations if o))


def plan_run(extras: Sequence[Mapping[str, Any] | None], table_columns: Mapping[str, str],
             fixed: Iterable[str], limits: EvolveLimits = EvolveLimits(), *,
             table: str = "the table", admit: Admit | None = None,
             overflow: bool = False) -> RunPlan:
    """The plan for one run of one table (see the module doc).

    ``table_columns``: every column of the table now (name → icefloe type string); ``fixed``:
    the names evolution must not touch (declared columns, icefloe's own). Rows are read in
    the order given (the run's order), so the same run always gives the same plan.
    ``admit``: see :func:`plan_observed`; ``overflow``: fields with no room do not refuse
    their rows (the caller keeps them in :data:`OVERFLOW`).
    """
    fixed_names = set(fixed)
    existing = {n: t for n, t in table_columns.items() if n not in fixed_names}
    observations = [observe(e, existing, limits.max_depth) if e else None for e in extras]
    plan = plan_observed(observations, table_columns, fixed_names, limits, table=table,
                         admit=admit)
    for index, seen in enumerate(observations):
        if seen is not None and seen in plan.verdicts:
            plan.refused[index] = plan.verdicts[seen]
    specs = {n: parse_type(t) for n, t in plan.columns.items()}
    for index, extra in enumerate(extras):
        if index in plan.refused or not extra:
            continue
        reason = _row_conflict(extra, specs, frozenset() if overflow else plan.over, limits,
                               table)
        if reason is not None:
            plan.refused[index] = reason
    return plan


Admit = Callable[[str], "str | None"]
"""Asked once per new field that has room under ``max_columns``, in run order: None to add
its column (the callee counts it), or why its clients may not add it."""


def overflow_part(extra: Mapping[str, Any] | None, over: frozenset[str]
                  ) -> dict[str, Any] | None:
    """The non-null fields of one row's undeclared ``extra`` that found no room (None:
    none): what its :data:`OVERFLOW` cell holds."""
    if not extra or not over:
        return None
    part = {k: v for k, v in extra.items() if k in over and v is not None}
    return part or None


def plan_observed(observations: Sequence[Observation | None],
                  table_columns: Mapping[str, str], fixed: Iterable[str],
                  limits: EvolveLimits = EvolveLimits(), *, table: str = "the table",
                  admit: Admit | None = None) -> RunPlan:
    """The plan's changes, columns and :attr:`RunPlan.verdicts` from a run's observations
    in run order (repeats allowed: each distinct one is judged once, at its first sight).
    Rows refused by a conflict with the planned columns are not in it: see
    :func:`plan_run`. ``admit`` (the quotas) is asked about
    each new field that has room under ``max_columns``; a field it turns down joins
    :attr:`RunPlan.over`, with the reason it gives."""
    fixed_names = set(fixed)
    evolved = {n: t for n, t in table_columns.items() if n not in fixed_names}
    lowered = {n.lower(): n for n in table_columns}
    plan = RunPlan()
    shapes: dict[str, Shape] = {}
    widen: dict[str, str] = {}
    seen: dict[str, str | None] = {}
    judged: set[Observation] = set()
    for observation in observations:
        if not observation or observation in judged:
            continue
        judged.add(observation)
        reason = _check_names(observation, lowered, fixed_names, seen, limits, table)
        if reason is not None:
            plan.verdicts[observation] = reason
            continue
        for name, _, tag in observation:
            if tag is None:
                continue
            what, value = tag
            if what == "have":
                if value is not None:
                    widen[name] = value
                continue
            if what == "beyond":
                plan.verdicts[observation] = (f"field {name!r}: integer {value} is beyond "
                                              "the long range")
                break
            merged = _merge(shapes.get(name), value)
            shapes[name] = shapes.get(name) if merged is _CONFLICT else merged
            lowered.setdefault(name.lower(), name)
    plan.columns = {n: widen.get(n, t) for n, t in evolved.items()}
    plan.changes = [ColumnChange("widen", n, t) for n, t in widen.items()]
    room = limits.max_columns - len(table_columns)
    over: dict[str, str] = {}
    for name, shape in shapes.items():
        if shape is None:
            continue  # only nulls so far: no column until a value says what it is
        if room <= 0:
            over[name] = (f"a new column would take {table} past {limits.max_columns} "
                          "columns (collector.evolve_max_columns)")
            continue
        why = admit(name) if admit is not None else None
        if why is not None:
            over[name] = why
            continue
        kind = render(shape)
        plan.columns[name] = kind
        plan.changes.append(ColumnChange("add", name, kind))
        room -= 1
    plan.over = frozenset(over)
    plan.over_reasons = over
    return plan


def _check_names(observation: Observation, lowered: Mapping[str, str], fixed: set[str],
                 seen: dict[str, str | None], limits: EvolveLimits, table: str
                 ) -> str | None:
    """Why a row's new fields cannot become columns, or None. ``seen`` caches each name's
    verdict for the run (a name's verdict never changes within one)."""
    for name, depth, _ in observation:
        if name in seen:
            reason = seen[name]
        else:
            reason = seen[name] = _name_reason(name, lowered, fixed, limits, table)
        if reason is not None:
            return reason
        if depth:
            return (f"field {name!r}: the value nests {depth} levels, the limit is "
                    f"{limits.max_depth} (collector.evolve_max_depth)")
    return None


def _name_reason(name: str, lowered: Mapping[str, str], fixed: set[str],
                 limits: EvolveLimits, table: str) -> str | None:
    if name.lower() in _RESERVED_LOWER or name in fixed:
        return f"field {name!r}: the name is reserved for icefloe's own columns"
    if not _IDENT.fullmatch(name):
        return (f"field {name!r}: a new column's name must be letters, digits and '_' "
                "(not starting with a digit)")
    if len(name) > limits.max_name_length:
        return (f"field {name[:32]!r}...: the name is {len(name)} characters, the limit "
                f"is {limits.max_name_length} (collector.evolve_max_name_length)")
    other = lowered.get(name.lower())
    if other is not None and other != name:
        return (f"field {name!r}: {table} has a column {other!r}; names that differ "
                "only in case are refused (Spark ignores case)")
    return None


def _row_conflict(extra: Mapping[str, Any], specs: Mapping[str, TypeSpec],
                  over: AbstractSet[str], limits: EvolveLimits, table: str) -> str | None:
    for name, value in extra.items():
        if value is None:
            continue
        if name in over:
            return (f"field {name!r}: a new column would take {table} past "
                    f"{limits.max_columns} columns (collector.evolve_max_columns)")
        spec = specs.get(name)
        if spec is None:
            continue
        fits = _FITS.get(spec.name)
        if fits is not None and fits(value):
            continue  # the common case, without building a reason
        reason = conflict(value, spec, name)
        if reason is not None:
            return f"{reason} (column {name!r} of {table}; values are never cast)"
    return None


_FITS: dict[str, Any] = {
    "long": lambda v: v.__class__ is int and _LONG[0] <= v <= _LONG[1],
    "double": lambda v: (v.__class__ is float and math.isfinite(v)) or v.__class__ is int,
    "string": lambda v: v.__class__ is str,
    "boolean": lambda v: v.__class__ is bool,
    "json": lambda v: True,
}
"""Fast yes-answers of :func:`conflict` for flat types (a no goes through it for the
reason)."""


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _infer(value: Any) -> Shape:
    """The shape of one non-null JSON value (None: nothing to tell, like ``[]``)."""
    if value is None:
        return None
    if value is True or value is False:
        return "boolean"
    if isinstance(value, int):
        return "long" if _LONG[0] <= value <= _LONG[1] else _CONFLICT
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        if not all(_IDENT.fullmatch(k) and len(k) <= 128 for k in value):
            return "json"
        fields = tuple((k, _infer(v)) for k, v in value.items())
        if any(s is _CONFLICT for _, s in fields):
            return "json"
        return ("struct", fields)
    shape: Shape = None
    for item in value:
        inferred = _infer(item)
        shape = _CONFLICT if inferred is _CONFLICT else _merge(shape, inferred)
        if shape is _CONFLICT:
            return "json"
    return ("list", shape)


def _merge(a: Shape, b: Shape) -> Shape:
    """Two shapes of one field as one, or ``_CONFLICT`` (a scalar kind changed)."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    if (a, b) in (("long", "double"), ("double", "long")):
        return "double"
    nested_a, nested_b = isinstance(a, tuple), isinstance(b, tuple)
    if (nested_a or a == "json") and (nested_b or b == "json"):
        return _merge_nested(a, b)
    return _CONFLICT


def _merge_nested(a: Shape, b: Shape) -> Shape:
    if a == "json" or b == "json" or a[0] != b[0]:
        return "json"  # the shape varies between events
    if a[0] == "list":
        element = _merge(a[1], b[1])
        return "json" if element is _CONFLICT else ("list", element)
    fields = dict(a[1])
    for name, shape in b[1]:
        merged = _merge(fields.get(name), shape)
        if merged is _CONFLICT:
            return "json"
        fields[name] = merged
    return ("struct", tuple(fields.items()))


def render(shape: Shape) -> str:
    """A shape as a column type string; a part only nulls filled becomes ``json``."""
    if shape is None:
        return "json"
    if isinstance(shape, str):
        return shape
    if shape[0] == "list":
        return f"list<{render(shape[1])}>"
    if not shape[1]:
        return "json"  # an empty object says nothing about its members
    return "struct<" + ",".join(f"{n}:{render(s)}" for n, s in shape[1]) + ">"


def _widening(kind: str, value: Any) -> str | None:
    """The wider type an existing ``int``/``float`` column needs for ``value``, if any."""
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool) \
            and not _INT[0] <= value <= _INT[1] and _LONG[0] <= value <= _LONG[1]:
        return "long"
    if kind == "float" and isinstance(value, int | float) and not isinstance(value, bool) \
            and not _fits_float32(value):
        return "double"
    return None


def _fits_float32(value: float) -> bool:
    try:
        return bool(struct.unpack("<f", struct.pack("<f", value))[0] == value)
    except OverflowError:
        return False


def conflict(value: Any, spec: TypeSpec, where: str) -> str | None:
    """Why ``value`` does not fit a column of type ``spec`` without a cast, or None."""
    name = spec.name
    if value is None or name == "json":
        return None
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if name in ("long", "int"):
        low, high = _LONG if name == "long" else _INT
        if is_int and low <= value <= high:
            return None
        return f"field {where!r}: {_kind(value)} {_short(value)} does not fit {name}"
    if name in ("double", "float"):
        if (is_int or isinstance(value, float)) and math.isfinite(value):
            return None
        return f"field {where!r}: {_kind(value)} {_short(value)} does not fit {name}"
    if name == "boolean" and isinstance(value, bool):
        return None
    if name == "string" and isinstance(value, str):
        return None
    if name == "list" and isinstance(value, list):
        assert spec.element is not None
        for i, item in enumerate(value):
            reason = conflict(item, spec.element, f"{where}[{i}]")
            if reason is not None:
                return reason
        return None
    if name == "struct" and isinstance(value, dict):
        members = dict(spec.fields)
        for key, item in value.items():
            if key not in members:
                return (f"field {where + '.' + key!r}: the struct column has no member "
                        f"{key!r} (members are not added to a struct; declare it json)")
            reason = conflict(item, members[key], f"{where}.{key}")
            if reason is not None:
                return reason
        return None
    return f"field {where!r}: {_kind(value)} {_short(value)} does not fit {_render_spec(spec)}"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    names: dict[type, str] = {str: "string", dict: "object", list: "array"}
    return names.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."


def _render_spec(spec: TypeSpec) -> str:
    if spec.name == "list" and spec.element is not None:
        return f"list<{_render_spec(spec.element)}>"
    if spec.name == "struct":
        return "struct<" + ",".join(f"{n}:{_render_spec(s)}" for n, s in spec.fields) + ">"
    return spec.name


def column_value(value: Any, spec: TypeSpec) -> Any:
    """A fitting value as its column's Arrow input: ``json`` parts become JSON text,
    integers in ``double`` columns floats, struct members the column lacks are absent."""
    if value is None:
        return None
    if spec.name == "json":
        return msgspec.json.encode(value).decode()
    if spec.name in ("double", "float"):
        return float(value)
    if spec.name == "list" and spec.element is not None:
        return [column_value(item, spec.element) for item in value]
    if spec.name == "struct":
        return {n: column_value(value.get(n), s) for n, s in spec.fields}
    return value
