"""``icefloe sql`` reads DuckDB's dialect, ``icefloe query`` Spark's, ``--dialect`` another
(issue #37): a query means what its dialect says whichever engine answers, or is refused
naming the construct the answering engine would answer by other rules.

Both real engines run here: DuckDB in process, Spark as the test session. The divergence
list of :mod:`icefloe.streams.divergent` is checked against them: each refused construct
does answer differently on the two engines, and each allowed one answers the same.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlglot

from icefloe.config import Config
from icefloe.streams.divergent import Divergent, refuse_divergent
from icefloe_app.cli import main
from tests.pipeline.test_models import EXAMPLE_CONFIG
from tests.pipeline.test_query import lake  # noqa: F401  (fixture)

SUBSTRING = "SELECT substring(url, 0, 2) AS h FROM pageviews WHERE url = '/b'"


def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *words: str
        ) -> tuple[int, Any, str]:
    """``icefloe <words>`` on the lake; exit code, JSON stdout (or None) and stderr."""
    code = main([*words[:-1], "--config", str(EXAMPLE_CONFIG), "--data-dir", str(tmp_path),
                 "--format", "json", words[-1]])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else None, out.err.strip()


def duckdb_says(sql: str) -> Any:
    import duckdb

    return duckdb.sql(sql).fetchall()[0][0]


def spark_says(spark: Any, sql: str) -> Any:
    return spark.sql(sql).collect()[0][0]


def test_sql_answers_by_duckdb_rules(lake: Config, tmp_path: Path,  # noqa: F811
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """DuckDB's ``substring('/b', 0, 2)`` is ``'/'``; Spark's rules gave ``'/b'``."""
    del lake
    want = duckdb_says("SELECT substring('/b', 0, 2)")
    code, rows, err = cli(tmp_path, capsys, "sql", SUBSTRING)
    assert code == 0, err
    assert rows == [{"h": want}] == [{"h": "/"}]
    assert "engine duckdb" in err


def test_dialect_spark_answers_by_spark_rules(spark: Any, lake: Config,  # noqa: F811
                                              tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    del lake
    want = spark_says(spark, "SELECT substring('/b', 0, 2)")
    for words in (("sql", "--dialect", "spark"), ("query",),
                  ("sql", "--dialect", "spark", "--engine", "spark")):
        code, rows, err = cli(tmp_path, capsys, *words, SUBSTRING)
        assert code == 0, err
        assert rows == [{"h": want}] == [{"h": "/b"}], words


@pytest.mark.parametrize(("sql", "construct"), [
    (SUBSTRING, "SUBSTRING(url, 0, 2)"),
    ("SELECT CAST(duration_ms / 3 AS INT) AS n FROM pageviews", "CAST(duration_ms / 3 AS INT)"),
    ("SELECT regexp_replace(url, '/', '_') AS u FROM pageviews", "REGEXP_REPLACE(url, '/', '_')"),
])
def test_spark_refuses_what_it_would_answer_by_its_own_rules(
        lake: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
        sql: str, construct: str) -> None:
    """``--engine spark`` on DuckDB SQL: refused in one line naming the construct, before
    Spark starts (on main it answered ``'/b'``)."""
    del lake
    code, rows, err = cli(tmp_path, capsys, "sql", "--engine", "spark", sql)
    assert (code, rows) == (1, None)
    assert construct in err
    assert "--engine duckdb" in err
    assert len(err.splitlines()) == 1


def test_auto_too_big_for_duckdb_refuses_rather_than_answer_by_spark_rules(
        lake: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    del lake
    monkeypatch.setenv("ICEFLOE_QUERY_EMBEDDED_MAX_BYTES", "0")
    code, _, err = cli(tmp_path, capsys, "sql", SUBSTRING)
    assert code == 1
    assert "SUBSTRING(url, 0, 2)" in err
    assert "embedded_max_bytes" in err


def test_an_unknown_dialect_is_refused_listing_the_choices(
        lake: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    del lake
    code, rows, err = cli(tmp_path, capsys, "sql", "--dialect", "nonsense", SUBSTRING)
    assert code != 0
    assert rows is None
    assert "'nonsense'" in err
    assert "spark, duckdb, postgres" in err
    assert len(err.splitlines()) == 1


def test_postgres_sql_is_transpiled_or_refused(lake: Config, tmp_path: Path,  # noqa: F811
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Postgres' ``7 / 2`` is 3: Spark's would be 3.5, so it is refused by name."""
    del lake
    code, _, err = cli(tmp_path, capsys, "query", "--dialect", "postgres",
                       "SELECT duration_ms / 3 AS n FROM pageviews")
    assert code == 1
    assert "duration_ms / 3" in err
    assert "integer" in err
    code, rows, err = cli(tmp_path, capsys, "query", "--dialect", "postgres",
                          "SELECT count(*) AS n FROM pageviews WHERE url IN ('/A', '/a')")
    assert code == 0, err
    assert rows == [{"n": 3}]


