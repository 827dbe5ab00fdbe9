"""``icefloe query``'s rewrite: DuckLake's ``AT (VERSION|TIMESTAMP => …)`` reads the snapshot it
names, and a table clause the rewrite cannot honour is refused by name, never dropped.

Planning needs only the catalog (no Spark); one test runs Spark to see the rows themselves.
The table is the example config's ``web.pageviews`` in a fresh SQLite catalog, written with
pyiceberg directly, each commit claiming a catalog version as a collector run does: three
commits of 4, 1 and 1 rows, i.e. catalog versions 1, 2 and 3.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from icefloe.config import Config
from pipeline.iceberg.catalog import open_catalog
from pipeline.read.query import QueryError, plan, run_query
from tests.pipeline.test_models import lake_config, pageviews

TABLE = "web.pageviews"


@pytest.fixture
def lake(tmp_path: Path) -> Config:
    config = lake_config(tmp_path)
    pageviews(config, [(1, 0, "/A", 1), (1, 0, "/a", 1), (1, 0, "/b", 2), (1, 1, "/a", 3)])
    pageviews(config, [(2, 0, "/c", 4)])
    pageviews(config, [(3, 0, "/d", 5)])
    return config


def snapshots(config: Config) -> list[Any]:
    """The table's snapshots, oldest first."""
    table = open_catalog(config.catalog).load_table(TABLE)
    return sorted(table.snapshots(), key=lambda s: s.sequence_number)


def pinned(config: Config, sql: str) -> list[int | None]:
    return list(plan(sql, config).snapshots.values())


def test_should_read_the_version_at_names(lake: Config) -> None:
    first, second, third = (s.snapshot_id for s in snapshots(lake))
    assert pinned(lake, f"SELECT * FROM {TABLE} AT (VERSION => 1)") == [first]
    assert pinned(lake, "SELECT * FROM pageviews AT (VERSION => 2) AS p") == [second]
    assert pinned(lake, f"SELECT * FROM {TABLE} FOR VERSION AS OF {first}") == [first]
    assert pinned(lake, f"SELECT * FROM {TABLE}") == [third]


