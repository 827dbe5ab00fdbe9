"""``icefloe query``'s embedded DuckDB engine against the Spark engine, on real tables.

One query set (counts, group-bys, filters, a join of two tables, order by + limit, time
travel) runs on both engines over the same pinned snapshots; the answers must be equal as
multisets (and in the same order where the query orders). Refusals name the construct;
``--engine auto`` picks by size and exactness; an S3 warehouse (moto) reads the same way;
``duckdb`` is not imported by a query Spark answers.
"""

from __future__ import annotations

import collections
import datetime as dt
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from icefloe.config import Config, load_config
from icefloe.errors import ConfigError
from icefloe_app.cli import main
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.read.embedded import Untranslatable, choose, run_embedded, translate
from pipeline.read.query import QueryError, plan, run_query
from tests.collector_support import BUYS, CLICKS, collector_config

T0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
ROOT = Path(__file__).resolve().parents[2]


def _clicks(start: int, count: int) -> pa.Table:
    rows = [{"user_id": f"u{i % 3}", "url": None if i % 7 == 0 else f"/p/{i % 4}", "n": i,
             "ts": T0 + dt.timedelta(hours=i), "_event_id": f"e{i}", "_received_at": T0,
             "_sequence": i} for i in range(start, start + count)]
    return pa.Table.from_pylist(rows, schema=table_arrow_schema(CLICKS))


def _buys(count: int) -> pa.Table:
    rows = [{"order_id": f"u{i % 4}", "amount": 1.5 * i, "qty": i, "paid": i % 2 == 0,
             "day": (T0 + dt.timedelta(days=i % 3)).date(), "meta": None, "ratio": 0.5,
             "_event_id": f"b{i}", "_received_at": T0, "_sequence": i} for i in range(count)]
    return pa.Table.from_pylist(rows, schema=table_arrow_schema(BUYS))


def _fill(config: Config) -> int:
    """Two commits to web.clicks (the first one's snapshot id is returned), one to shop.buys."""
    catalog = open_catalog(config.catalog)
    clicks = ensure_stream_table(catalog, CLICKS)
    clicks.append(_clicks(0, 30))
    first = clicks.current_snapshot().snapshot_id
    clicks.append(_clicks(30, 12))
    ensure_stream_table(catalog, BUYS).append(_buys(9))
    return first


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = collector_config(tmp_path_factory.mktemp("embedded"))
    return {"config": config, "first": _fill(config)}


QUERIES = [
    ("count", "SELECT count(*) AS n FROM web.clicks", False),
    ("join using", "SELECT count(*) AS n FROM web.clicks a JOIN web.clicks b USING (url)",
     False),  # USING names a column through an identifier, not a column node
    ("group by", "SELECT url, count(*) AS c, sum(n) AS s, min(ts) AS t0 FROM clicks "
                 "GROUP BY url", False),
    ("filters", "SELECT user_id, n FROM clicks WHERE n BETWEEN 5 AND 30 AND url IS NOT NULL "
                "AND url LIKE '/p/%' AND ts >= '2026-11-20 12:00:00' AND user_id IN "
                "('u1', 'u2')", False),
    ("join", "SELECT c.user_id, count(*) AS k, sum(b.qty) AS q, max(b.amount) AS a "
             "FROM clicks c JOIN shop.buys b ON c.user_id = b.order_id "
             "WHERE b.paid GROUP BY c.user_id", False),
    ("left join", "SELECT b.order_id, count(c.n) AS k FROM buys b LEFT JOIN clicks c "
                  "ON c.user_id = b.order_id GROUP BY b.order_id", False),
    ("order by + limit", "SELECT url, n FROM clicks ORDER BY url, n DESC LIMIT 9", True),
    ("having + cte", "WITH t AS (SELECT user_id, avg(n) AS m FROM clicks GROUP BY user_id) "
                     "SELECT user_id, m FROM t WHERE m > 1 ORDER BY m", True),
    ("case + coalesce", "SELECT coalesce(url, 'none') AS u, CASE WHEN n > 20 THEN 'late' "
                        "ELSE 'early' END AS k, length(user_id) AS l FROM clicks", False),
    ("union", "SELECT user_id AS id FROM clicks UNION SELECT order_id FROM buys", False),
    ("dates", "SELECT day, count(*) AS c FROM shop.buys WHERE day >= '2026-11-21' "
              "GROUP BY day", False),
]


def _value(value: Any) -> Any:
    """Compare floats to 9 digits (summation order differs between engines)."""
    if isinstance(value, float) and math.isfinite(value):
        return round(value, 9)
    return value


def _rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return [tuple(_value(v) for v in row.values()) for row in table.to_pylist()]


