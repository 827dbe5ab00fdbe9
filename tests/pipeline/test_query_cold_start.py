"""A cold ``icefloe query`` stays light: what it imports, and that the light paths answer
exactly as the heavy ones they skip (issue #28's one-second target).

The import budget is pinned by module names, not by time: a fresh interpreter answers a
query through the CLI's entry point and must not have imported pandas, pyspark,
pyarrow's dataset module, SQLAlchemy, pyiceberg's pyarrow FileIO or any other command's
module. Timing stays in ``bench/query_bench.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.types import LongType

from icefloe.config import Config
from icefloe.errors import CatalogError
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.read.embedded import (
    Rows,
    choose,
    parquet_source,
    plan_files,
    read_pinned,
    run_embedded,
    run_embedded_plain,
)
from pipeline.read.query import QueryError, plan
from pipeline.read.tables import load_table, load_table_to_read
from tests.collector_support import CLICKS, collector_config

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("pandas", "pyspark", "pyarrow", "pyarrow.dataset", "sqlalchemy",
         "pyiceberg.io.pyarrow", "pyiceberg.catalog.sql")


def _clicks(start: int, count: int) -> pa.Table:
    rows = [{"user_id": f"u{i % 3}", "url": f"/p/{i % 4}", "n": i, "_event_id": str(i),
             "_sequence": i} for i in range(start, start + count)]
    return pa.Table.from_pylist(rows, schema=table_arrow_schema(CLICKS))


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """web.clicks (two commits); t.evolved (a file before and after a rename and an added
    column); t.imported (a Parquet file without field ids, added as pyiceberg adds one)."""
    root = tmp_path_factory.mktemp("cold")
    config = collector_config(root, streams=(CLICKS,))
    catalog = open_catalog(config.catalog)
    clicks = ensure_stream_table(catalog, CLICKS)
    clicks.append(_clicks(0, 30))
    clicks.append(_clicks(30, 12))
    catalog.create_namespace_if_not_exists("t")
    evolved = catalog.create_table("t.evolved", pa.schema([("k", pa.int64()),
                                                           ("old", pa.string())]))
    evolved.append(pa.table({"k": pa.array([1, 2], pa.int64()), "old": ["a", "b"]}))
    with evolved.update_schema() as update:
        update.rename_column("old", "new")
        update.add_column("extra", LongType())
    evolved.append(pa.table({"k": pa.array([3], pa.int64()), "new": ["c"],
                             "extra": pa.array([30], pa.int64())}))
    imported = catalog.create_table("t.imported", pa.schema([("k", pa.int64()),
                                                             ("v", pa.string())]))
    path = root / "no_field_ids.parquet"
    pq.write_table(pa.table({"k": pa.array([7, 8], pa.int64()), "v": ["x", "y"]}), path)
    imported.add_files([path.as_uri()])
    config_file = root / "query.toml"
    config_file.write_text(f'[catalog]\nuri = "{config.catalog.uri}"\n'
                           f'warehouse = "{config.catalog.warehouse}"\n'
                           '[store]\nurl = "file:///tmp/unused-store"\n')
    return {"config": config, "file": config_file}


def _both(config: Config, sql: str) -> tuple[Any, pa.Table]:
    """The plain result the CLI prints and the Arrow result, of one plan."""
    pinned = plan(sql, config)
    choice = choose(config, pinned, "duckdb")
    assert choice.duck_sql is not None
    assert choice.planned is not None
    plain, _ = run_embedded_plain(config, pinned, choice.duck_sql, choice.planned)
    arrow, _ = run_embedded(config, pinned, choice.duck_sql, choice.planned)
    return plain, arrow


def test_a_cold_query_imports_neither_pandas_nor_spark_nor_other_commands(lake):
    """Fails on the code before #28's cut: the CLI imported every command module, and the
    query path pyiceberg's SQL catalog (SQLAlchemy) and pyarrow FileIO (pandas)."""
    probe = ("import json, sys\n"
             "from icefloe_app.cli import main\n"
             f"code = main(['query', '--config', {str(lake['file'])!r}, '--engine', "
             "'duckdb', '--format', 'json', 'SELECT url, count(*) AS c, sum(n) AS s "
             "FROM web.clicks GROUP BY url ORDER BY url'])\n"
             "print(json.dumps([code, sorted(sys.modules)]))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    answer, last = done.stdout.strip().splitlines()
    code, modules = json.loads(last)
    assert code == 0
    assert json.loads(answer) == [{"url": f"/p/{u}", "c": len(range(u, 42, 4)),
                                   "s": sum(range(u, 42, 4))} for u in range(4)]
    assert [m for m in HEAVY if m in modules] == []
    commands = [m for m in modules if m.startswith("icefloe_app.cli.") and
                m.endswith("_cmd")]
    assert commands == ["icefloe_app.cli.query_cmd"]


def test_duckdb_reads_the_files_by_field_id_as_pyiceberg_does(lake):
    """A renamed column keeps its data, an added one reads NULL in the older file."""
    config = lake["config"]
    pinned = plan("SELECT k, new, extra FROM t.evolved ORDER BY k", config)
    planned = plan_files(config, pinned)
    entry = next(iter(planned.values()))
    assert parquet_source(entry) is not None  # DuckDB reads these files itself
    plain, arrow = _both(config, "SELECT k, new, extra FROM t.evolved ORDER BY k")
    expected = [{"k": 1, "new": "a", "extra": None}, {"k": 2, "new": "b", "extra": None},
                {"k": 3, "new": "c", "extra": 30}]
    assert plain.to_pylist() == arrow.to_pylist() == expected
    assert sorted(read_pinned(entry, {"*"}).to_pylist(), key=lambda r: r["k"]) == expected


def test_a_file_without_field_ids_is_read_through_pyiceberg(lake):
    """DuckDB's field-id map would read its columns as NULL; pyiceberg maps them by name."""
    plain, arrow = _both(lake["config"], "SELECT k, v FROM t.imported ORDER BY k")
    assert plain.to_pylist() == arrow.to_pylist() == [{"k": 7, "v": "x"}, {"k": 8, "v": "y"}]


def test_plain_rows_hold_the_values_arrow_holds(lake):
    sql = ("SELECT url, count(*) AS c, sum(n) AS s, avg(n) AS a, min(ts) AS t0, "
           "max(user_id) AS u, min(n) > 3 AS b FROM web.clicks GROUP BY url ORDER BY url")
    plain, arrow = _both(lake["config"], sql)
    assert isinstance(plain, Rows)
    assert plain.to_pylist() == arrow.to_pylist()
    assert plain.numeric == [False, True, True, True, False, False, False]


def test_a_sum_beyond_int64_fails_as_on_arrow(lake):
    """DuckDB's 128-bit sum comes back as int64 on both paths, so an overflow is an error."""
    sql = "SELECT sum(n + 4611686018427387904) AS s FROM web.clicks"  # each fits, not 42
    pinned = plan(sql, lake["config"])
    choice = choose(lake["config"], pinned, "duckdb")
    with pytest.raises((pa.ArrowInvalid, QueryError)) as plain:
        run_embedded_plain(lake["config"], pinned, choice.duck_sql, choice.planned)
    with pytest.raises((pa.ArrowInvalid, QueryError)) as arrow:
        run_embedded(lake["config"], pinned, choice.duck_sql, choice.planned)
    assert type(plain.value) is type(arrow.value)


def test_the_light_sqlite_load_is_the_catalogs_table(lake):
    config = lake["config"]
    light = load_table_to_read(config.catalog, "web.clicks")
    full = load_table(config.catalog, "web.clicks")
    assert light.metadata_location == full.metadata_location
    assert light.name() == full.name()
    assert [s.snapshot_id for s in light.snapshots()] == [s.snapshot_id
                                                         for s in full.snapshots()]
    with pytest.raises(CatalogError, match=r"tables in namespace 'web': web\.clicks"):
        load_table_to_read(config.catalog, "web.nope")
