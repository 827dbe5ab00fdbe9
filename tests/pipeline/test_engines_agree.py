"""``icefloe query`` gives one answer whichever engine runs it: uuids and NULL nested values.

Issue #36: ``WHERE uid = '…'`` answered 0 on Spark (its reader hands a uuid over as 16
bytes, compared with the string's UTF-8 bytes) and was refused by the embedded engine
(so ``auto`` fell back to Spark's 0); a NULL ``list<struct>`` read as ``[]`` on
``--engine duckdb`` in a fresh process (pyiceberg's projection drops the list's validity
and the fix was installed only when the writer side had been imported). The table here is
written by icefloe's own writer (the embedded append) into a real SQLite catalog; Spark is
the real session, the embedded engine is run in process and through the CLI in a fresh
process (where nothing else has imported pyiceberg's fix).
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from icefloe.config import Column, Config, StreamConfig
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import commit_rows
from pipeline.iceberg.file_append import WriteThenAdd
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.read.embedded import choose, run_embedded
from pipeline.read.query import QueryError, plan, run_query
from tests.collector_support import collector_config

ROOT = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2026, 11, 23, 12, tzinfo=dt.UTC)
ORDERS = StreamConfig(name="orders", table="shop.orders", columns=(
    Column("uid", "uuid"), Column("items", "list<struct<sku: string, qty: long>>"),
    Column("addr", "struct<city: string, ref: uuid>"), Column("k", "long")))
ROWS = 60


def uid(i: int) -> uuid.UUID:
    """Every other uuid has its top bit set: signed, those sort first (the Java bug)."""
    return uuid.UUID(int=((i * 0x9E3779B97F4A7C15F39CC0605CEDC834) % (1 << 127))
                     | ((i % 2) << 127))


def order(i: int, sequence: int) -> dict[str, Any]:
    return {"uid": uid(i).bytes,
            "items": None if i % 3 == 0 else [{"sku": f"s{i}", "qty": i}] * (i % 2 + 1),
            "addr": None if i % 5 == 0 else {"city": f"c{i % 4}", "ref": uid(i + 1).bytes},
            "k": i, "_event_id": f"e{i}", "_received_at": T0, "_sequence": sequence}


EXPECTED_NULL_ITEMS = sum(1 for i in range(ROWS) if i % 3 == 0)
EXPECTED_NULL_ADDR = sum(1 for i in range(ROWS) if i % 5 == 0)


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """Two files written by the embedded append (icefloe's own Parquet writer)."""
    config = collector_config(tmp_path_factory.mktemp("agree"), streams=(ORDERS,))
    catalog = open_catalog(config.catalog)
    ensure_stream_table(catalog, ORDERS)
    for sequence, part in ((1, range(0, ROWS // 2)), (2, range(ROWS // 2, ROWS))):
        rows = pa.Table.from_pylist([order(i, sequence) for i in part],
                                    schema=table_arrow_schema(ORDERS))
        commit_rows(catalog, ORDERS.table, rows, sequence=sequence, epoch=1,
                    append=WriteThenAdd(ORDERS.name))
    return config


def embedded(config: Config, sql: str) -> list[dict[str, Any]]:
    pinned = plan(sql, config)
    choice = choose(config, pinned, "duckdb")
    assert choice.duck_sql is not None
    assert choice.planned is not None
    return run_embedded(config, pinned, choice.duck_sql, choice.planned)[0].to_pylist()


def spark_rows(spark: Any, config: Config, sql: str) -> list[dict[str, Any]]:
    return run_query(spark, config, sql)[0].to_pylist()


HIGH = next(uid(i) for i in range(ROWS) if uid(i).int >> 127)
LOOKUPS = [
    ("canonical", f"SELECT k FROM shop.orders WHERE uid = '{HIGH}'", [HIGH]),
    ("upper case", f"SELECT k FROM orders WHERE uid = '{str(HIGH).upper()}'", [HIGH]),
    ("no dashes", f"SELECT k FROM orders WHERE '{HIGH.hex}' = uid", [HIGH]),
    ("in", f"SELECT k FROM orders WHERE uid IN ('{uid(1)}', '{uid(2)}', "
           f"'{uuid.UUID(int=5)}')", [uid(1), uid(2)]),
    ("not equal", f"SELECT k FROM orders WHERE uid <> '{uid(3)}'",
     [uid(i) for i in range(ROWS) if i != 3]),
    ("range", f"SELECT k FROM orders WHERE uid >= '{HIGH}'",
     [uid(i) for i in range(ROWS) if uid(i).bytes >= HIGH.bytes]),
]


@pytest.mark.parametrize(("name", "sql", "want"), LOOKUPS, ids=[q[0] for q in LOOKUPS])
def test_uuid_lookups_answer_on_every_engine(spark, lake, name, sql, want):
    """Spark answered 0 rows and the embedded engine refused: now both find them."""
    expected = sorted(i for i in range(ROWS) if uid(i) in want)
    assert expected, name
    assert sorted(r["k"] for r in spark_rows(spark, lake, sql)) == expected
    assert sorted(r["k"] for r in embedded(lake, sql)) == expected


def test_uuids_read_as_the_same_text_on_both_engines(spark, lake):
    """Top-level uuids come back as canonical text, ordered as the spec orders them
    (unsigned bytes); a uuid inside a struct as its 16 bytes, as Spark's reader has it."""
    sql = "SELECT uid, addr, k FROM shop.orders ORDER BY uid LIMIT 12"
    got, want = embedded(lake, sql), spark_rows(spark, lake, sql)
    assert got == want
    ordered = sorted(range(ROWS), key=lambda i: uid(i).bytes)[:12]
    assert [r["uid"] for r in got] == [str(uid(i)) for i in ordered]
    nested = next(r for r in got if r["addr"] is not None)
    assert nested["addr"]["ref"] == uid(nested["k"] + 1).bytes


def test_a_string_that_is_no_uuid_is_refused_by_name(lake):
    with pytest.raises(QueryError, match=r"'12345' is not a uuid \(column 'uid'"):
        plan("SELECT count(*) FROM orders WHERE uid = '12345'", lake)


NULLS = [
    ("list of structs", "SELECT count(*) AS n FROM shop.orders WHERE items IS NULL",
     EXPECTED_NULL_ITEMS),
    ("struct", "SELECT count(*) AS n FROM shop.orders WHERE addr IS NULL",
     EXPECTED_NULL_ADDR),
    ("empty or null", "SELECT count(*) AS n FROM shop.orders WHERE items IS NOT NULL",
     ROWS - EXPECTED_NULL_ITEMS),
]


def _config_file(tmp_path: Path, config: Config) -> Path:
    path = tmp_path / "query.toml"
    path.write_text(f'[catalog]\nuri = "{config.catalog.uri}"\n'
                    f'warehouse = "{config.catalog.warehouse}"\n'
                    '[store]\nurl = "file:///tmp/unused-store"\n')
    return path


def cli_query(config_file: Path, engine: str, sql: str) -> list[dict[str, Any]]:
    """``icefloe query`` in a fresh process, as a user runs it."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from icefloe_app.cli import main; "
         "sys.exit(main(sys.argv[1:]))", "query", "--config", str(config_file),
         "--engine", engine, "--format", "json", sql],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(("name", "sql", "want"), NULLS, ids=[q[0] for q in NULLS])
def test_null_lists_and_structs_stay_null_with_duckdb_in_a_fresh_process(
        lake, tmp_path, name, sql, want):
    assert cli_query(_config_file(tmp_path, lake), "duckdb", sql) == [{"n": want}], name


@pytest.mark.parametrize(("name", "sql", "want"), NULLS, ids=[q[0] for q in NULLS])
def test_null_lists_and_structs_stay_null_with_spark(spark, lake, name, sql, want):
    assert spark_rows(spark, lake, sql) == [{"n": want}], name


def test_nested_values_read_the_same_on_both_engines(spark, lake):
    sql = "SELECT k, items, addr FROM shop.orders"
    key = lambda r: json.dumps(r, sort_keys=True, default=bytes.hex)  # noqa: E731
    assert collections.Counter(map(key, embedded(lake, sql))) == collections.Counter(
        map(key, spark_rows(spark, lake, sql)))


def test_a_uuid_lookup_through_the_cli_picks_duckdb(lake, tmp_path):
    """``auto`` no longer falls back to Spark for a uuid point lookup (and answers 1)."""
    path = _config_file(tmp_path, lake)
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from icefloe_app.cli import main; "
         "sys.exit(main(sys.argv[1:]))", "query", "--config", str(path), "--format", "json",
         f"SELECT count(*) AS n FROM shop.orders WHERE uid = '{HIGH}'"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [{"n": 1}]
    assert "engine duckdb" in done.stderr


def test_string_functions_and_like_on_uuids_agree(spark, lake):
    """A uuid is text on both engines: DuckDB's own UUID type has no string functions and
    would fail where Spark answers."""
    sql = ("SELECT upper(uid) AS u, length(uid) AS l FROM orders WHERE uid LIKE '%a%' "
           "ORDER BY u")
    got = embedded(lake, sql)
    assert got == spark_rows(spark, lake, sql)
    assert got
    assert {r["l"] for r in got} == {36}
