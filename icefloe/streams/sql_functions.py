"""The functions a ``sql`` column mapping may call: an explicit allow-list, checked on the AST.

Why an allow-list and not a deny-list: Spark SQL can call into the JVM (``reflect``,
``java_method``, ``try_reflect``), raise on purpose (``raise_error``, ``assert_true``), run
user-registered functions, and grows new functions every release. A mapping is config an
admin types (or an API request a careless client sends), executed by the single collector on
every row of a stream; a function nobody reviewed could read files, stall the queue or make
a replay compute different values. So only functions reviewed as *pure, deterministic,
per-row scalar* Spark functions are accepted: string, math, date and time, conditional,
casts, JSON reads, hashing, and scalar array/map/struct access. Left out on purpose:

* JVM calls, raising functions, anything not built in (UDFs, ``db.fn(...)`` names);
* non-determinism (``rand``, ``uuid``, ``current_timestamp``, ``now``, zero-argument
  ``unix_timestamp``...): a run replayed after a crash must compute the same values, or
  exactly-once would hold for rows but not for their content — use ``_received_at``;
* aggregate, window, generator (``explode``) and table functions, and subqueries (also
  refused by :func:`icefloe.streams.mappings.sql_expression`: a mapping computes one value per
  event);
* functions that allocate in proportion to an argument (``repeat``, ``space``,
  ``array_repeat``, ``sequence``): one row could exhaust the collector's memory.

Functions whose output size an argument sets but that users need (``lpad``/``rpad`` to a
width, ``printf``/``format_string`` with a width or precision, #36) are allowed only with
that size as a literal of at most :data:`MAX_SIZE_ARGUMENT` (:func:`check_sizes`): a
``printf('%999999999d', x)`` asked the driver for hundreds of megabytes per row.
``regexp_replace``/``replace`` over such a function need a literal replacement and stay
within the same bound. ``overlay`` is bounded by its inputs (it never pads).

The check runs on the expression as transpiled to Spark SQL (what Spark will run), when
config is loaded, when the admin API receives a sink, and again when the collector builds a
run (a registry written by an older icefloe is not trusted). An allow-listed function can
still fail on some row (``element_at(a, 0)``, a bad regex read from the data): that costs
the row's value, never the run (see :mod:`pipeline.load.mapped`).
"""

from __future__ import annotations

import re

from sqlglot import exp

_STRING = """
ascii base64 bit_length btrim char char_length character_length chr concat concat_ws
contains elt endswith find_in_set format_number format_string ilike initcap instr lcase
left len length levenshtein like locate lower lpad ltrim luhn_check mask octet_length
overlay parse_url position printf regexp regexp_count regexp_extract regexp_extract_all
regexp_instr regexp_like regexp_replace regexp_substr replace reverse right rlike rpad rtrim
soundex split split_part startswith substr substring substring_index to_char to_number
translate trim try_parse_url try_to_number try_url_decode ucase unbase64 upper url_decode
url_encode encode decode to_binary try_to_binary
"""
_MATH = """
abs acos acosh asin asinh atan atan2 atanh bin bit_count bit_get bround cbrt ceil ceiling
conv cos cosh cot csc degrees div e exp expm1 factorial floor getbit greatest hex hypot
least ln log log10 log1p log2 mod negative pi pmod positive pow power radians rint round
sec shiftleft shiftright shiftrightunsigned sign signum sin sinh sqrt tan tanh try_add
try_divide try_mod try_multiply try_subtract unhex width_bucket
"""
_DATETIME = """
add_months convert_timezone date_add date_diff date_format date_from_unix_date date_part
date_sub date_trunc dateadd datediff datepart day dayofmonth dayofweek dayofyear extract
from_unixtime from_utc_timestamp hour last_day make_date make_dt_interval make_interval
make_timestamp make_timestamp_ltz make_timestamp_ntz make_ym_interval minute month
months_between next_day quarter second timestamp_micros timestamp_millis timestamp_seconds
timestampadd timestampdiff to_date to_timestamp to_timestamp_ltz to_timestamp_ntz
to_unix_timestamp to_utc_timestamp trunc try_make_timestamp try_to_timestamp unix_date
unix_micros unix_millis unix_seconds weekday weekofyear year dayname monthname
"""
_CONDITIONAL = """
case coalesce if ifnull nanvl nullif nullifzero nvl nvl2 zeroifnull equal_null isnan isnull
isnotnull
"""
_CAST = """
cast try_cast bigint binary boolean date decimal double float int smallint string timestamp
tinyint typeof
"""
_JSON = "get_json_object json_array_length json_object_keys from_json to_json"
_HASH = "crc32 hash md5 sha sha1 sha2 xxhash64"
_COLLECTIONS = """
aggregate reduce array array_append array_compact array_contains array_distinct array_except
array_insert array_intersect array_join array_max array_min array_position array_prepend
array_remove array_size array_union arrays_overlap arrays_zip cardinality element_at
try_element_at exists filter flatten forall get map map_contains_key map_filter
map_from_arrays map_from_entries map_keys map_values named_struct size slice sort_array
struct transform transform_keys transform_values zip_with
"""

ALLOWED_FUNCTIONS: frozenset[str] = frozenset(
    " ".join((_STRING, _MATH, _DATETIME, _CONDITIONAL, _CAST, _JSON, _HASH, _COLLECTIONS)
             ).split())
"""Spark SQL function names (lower case) a ``sql`` mapping may call."""

