"""The constructs Spark would answer by other rules than the dialect they were written in.

Why: SQL written in DuckDB's or Postgres' dialect (a query's ``--dialect``, a model's
``-- dialect:``, a mapping's ``dialect``) is transpiled by sqlglot to Spark SQL when Spark
answers it. sqlglot rewrites what it knows (1-based list indexes with a literal, ``concat``
with NULL, ``//``, ``strftime`` patterns, NULL ordering) and raises for what it cannot
express (``unsupported_level=RAISE``), but some constructs come out as valid Spark SQL that
means something else, with no warning. Each one below was run on both engines (DuckDB 1.x,
Spark 4 in ANSI mode, see ``tests/pipeline/test_query_dialects.py``) and gave two different
answers; a statement holding one is refused with the construct named, never answered by
Spark's rules:

* ``substring(s, 0, 2)``: DuckDB/Postgres count a start of 0 as the position before the
  string (``'h'``), Spark as 1 (``'he'``); a negative length gives ``'h'`` vs ``''``. Only
  literal starts >= 1 (or negative in DuckDB, from the end on both) and literal lengths
  >= 0 pass. ``left``/``right`` with a negative length: DuckDB drops that many, Spark ``''``.
* ``l[i]`` with a non-literal index: sqlglot shifts a literal 1-based index to Spark's
  0-based one but leaves ``l[i]`` as it is (DuckDB's ``l[1]`` is Spark's ``l[1]``, the second
  element); ``l[0]``/``l[-1]`` and slices are refused too.
* ``CAST(x AS INTEGER)`` (and ``::int``, ``TRY_CAST``) of a fraction: DuckDB and Postgres
  round (``1.5`` -> 2), Spark truncates (1); refused unless ``x`` is known to be an integer
  (or a string, for ``CAST``: a fraction in it is an error on Spark, not a different answer).
* The weekday as a number: ``dayofweek``/``isodow``/``weekday`` and ``extract``/
  ``date_part`` of ``dow``/``dayofweek``/``weekday``/``isodow`` (Sunday is 0 there, 7 for
  ``isodow``; 1 in Spark, whose ``weekday`` is 6); ``dayname``/``monthname`` (``'Sunday'``
  in DuckDB, ``'Sun'`` in Spark). ``strftime(d, '%a')`` (``'Sun'``) and ``'%A'`` agree.
* DuckDB's ``date_diff``/``datediff`` with a unit counts the boundaries crossed (10:59 to
  11:01 is 1 hour), Spark's whole units elapsed (0); passed: ``microsecond``, a unit of a
  day or less between two dates, or both sides truncated to the unit
  (``date_diff('hour', date_trunc('hour', a), date_trunc('hour', b))``).
* ``array_agg``/``list`` keep NULL elements (and answer NULL for no rows), Spark's
  ``collect_list`` drops them (and answers ``[]``); passed only as
  ``coalesce(array_agg(x) FILTER (WHERE x IS NOT NULL), [])``.
* DuckDB's ``quantile(x, q)`` picks an element (as ``quantile_disc``), sqlglot's Spark
  ``percentile`` interpolates; ``percentile_disc``/``percentile_cont(q) WITHIN GROUP (ORDER
  BY x)`` agree (:func:`pipeline.read.query.spark_sql` keeps them Spark's exact functions).
* A DuckDB ``LIKE``/``ILIKE`` pattern holding a backslash (or computed, so it may hold
  one) without ``ESCAPE``: a character in DuckDB, an escape in Spark (Postgres escapes with
  it too, as Spark does).
* ``log(x)`` (base 10 there, e in Spark), ``epoch(ts)`` (fractional seconds there, whole in
  Spark), ``hash`` (different functions), ``regexp_replace`` without the ``'g'`` flag
  (first match there, every match in Spark).
* Postgres' ``/`` of two integers (integer division; Spark's ``/`` gives a fraction).

Same answers, verified and therefore allowed: ``/`` of DuckDB (a fraction on both),
``||`` and ``concat`` with NULL, ``%``, ``//``, literal list indexes >= 1, ``round``.
Division by zero answers ``inf``/NULL in DuckDB and fails in Spark: an error, not a
different answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp


class Divergent(ValueError):
    """A construct Spark would answer differently from the declared dialect."""

    def __init__(self, construct: str, reason: str) -> None:
        super().__init__(f"{construct}: {reason}")
        self.construct = construct
        self.reason = reason


def refuse_divergent(tree: exp.Expr, dialect: str,
                     schema: Mapping[str, Mapping[str, str]] | None = None) -> None:
    """Raise :class:`Divergent` naming the first construct of ``tree`` (parsed in
    ``dialect``) that Spark would answer by other rules (see the module docstring).

    ``schema``: table (as the tree names it) -> column -> SQL type, to tell an integer from
    a fraction in a ``CAST``; without it a column's type is unknown, and a cast of it to an
    integer is refused."""
    if dialect == "spark":
        return
    for node in tree.walk():  # as written: the construct is shown as its user typed it
        reason = _divergence(node, dialect)
        if reason is not None:
            raise Divergent(node.sql(dialect=dialect)[:120], reason)
    for node in _annotated(tree, dialect, schema or {}).walk():  # what needs types
        reason = _typed_divergence(node, dialect)
        if reason is not None:
            raise Divergent(_shown(node, dialect), reason)


def _annotated(tree: exp.Expr, dialect: str,
               schema: Mapping[str, Mapping[str, str]]) -> exp.Expr:
    """A copy of ``tree`` with inferred types (columns qualified first, so they resolve)."""
    from sqlglot.errors import SqlglotError  # lazy: sqlglot
    from sqlglot.optimizer.annotate_types import annotate_types  # lazy: sqlglot
    from sqlglot.optimizer.qualify import qualify  # lazy: sqlglot

    copy = tree.copy()
    # (qualify and annotate_types take any nested mapping: dict[str, object] in their hints)
    plain: dict[str, object] = {table: dict(columns) for table, columns in schema.items()}
    try:
        if isinstance(copy, exp.Query):
            copy = qualify(copy, schema=plain or None, dialect=dialect, identify=False,
                           quote_identifiers=False, validate_qualify_columns=False,
                           expand_stars=False)
        return annotate_types(copy, schema=plain or None, dialect=dialect)
    except (SqlglotError, KeyError, ValueError):  # odd shapes: types stay unknown
        return tree.copy()


def _shown(node: exp.Expr, dialect: str) -> str:
    """The construct as its user wrote it (without the qualifiers added for typing)."""
    shown = node.copy()
    for column in shown.find_all(exp.Column):
        column.set("table", None)
    return shown.sql(dialect=dialect)[:120]


_INTEGERS = tuple(exp.DataType.INTEGER_TYPES)
_WEEKDAY_FIELDS = frozenset({"DOW", "DAYOFWEEK", "WEEKDAY", "ISODOW"})
_SPARK_HINT = ("write it in Spark's dialect, where dayofweek(d) is 1 on Sunday (so "
               "dayofweek(d) - 1 is this dow)")
_WEEKDAY_HINT = {"duckdb": "compare the weekday's name instead, strftime(d, '%a') ('Sun' on "
                           "both engines), or " + _SPARK_HINT}
_EMPTY = {"postgres": "ARRAY[]::int[]"}  # the empty array literal, per dialect
_EXACT_UNITS = frozenset({"DAY", "HOUR", "MINUTE", "SECOND", "MILLISECOND", "MICROSECOND"})
"""Units of a day or less: between two dates (midnights) boundaries and whole units agree."""


def _divergence(node: exp.Expr, dialect: str) -> str | None:
    """Why Spark would answer ``node`` differently, or None when it would not."""
    if isinstance(node, exp.Substring):
        return _substring(node, dialect)
    if isinstance(node, exp.Left | exp.Right) and _int(node.expression, minimum=0) is None:
        return (f"{dialect} counts a negative length from the other end, Spark returns ''; "
                "give a literal length >= 0")
    if isinstance(node, exp.Bracket):
        return _bracket(node)
    if isinstance(node, exp.DayOfWeek | exp.DayOfWeekIso) or _weekday_number(node, dialect):
        return (f"{dialect} numbers Sunday 0 (isodow: 7), Spark 1 (its weekday: 6); "
                + _WEEKDAY_HINT.get(dialect, _SPARK_HINT))
    if isinstance(node, exp.Dayname | exp.Monthname) and dialect == "duckdb":
        part, full, short, letter = (("weekday", "Sunday", "Sun", "A")
                                     if isinstance(node, exp.Dayname)
                                     else ("month", "November", "Nov", "B"))
        return (f"duckdb spells the {part}'s whole name ('{full}'), Spark abbreviates it "
                f"('{short}'); write strftime(d, '%{letter}')")
    if isinstance(node, exp.ArrayAgg) and not _nulls_dropped(node):
        return (f"{dialect} keeps NULL elements (and answers NULL for no rows), Spark's "
                "collect_list drops them (and answers []); write coalesce(array_agg(x) "
                f"FILTER (WHERE x IS NOT NULL), {_EMPTY.get(dialect, '[]')})")
    if isinstance(node, exp.Quantile):
        return (f"{dialect}'s quantile picks an element, Spark's percentile interpolates; write "
                "percentile_disc(q) WITHIN GROUP (ORDER BY x) (an element on both), or "
                "percentile_cont for the interpolated value")
    if isinstance(node, exp.Like | exp.ILike) and dialect == "duckdb":
        return _like(node)
    if isinstance(node, exp.Log) and node.expression is None:
        return f"log(x) is base 10 in {dialect}, base e in Spark; write log10(x) or ln(x)"
    if isinstance(node, exp.TimeToUnix):
        return (f"{dialect} keeps fractions of a second, Spark's unix_timestamp drops them; "
                "write date_diff('microsecond', TIMESTAMP '1970-01-01', ts) / 1e6")
    if isinstance(node, exp.Anonymous) and node.name.upper() == "HASH":
        return f"{dialect}'s hash and Spark's are different functions"
    if isinstance(node, exp.RegexpReplace) and _first_only(node):
        return (f"{dialect} replaces the first match only, Spark every match; add the 'g' "
                "flag to replace every match")
    return None


def _typed_divergence(node: exp.Expr, dialect: str) -> str | None:
    """:func:`_divergence` for the constructs that depend on their operands' types."""
    if isinstance(node, exp.Cast | exp.TryCast) and node.to.is_type(*_INTEGERS):
        return _integer_cast(node, dialect)
    if isinstance(node, exp.DateDiff) and node.args.get("date_part_boundary"):
        return _date_diff(node, dialect)
    if isinstance(node, exp.Div) and node.args.get("typed") and not _fraction(node):
        return (f"{dialect} divides integers to an integer, Spark to a fraction; write "
                "DIV, or cast one side to a decimal")
    return None


