"""A sink's ``where``: the SQL predicate that picks which of its source's events it takes.

Why a small checked subset and not any Spark SQL: the collector evaluates a predicate on
every row of a run to decide where the row *goes*; a predicate that throws, reads the clock
or depends on other rows would make routing differ between a run and its replay. So a
``where`` is parsed with sqlglot (Spark dialect) when the config loads and when the admin
API receives a sink, and accepted only if every part of it is one the collector evaluates
exactly, column-wise in Arrow (:mod:`pipeline.where`): column references (the sink's
declared columns and ``_event_id``/``_received_at``), literals, ``AND``/``OR``/``NOT``,
comparisons, ``IN`` (a list), ``BETWEEN``, ``IS [NOT] NULL``, ``LIKE``/``ILIKE``,
``+ - * /`` and the functions in :data:`WHERE_FUNCTIONS` (a subset of the ``sql`` mapping
allow-list, :mod:`icefloe.streams.sql_functions`). The result must be a boolean; SQL's
three-valued logic holds: a row whose predicate is NULL is not taken.

Types are checked here as well, on the declared column types, so a comparison Arrow could
not evaluate (a string column against a number) is refused up front instead of failing a
run.

Why size limits (:data:`MAX_WHERE_CHARS`, :data:`MAX_WHERE_DEPTH`, :data:`MAX_IN_ITEMS`):
the parser and the checks are recursive and cost time in proportion to the text, and the
admin API validates while it serves. A predicate nested deeper than the limit would end in
Python's ``RecursionError`` (an HTTP 500), and a 50,000-item ``IN`` list took about a
second to parse; both are refused by name before they cost that, the depth and length
before anything is parsed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from icefloe.streams.model import Column
from icefloe.streams.sql_functions import ALLOWED_FUNCTIONS, function_name
from icefloe.streams.typespec import BadType, parse_type

WHERE_COLUMNS = ("_event_id", "_received_at")
"""Envelope columns a predicate may read besides the declared ones."""

WHERE_FUNCTIONS = frozenset({"lower", "upper", "length", "coalesce", "abs"})
"""Functions a ``where`` may call (Spark names): what :mod:`pipeline.where` evaluates."""

MAX_WHERE_CHARS = 16 * 1024
"""The longest ``where`` text accepted (characters)."""
MAX_WHERE_DEPTH = 32
"""How deep a ``where`` may nest: each parenthesis, function call, ``NOT``, comparison and
arithmetic operator is one level; a chain of ``AND`` (or of ``OR``) is one level."""
MAX_IN_ITEMS = 1000
"""The most values one ``IN (...)`` list may hold."""

UNROUTED = ("drop", "dead_letter")
"""What happens to a source's event that no sink's ``where`` takes (always counted)."""

COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div)
_FUNCS = {exp.Lower: "lower", exp.Upper: "upper", exp.Length: "length",
          exp.Coalesce: "coalesce", exp.Abs: "abs"}
_KINDS = {"string": "string", "json": "string", "uuid": "string", "long": "number",
          "int": "number", "float": "number", "double": "number", "boolean": "boolean",
          "timestamp": "temporal", "timestamp_ns": "temporal", "date": "temporal",
          "time": "temporal"}


def temporal_literal(text: str) -> datetime:
    """A string compared with a time column, read as an ISO 8601 time (UTC unless it
    names a zone), or ``ValueError``."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 date or time (e.g. '2026-01-31' or "
                         "'2026-01-31T12:00:00Z')") from None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _kind(type_: str) -> str:
    """A declared type's class for the check: number, string, boolean, temporal or other."""
    if type_.startswith("decimal"):
        return "number"
    try:
        parse_type(type_)
    except BadType:
        return "other"
    return _KINDS.get(type_, "other")


def column_kinds(columns: tuple[Column, ...]) -> dict[str, str]:
    """Each readable column's class: the declared ones and the envelope's."""
    kinds = {c.name: _kind(c.type) for c in columns}
    kinds.update({"_event_id": "string", "_received_at": "temporal"})
    return kinds


def check_where(sql: str, columns: tuple[Column, ...]) -> None:
    """:func:`parse_where`, remembered per predicate and column set: the admin API checks
    a change before it writes it and again inside the write, which then costs nothing."""
    _checked(sql, tuple((c.name, c.type) for c in columns))


@lru_cache(maxsize=512)
def _checked(sql: str, columns: tuple[tuple[str, str], ...]) -> None:
    parse_where(sql, tuple(Column(name, type_) for name, type_ in columns))


def _too_deep() -> ValueError:
    return ValueError(f"nests deeper than {MAX_WHERE_DEPTH} levels (the limit of a where: "
                      "each parenthesis, function call, NOT, comparison and operator is a "
                      "level; a chain of AND or of OR is one)")


