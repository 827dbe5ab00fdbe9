"""How large one value of a ``sql`` mapping can get: a bound checked before anything runs.

Why: a mapping runs in the collector's JVM on every row of a stream. A few allow-listed
functions multiply their input (``regexp_replace`` by its replacement, ``concat_ws`` and
``array_join`` by their separator per element, a lambda by what it adds per element, an
``aggregate`` whose accumulator is used twice doubles per element): nested, four
``regexp_replace`` calls turned a 1 KB field into gigabytes per row and ended the JVM (#36).
What can be known from the expression alone is refused when the mapping is loaded or sent
to the admin API, naming the call; what cannot (sizes of actual values) is bounded at run
time (``collector.sql_max_value_bytes``, see :mod:`pipeline.load.mapped`).

The bound is in bytes, over inputs of at most :data:`INPUT_BYTES` each (an event's largest
size by default: every field of it is at most that) and is deliberately coarse: most
functions give at most the sum of their arguments; the expanding ones multiply by a factor
that holds for any input (``hex`` x2, ``url_encode`` x3, ``to_json`` x6 for escapes...);
a lambda adds, per element, what its body adds beyond the element. Arrays are counted by
their bytes, and an array of ``b`` bytes has at most ``b + 1`` elements (``split(s, '')``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlglot import exp

from icefloe.streams.sql_functions import function_name

INPUT_BYTES = 1024 * 1024
"""The size assumed for each column a mapping reads (``ingestor.max_event_bytes``' default)."""
MAX_VALUE_BOUND = 64 * 1024 * 1024
"""The largest bound a mapping's value may have over such inputs."""
_FACTORS: dict[str, int] = {
    "hex": 2, "base64": 2, "url_encode": 3, "to_json": 6, "upper": 3, "lower": 3,
    "ucase": 3, "lcase": 3, "initcap": 3, "mask": 4, "encode": 4, "bin": 2,
}
_PATTERNED = ("date_format", "to_char", "from_unixtime", "format_number")
_SEPARATED = ("concat_ws",)
_JOINS = ("array_join",)
_REPLACES = ("regexp_replace", "replace")
_PADS = ("lpad", "rpad")
_FORMATS = ("printf", "format_string")


class _TooLarge(ValueError):
    pass


def check_value_bound(tree: exp.Expr) -> None:
    """Raise ``ValueError`` naming the innermost call of ``tree`` (Spark SQL) whose value can
    exceed :data:`MAX_VALUE_BOUND` bytes over inputs of :data:`INPUT_BYTES` each."""
    _size(tree, {})


def _size(node: exp.Expr, env: Mapping[str, int]) -> int:
    size = _node_size(node, env)
    if size > MAX_VALUE_BOUND:
        raise _TooLarge(
            f"{_named(node)} can give up to {size:,} bytes per row from fields of "
            f"{INPUT_BYTES:,} bytes; a sql mapping may give at most {MAX_VALUE_BOUND:,} "
            "(its output must be bounded by its input)")
    return size


def _node_size(node: exp.Expr, env: Mapping[str, int]) -> int:
    if isinstance(node, exp.Literal):
        return len(str(node.this))
    if isinstance(node, exp.Null | exp.Boolean):
        return 8
    if isinstance(node, exp.Identifier):
        return env.get(node.name, INPUT_BYTES)
    if isinstance(node, exp.Column):
        return env.get(node.name, INPUT_BYTES) if not node.table else INPUT_BYTES
    args = [a for a in node.iter_expressions() if not isinstance(a, exp.DataType)]
    lambdas = [a for a in args if isinstance(a, exp.Lambda)]
    if lambdas:
        return _with_lambdas(node, [a for a in args if a not in lambdas], lambdas, env)
    name = function_name(node) if isinstance(node, exp.Func) and \
        not isinstance(node, exp.Connector) else ""
    sizes = [_size(a, env) for a in args]
    total = sum(sizes)
    if name in _REPLACES:
        return sizes[0] * ((sizes[2] if len(sizes) > 2 else 0) + 1) if sizes else 0
    if name in _SEPARATED and sizes:
        rest = total - sizes[0]
        return rest + sizes[0] * (rest + len(sizes))
    if name in _JOINS and sizes:
        per = sum(sizes[1:])
        return sizes[0] + per * (sizes[0] + 1)
    if name in _PADS:
        width = args[1] if len(args) > 1 else None
        literal = isinstance(width, exp.Literal) and not width.is_string
        return (abs(int(width.this)) if literal and width is not None else INPUT_BYTES) * 4 \
            + total
    if name in _FORMATS or name in _PATTERNED:
        return total * 4 + 64 + _literal_count(args[1:] if name == "format_number" else [])
    if isinstance(node, exp.ArrayInsert):
        return total + _position(node.args.get("position")) * 8
    if isinstance(node, exp.Cast | exp.TryCast):
        return total * 2 + 32
    return total * _FACTORS.get(name, 1)


def _literal_count(args: Sequence[exp.Expr]) -> int:
    """``format_number``'s decimal places (a literal; checked by the allow-list's caller)."""
    first = args[0] if args else None
    if isinstance(first, exp.Literal) and not first.is_string and first.this.isdigit():
        return int(first.this)
    if first is None or (isinstance(first, exp.Literal) and first.is_string):
        return 0
    raise _TooLarge("function format_number needs literal decimal places in a sql mapping "
                    f"(got {first.sql(dialect='spark')[:60]!r}): they set its output size")


def _position(position: exp.Expr | None) -> int:
    """``array_insert``'s position: past the end it pads with nulls up to it."""
    if isinstance(position, exp.Neg):
        position = position.this
    if isinstance(position, exp.Literal) and not position.is_string and \
            position.this.isdigit():
        return int(position.this)
    raise _TooLarge("function array_insert needs a literal position in a sql mapping (got "
                    f"{position.sql(dialect='spark')[:60] if position else 'nothing'!r}): "
                    "past the end it pads with nulls up to it")


def _with_lambdas(node: exp.Expr, others: Sequence[exp.Expr],
                  lambdas: Sequence[exp.Lambda], env: Mapping[str, int]) -> int:
    """A higher-order call: its arrays, plus per element what each lambda adds beyond the
    element. An accumulator (``aggregate``'s) used more than once grows geometrically."""
    arrays = sum(_size(a, env) for a in others)
    count = arrays + 1
    total = arrays
    for lam in lambdas:
        names = [v.name for v in lam.expressions]
        base = _size(lam.this, {**env, **dict.fromkeys(names, 0)})
        if isinstance(node, exp.Reduce) and lam is node.args.get("merge") and names:
            grown = _size(lam.this, {**env, **dict.fromkeys(names[:1], INPUT_BYTES),
                                     **dict.fromkeys(names[1:], 0)})
            if grown - base > INPUT_BYTES:
                raise _TooLarge(f"{_named(node)} uses its accumulator {names[0]} more than "
                                "once per element: its value can double per element (a sql "
                                "mapping's output must be bounded by its input)")
        per = _size(lam.this, {**env, **dict.fromkeys(names, INPUT_BYTES)}) - base
        total += per * max(arrays, 1) // INPUT_BYTES + base * count
    return total


def _named(node: exp.Expr) -> str:
    name = function_name(node) if isinstance(node, exp.Func) and \
        not isinstance(node, exp.Connector) else type(node).__name__.lower()
    return f"function {name} ({node.sql(dialect='spark')[:60]!r})"