def _int(node: exp.Expr | None, minimum: int | None = None) -> int | None:
    """The integer a literal (or a negated one) holds, if at least ``minimum``."""
    value: int | None = None
    if isinstance(node, exp.Literal) and not node.is_string and node.this.lstrip("-").isdigit():
        value = int(node.this)
    elif isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        inner = _int(node.this)
        value = -inner if inner is not None else None
    if value is None or (minimum is not None and value < minimum):
        return None
    return value


def _substring(node: exp.Substring, dialect: str) -> str | None:
    start = _int(node.args.get("start"))
    length = node.args.get("length")
    if start is None or start == 0 or (start < 0 and dialect != "duckdb"):
        return (f"{dialect} counts a start of 0 (or less) before the first character, "
                "Spark as 1: give a literal start >= 1")
    if length is not None and _int(length, minimum=0) is None:
        return (f"{dialect} takes a negative length backwards, Spark returns '': give a "
                "literal length >= 0")
    return None


def _bracket(node: exp.Bracket) -> str | None:
    index = node.expressions[0] if len(node.expressions) == 1 else None
    if isinstance(index, exp.Literal) and index.is_string:
        return None  # a map key or struct field: no offset
    if isinstance(index, exp.Slice):
        return "list slices are not translated to Spark"
    if _int(index, minimum=0) is None:  # sqlglot holds the index 0-based: [1] is 0
        return ("only a literal 1-based index (>= 1) is translated to Spark's 0-based "
                "one; a computed or non-positive index would read another element")
    return None