# Each construct refused for DuckDB SQL answers differently on the two engines when Spark
# runs sqlglot's transpilation (so refusing it is needed), and each allowed one the same.
FROM = (" FROM (SELECT 'hello' AS s, 7 AS a, -7 AS b, 2 AS c, [10, 20, 30] AS l, 1 AS i, "
        "1.5 AS d, DATE '2026-11-22' AS dt, TIMESTAMP '2026-11-22 10:11:12.5' AS ts, "
        "TIMESTAMP '2026-11-22 10:59:00' AS t1, TIMESTAMP '2026-11-22 11:01:00' AS t2, "
        "'a_b' AS u) t")  # 2026-11-22 is a Sunday
DIVERGENT = ["substring(s, 0, 2)", "substring(s, 2, -1)", "left(s, -2)", "l[i]",
             "CAST(d AS INTEGER)", "d::int", "dayofweek(dt)", "isodow(dt)", "log(100)",
             "epoch(ts)", "hash(s)", "regexp_replace(s, 'l', 'L')",
             "extract(dow FROM dt)", "date_part('dow', dt)", "datepart('dow', dt)",
             "extract(dayofweek FROM dt)", "weekday(dt)", "dayname(dt)", "monthname(dt)",
             "date_diff('hour', t1, t2)", "datediff('day', t1, t2 + INTERVAL 14 HOUR)",
             "date_diff('month', DATE '2024-01-31', DATE '2024-02-01')",
             "u LIKE 'a\\_b'", "u ILIKE 'A\\_B'"]
SAME = ["substring(s, 1, 2)", "substring(s, -3, 2)", "a / c", "b // c", "b % c",
        "'x' || NULL", "concat('x', NULL)", "l[1]", "l[3]", "CAST(a AS INTEGER)",
        "regexp_replace(s, 'l', 'L', 'g')", "round(d)", "instr(s, 'l')", "log10(100)",
        # what the refusals say to write instead
        "strftime(dt, '%a')", "strftime(dt, '%A')", "strftime(dt, '%B')",
        "date_diff('hour', date_trunc('hour', t1), date_trunc('hour', t2))",
        "date_diff('day', CAST(t1 AS DATE), CAST(t2 + INTERVAL 14 HOUR AS DATE))",
        "date_diff('day', DATE '2024-01-31', DATE '2024-02-01')",
        "date_diff('microsecond', TIMESTAMP '1970-01-01', ts) / 1e6",
        "u LIKE 'a\\_b' ESCAPE '\\'", "u LIKE 'a_b'"]
# Aggregates, over a group with a NULL and one with only NULLs.
GROUPS = (" FROM (VALUES (1, 1), (1, 2), (1, NULL), (1, 3), (1, 4), (2, NULL)) AS t(g, x) "
          "GROUP BY g ORDER BY g")
DIVERGENT_AGGREGATES = ["array_agg(x)", "list(x)", "array_agg(x) FILTER (WHERE x IS NOT NULL)",
                        "quantile(x, 0.5)"]
SAME_AGGREGATES = ["coalesce(array_agg(x) FILTER (WHERE x IS NOT NULL), [])", "median(x)",
                   "percentile_cont(0.5) WITHIN GROUP (ORDER BY x)",
                   "percentile_cont(0.3) WITHIN GROUP (ORDER BY x DESC)",
                   "percentile_disc(0.3) WITHIN GROUP (ORDER BY x)",
                   "percentile_disc(0.5) WITHIN GROUP (ORDER BY x DESC)"]


def _both(spark: Any, expression: str) -> tuple[Any, Any]:
    sql = f"SELECT {expression} AS v{FROM}"
    tree = sqlglot.parse_one(sql, read="duckdb")
    try:
        on_spark = spark_says(spark, tree.sql(dialect="spark"))
    except Exception as exc:  # an error is an answer too
        on_spark = f"error: {type(exc).__name__}"
    return duckdb_says(sql), on_spark