def _paren_depth(sql: str) -> int:
    """The deepest parenthesis nesting of ``sql`` outside quotes (a linear scan, before
    the recursive parser sees the text)."""
    depth = deepest = 0
    quote: str | None = None
    escaped = False
    for char in sql:
        if quote is not None:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = None
        elif char in "'\"`":
            quote = char
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest


def tree_depth(tree: exp.Expr) -> int:
    """``tree``'s nesting as :data:`MAX_WHERE_DEPTH` counts it, without recursion: a child
    of the same ``AND``/``OR`` kind as its parent adds no level."""
    deepest = 0
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, exp.Column | exp.Literal):
            continue  # a leaf: its identifier parts are not nesting
        for child in node.iter_expressions():
            same = isinstance(node, exp.Connector) and type(child) is type(node)
            stack.append((child, depth if same else depth + 1))
    return deepest


def _parse(sql: str) -> list[exp.Expr | None]:
    """``sql`` parsed, once it is known to be short and shallow enough to parse."""
    if len(sql) > MAX_WHERE_CHARS:
        raise ValueError(f"is {len(sql)} characters long; a where is at most "
                         f"{MAX_WHERE_CHARS} (use fewer IN values, or route on a coarser "
                         "column)")
    if _paren_depth(sql) > MAX_WHERE_DEPTH:
        raise _too_deep()
    try:
        return sqlglot.parse(sql, read="spark")
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        raise ValueError(f"does not parse as Spark SQL: {first.get('description', exc)}"
                         ) from None
    except RecursionError:  # NOT NOT NOT ...: deep without parentheses
        raise _too_deep() from None


def parse_where(sql: str, columns: tuple[Column, ...]) -> exp.Expr:
    """The checked predicate tree; ``ValueError`` says what is wrong (see module doc)."""
    parsed = _parse(sql)
    if len(parsed) != 1 or parsed[0] is None:
        raise ValueError("give exactly one SQL boolean expression (no ';')")
    tree = parsed[0]
    if isinstance(tree, exp.Query | exp.Command) or tree.find(exp.Query) is not None:
        raise ValueError("a subquery or statement is not allowed: a predicate reads one "
                         "event")
    if tree.find(exp.AggFunc, exp.Window) is not None:
        raise ValueError("an aggregate or window function is not allowed: a predicate reads "
                         "one event")
    if tree_depth(tree) > MAX_WHERE_DEPTH:
        raise _too_deep()
    for listed in tree.find_all(exp.In):
        if len(listed.expressions) > MAX_IN_ITEMS:
            raise ValueError(f"an IN list holds {len(listed.expressions)} values; a where "
                             f"allows at most {MAX_IN_ITEMS} per list")
    kind = _check(tree, column_kinds(columns))
    if kind not in ("boolean", "null"):
        raise ValueError(f"is not a boolean expression (it gives a {kind})")
    return tree


def parse_value(sql: str, kinds: dict[str, str]) -> tuple[exp.Expr, str]:
    """One expression of the ``where`` subset that gives a *value* (a table template's
    ``{…}`` part, :mod:`icefloe.streams.dynamic_tables`): its checked tree and the class
    of its value; ``ValueError`` says what is wrong."""
    parsed = _parse(sql)
    if len(parsed) != 1 or parsed[0] is None:
        raise ValueError("give exactly one expression (no ';')")
    tree = parsed[0]
    if isinstance(tree, exp.Query | exp.Command) or tree.find(
            exp.Query, exp.AggFunc, exp.Window) is not None:
        raise ValueError("subqueries, aggregates and windows are not allowed (an "
                         "expression reads one event)")
    if tree_depth(tree) > MAX_WHERE_DEPTH:
        raise _too_deep()
    return tree, _check(tree, kinds)