def test_should_number_versions_as_tables_history_does(
        lake: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from icefloe_app.cli import main
    from tests.pipeline.test_models import EXAMPLE_CONFIG

    del lake
    assert main(["tables", "history", TABLE, "--config", str(EXAMPLE_CONFIG),
                 "--data-dir", str(tmp_path), "--json"]) == 0
    history = json.loads(capsys.readouterr().out)["snapshots"]
    config = lake_config(tmp_path)
    for row in history:
        at = pinned(config, f"SELECT * FROM {TABLE} AT (VERSION => {row['version']})")
        assert at == [row["snapshot_id"]]
    assert [r["version"] for r in history] == [3, 2, 1]


def test_should_read_a_snapshot_id_with_for_version_as_of(lake: Config) -> None:
    _, second, _ = (s.snapshot_id for s in snapshots(lake))
    assert pinned(lake, f"SELECT * FROM {TABLE} FOR VERSION AS OF {second}") == [second]
    assert pinned(lake, f"SELECT * FROM {TABLE} VERSION AS OF {second}") == [second]
    assert pinned(lake, f"SELECT * FROM {TABLE} AT (VERSION => 2)") == [second]


def test_should_read_the_snapshot_current_at_a_timestamp(lake: Config) -> None:
    first, _, third = snapshots(lake)
    at = dt.datetime.fromtimestamp(first.timestamp_ms / 1000, dt.UTC)
    text = at.isoformat().replace("+00:00", "Z")
    assert pinned(lake, f"SELECT * FROM {TABLE} AT (TIMESTAMP => '{text}')") == [
        first.snapshot_id]
    naive = at.replace(tzinfo=None).isoformat(sep=" ")
    assert pinned(lake, f"SELECT * FROM {TABLE} AT (TIMESTAMP => TIMESTAMP '{naive}')") == [
        first.snapshot_id]
    assert pinned(lake, f"SELECT * FROM {TABLE} FOR TIMESTAMP AS OF '{text}'") == [
        first.snapshot_id]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    assert pinned(lake, f"SELECT * FROM {TABLE} AT (TIMESTAMP => '{later.isoformat()}')") == [
        third.snapshot_id]


@pytest.mark.parametrize(("sql", "message"), [
    (f"SELECT * FROM {TABLE} AT (VERSION => 9)",
     r"there is no catalog version 9 yet; the newest is 3"),
    (f"SELECT * FROM {TABLE} FOR VERSION AS OF 9",
     r"FOR VERSION AS OF 9: Spark's FOR VERSION AS OF takes a snapshot id .* write "
     r"AT \(VERSION => 9\)"),
    (f"SELECT * FROM {TABLE} AT (TIMESTAMP => '2000-01-01T00:00:00Z')",
     r"table 'web.pageviews' had no snapshot at 2000-01-01T00:00:00\+00:00; its first"),
    (f"SELECT * FROM {TABLE} AT (VERSION => 'x')", r"AT \(VERSION => 'x'\).*a version is"),
    (f"SELECT * FROM {TABLE} AT (TIMESTAMP => now())", r"AT \(TIMESTAMP => NOW\(\)\).*literal"),
    # digits in a TIMESTAMP clause are not a time: they were read as a snapshot id
    (f"SELECT * FROM {TABLE} FOR TIMESTAMP AS OF '123'", r"'123'.*not an ISO 8601 time"),
    (f"SELECT * FROM {TABLE} AT (TIMESTAMP => '123')", r"not an ISO 8601 time"),
])
def test_should_refuse_travel_to_nowhere(lake: Config, sql: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        plan(sql, lake)


@pytest.mark.parametrize(("sql", "construct"), [
    (f"SELECT * FROM {TABLE} AT (OFFSET => -5)", "AT (OFFSET => -5)"),
    (f"SELECT * FROM {TABLE} BEFORE (TIMESTAMP => '2026-01-01')", "BEFORE (TIMESTAMP"),
    (f"SELECT * FROM {TABLE} WITH (NOLOCK)", "table hint WITH (NOLOCK)"),
    (f"SELECT * FROM {TABLE} CHANGES (INFORMATION => DEFAULT) AT (VERSION => 1)",
     "CHANGES (INFORMATION => DEFAULT)"),
    (f"SELECT * FROM {TABLE} WITH (INDEX(i))", "table hint WITH (INDEX(i))"),
    (f"SELECT * FROM {TABLE} AT (VERSION => 1) FOR VERSION AS OF 2", "two time-travel"),
    ("WITH c AS (SELECT 1 AS x) SELECT * FROM c AT (VERSION => 1)", "'c' is a CTE"),
])
def test_should_refuse_a_clause_it_cannot_honour(lake: Config, sql: str, construct: str
                                                 ) -> None:
    with pytest.raises(QueryError) as error:
        plan(sql, lake)
    assert construct in str(error.value)


def test_should_keep_what_the_table_reference_says_besides_its_name(lake: Config) -> None:
    sql = plan(f"SELECT * FROM ({TABLE} p JOIN web.pageviews q ON p.url = q.url) "
               f"TABLESAMPLE (50 PERCENT)", lake).sql
    assert " JOIN " in sql
    kept = plan(f"SELECT * FROM {TABLE} TABLESAMPLE (BUCKET 1 OUT OF 2) AS t(a, b)", lake).sql
    assert "TABLESAMPLE (BUCKET 1 OUT OF 2)" in kept
    assert "AS t(a, b)" in kept
    pivot = plan(f"SELECT * FROM {TABLE} PIVOT (count(*) FOR url IN ('/a', '/b'))", lake).sql
    assert "PIVOT" in pivot


def test_should_return_the_rows_of_the_version(spark: Any, lake: Config) -> None:
    sql = (f"SELECT v1.n AS v1, v2.n AS v2, now.n AS now FROM "
           f"(SELECT count(*) AS n FROM {TABLE} AT (VERSION => 1)) v1 CROSS JOIN "
           f"(SELECT count(*) AS n FROM pageviews AT (VERSION => 2)) v2 CROSS JOIN "
           f"(SELECT count(*) AS n FROM {TABLE}) now")
    result, _, _ = run_query(spark, lake, sql)
    assert result.to_pylist() == [{"v1": 4, "v2": 5, "now": 6}]
    bucket, _, _ = run_query(spark, lake, f"SELECT count(*) AS n FROM {TABLE} "
                             "TABLESAMPLE (0 PERCENT)")
    assert bucket.to_pylist() == [{"n": 0}]


@pytest.mark.parametrize(("sql", "construct"), [
    (f"SELECT url FROM {TABLE} ORDER BY url FETCH FIRST 1 ROWS WITH TIES", "WITH TIES"),
    (f"SELECT array_agg(url ORDER BY ts) FROM {TABLE}", "ARRAY_AGG(url ORDER BY ts)"),
    (f"SELECT url FROM {TABLE} FOR UPDATE", "FOR UPDATE"),
])
def test_should_refuse_what_spark_sql_would_lose(lake: Config, sql: str, construct: str
                                                 ) -> None:
    with pytest.raises(QueryError) as error:
        plan(sql, lake)
    assert construct in str(error.value)


def test_should_fail_the_command_in_one_line(lake: Config, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from icefloe_app.cli import main
    from tests.pipeline.test_models import EXAMPLE_CONFIG

    del lake
    code = main(["query", "--config", str(EXAMPLE_CONFIG), "--data-dir", str(tmp_path),
                 f"SELECT * FROM {TABLE} AT (VERSION => 7)"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0
    assert "there is no catalog version 7 yet; the newest is 3" in err


@pytest.mark.parametrize(("sql", "dialect"), [
    ("WITH Recent AS (SELECT url FROM pageviews) SELECT count(*) AS n FROM recent", "spark"),
    ("WITH recent AS (SELECT url FROM pageviews) SELECT count(*) AS n FROM RECENT", "duckdb"),
    ('WITH "Recent" AS (SELECT url FROM pageviews) SELECT count(*) AS n FROM recent',
     "duckdb"),
    ("WITH Recent AS (SELECT url FROM pageviews) SELECT count(*) AS n FROM recent",
     "postgres"),
])
def test_should_match_cte_names_ignoring_case(lake: Config, sql: str, dialect: str) -> None:
    """A reference differing from a CTE's name only in case reads the CTE, as in SQL (it
    was resolved as a stream: an unknown table, or another table's rows)."""
    pinned = plan(sql, lake, dialect=dialect)
    assert set(pinned.tables) == {TABLE}
    assert "recent" in pinned.sql.lower()
    assert pinned.sql.lower().count("__icefloe_") == 1


def test_should_refuse_a_postgres_cte_that_matches_only_ignoring_case(lake: Config) -> None:
    """Postgres keeps a quoted name's case: there ``recent`` is not ``"Recent"``, in Spark
    it is."""
    with pytest.raises(QueryError, match="recent matches a CTE only ignoring case"):
        plan('WITH "Recent" AS (SELECT url FROM pageviews) SELECT * FROM recent', lake,
             dialect="postgres")
    with pytest.raises(QueryError, match="'c' is a CTE"):
        plan("WITH C AS (SELECT 1 AS x) SELECT * FROM c AT (VERSION => 1)", lake)