def _embedded(config: Config, sql: str) -> pa.Table:
    pinned = plan(sql, config)
    choice = choose(config, pinned, "duckdb")
    assert choice.duck_sql is not None
    assert choice.planned is not None
    result, _ = run_embedded(config, pinned, choice.duck_sql, choice.planned)
    return result


def _assert_same(spark_result: pa.Table, duck_result: pa.Table, ordered: bool) -> None:
    spark_rows, duck_rows = _rows(spark_result), _rows(duck_result)
    assert collections.Counter(duck_rows) == collections.Counter(spark_rows)
    if ordered:
        assert duck_rows == spark_rows


@pytest.mark.parametrize(("name", "sql", "ordered"), QUERIES, ids=[q[0] for q in QUERIES])
def test_both_engines_give_the_same_answers(spark, lake, name, sql, ordered):
    config = lake["config"]
    expected, _, _ = run_query(spark, config, sql)
    got = _embedded(config, sql)
    assert got.num_rows > 0, name
    _assert_same(expected, got, ordered)


def test_time_travel_reads_the_same_snapshot_on_both_engines(spark, lake):
    config, first = lake["config"], lake["first"]
    sql = (f"SELECT a.n AS n, a.c AS c FROM (SELECT count(*) AS n, 1 AS c FROM clicks "
           f"FOR VERSION AS OF {first}) a JOIN (SELECT count(*) AS n, 1 AS c FROM clicks) b "
           f"ON a.c = b.c WHERE a.n < b.n")
    expected, _, _ = run_query(spark, config, sql)
    got = _embedded(config, sql)
    assert _rows(got) == [(30, 1)]
    _assert_same(expected, got, ordered=True)


def test_limit_cuts_and_says_so(lake):
    config = lake["config"]
    pinned = plan("SELECT n FROM clicks ORDER BY n", config)
    choice = choose(config, pinned, "duckdb")
    result, truncated = run_embedded(config, pinned, choice.duck_sql, choice.planned, limit=4)
    assert truncated
    assert result.column("n").to_pylist() == [0, 1, 2, 3]


@pytest.mark.parametrize(("sql", "construct"), [
    ("SELECT n / 2 FROM clicks", "/ (division)"),
    ("SELECT CAST(n AS INT) FROM clicks", "CAST"),
    ("SELECT row_number() OVER (ORDER BY n) FROM clicks", "OVER (window function)"),
    ("SELECT substring(url, 0, 2) FROM clicks", "SUBSTRING"),
    ("SELECT n FROM clicks WHERE n = '1'", "n vs '1'"),
    ("SELECT n FROM clicks WHERE url = 'a\\\\b'", "backslash"),
    ("SELECT n FROM clicks WHERE ts > 'yesterday'", "not plain ISO 8601"),
    ("SELECT if(n > 1, 1, 0) FROM clicks", "does not read back"),
    ("SELECT upper(url) AS u FROM clicks", "UPPER(url): DuckDB and Spark map case"),
    ("SELECT count(*) FROM clicks WHERE lower(user_id) = 'u1'", "LOWER(user_id)"),
])
def test_duckdb_engine_names_what_it_cannot_translate(lake, sql, construct):
    pinned = plan(sql, lake["config"])
    with pytest.raises(QueryError, match="--engine duckdb cannot run this query exactly") as err:
        choose(lake["config"], pinned, "duckdb")
    assert construct in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("sql", "exact"), [
    ("SELECT upper(s) FROM v", False),  # upper('straße'): 'STRAẞE' vs 'STRASSE'
    ("SELECT lower(s) FROM v", False),  # lower('İ'): one character vs two
    ("SELECT upper('straße')", False),
    ("SELECT upper('abc'), lower(uid) FROM v", True),  # ASCII: the same on both
    ("SELECT avg(price) FROM v", False),  # decimal(p+4, s+4) in Spark, DOUBLE in DuckDB
    ("SELECT avg(n * 1.5) FROM v", False),  # 1.5 is a decimal literal in Spark
    ("SELECT avg(x) FROM v", False),  # unknown type
    ("WITH w AS (SELECT price AS n FROM v) SELECT avg(n) FROM w", False),  # n renamed
    ("SELECT avg(n), avg(DISTINCT n * 2 + r) FROM v", True),  # a double on both
])
def test_only_exact_case_mapping_and_averages_run_embedded(sql, exact):
    """``lower``/``upper`` and ``avg`` were allowed on any argument: the answer depended on
    the engine (``tests/pipeline/test_query_dialects.py`` runs both)."""
    columns = {"s": "string", "uid": "uuid", "price": "decimal(10, 2)", "n": "long",
               "r": "double"}
    if exact:
        assert translate(sql, columns)
    else:
        with pytest.raises(Untranslatable, match=r"Unicode rules|avg of a decimal"):
            translate(sql, columns)