ZERO_ARG_REFUSED = frozenset({"unix_timestamp"})
"""Allowed only with arguments: without, they read the clock (non-deterministic)."""

MAX_SIZE_ARGUMENT = 65_536
"""The largest literal width (``lpad``/``rpad``) or total width and precision
(``printf``/``format_string``) a ``sql`` mapping may ask for, in characters."""
_PADS = ("lpad", "rpad")
_FORMATS = ("printf", "format_string")
_REPLACES = ("regexp_replace", "replace")
_SPEC = re.compile(r"%(?:\d+\$)?[-#+ 0,(<]*(\d+)?(?:\.(\d+))?[a-zA-Z%]")

_CALL = re.compile(r"`?([A-Za-z_][A-Za-z0-9_]*)`?\s*\(")


def function_name(node: exp.Func) -> str:
    """The Spark name of a function node (lower case), as Spark SQL will spell it.

    sqlglot normalizes known functions into its own classes (``nvl`` → ``Coalesce``) and
    renders them back per dialect; the rendered call name is what Spark resolves. Infix
    and keyword forms (``x RLIKE p``, ``CASE``) have no call name: their sqlglot name."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    text = node.sql(dialect="spark")
    first = node.args.get("this")
    infix = isinstance(first, exp.Expression) and text.startswith(first.sql(dialect="spark"))
    match = None if infix else _CALL.match(text)
    return (match.group(1) if match else node.sql_name()).lower()


def check_functions(tree: exp.Expr) -> None:
    """Raise ``ValueError`` naming the first function of ``tree`` (a Spark SQL expression)
    that is not allow-listed, or a qualified call (``db.fn(x)``: not a built-in)."""
    for dot in tree.find_all(exp.Dot):
        if isinstance(dot.expression, exp.Func):
            raise ValueError(f"function {dot.sql(dialect='spark').split('(', 1)[0]} is not "
                             "allowed in a sql mapping: only built-in functions, called "
                             "by their plain name (allowed: see docs/streams.md, Column mappings)")
    for node in tree.find_all(exp.Func):
        if isinstance(node, exp.Connector):
            continue  # AND, OR, XOR: operators, though sqlglot models them as functions
        name = function_name(node)
        if name in ALLOWED_FUNCTIONS:
            continue
        if name in ZERO_ARG_REFUSED:
            if any(True for _ in node.iter_expressions()):
                continue
            raise ValueError(f"function {name} without arguments is not allowed in a sql "
                             "mapping: it reads the clock, so a replay would compute "
                             "another value (use _received_at)")
        raise ValueError(f"function {name} is not allowed in a sql mapping (allowed: see "
                         "docs/streams.md, Column mappings; the list is "
                         "icefloe.streams.sql_functions.ALLOWED_FUNCTIONS)")


def check_sizes(tree: exp.Expr) -> None:
    """Raise ``ValueError`` naming a function whose output size an argument sets when that
    size is not a literal within :data:`MAX_SIZE_ARGUMENT` (see the module doc)."""
    for node in tree.find_all(exp.Func):
        name = function_name(node) if not isinstance(node, exp.Connector) else ""
        if name in _PADS or name in _FORMATS:
            _bound(node, name)
        elif name in _REPLACES:
            args = list(node.iter_expressions())
            padded = max((_bound(inner, function_name(inner)) for inner in
                          args[0].find_all(exp.Func) if function_name(inner) in
                          (*_PADS, *_FORMATS)), default=None) if args else None
            if padded is None:
                continue
            replacement = args[2] if len(args) > 2 else None
            if replacement is not None and not (isinstance(replacement, exp.Literal) and
                                                replacement.is_string):
                raise ValueError(f"function {name} over {_shown(args[0])} needs a literal "
                                 "replacement in a sql mapping (its output size must be "
                                 "bounded)")
            grown = padded * (len(replacement.this) + 1 if replacement is not None else 1)
            if grown > MAX_SIZE_ARGUMENT:
                raise ValueError(f"function {name} over {_shown(args[0])} can give "
                                 f"{grown} characters per row; a sql mapping may ask for "
                                 f"at most {MAX_SIZE_ARGUMENT}")


def _bound(node: exp.Expr, name: str) -> int:
    """The most characters a padding or formatting call can add (raising if unbounded)."""
    args = list(node.iter_expressions())
    if name in _PADS:
        width = args[1] if len(args) > 1 else None
        if not (isinstance(width, exp.Literal) and not width.is_string and
                width.this.lstrip("-").isdigit()):
            raise ValueError(f"function {name} needs a literal width in a sql mapping "
                             f"(got {_shown(width)}): its output size must be bounded")
        size = int(width.this)
    else:
        fmt = args[0] if args else None
        if not (isinstance(fmt, exp.Literal) and fmt.is_string):
            raise ValueError(f"function {name} needs a literal format in a sql mapping "
                             f"(got {_shown(fmt)}): widths in it set its output size")
        size = len(fmt.this) + sum(int(w or 0) + int(p or 0)
                                   for w, p in _SPEC.findall(fmt.this))
    if size > MAX_SIZE_ARGUMENT:
        raise ValueError(f"function {name} asks for {size} characters per row "
                         f"({_shown(node)}); a sql mapping may ask for at most "
                         f"{MAX_SIZE_ARGUMENT}")
    return max(size, 0)


def _shown(node: exp.Expr | None) -> str:
    return "nothing" if node is None else repr(node.sql(dialect="spark")[:60])
