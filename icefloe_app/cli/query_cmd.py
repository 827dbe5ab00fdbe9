"""``icefloe query "SQL"``: ask the Iceberg tables a question from the shell.

Two engines read the same pinned snapshots. ``icefloe query`` reads Spark SQL (the language
the collector and the SQL models speak), ``icefloe sql`` DuckDB's (what OndatraSQL and DuckLake
users type); ``--dialect`` names another. The dialect decides what the query means, whichever
engine answers: a construct the answering engine would answer by other rules is refused by
name (:mod:`icefloe.streams.divergent`). Spark is the reference engine; but its ~10 s JVM
start per call is too slow for a one-row answer, so ``--engine auto`` hands queries over
small enough data (``query.embedded_max_bytes``) that sqlglot translates exactly to an
embedded DuckDB (:mod:`pipeline.read.embedded`), and says on stderr which engine answered
and why. Output is a readable table by default,
``json`` (a list of objects) or ``csv`` for scripts; only data goes to stdout.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import decimal
import math
import sys
from typing import TYPE_CHECKING, Any, cast

import msgspec

from icefloe.errors import ConfigError
from icefloe.streams.dialects import DIALECTS
from icefloe_app.cli.arg_types import whole_number
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

if TYPE_CHECKING:
    import pyarrow as pa

    from icefloe.config import Config
    from pipeline.read.embedded import Rows
    from pipeline.read.query import Plan

DESCRIPTION = """\
Run one read-only SQL query over the Iceberg tables: Spark SQL for `icefloe query`, DuckDB's
dialect for `icefloe sql` (--dialect spark|duckdb|postgres says otherwise). Name tables as
namespace.table (web.pageviews), or by stream name (pageviews). Every table is read at one
snapshot: the current one, or with --as-of the given snapshot id or the snapshot current at
a time.

examples:
  icefloe query "SELECT count(*) FROM web.pageviews"
  icefloe query "SELECT url, count(*) AS views FROM pageviews GROUP BY url ORDER BY views DESC"
  icefloe query --format json "SELECT * FROM shop.orders WHERE amount > 100"
  icefloe query --as-of 2026-11-23T17:00:00Z "SELECT count(*) FROM web.pageviews"
  icefloe query "SELECT count(*) FROM web.pageviews AT (VERSION => 3)"
  icefloe query "SELECT reason, count(*) FROM icefloe.dead_letters GROUP BY reason"
  icefloe query --engine spark "SELECT url, count(*) FROM pageviews GROUP BY url"
  icefloe sql "SELECT substring(url, 1, 4) AS head, count(*) FROM pageviews GROUP BY 1"
"""

EPILOG = """\
engines: auto (default) answers with the embedded DuckDB engine (about a second) when the
pinned data files total at most query.embedded_max_bytes and the statement translates
exactly (a DuckDB-dialect statement runs there as written), else with Spark (~10 s start
per call); --engine duckdb fails, naming the construct, when it cannot translate exactly;
--engine spark always starts Spark, and fails, naming the construct, when Spark would
answer a non-Spark dialect's statement by its own rules (such as substring(s, 0, 2)).