def test_auto_hands_case_mapping_to_spark(lake):
    config = lake["config"]
    choice = choose(config, plan("SELECT upper(url) AS u FROM clicks", config), "auto")
    assert choice.engine == "spark"
    assert "UPPER(url)" in choice.reason


def test_translation_keeps_spark_null_ordering():
    assert translate("SELECT n FROM v ORDER BY n") == "SELECT n FROM v ORDER BY n NULLS FIRST"
    with pytest.raises(Untranslatable, match="CAST"):
        translate("SELECT * FROM v WHERE ts > TIMESTAMP '2026-01-01 00:00:00'")


def test_auto_picks_by_size_and_exactness(lake):
    config = lake["config"]
    small = choose(config, plan("SELECT count(*) FROM clicks", config), "auto")
    assert small.engine == "duckdb"
    odd = choose(config, plan("SELECT n / 2 FROM clicks", config), "auto")
    assert odd.engine == "spark"
    assert "/ (division)" in odd.reason
    tiny = msgspec.structs.replace(config, query=msgspec.structs.replace(
        config.query, embedded_max_bytes=1))
    big = choose(tiny, plan("SELECT count(*) FROM clicks", tiny), "auto")
    assert big.engine == "spark"
    assert "query.embedded_max_bytes" in big.reason
    assert choose(config, plan("SELECT 1", config), "spark").engine == "spark"


def test_embedded_max_bytes_is_validated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no ./icefloe.toml: defaults plus the environment
    monkeypatch.setenv("ICEFLOE_QUERY_EMBEDDED_MAX_BYTES", "-1")
    with pytest.raises(ConfigError, match=r"query\.embedded_max_bytes must be >= 0"):
        load_config(None)
    monkeypatch.setenv("ICEFLOE_QUERY_EMBEDDED_MAX_BYTES", "2048")
    assert load_config(None).query.embedded_max_bytes == 2048


def _config_file(tmp_path: Path, config: Config) -> Path:
    path = tmp_path / "query.toml"
    path.write_text(f'[catalog]\nuri = "{config.catalog.uri}"\n'
                    f'warehouse = "{config.catalog.warehouse}"\n'
                    '[store]\nurl = "file:///tmp/unused-store"\n')
    return path


def test_cli_answers_with_duckdb_and_says_so(lake, tmp_path, capsys):
    path = _config_file(tmp_path, lake["config"])
    assert main(["query", "--config", str(path), "--format", "json",
                 "SELECT count(*) AS n FROM web.clicks"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == '[{"n":42}]'
    assert "engine duckdb" in out.err
    assert main(["query", "--config", str(path), "--engine", "duckdb",
                 "SELECT n / 2 FROM web.clicks"]) == 1
    err = capsys.readouterr().err.strip()
    assert "/ (division)" in err
    assert len(err.splitlines()) == 1


def test_spark_answers_do_not_import_duckdb(lake, tmp_path):
    """The lazy import: planning and choosing Spark never load duckdb (nor does a duckdb
    answer load pyspark)."""
    path = _config_file(tmp_path, lake["config"])
    probe = ("import sys\n"
             "from icefloe.config import load_config\n"
             "from pipeline.read.query import plan\n"
             "from pipeline.read.embedded import choose, run_embedded\n"
             f"config = load_config({str(path)!r})\n"
             "p = plan('SELECT n / 2 FROM web.clicks', config)\n"
             "assert choose(config, p, 'auto').engine == 'spark'\n"
             "print('duckdb' in sys.modules)\n"
             "p = plan('SELECT count(*) FROM web.clicks', config)\n"
             "c = choose(config, p, 'auto')\n"
             "run_embedded(config, p, c.duck_sql, c.planned)\n"
             "print('duckdb' in sys.modules, 'pyspark' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "False"]


@pytest.mark.s3
def test_reads_an_s3_warehouse(tmp_path, s3_bucket):
    local = collector_config(tmp_path)
    catalog = msgspec.structs.replace(local.catalog, warehouse=s3_bucket.url.rstrip("/"),
                                      properties={"s3.endpoint": s3_bucket.endpoint_url,
                                                  "s3.access-key-id": "testing",
                                                  "s3.secret-access-key": "testing",
                                                  "s3.region": "us-east-1"})
    config = msgspec.structs.replace(local, catalog=catalog)
    first = _fill(config)
    got = _embedded(config, f"SELECT count(*) AS n, sum(n) AS s FROM clicks "
                            f"FOR VERSION AS OF {first}")
    assert _rows(got) == [(30, sum(range(30)))]
    assert got.schema.field("s").type == pa.int64()