@pytest.mark.parametrize("expression", DIVERGENT)
def test_each_refused_construct_answers_differently(spark: Any, expression: str) -> None:
    on_duckdb, on_spark = _both(spark, expression)
    assert str(on_duckdb) != str(on_spark)
    assert not str(on_spark).startswith("error"), "an error is no silently wrong answer"
    with pytest.raises(Divergent):
        refuse_divergent(sqlglot.parse_one(f"SELECT {expression}{FROM}", read="duckdb"),
                         "duckdb")


@pytest.mark.parametrize("expression", SAME)
def test_each_allowed_construct_answers_the_same(spark: Any, expression: str) -> None:
    on_duckdb, on_spark = _both(spark, expression)
    assert str(on_duckdb) == str(on_spark)
    refuse_divergent(sqlglot.parse_one(f"SELECT {expression}{FROM}", read="duckdb"),
                     "duckdb")


def test_models_and_mappings_refuse_the_same_constructs(tmp_path: Path) -> None:
    """A ``-- dialect: duckdb`` model and a ``dialect = "duckdb"`` mapping run on Spark: the
    same construct is refused there too, not answered by Spark's rules."""
    from icefloe.config import Column
    from icefloe.streams.mappings import sql_expression
    from pipeline.models.dag import check_model_sql
    from pipeline.models.spec import ModelError
    from tests.pipeline.test_models import parse_model, write_model

    model = parse_model(write_model(tmp_path, "m", "-- dialect: duckdb\n"
                                    "SELECT substring(url, 0, 2) AS h FROM web.pageviews"))
    with pytest.raises(ModelError, match=r"SUBSTRING\(url, 0, 2\)"):
        check_model_sql(model)
    with pytest.raises(ValueError, match=r"SUBSTRING\(url, 0, 2\)"):
        sql_expression(Column("h", "string", sql="substring(url, 0, 2)", dialect="duckdb"))


def _numbers(rows: Any) -> list[Any]:
    """Rows with every number as a float (DuckDB's percentile_disc keeps the integer type,
    Spark's answers a double: the same value)."""
    def plain(value: Any) -> Any:
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        return value
    return [plain(row[0]) for row in rows]


def _groups(spark: Any, expression: str, transpiled: bool) -> tuple[Any, Any]:
    """Per group: DuckDB's answer and Spark's, Spark's from icefloe's Spark SQL
    (``transpiled``: from sqlglot's, as it was before the construct was refused)."""
    import duckdb

    from pipeline.read.query import spark_sql

    sql = f"SELECT {expression} AS v{GROUPS}"
    tree = sqlglot.parse_one(sql, read="duckdb")
    text = tree.sql(dialect="spark") if transpiled else spark_sql(tree, "duckdb")
    return (_numbers(duckdb.sql(sql).fetchall()),
            _numbers([tuple(r) for r in spark.sql(text).collect()]))


@pytest.mark.parametrize("expression", DIVERGENT_AGGREGATES)
def test_each_refused_aggregate_answers_differently(spark: Any, expression: str) -> None:
    on_duckdb, on_spark = _groups(spark, expression, transpiled=True)
    assert on_duckdb != on_spark
    with pytest.raises(Divergent):
        refuse_divergent(sqlglot.parse_one(f"SELECT {expression}{GROUPS}", read="duckdb"),
                         "duckdb")


@pytest.mark.parametrize("expression", SAME_AGGREGATES)
def test_each_allowed_aggregate_answers_the_same(spark: Any, expression: str) -> None:
    """``percentile_cont``/``_disc ... WITHIN GROUP`` too: sqlglot alone wrote Spark's
    approximate ``percentile_approx`` (and dropped ``DESC``)."""
    on_duckdb, on_spark = _groups(spark, expression, transpiled=False)
    assert on_duckdb == on_spark