exit codes: 0 ok; 1 the query failed (the engine's message, in one line), an engine cannot
run it exactly, unknown --dialect, Java missing, catalog unreachable; 2 bad configuration,
a bad --as-of or --limit.
"""


HELP = ("run a read-only SQL query over the Iceberg tables (query: Spark SQL; "
        "sql: DuckDB's dialect)")


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "query", aliases=["sql"],
        help=HELP,
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sql", metavar="SQL", help="one SELECT / WITH / UNION query")
    add_config_arguments(parser, example=True)
    parser.add_argument("--format", choices=["table", "json", "csv"], default="table",
                        help="output format (default: table)")
    parser.add_argument("--as-of", metavar="SNAPSHOT_ID|TIMESTAMP",
                        help="read each table at this snapshot id, or at the snapshot that "
                             "was current at this ISO 8601 time (UTC unless it says otherwise)")
    parser.add_argument("--limit", type=whole_number("--limit", "all rows"), default=1000,
                        metavar="N",
                        help="print at most N rows (default 1000; 0 = all rows)")
    parser.add_argument("--engine", choices=["auto", "duckdb", "spark"], default="auto",
                        help="who answers: auto (default: DuckDB when small and exactly "
                             "translatable, else Spark), duckdb or spark")
    parser.add_argument("--dialect", metavar="|".join(DIALECTS),
                        help="the SQL dialect the query is written in: spark (the default of "
                             "`icefloe query`), duckdb (the default of `icefloe sql`) or "
                             "postgres; transpiled by sqlglot for the engine that answers")
    parser.add_argument("--spark-master", default="local[2]", metavar="URL",
                        help="Spark master (default local[2])")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pipeline.read.embedded import choose, run_embedded_plain  # startup time
    from pipeline.read.query import AsOf, QueryError, plan  # startup time

    try:  # a mistyped flag: bad usage (exit 2), like replay's --from, deadletters' --since
        as_of = AsOf.parse(args.as_of)
    except QueryError as exc:
        raise ConfigError(str(exc)) from None
    _, config = config_from_args(args, example=True)
    # names, tables, snapshots, dialect: fail before any engine starts
    pinned = plan(args.sql, config, as_of, dialect_of(args))
    limit = args.limit if args.limit > 0 else None
    choice = choose(config, pinned, args.engine)
    if choice.engine == "duckdb":
        assert choice.duck_sql is not None
        assert choice.planned is not None
        result, truncated = run_embedded_plain(config, pinned, choice.duck_sql,
                                               choice.planned, limit)
    else:
        print(f"icefloe query: starting Spark ({choice.reason}) ...", file=sys.stderr,
              flush=True)
        result, truncated = _run_spark(args, config, pinned, limit)
    write(result, args.format, sys.stdout)
    read_at = ", ".join(f"{t} @ {s if s is not None else 'empty'}"
                        for t, s in pinned.snapshots.items())
    note = f"{result.num_rows} row{'s' if result.num_rows != 1 else ''}"
    if truncated:
        note += f" shown (more exist; --limit {args.limit} cut them, --limit 0 shows all)"
    print(f"({note}{'; read ' + read_at if read_at else ''}; engine {choice.engine})",
          file=sys.stderr, flush=True)
    return 0


def dialect_of(args: argparse.Namespace) -> str:
    """``--dialect``, else the command's own: DuckDB's for ``sql``, Spark's for ``query``."""
    if args.dialect is not None:
        return str(args.dialect)
    return "duckdb" if getattr(args, "command", None) == "sql" else "spark"


def _run_spark(args: argparse.Namespace, config: Config, pinned: Plan, limit: int | None
               ) -> tuple[pa.Table, bool]:
    from pipeline.read.query import run_query  # startup time
    from pipeline.spark import get_spark  # lazy: pyspark

    spark = get_spark(args.spark_master, "icefloe-query")
    result, truncated, _ = run_query(spark, config, args.sql, limit=limit, pinned=pinned)
    return result, truncated


def write(result: pa.Table | Rows, fmt: str, out: Any) -> None:
    """Print ``result`` (Arrow, or the embedded engine's plain :class:`Rows`) as ``table``,
    ``json`` or ``csv``."""
    names = result.column_names
    rows = result.to_pylist()
    if fmt == "json":
        out.write(msgspec.json.encode([{k: _json(v) for k, v in r.items()} for r in rows])
                  .decode() + "\n")
        return
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([["" if r[n] is None else _text(r[n]) for n in names] for r in rows])
        return
    out.write(text_table(names, [[_text(r[n]) for n in names] for r in rows],
                         numeric=_numeric(result)))


def text_table(headers: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    """A boxed, aligned table; numbers right-aligned, like a SQL shell's."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        padded = [c.rjust(w) if num else c.ljust(w)
                  for c, w, num in zip(cells, widths, numeric, strict=True)]
        return "| " + " | ".join(padded) + " |"

    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    body = [rule, line(headers), rule, *(line(r) for r in rows), rule]
    return "\n".join(body) + "\n"


def _numeric(result: pa.Table | Rows) -> list[bool]:
    """Which columns hold numbers (right-aligned)."""
    if hasattr(result, "numeric"):  # Rows: known without importing pyarrow
        return list(result.numeric)
    table = cast("pa.Table", result)  # (the checker does not narrow on hasattr's False)
    return [_is_number(table.schema.field(n).type) for n in table.column_names]


def _is_number(kind: pa.DataType) -> bool:
    import pyarrow as pa  # lazy: pyarrow

    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind)
                or pa.types.is_decimal(kind))


def _text(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict | list):
        return msgspec.json.encode(_json(value)).decode()
    return str(value)


def _json(value: Any) -> Any:
    """Values msgspec cannot encode as-is: times as ISO strings, bytes as hex, NaN as None."""
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value