def _integer_cast(node: exp.Cast | exp.TryCast, dialect: str) -> str | None:
    source = node.this.type
    if source is not None and source.is_type(*_INTEGERS):
        return None
    if isinstance(node.this, exp.Round | exp.Floor | exp.Ceil) or (
            isinstance(node.this, exp.Anonymous) and node.this.name.upper() == "TRUNC"):
        return None  # already whole: both engines keep it
    if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast) and source is not None \
            and source.is_type(*exp.DataType.TEXT_TYPES):
        return None  # a fraction in the text is an error on Spark, not another answer
    return (f"{dialect} rounds a fraction cast to an integer, Spark truncates it; round "
            "it first (CAST(round(x) AS INT)) or cast an integer")


def _first_only(node: exp.RegexpReplace) -> bool:
    modifiers = node.args.get("modifiers")
    if isinstance(modifiers, exp.Literal) and "g" in modifiers.this:
        return False
    return bool(node.args.get("single_replace")) or modifiers is None


def _fraction(node: exp.Div) -> bool:
    """Whether one side of a typed division is a non-integer literal or a fraction type."""
    for side in (node.this, node.expression):
        if isinstance(side, exp.Literal) and not side.is_string and not side.this.isdigit():
            return True
        kind = side.type
        if kind is not None and kind.is_type(*exp.DataType.REAL_TYPES):
            return True
    return False


