"""Evaluate a sink's ``where`` on a source's decoded rows, column-wise in Arrow.

Why Arrow and not Spark SQL: one evaluator for both output paths, so a row goes to the same
tables whichever path wrote it. The embedded path runs it on the driver, over the run's
rows split per sink (:meth:`collector.routing.Routes.split`); the cluster path runs it on
the executors, one boolean column per sink added to the persisted run
(:func:`pipeline.load.cluster.run_cluster`). The predicate was checked when it arrived
(:func:`icefloe.streams.where.parse_where`: only the node kinds handled here, with types
that compare), and is checked again here, since a registry written by an older icefloe is
not trusted. SQL's three-valued logic holds throughout (Kleene ``AND``/``OR``, comparisons
with NULL give NULL); :func:`accepts` turns NULL into "not taken".

A predicate that does not fit the columns it is judged over is an error of every row it
judges, never an exception (:func:`fitted`): a queued event is judged by the ``where`` of
the registry version it was accepted under, over the sink's columns of the moment, and a
sink PATCH may have removed a column that an older version's ``where`` reads (dropping the
``where`` with it). Raising would fail the run and every retry; instead those events are
dead-lettered with the reason (below), and the others route normally.

Arithmetic follows Spark SQL's ANSI mode, row by row (:func:`judge`): an integer ``+ - *``,
unary ``-`` or ``abs`` whose result leaves its type (``int`` with ``int``, ``bigint`` as
soon as one side is; an integer literal is an ``int`` when it fits, as in Spark), and a
``/`` by zero, are an *error for that row*, never a value that routes it: Arrow would wrap
the integer around and give ±infinity. Such a row is taken by no sink whose predicate
errs on it; the collector dead-letters it with the message (reason ``where_error``), as a
mapping error. As in Spark, the right side of ``AND`` is only evaluated where the left is
not FALSE (of ``OR``: not TRUE), ``COALESCE`` stops at the first non-NULL value and ``IN``
at the first match, so ``d <> 0 AND n / d > 1`` errs on no row. Decimal arithmetic is
done in double (Arrow refuses the widened decimal types Spark would use).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from functools import lru_cache
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from icefloe.streams.model import Column
from icefloe.streams.where import (
    MAX_WHERE_CHARS,
    WHERE_COLUMNS,
    parse_where,
    temporal_literal,
)

Value: TypeAlias = "pa.Array | pa.ChunkedArray | pa.Scalar"
Errors: TypeAlias = "pa.Array | None"
"""Per row, the message of the first error the predicate raised for it (null: none);
None when no row erred."""

# node class -> Arrow kernel(s); keyed by sqlglot class, looked up by type(node)
_COMPARE: dict[type[exp.Expr], Any] = {
    exp.EQ: pc.equal, exp.NEQ: pc.not_equal, exp.GT: pc.greater,
    exp.GTE: pc.greater_equal, exp.LT: pc.less, exp.LTE: pc.less_equal}
_ARITHMETIC: dict[type[exp.Expr], tuple[Any, Any, Any]] = {
    exp.Add: (pc.add, pc.add_checked, np.add),
    exp.Sub: (pc.subtract, pc.subtract_checked, np.subtract),
    exp.Mul: (pc.multiply, pc.multiply_checked, np.multiply)}
_INT32 = (-(2 ** 31), 2 ** 31 - 1)
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


@dataclass(frozen=True)
class Verdict:
    """What a predicate says about each row: ``taken`` (no nulls; FALSE where it erred)
    and ``errors`` (see :data:`Errors`)."""

    taken: pa.Array
    errors: Errors


def where_error_messages(sink: str, table: str, sql: str, errors: pa.Array) -> pa.Array:
    """``errors`` (per row: what the predicate raised, or null) as dead-letter messages
    naming the sink, its table and its ``where``: one text for both output paths."""
    prefix = f"where {sql[:200]!r} of sink {sink!r} (table {table!r}): "
    return pc.binary_join_element_wise(pa.scalar(prefix), errors, "")


@lru_cache(maxsize=256)
def compiled(sql: str, columns: tuple[tuple[str, str], ...]) -> exp.Expr:
    """The checked tree of ``sql`` over ``(name, type)`` columns (parsed once per
    predicate and column set)."""
    return parse_where(sql, tuple(Column(name, type_) for name, type_ in columns))


@lru_cache(maxsize=256)
def fitted(sql: str, columns: tuple[tuple[str, str], ...]) -> exp.Expr | str:
    """:func:`compiled`, or why ``sql`` does not fit ``columns`` (a text; remembered too):
    an older registry version's ``where`` that reads a column the sink no longer declares
    (the module doc), or one a registry not written by this icefloe holds."""
    try:
        return compiled(sql, columns)
    except ValueError as exc:
        missing = _missing_columns(sql, {name for name, _ in columns})
        if missing:
            named = ", ".join(repr(n) for n in missing)
            return (f"reads column{'s' if len(missing) > 1 else ''} {named}, which the sink "
                    "no longer declares (the where of the registry version this event was "
                    "accepted under; the column was removed from the sink since)")
        return f"does not fit the sink's columns any more: {exc}"


def _missing_columns(sql: str, declared: set[str]) -> list[str]:
    """The columns ``sql`` reads that are neither in ``declared`` nor the envelope's
    (empty when it does not even parse, or is too long to)."""
    if len(sql) > MAX_WHERE_CHARS:
        return []
    try:
        trees = sqlglot.parse(sql, read="spark")
    except (SqlglotError, RecursionError):
        return []
    names = {c.name for tree in trees if tree is not None for c in tree.find_all(exp.Column)
             if not c.table}
    return sorted(names - declared - set(WHERE_COLUMNS))


def judge(sql: str, columns: tuple[Column, ...], rows: pa.Table) -> Verdict:
    """Which rows the predicate takes, and the error it raised on any row (module doc); a
    predicate that does not fit ``columns`` errs on every row, with the reason
    (:func:`fitted`)."""
    tree = fitted(sql, tuple((c.name, c.type) for c in columns))
    if isinstance(tree, str):
        return Verdict(pa.array(np.zeros(rows.num_rows, dtype=bool)),
                       pa.array([tree] * rows.num_rows, pa.string()))
    value, errors = _Eval(rows).eval(tree)
    if isinstance(value, pa.Scalar):
        taken = value.is_valid and bool(value.as_py())
        mask = pa.array(np.full(rows.num_rows, taken, dtype=bool))
    else:
        value = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
        mask = pc.fill_null(value.cast(pa.bool_()), False)
    if errors is not None:
        mask = pc.and_(mask, pc.is_null(errors))
    return Verdict(mask, errors)


def evaluate(tree: exp.Expr, rows: pa.Table) -> tuple[Value, Errors]:
    """The value of a checked expression tree over ``rows`` and its rows' errors (a
    table template's part: :mod:`pipeline.table_names`)."""
    return _Eval(rows).eval(tree)


