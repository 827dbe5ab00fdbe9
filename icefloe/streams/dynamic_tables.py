"""Tables named by the data: a sink whose ``table`` is a template over the event.

``table = "tenants.events_{tenant_id}"`` writes each event to the table its own value
names (``tenants.events_acme``), created on first use with the sink's columns and layout.
This module holds the rules, checked when the config loads; :mod:`pipeline.table_names`
evaluates a template on a run's rows and :mod:`collector.dynamic` routes them.

Why these rules (docs/streams.md, "Tables named by the data"):

* **The namespace is fixed by the template** and holds only that template's tables: the
  part before the first ``.`` is literal, so a value can never choose the namespace, and
  every ``.`` (or other character outside ``[a-z0-9_]``) a value carries becomes ``_``, so
  it can never inject one. No other sink may write into that namespace, which is what
  lets a sink count its tables (``max_tables``) by listing it, and what keeps two sinks
  from ever writing one table.
* **Each ``{…}`` part** is a declared column or an expression of the ``where`` subset
  (:mod:`icefloe.streams.where`: arithmetic, ``lower upper length coalesce abs``,
  evaluated exactly, column-wise in Arrow, on both output paths), giving a string or a
  number. Anything else a ``sql`` mapping column computes (allow-list, Spark) and the
  template names that column.
* **Values are sanitised**, not refused: lower-cased, and each character outside
  ``[a-z0-9_]`` becomes ``_`` (so ``Acme-EU`` and ``acme_eu`` share a table). A null or
  empty value, a name past ``max_name_length`` and a table past ``max_tables`` are
  refused per row: the row goes to the dead letters with reason ``dynamic_table:<rule>``
  (:data:`RULES`), nothing else is affected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from icefloe.streams.model import Column, DynamicTables
from icefloe.streams.where import column_kinds, parse_value

MAX_PARTS = 8
"""The most ``{…}`` parts one template may hold."""
MAX_PART_CHARS = 1024
"""The longest expression one part may hold (characters)."""
NAME_LIMIT = 255
"""The longest table name (the part after the namespace) any catalog here stores."""
LITERAL = re.compile(r"[a-z0-9_]*")
NAMESPACE = re.compile(r"[a-z][a-z0-9_]{0,62}")
RESERVED_NAMESPACES = ("icefloe",)

RULES = ("null_value", "empty_value", "name_too_long", "max_tables", "expression_error")
"""Dead-letter reasons of a row whose table the template cannot name
(``dynamic_table:<rule>``): its value was null, empty, made a name longer than
``max_name_length``, would create a table past ``max_tables``, or its expression raised
an error (an integer overflow, a division by zero)."""
REASON_PREFIX = "dynamic_table"


DEFAULT_LIMITS = DynamicTables()


@dataclass(frozen=True)
class Template:
    """A parsed table template: its namespace and its table part as literal strings and
    expressions (Spark SQL text), in order."""

    text: str
    namespace: str
    pieces: tuple[tuple[bool, str], ...]
    """``(is_expression, text)`` per piece."""

    @property
    def expressions(self) -> tuple[str, ...]:
        return tuple(text for is_expr, text in self.pieces if is_expr)

    def pattern(self) -> re.Pattern[str]:
        """What the names of this template's tables look like (after the namespace)."""
        return re.compile("".join("[a-z0-9_]+" if is_expr else re.escape(text)
                                  for is_expr, text in self.pieces))


def is_template(table: str) -> bool:
    """Whether ``table`` is a template (holds a ``{`` or ``}``) rather than a name."""
    return "{" in table or "}" in table


def split_template(text: str) -> Template:
    """The namespace and pieces of ``text``; ``ValueError`` names what is wrong."""
    namespace, dot, rest = text.partition(".")
    if not dot or not NAMESPACE.fullmatch(namespace):
        raise ValueError("must be 'namespace.table_{expr}': a literal namespace (lower case "
                         "letters, digits, '_') before the first '.'; a value never "
                         "chooses the namespace")
    if namespace in RESERVED_NAMESPACES:
        raise ValueError(f"namespace {namespace!r} is icefloe's own; choose another")
    pieces: list[tuple[bool, str]] = []
    at = 0
    for match in re.finditer(r"\{([^{}]*)\}", rest):
        pieces.append((False, rest[at:match.start()]))
        pieces.append((True, match.group(1).strip()))
        at = match.end()
    pieces.append((False, rest[at:]))
    for is_expr, piece in pieces:
        if is_expr:
            continue
        if "{" in piece or "}" in piece:
            raise ValueError("has an unbalanced or nested '{' / '}' (each {…} part is one "
                             "expression)")
        if not LITERAL.fullmatch(piece):
            raise ValueError(f"literal part {piece!r} may hold only lower case letters, "
                             "digits and '_' (a '.' after the namespace is not allowed)")
    kept = tuple(p for p in pieces if p[0] or p[1])
    return Template(text, namespace, kept)


def parse_template(text: str, columns: tuple[Column, ...]) -> Template:
    """The checked template over the sink's ``columns``; ``ValueError`` names the part."""
    template = split_template(text)
    expressions = template.expressions
    if not expressions:
        raise ValueError("holds no {…} part")
    if len(expressions) > MAX_PARTS:
        raise ValueError(f"holds {len(expressions)} {{…}} parts; at most {MAX_PARTS}")
    kinds = column_kinds(columns)
    for sql in expressions:
        check_part(sql, kinds)
    return template


def check_part(sql: str, kinds: dict[str, str]) -> exp.Expr:
    """One ``{…}`` part: one expression of the ``where`` subset giving a string or a
    number (a column name is the simplest)."""
    if not sql:
        raise ValueError("has an empty {} part (name a column or an expression)")
    if len(sql) > MAX_PART_CHARS:
        raise ValueError(f"part {{{sql[:40]}...}} is {len(sql)} characters; at most "
                         f"{MAX_PART_CHARS}")
    try:
        tree, kind = parse_value(sql, kinds)
    except ValueError as exc:
        raise ValueError(f"part {{{sql[:60]}}}: {exc} (a part may use the sink's columns "
                         "and what a where may: see docs/streams.md, Tables named by the "
                         "data; compute anything else in a sql mapping column and name "
                         "it)") from None
    if kind not in ("string", "number"):
        raise ValueError(f"part {{{sql[:60]}}} gives a {kind}; a part must give a string or "
                         "a number (format other values in a sql mapping column)")
    return tree


def check_limits(limits: DynamicTables, template: Template) -> None:
    """The limits must be usable with this template."""
    if not 1 <= limits.max_tables <= 1_000_000:
        raise ValueError(f"max_tables: {limits.max_tables} is not 1-1000000")
    if not 1 <= limits.max_name_length <= NAME_LIMIT:
        raise ValueError(f"max_name_length: {limits.max_name_length} is not 1-{NAME_LIMIT}")
    literal = sum(len(text) for is_expr, text in template.pieces if not is_expr)
    if literal + len(template.expressions) > limits.max_name_length:
        raise ValueError(f"max_name_length: {limits.max_name_length} leaves no room for the "
                         f"values (the literal parts take {literal} characters)")


def reason(rule: str) -> str:
    """The dead-letter reason of ``rule`` (one of :data:`RULES`)."""
    assert rule in RULES, rule
    return f"{REASON_PREFIX}:{rule}"