def _weekday_number(node: exp.Expr, dialect: str) -> bool:
    """``extract(dow FROM d)``, ``date_part('dow', d)`` (and the other weekday fields), or
    DuckDB's ``weekday(d)``: the weekday as a number Spark counts differently."""
    if isinstance(node, exp.Extract):
        return node.this.name.upper() in _WEEKDAY_FIELDS
    if not isinstance(node, exp.Anonymous):
        return False
    name = node.name.upper()
    if name == "WEEKDAY":
        return dialect == "duckdb"
    if name in ("DATE_PART", "DATEPART") and node.expressions:
        field = node.expressions[0]
        return isinstance(field, exp.Literal) and field.this.upper() in _WEEKDAY_FIELDS
    return False


def _nulls_dropped(node: exp.ArrayAgg) -> bool:
    """Whether ``node`` is ``coalesce(array_agg(x) FILTER (WHERE x IS NOT NULL ...), [])``:
    NULLs dropped and no rows answered by ``[]``, as Spark's ``collect_list`` does."""
    target = node.this
    if isinstance(target, exp.Distinct) and len(target.expressions) == 1:
        target = target.expressions[0]
    filtered, call = node.parent, node.parent and node.parent.parent
    if not isinstance(filtered, exp.Filter) or filtered.this is not node:
        return False
    where = filtered.expression
    condition = where.this if isinstance(where, exp.Where) else where
    conjuncts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    if not any(_not_null(c.unnest(), target) for c in conjuncts):
        return False
    if not isinstance(call, exp.Coalesce) or call.this is not filtered \
            or len(call.expressions) != 1:
        return False
    empty = call.expressions[0]
    if isinstance(empty, exp.Cast):
        empty = empty.this
    return isinstance(empty, exp.Array) and not empty.expressions


def _not_null(condition: exp.Expr, target: exp.Expr) -> bool:
    """Whether ``condition`` is ``target IS NOT NULL``."""
    negated = isinstance(condition, exp.Not)
    test = condition.this if negated else condition
    return isinstance(test, exp.Is) and isinstance(test.expression, exp.Null) \
        and test.this == target and negated != bool(test.args.get("negate"))


def _like(node: exp.Like | exp.ILike) -> str | None:
    """DuckDB's ``LIKE`` has no escape character unless ``ESCAPE`` names one; Spark's is
    the backslash."""
    if isinstance(node.parent, exp.Escape):
        return None  # both engines escape with the character it names
    pattern = node.expression
    if isinstance(pattern, exp.Literal) and pattern.is_string:
        if "\\" not in pattern.this:
            return None
        return ("a backslash in a duckdb LIKE pattern is a character, in Spark an escape; "
                "write ESCAPE '\\' if it escapes, or ESCAPE '!' (any other character) to "
                "match a backslash")
    return ("a computed duckdb LIKE pattern may hold a backslash, a character there and an "
            "escape in Spark; add ESCAPE '\\' (or another character)")


def _date_diff(node: exp.DateDiff, dialect: str) -> str | None:
    unit = node.text("unit").upper()
    if unit == "MICROSECOND":
        return None  # the finest unit: boundaries and whole units agree
    sides = (node.this, node.expression)
    if unit in _EXACT_UNITS and all(s.type is not None and s.type.is_type(exp.DType.DATE)
                                    for s in sides):
        return None
    if all(isinstance(s, exp.TimestampTrunc | exp.DateTrunc)
           and s.args["unit"].name.upper() == unit for s in sides):
        return None  # both on a boundary: boundaries crossed = whole units
    shown = unit.lower() or "unit"
    return (f"{dialect}'s date_diff counts the {shown} boundaries crossed, Spark whole "
            f"{shown}s elapsed (10:59 to 11:01 is 1 hour there, 0 in Spark); truncate both "
            f"sides first: date_diff('{shown}', date_trunc('{shown}', a), "
            f"date_trunc('{shown}', b)), or for days cast both to DATE")