# one branch per node kind: ruff's caps (noqa below)
def _check(node: exp.Expr, kinds: dict[str, str]) -> str:  # noqa: C901, PLR0912
    """The class of ``node``'s value, raising for anything outside the subset."""
    if isinstance(node, exp.Paren):
        return _check(node.this, kinds)
    if isinstance(node, exp.Column):
        if node.table or node.name not in kinds:
            raise ValueError(f"unknown column {node.sql('spark')!r} (a predicate reads the "
                             f"sink's declared columns and {', '.join(WHERE_COLUMNS)})")
        return kinds[node.name]
    if isinstance(node, exp.Literal):
        if not node.is_string:
            _check_number(node.this)
        return "string" if node.is_string else "number"
    if isinstance(node, exp.Boolean):
        return "boolean"
    if isinstance(node, exp.Null):
        return "null"
    if isinstance(node, exp.And | exp.Or):
        for side in node.flatten():  # a long chain without deep recursion
            _expect(side, kinds, "boolean", node)
        return "boolean"
    if isinstance(node, exp.Not):
        _expect(node.this, kinds, "boolean", node)
        return "boolean"
    if isinstance(node, COMPARISONS):
        _comparable(node, [node.this, node.expression], kinds)
        return "boolean"
    if isinstance(node, exp.Between):
        _comparable(node, [node.this, node.args["low"], node.args["high"]], kinds)
        return "boolean"
    if isinstance(node, exp.In):
        if node.args.get("query") is not None or node.args.get("unnest") is not None:
            raise ValueError("IN takes a list of values here, not a subquery")
        _comparable(node, [node.this, *node.expressions], kinds)
        return "boolean"
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise ValueError(f"{node.sql('spark')!r}: only IS [NOT] NULL is supported")
        _check(node.this, kinds)
        return "boolean"
    if isinstance(node, exp.Like | exp.ILike):
        _expect(node.this, kinds, "string", node)
        if not (isinstance(node.expression, exp.Literal) and node.expression.is_string):
            raise ValueError(f"{node.sql('spark')!r}: the LIKE pattern must be a string "
                             "literal")
        return "boolean"
    if isinstance(node, ARITHMETIC):
        for side in (node.this, node.expression):
            _expect(side, kinds, "number", node)
        divisor = node.expression.unnest()
        if isinstance(node, exp.Div) and isinstance(divisor, exp.Literal) and \
                not divisor.is_string and float(divisor.this) == 0:
            raise ValueError(f"{node.sql('spark')[:60]!r} divides by zero (an error for "
                             "every row, as in Spark SQL's ANSI mode)")
        return "number"
    if isinstance(node, exp.Neg):
        _expect(node.this, kinds, "number", node)
        return "number"
    if isinstance(node, exp.Func):
        return _check_function(node, kinds)
    raise ValueError(f"{node.sql('spark')[:60]!r} is not supported in a where predicate "
                     "(see docs/streams.md, Routing by content)")


def _check_number(text: str) -> None:
    """A numeric literal the evaluator can type as Spark does: an integer within
    ``bigint`` (Spark would read a larger one as a decimal), or a finite double."""
    try:
        value = int(text)
    except ValueError:
        if float(text) in (float("inf"), float("-inf")):
            raise ValueError(f"the number {text[:40]} is out of range of a double") from None
        return
    if not -(2 ** 63) <= value < 2 ** 63:
        raise ValueError(f"the integer {text[:40]} is out of range of bigint (a where "
                         "compares with integers within 64 bits)")


def _check_function(node: exp.Func, kinds: dict[str, str]) -> str:
    name = _FUNCS.get(type(node))
    if name is None:
        called = function_name(node)
        if called not in ALLOWED_FUNCTIONS:
            raise ValueError(f"function {called} is not allowed: it is not on the allow-list "
                             "of icefloe.streams.sql_functions (pure per-row functions)")
        raise ValueError(f"function {called} is not supported in a where predicate "
                         f"(supported: {', '.join(sorted(WHERE_FUNCTIONS))})")
    args = [a for a in node.iter_expressions()]
    if name in ("lower", "upper", "length"):
        _expect(args[0], kinds, "string", node)
        return "number" if name == "length" else "string"
    if name == "abs":
        _expect(args[0], kinds, "number", node)
        return "number"
    found = {_check(a, kinds) for a in args} - {"null"}
    if len(found) > 1:
        raise ValueError(f"{node.sql('spark')[:60]!r}: coalesce of different types "
                         f"({', '.join(sorted(found))})")
    return found.pop() if found else "null"


def _expect(node: exp.Expr, kinds: dict[str, str], want: str,
            parent: exp.Expr) -> None:
    got = _check(node, kinds)
    if got not in (want, "null"):
        raise ValueError(f"{parent.sql('spark')[:60]!r}: {node.sql('spark')[:40]!r} is a "
                         f"{got}, expected a {want}")


def _comparable(node: exp.Expr, sides: list[exp.Expr],
                kinds: dict[str, str]) -> None:
    """Compared values must share a class; a string literal compares with a temporal
    column (read as a timestamp or date). ``other`` (lists, structs, binary) compares
    with nothing."""
    found = {_check(s, kinds) for s in sides} - {"null"}
    literal_strings = all(isinstance(s, exp.Literal) and s.is_string for s in sides
                          if _check(s, kinds) == "string")
    if found == {"temporal", "string"} and literal_strings:
        for side in sides:
            if isinstance(side, exp.Literal) and side.is_string:
                temporal_literal(side.this)
        return
    if len(found) > 1 or "other" in found:
        raise ValueError(f"{node.sql('spark')[:60]!r} compares values of different types "
                         f"({', '.join(sorted(found))})")
