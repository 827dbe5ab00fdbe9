"""Column type strings: the small grammar of ``icefloe.toml``'s ``type`` and its parsed form.

Why a grammar and not a list: besides the flat types (``long``, ``string``, ...) a column may
be ``decimal(p,s)``, ``uuid``, ``binary``, ``time``, or nested —
``list<T>``, ``map<string,T>``, ``struct<name: T, ...>`` — to any depth up to
:data:`MAX_TYPE_DEPTH`. The config, the ingestor's validator, the Arrow schemas and the
Iceberg schemas all read the same parsed :class:`TypeSpec`, so they cannot disagree about
what a type string means. Parsing is cached: every layer asks by the string.

Grammar (whitespace between tokens is free)::

    type    := name | decimal | list | map | struct
    decimal := "decimal" "(" P "," S ")"            1 <= P <= 38, 0 <= S <= P
    list    := "list" "<" type ">"
    map     := "map" "<" "string" "," type ">"      keys are always strings (JSON objects)
    struct  := "struct" "<" field ("," field)* ">"
    field   := ident ":" type
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from icefloe.streams.model import COLUMN_TYPES

FLAT_TYPES = COLUMN_TYPES
"""Type names without parameters."""
UNSUPPORTED_TYPES = {
    "timestamp_ns": "Iceberg stores nanosecond timestamps only in table format version 3, "
                    "which the pyiceberg release icefloe writes with cannot write yet; use "
                    "timestamp (microseconds) or long (epoch nanoseconds)",
}
"""Type names the grammar knows but icefloe refuses, with why (named in the error)."""
MAX_TYPE_DEPTH = 16
"""How deep ``list``/``map``/``struct`` may nest in one column type. Why a bound: each level
costs a recursion in the validator, the Arrow conversion and the Iceberg schema, and
Spark's and Parquet's readers slow down on very deep schemas; 16 is far beyond real events."""
MAX_DECIMAL_PRECISION = 38
"""Iceberg's (and Parquet's decimal128) largest precision."""
_TOKEN = re.compile(r"\s*(?:(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<num>\d+)|(?P<sym>[<>(),:]))")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True, slots=True)
class TypeSpec:
    """A parsed column type. ``name`` is the flat type or ``decimal``/``list``/``map``/
    ``struct``; ``element`` is a list's element or a map's value type; ``fields`` a
    struct's ``(name, type)`` pairs; ``precision``/``scale`` a decimal's."""

    name: str
    element: TypeSpec | None = None
    fields: tuple[tuple[str, TypeSpec], ...] = ()
    precision: int = 0
    scale: int = 0

    @property
    def nested(self) -> bool:
        return self.name in ("list", "map", "struct")

    def __str__(self) -> str:
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.name == "list":
            return f"list<{self.element}>"
        if self.name == "map":
            return f"map<string,{self.element}>"
        if self.name == "struct":
            return "struct<" + ", ".join(f"{n}: {t}" for n, t in self.fields) + ">"
        return self.name

    def contains(self, *names: str) -> bool:
        """True when this type or any type nested in it is one of ``names``."""
        if self.name in names:
            return True
        if self.element is not None and self.element.contains(*names):
            return True
        return any(t.contains(*names) for _, t in self.fields)


class BadType(ValueError):
    """A type string that does not parse, or names an unknown or refused type."""


@functools.lru_cache(maxsize=1024)
def parse_type(text: str) -> TypeSpec:
    """``text`` parsed. Raises :class:`BadType` saying what is wrong and where."""
    tokens = _tokens(text)
    spec, pos = _parse(tokens, 0, 0, text)
    if pos != len(tokens):
        raise BadType(f"unexpected {tokens[pos]!r} after the type {str(spec)!r}")
    return spec


def is_native(text: str) -> bool:
    """True for a type that is not one of the original flat types (icefloe's nine)."""
    return parse_type(text).name not in ("string", "long", "int", "float", "double",
                                         "boolean", "timestamp", "date", "json")


def _tokens(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    stripped = text.rstrip()
    while pos < len(stripped):
        match = _TOKEN.match(stripped, pos)
        if match is None:
            raise BadType(f"unexpected character {stripped[pos]!r} at position {pos}")
        tokens.append(match.group(match.lastgroup or "sym"))
        pos = match.end()
    if not tokens:
        raise BadType("the type is empty")
    return tokens


def _expect(tokens: list[str], pos: int, want: str, after: str) -> int:
    got = tokens[pos] if pos < len(tokens) else "the end"
    if got != want:
        raise BadType(f"expected {want!r} after {after}, found {got!r}")
    return pos + 1


def _parse(tokens: list[str], pos: int, depth: int, text: str) -> tuple[TypeSpec, int]:
    if pos >= len(tokens):
        raise BadType("the type ends too early")
    word = tokens[pos].lower()
    pos += 1
    if word in FLAT_TYPES:
        return TypeSpec(word), pos
    if word in UNSUPPORTED_TYPES:
        raise BadType(f"{word} is not supported: {UNSUPPORTED_TYPES[word]}")
    if word == "decimal":
        return _decimal(tokens, pos)
    if word in ("list", "map", "struct"):
        if depth >= MAX_TYPE_DEPTH:
            raise BadType(f"nested deeper than {MAX_TYPE_DEPTH} levels")
        pos = _expect(tokens, pos, "<", word)
        if word == "list":
            element, pos = _parse(tokens, pos, depth + 1, text)
            return TypeSpec("list", element), _expect(tokens, pos, ">", f"list<{element}")
        if word == "map":
            return _map(tokens, pos, depth, text)
        return _struct(tokens, pos, depth, text)
    raise BadType(f"unknown type {tokens[pos - 1]!r} (expected one of "
                     f"{', '.join(FLAT_TYPES)}, decimal(p,s), list<T>, map<string,T>, "
                     "struct<name: T, ...>)")


def _decimal(tokens: list[str], pos: int) -> tuple[TypeSpec, int]:
    pos = _expect(tokens, pos, "(", "decimal")
    numbers: list[int] = []
    for sep in (",", ")"):
        if pos >= len(tokens) or not tokens[pos].isdigit():
            raise BadType("decimal takes two numbers: decimal(precision,scale)")
        numbers.append(int(tokens[pos]))
        pos = _expect(tokens, pos + 1, sep, "decimal's " + ("precision" if sep == "," else
                                                              "scale"))
    precision, scale = numbers
    if not 1 <= precision <= MAX_DECIMAL_PRECISION:
        raise BadType(f"decimal precision {precision} must be 1..{MAX_DECIMAL_PRECISION}")
    if scale > precision:
        raise BadType(f"decimal scale {scale} is larger than its precision {precision}")
    return TypeSpec("decimal", precision=precision, scale=scale), pos


def _map(tokens: list[str], pos: int, depth: int, text: str) -> tuple[TypeSpec, int]:
    key = tokens[pos] if pos < len(tokens) else "the end"
    if key.lower() != "string":
        raise BadType(f"map keys must be string (a JSON object's keys are), not {key!r}")
    pos = _expect(tokens, pos + 1, ",", "map<string")
    value, pos = _parse(tokens, pos, depth + 1, text)
    return TypeSpec("map", value), _expect(tokens, pos, ">", f"map<string,{value}")


def _struct(tokens: list[str], pos: int, depth: int, text: str) -> tuple[TypeSpec, int]:
    fields: list[tuple[str, TypeSpec]] = []
    while True:
        name = tokens[pos] if pos < len(tokens) else ""
        if not _IDENT.fullmatch(name):
            raise BadType(f"expected a struct field name, found {name or 'the end'!r}")
        if any(name == seen for seen, _ in fields):
            raise BadType(f"duplicate struct field {name!r}")
        pos = _expect(tokens, pos + 1, ":", f"struct field {name!r}")
        kind, pos = _parse(tokens, pos, depth + 1, text)
        fields.append((name, kind))
        if pos < len(tokens) and tokens[pos] == ",":
            pos += 1
            continue
        return TypeSpec("struct", fields=tuple(fields)), _expect(tokens, pos, ">",
                                                                 f"struct field {name!r}")