def accepts(sql: str, columns: tuple[Column, ...], rows: pa.Table) -> pa.Array:
    """A boolean mask with no nulls: row i is taken iff the predicate is TRUE for it (and
    raised no error on it)."""
    return judge(sql, columns, rows).taken


def referenced(sql: str, columns: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The column names ``sql`` reads: all an evaluator needs in ``rows`` (the executors
    hand it only those, in their declared Arrow types)."""
    tree = fitted(sql, columns)
    if isinstance(tree, str):  # errs on every row, reading nothing (:func:`judge`)
        return ()
    return tuple(sorted({c.name for c in tree.find_all(exp.Column)}))


class _Eval:
    """One evaluation over ``rows``: each node gives its value and its rows' errors."""

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows
        self.n = rows.num_rows

    def eval(self, node: exp.Expr) -> tuple[Value, Errors]:
        kind = type(node)
        if isinstance(node, exp.Paren):
            return self.eval(node.this)
        if isinstance(node, exp.Column):
            rows = self.rows
            return (rows.column(node.name) if node.name in rows.column_names else
                    pa.scalar(None)), None
        if isinstance(node, exp.Literal):
            return (pa.scalar(node.this) if node.is_string else _number(node.this)), None
        if isinstance(node, exp.Boolean):
            return pa.scalar(bool(node.this)), None
        if isinstance(node, exp.Null):
            return pa.scalar(None), None
        if isinstance(node, exp.And | exp.Or):
            return self._connector(node)
        if isinstance(node, exp.Not):
            value, errors = self.eval(node.this)
            return pc.invert(_boolean(value)), errors
        if kind in _COMPARE:
            (left, e1), (right, e2) = self.eval(node.this), self.eval(node.expression)
            return _compare(_COMPARE[kind], left, right), _first(e1, e2)
        if isinstance(node, exp.Between):  # Spark: this >= low AND this <= high
            this, e0 = self.eval(node.this)
            low, e1 = self.eval(node.args["low"])
            above = _compare(pc.greater_equal, this, low)
            high, e2 = self.eval(node.args["high"])
            errors = _first(_first(e0, e1), self._where(e2, _not_false(above)))
            return pc.and_kleene(above, _compare(pc.less_equal, this, high)), errors
        if isinstance(node, exp.In):
            return self._in(node)
        if isinstance(node, exp.Is):
            value, errors = self.eval(node.this)
            return pc.is_null(value), errors
        if isinstance(node, exp.Like | exp.ILike):
            value, errors = self.eval(node.this)
            return pc.match_like(value, node.expression.this,
                                 ignore_case=isinstance(node, exp.ILike)), errors
        if kind in _ARITHMETIC or isinstance(node, exp.Div):
            return self._arithmetic(node)
        if isinstance(node, exp.Neg):
            value, errors = self.eval(node.this)
            return self._unary(node, value, errors, pc.negate, pc.negate_checked)
        return self._function(node)

    def _connector(self, node: exp.Connector) -> tuple[Value, Errors]:
        """A chain of AND (or OR), left to right: a side is evaluated (its errors count)
        only on rows the sides before it have not decided (FALSE for AND, TRUE for OR)."""
        is_and = isinstance(node, exp.And)
        combine = pc.and_kleene if is_and else pc.or_kleene
        out: Value | None = None
        errors: Errors = None
        for side in node.flatten():
            value, more = self.eval(side)
            value = _boolean(value)
            if out is None:
                out, errors = value, more
                continue
            open_ = _not_false(out) if is_and else _not_true(out)
            errors = _first(errors, self._where(more, open_))
            out = combine(out, value)
        assert out is not None
        return out, errors

    def _in(self, node: exp.In) -> tuple[Value, Errors]:
        """``x IN (a, b)`` as ``x = a OR x = b``: NULL when no item matches and x or an item
        is NULL, as SQL has it; an item is evaluated only where x is not NULL and no item
        before it matched (Spark's order)."""
        this, errors = self.eval(node.this)
        out: Value | None = None
        for item in node.expressions:
            value, more = self.eval(item)
            if more is not None:
                open_ = pc.is_valid(this) if out is None else \
                    pc.and_(pc.is_valid(this), _not_true(out))
                errors = _first(errors, self._where(more, open_))
            equal = _compare(pc.equal, this, value)
            out = equal if out is None else pc.or_kleene(out, equal)
        assert out is not None
        return out, errors

    def _arithmetic(self, node: exp.Expr) -> tuple[Value, Errors]:
        (left, e1), (right, e2) = self.eval(node.this), self.eval(node.expression)
        errors = _first(e1, e2)
        if isinstance(node, exp.Div):  # Spark's '/' is always fractional
            left, right = _double(left), _double(right)
            zero = pc.and_(pc.equal(right, 0.0), pc.is_valid(left))  # NULL / 0 is NULL
            divisor = pc.if_else(zero, None, right) if not isinstance(right, pa.Scalar) \
                else (pa.scalar(None, pa.float64()) if right.is_valid and
                      right.as_py() == 0 else right)
            return pc.divide(left, divisor), _first(errors, self._flag(
                zero, f"division by zero in {_shown(node)}"))
        unchecked, checked, exact = _ARITHMETIC[type(node)]
        if _is_decimal(left) or _is_decimal(right):
            left, right = _double(left), _double(right)
        if not (_is_integer(left) and _is_integer(right)):
            return unchecked(left, right), errors
        try:
            return checked(left, right), errors
        except pa.ArrowInvalid:  # some row overflows: find which
            pass
        value = unchecked(left, right)
        bad = _overflowed(exact, left, right, value.type)
        return value, _first(errors, self._flag(
            bad, f"integer overflow in {_shown(node)} (past the range of "
            f"{_spark_type(value.type)})"))

    def _unary(self, node: exp.Expr, value: Value, errors: Errors, unchecked: Any,
               checked: Any) -> tuple[Value, Errors]:
        """``-x`` or ``abs(x)``: an error where x is its integer type's minimum."""
        if not _is_integer(value):
            return unchecked(_double(value) if _is_decimal(value) else value), errors
        try:
            return checked(value), errors
        except pa.ArrowInvalid:
            pass
        lowest = _INT32[0] if value.type == pa.int32() else _INT64[0]
        bad = pc.equal(value, pa.scalar(lowest, value.type))
        return unchecked(value), _first(errors, self._flag(
            bad, f"integer overflow in {_shown(node)} (past the range of "
            f"{_spark_type(value.type)})"))

    def _function(self, node: exp.Expr) -> tuple[Value, Errors]:
        if isinstance(node, exp.Coalesce):  # Spark stops at the first non-NULL value
            out: Value | None = None
            errors: Errors = None
            for arg in node.iter_expressions():
                value, more = self.eval(arg)
                if out is None:
                    out, errors = value, more
                    continue
                errors = _first(errors, self._where(more, pc.is_null(out)))
                out = pc.coalesce(out, value)
            assert out is not None
            return out, errors
        (value, errors), *_ = [self.eval(a) for a in node.iter_expressions()]
        if isinstance(node, exp.Lower):
            return pc.utf8_lower(value), errors
        if isinstance(node, exp.Upper):
            return pc.utf8_upper(value), errors
        if isinstance(node, exp.Length):
            return pc.utf8_length(value), errors
        if isinstance(node, exp.Abs):
            return self._unary(node, value, errors, pc.abs, pc.abs_checked)
        raise ValueError(f"{node.sql('spark')[:60]!r} is not supported in a where predicate")

    def _flag(self, bad: Value, message: str) -> Errors:
        """``message`` on the rows where ``bad`` is TRUE (None when there are none)."""
        if isinstance(bad, pa.Scalar):
            if not (bad.is_valid and bad.as_py()):
                return None
            return pa.array([message] * self.n, pa.string())
        bad = bad.combine_chunks() if isinstance(bad, pa.ChunkedArray) else bad
        bad = pc.fill_null(bad, False)
        if not pc.any(bad).as_py():
            return None
        return pc.if_else(bad, pa.scalar(message), pa.scalar(None, pa.string()))

    def _where(self, errors: Errors, open_: Value) -> Errors:
        """``errors`` on the rows where ``open_`` (a boolean) is TRUE: the rows on which
        the side that raised them was evaluated."""
        if errors is None:
            return None
        if isinstance(open_, pa.Scalar):
            return errors if open_.is_valid and open_.as_py() else None
        open_ = open_.combine_chunks() if isinstance(open_, pa.ChunkedArray) else open_
        kept = pc.if_else(pc.fill_null(open_, False), errors, pa.scalar(None, pa.string()))
        return kept if pc.any(pc.is_valid(kept)).as_py() else None


def _first(a: Errors, b: Errors) -> Errors:
    """Per row, the first of two errors (``a`` wins where both erred)."""
    if a is None:
        return b
    return a if b is None else pc.coalesce(a, b)


def _not_false(value: Value) -> Value:
    """TRUE where a boolean is TRUE or NULL: where ``AND`` goes on to its right side."""
    return pc.fill_null(_boolean(value), True) if not isinstance(value, pa.Scalar) else \
        pa.scalar(not (value.is_valid and value.as_py() is False))


def _not_true(value: Value) -> Value:
    """TRUE where a boolean is FALSE or NULL: where ``OR`` goes on to its right side."""
    return pc.invert(pc.fill_null(_boolean(value), False)) \
        if not isinstance(value, pa.Scalar) else \
        pa.scalar(not (value.is_valid and value.as_py() is True))


def _overflowed(exact: Any, left: Value, right: Value, kind: pa.DataType) -> pa.Array:
    """Rows whose exact integer result leaves ``kind`` (int32 or int64). Narrow types are
    recomputed in int64; for int64, only rows whose float result comes near the range
    are checked exactly, in Python (they are few)."""
    n = max(len(v) for v in (left, right) if not isinstance(v, pa.Scalar))
    a, b = _numpy(left, n), _numpy(right, n)
    valid = ~(_nulls(left, n) | _nulls(right, n))
    if kind != pa.int64():
        result = exact(a.astype(np.int64), b.astype(np.int64))
        return pa.array(valid & ((result < _INT32[0]) | (result > _INT32[1])))
    with np.errstate(over="ignore", invalid="ignore"):
        near = np.abs(exact(a.astype(np.float64), b.astype(np.float64))) >= 2.0 ** 62
    python = {np.add: operator.add, np.subtract: operator.sub,
              np.multiply: operator.mul}[exact]
    bad = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(near & valid):
        bad[i] = not _INT64[0] <= python(int(a[i]), int(b[i])) <= _INT64[1]
    return pa.array(bad)


def _numpy(value: Value, n: int) -> np.ndarray:
    if isinstance(value, pa.Scalar):
        return np.full(n, value.as_py() if value.is_valid else 0, dtype=np.int64)
    value = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    return value.fill_null(0).to_numpy(zero_copy_only=False)


def _nulls(value: Value, n: int) -> np.ndarray:
    if isinstance(value, pa.Scalar):
        return np.full(n, not value.is_valid)
    value = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    return pc.is_null(value).to_numpy(zero_copy_only=False)


def _is_integer(value: Value) -> bool:
    return pa.types.is_integer(value.type)


def _is_decimal(value: Value) -> bool:
    return pa.types.is_decimal(value.type)


def _spark_type(kind: pa.DataType) -> str:
    return "int" if kind == pa.int32() else "bigint"


def _shown(node: exp.Expr) -> str:
    return repr(node.sql("spark")[:80])


def _number(text: str) -> pa.Scalar:
    """A numeric literal as Spark types it: an integer is an ``int`` when it fits, else a
    ``bigint`` (the check refuses larger ones); anything else a double."""
    try:
        value = int(text)
    except ValueError:
        return pa.scalar(float(text))
    if _INT32[0] <= value <= _INT32[1]:
        return pa.scalar(value, pa.int32())
    return pa.scalar(value, pa.int64())


def _double(value: Value) -> Value:
    """``value`` as a double, rounded where a bigint is beyond 2**53 (Spark's cast)."""
    return pc.cast(value, pa.float64(), safe=False)


def _boolean(value: Value) -> Value:
    """A NULL literal or a null-typed value as a boolean NULL (Kleene logic needs bools)."""
    return value.cast(pa.bool_()) if value.type == pa.null() else value


def _compare(function: Callable[[Value, Value], Value], left: Value, right: Value) -> Value:
    """``function(left, right)`` with a literal read as the other side's type when they
    differ (``_received_at > '2026-01-01'``, ``x = NULL``): a NULL side gives NULL."""
    left, right = _aligned(left, right), _aligned(right, left)
    if left.type != right.type and pa.types.is_floating(left.type) != \
            pa.types.is_floating(right.type) and all(
                _is_numeric(v) for v in (left, right)):
        left, right = _double(left), _double(right)  # Spark compares them as doubles
    return function(left, right)


def _is_numeric(value: Value) -> bool:
    kind = value.type
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or \
        pa.types.is_decimal(kind)


def _aligned(value: Value, other: Value) -> Value:
    if not isinstance(value, pa.Scalar) or value.type == other.type:
        return value
    if value.type == pa.null():
        return value.cast(other.type)
    if pa.types.is_string(value.type) and pa.types.is_temporal(other.type):
        moment = temporal_literal(value.as_py())
        if pa.types.is_date(other.type):
            return pa.scalar(moment.date(), other.type)
        if pa.types.is_time(other.type):
            return pa.scalar(moment.time(), other.type)
        if getattr(other.type, "tz", None) is None:
            moment = moment.astimezone(UTC).replace(tzinfo=None)
        return pa.scalar(moment, other.type)
    return value