@pytest.mark.parametrize(("dialect", "refused", "instead"), [
    ("duckdb", "extract(dow FROM dt)", "strftime(d, '%a')"),
    ("duckdb", "date_part('isodow', dt)", "strftime(d, '%a')"),
    ("duckdb", "dayofweek(dt)", "strftime(d, '%a')"),  # no longer: "use extract"
    ("duckdb", "weekday(dt)", "strftime(d, '%a')"),
    ("duckdb", "dayname(dt)", "strftime(d, '%A')"),
    ("duckdb", "monthname(dt)", "strftime(d, '%B')"),
    ("postgres", "extract(dow FROM dt)", "dayofweek(d) - 1"),
    ("postgres", "date_part('isodow', dt)", "Spark's dialect"),
    ("duckdb", "date_diff('hour', t1, t2)",
     "date_diff('hour', date_trunc('hour', a), date_trunc('hour', b))"),
    ("duckdb", "datediff('day', t1, t2)", "cast both to DATE"),
    ("duckdb", "array_agg(x)", "coalesce(array_agg(x) FILTER (WHERE x IS NOT NULL), [])"),
    ("duckdb", "list(x)", "coalesce(array_agg(x) FILTER (WHERE x IS NOT NULL), [])"),
    ("postgres", "array_agg(x)", "ARRAY[]::int[]"),
    ("duckdb", "quantile(x, 0.5)", "percentile_disc(q) WITHIN GROUP (ORDER BY x)"),
    ("duckdb", "u LIKE 'a\\_b'", "ESCAPE '\\'"),
    ("duckdb", "u NOT LIKE u", "ESCAPE '\\'"),
    ("duckdb", "epoch(ts)", "date_diff('microsecond', TIMESTAMP '1970-01-01', ts) / 1e6"),
])
def test_each_refusal_names_the_construct_and_what_to_write(dialect: str, refused: str,
                                                            instead: str) -> None:
    """No Spark needed; the replacements are checked on both engines above (SAME)."""
    with pytest.raises(Divergent) as error:
        refuse_divergent(sqlglot.parse_one(f"SELECT {refused} FROM t", read=dialect), dialect)
    assert instead in error.value.reason
    assert "extract" not in error.value.reason
    assert "epoch_ms" not in error.value.reason
    construct = sqlglot.parse_one(refused, read=dialect).sql(dialect=dialect)
    assert error.value.construct == construct


@pytest.mark.parametrize(("dialect", "expression"), [
    ("postgres", "u LIKE 'a\\_b'"),  # Postgres escapes with a backslash, as Spark does
    ("postgres", "coalesce(array_agg(x) FILTER (WHERE x IS NOT NULL), ARRAY[]::int[])"),
    ("duckdb", "coalesce(array_agg(DISTINCT x) FILTER (WHERE x > 0 AND x IS NOT NULL), [])"),
    ("duckdb", "u LIKE 'a\\b' ESCAPE '!'"),
    ("duckdb", "date_diff('day', dt, DATE '2026-12-01')"),
    ("spark", "array_agg(x)"),  # Spark's own rules
])
def test_what_answers_the_same_is_not_refused(dialect: str, expression: str) -> None:
    from sqlglot import exp

    tree = sqlglot.parse_one(f"SELECT {expression} FROM t", read=dialect)
    refuse_divergent(tree, dialect, {"t": {"dt": "DATE", "x": "INT", "u": "TEXT"}})
    assert tree.find(exp.Select) is not None


@pytest.mark.parametrize("dialect", ["spark", "duckdb", "postgres"])
def test_percentiles_within_group_stay_exact_on_spark(dialect: str) -> None:
    """sqlglot alone writes ``percentile_approx(x, 0.3)`` (approximate, ``DESC`` lost)."""
    from pipeline.read.query import spark_sql

    sql = "SELECT percentile_cont(0.3) WITHIN GROUP (ORDER BY x DESC) AS p FROM t"
    text = spark_sql(sqlglot.parse_one(sql, read=dialect), dialect)
    assert "PERCENTILE_CONT(0.3) WITHIN GROUP (ORDER BY x DESC" in text
    assert "APPROX" not in text.upper()


@pytest.mark.parametrize(("expression", "embedded"), [
    ("upper('straße')", "SELECT upper(s) FROM v"),  # 'STRAẞE' vs 'STRASSE'
    ("lower('İ')", "SELECT lower(s) FROM v"),  # 'i' vs 'i̇'
    ("avg(CAST(x AS DECIMAL(10, 2)))", "SELECT avg(price) FROM v"),  # DOUBLE vs decimal
])
def test_what_the_embedded_engine_no_longer_runs_answers_differently(
        spark: Any, expression: str, embedded: str) -> None:
    """The embedded engine's allow-list had these as exact (``pipeline.read.embedded``):
    the same Spark SQL answered differently by DuckDB and by Spark."""
    from pipeline.read.embedded import Untranslatable, translate

    sql = f"SELECT {expression} AS v FROM (VALUES (1), (2), (2)) AS t(x)"
    on_spark = spark_says(spark, sqlglot.transpile(sql, read="duckdb", write="spark")[0])
    assert str(duckdb_says(sql)) != str(on_spark)
    with pytest.raises(Untranslatable, match=r"Unicode rules|avg of a decimal"):
        translate(embedded, {"s": "string", "price": "decimal(10, 2)"})
