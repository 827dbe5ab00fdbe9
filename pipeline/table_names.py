"""Evaluate a table template on a run's rows: the table each row names, or the rule it
breaks (:mod:`icefloe.streams.dynamic_tables`).

Why Arrow, and the ``where`` evaluator: a row's table must be a pure function of the row,
so a replay after a crash sends it to the same table; the ``where`` subset is evaluated
exactly, column-wise (:mod:`pipeline.where`), with Spark's ANSI errors as per-row errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from icefloe.streams.dynamic_tables import Template, check_part, split_template
from icefloe.streams.model import Column, DynamicTables
from icefloe.streams.where import column_kinds
from pipeline.where import evaluate

_UNSAFE = "[^a-z0-9_]"


@dataclass(frozen=True)
class Named:
    """Per row: the full table name (``namespace.name``; null where refused), the rule it
    broke (null where named) and a message naming the template, part and value."""

    tables: pa.Array
    rules: pa.Array
    messages: pa.Array


@lru_cache(maxsize=64)
def _compiled(text: str, columns: tuple[tuple[str, str], ...]
              ) -> tuple[Template, tuple[exp.Expr, ...]]:
    template = split_template(text)
    kinds = column_kinds(tuple(Column(n, t) for n, t in columns))
    return template, tuple(check_part(sql, kinds) for sql in template.expressions)


def table_names(text: str, columns: tuple[Column, ...], limits: DynamicTables,
                rows: pa.Table) -> Named:
    """The table each of ``rows`` names by the template ``text`` (see module doc)."""
    template, trees = _compiled(text, tuple((c.name, c.type) for c in columns))
    n = rows.num_rows
    rule = pa.nulls(n, pa.string())
    message = pa.nulls(n, pa.string())
    parts: list[pa.Array] = []
    trees_left = iter(trees)
    for is_expr, piece in template.pieces:
        if not is_expr:
            parts.append(pa.array([piece] * n, pa.string()))
            continue
        value, errors = evaluate(next(trees_left), rows)
        text_value = _as_text(value, n)
        clean = pc.replace_substring_regex(pc.utf8_lower(text_value), _UNSAFE, "_")
        shown = f"table template {text!r}: part {{{piece[:80]}}}"
        for name, bad in (("null_value", pc.is_null(text_value)),
                          ("empty_value", pc.equal(pc.utf8_length(clean), 0))):
            rule, message = _mark(rule, message, bad, name, f"{shown} is {name[:-6]}")
        if errors is not None:
            failed = pc.is_valid(errors)
            rule = pc.if_else(failed, pa.scalar("expression_error"), rule)
            message = pc.if_else(failed, pc.binary_join_element_wise(
                pa.scalar(f"{shown}: "), errors, ""), message)
        parts.append(pc.fill_null(clean, ""))
    name = pc.binary_join_element_wise(*parts, "") if len(parts) > 1 else parts[0]
    too_long = pc.greater(pc.utf8_length(name), limits.max_name_length)
    rule, message = _mark(rule, message, too_long, "name_too_long",
                          f"table template {text!r}: the name is longer than "
                          f"max_name_length ({limits.max_name_length})")
    full = pc.binary_join_element_wise(pa.scalar(template.namespace + "."), name, "")
    tables = pc.if_else(pc.is_null(rule), full, pa.scalar(None, pa.string()))
    return Named(_flat(tables), _flat(rule), _flat(message))


def _mark(rule: pa.Array, message: pa.Array, bad: pa.Array, name: str, text: str
          ) -> tuple[pa.Array, pa.Array]:
    """Rows where ``bad`` holds and no earlier rule was broken break ``name``."""
    hit = pc.and_(pc.fill_null(bad, False), pc.is_null(rule))
    return (pc.if_else(hit, pa.scalar(name), rule),
            pc.if_else(hit, pa.scalar(text), message))


def _as_text(value: pa.Array | pa.ChunkedArray | pa.Scalar, n: int) -> pa.Array:
    """A part's value as text: strings as they are, numbers in their shortest decimal
    text (Arrow's: ``4.0`` → ``4``; documented, and the same on every replay)."""
    if isinstance(value, pa.Scalar):
        value = pa.array([value.as_py()] * n)
    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if pa.types.is_null(value.type):
        return pa.nulls(n, pa.string())
    if pa.types.is_decimal(value.type) or pa.types.is_floating(value.type):
        value = value.cast(pa.float64())
    return value.cast(pa.string())


def _flat(value: pa.Array | pa.ChunkedArray) -> pa.Array:
    return value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
