"""Evaluate a sink's ``where`` on a source's decoded rows, column-wise in Arrow.

Why Arrow and not Spark SQL: one evaluator for both output paths, so a row goes to the same
tables whichever path wrote it. The embedded path runs it on the driver, over the run's
rows split per sink (:meth:`collector.routing.Routes.split`); the cluster path runs it on
the executors, one boolean column per sink added to the persisted run
(:func:`pipeline.load.executors.run_cluster`). The predicate was checked when it arrived
(:func:`icefloe.streams.where.parse_where`: only the node kinds handled here, with types
that compare), and is checked again here, since a registry written by an older icefloe is
not trusted. SQL's three-valued logic holds throughout (Kleene ``AND``/``OR``, comparisons
with NULL give NULL); :func:`accepts` turns NULL into "not taken".
"""

from __future__ import annotations

from datetime import UTC
from functools import lru_cache

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from icefloe.streams.model import Column
from icefloe.streams.where import parse_where, temporal_literal

Value = pa.Array | pa.ChunkedArray | pa.Scalar

_COMPARE = {exp.EQ: pc.equal, exp.NEQ: pc.not_equal, exp.GT: pc.greater,
            exp.GTE: pc.greater_equal, exp.LT: pc.less, exp.LTE: pc.less_equal}
_ARITHMETIC = {exp.Add: pc.add, exp.Sub: pc.subtract, exp.Mul: pc.multiply}


@lru_cache(maxsize=256)
def compiled(sql: str, columns: tuple[tuple[str, str], ...]) -> exp.Expression:
    """The checked tree of ``sql`` over ``(name, type)`` columns (parsed once per
    predicate and column set)."""
    return parse_where(sql, tuple(Column(name, type_) for name, type_ in columns))


def accepts(sql: str, columns: tuple[Column, ...], rows: pa.Table) -> pa.Array:
    """A boolean mask with no nulls: row i is taken iff the predicate is TRUE for it."""
    value = _eval(compiled(sql, tuple((c.name, c.type) for c in columns)), rows)
    if isinstance(value, pa.Scalar):
        taken = value.is_valid and bool(value.as_py())
        return pa.array([taken] * rows.num_rows, pa.bool_())
    value = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
    return pc.fill_null(value.cast(pa.bool_()), False)


def referenced(sql: str, columns: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The column names ``sql`` reads: all an evaluator needs in ``rows`` (the executors
    hand it only those, in their declared Arrow types)."""
    return tuple(sorted({c.name for c in compiled(sql, columns).find_all(exp.Column)}))


def _eval(node: exp.Expression, rows: pa.Table) -> Value:
    kind = type(node)
    if isinstance(node, exp.Paren):
        return _eval(node.this, rows)
    if isinstance(node, exp.Column):
        return rows.column(node.name) if node.name in rows.column_names else \
            pa.scalar(None)
    if isinstance(node, exp.Literal):
        return pa.scalar(node.this) if node.is_string else pa.scalar(_number(node.this))
    if isinstance(node, exp.Boolean):
        return pa.scalar(bool(node.this))
    if isinstance(node, exp.Null):
        return pa.scalar(None)
    if isinstance(node, exp.And):
        return pc.and_kleene(*_booleans(node, rows))
    if isinstance(node, exp.Or):
        return pc.or_kleene(*_booleans(node, rows))
    if isinstance(node, exp.Not):
        return pc.invert(_boolean(_eval(node.this, rows)))
    if kind in _COMPARE:
        return _compare(_COMPARE[kind], _eval(node.this, rows), _eval(node.expression, rows))
    if isinstance(node, exp.Between):
        this = _eval(node.this, rows)
        return pc.and_kleene(_compare(pc.greater_equal, this, _eval(node.args["low"], rows)),
                             _compare(pc.less_equal, this, _eval(node.args["high"], rows)))
    if isinstance(node, exp.In):
        return _in(node, rows)
    if isinstance(node, exp.Is):
        return pc.is_null(_eval(node.this, rows))
    if isinstance(node, exp.Like | exp.ILike):
        return pc.match_like(_eval(node.this, rows), node.expression.this,
                             ignore_case=isinstance(node, exp.ILike))
    if kind in _ARITHMETIC:
        return _ARITHMETIC[kind](_eval(node.this, rows), _eval(node.expression, rows))
    if isinstance(node, exp.Div):  # Spark's '/' is always fractional
        return pc.divide(_double(_eval(node.this, rows)), _double(_eval(node.expression,
                                                                         rows)))
    if isinstance(node, exp.Neg):
        return pc.negate(_eval(node.this, rows))
    return _function(node, rows)


def _function(node: exp.Expression, rows: pa.Table) -> Value:
    args = [_eval(a, rows) for a in node.iter_expressions()]
    if isinstance(node, exp.Lower):
        return pc.utf8_lower(args[0])
    if isinstance(node, exp.Upper):
        return pc.utf8_upper(args[0])
    if isinstance(node, exp.Length):
        return pc.utf8_length(args[0])
    if isinstance(node, exp.Abs):
        return pc.abs(args[0])
    if isinstance(node, exp.Coalesce):
        return pc.coalesce(*args)
    raise ValueError(f"{node.sql('spark')[:60]!r} is not supported in a where predicate")


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _double(value: Value) -> Value:
    return value.cast(pa.float64())


def _boolean(value: Value) -> Value:
    """A NULL literal or a null-typed value as a boolean NULL (Kleene logic needs bools)."""
    return value.cast(pa.bool_()) if value.type == pa.null() else value


def _booleans(node: exp.Expression, rows: pa.Table) -> tuple[Value, Value]:
    return (_boolean(_eval(node.this, rows)), _boolean(_eval(node.expression, rows)))


def _compare(function: object, left: Value, right: Value) -> Value:
    """``function(left, right)`` with a literal read as the other side's type when they
    differ (``_received_at > '2026-01-01'``, ``x = NULL``): a NULL side gives NULL."""
    left, right = _aligned(left, right), _aligned(right, left)
    return function(left, right)  # type: ignore[operator]


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


def _in(node: exp.In, rows: pa.Table) -> Value:
    """``x IN (a, b)`` as ``x = a OR x = b``: NULL when no item matches and x or an item
    is NULL, as SQL has it."""
    this = _eval(node.this, rows)
    out: Value | None = None
    for item in node.expressions:
        equal = _compare(pc.equal, this, _eval(item, rows))
        out = equal if out is None else pc.or_kleene(out, equal)
    assert out is not None
    return out
