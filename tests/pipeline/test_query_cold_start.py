"""A cold ``icefloe query`` stays light: what it imports, and that the light paths answer
exactly as the heavy ones they skip (issue #28's one-second target).

The import budget is pinned by module names, not by time: a fresh interpreter answers a
query through the CLI's entry point and must not have imported pandas, pyspark,
pyarrow's dataset module, SQLAlchemy, pyiceberg's pyarrow FileIO or any other command's
module. Timing stays in ``bench/query_bench.py``.
"""

from __future__ import annotations

import datetime as dt
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
VERSION = "icefloe.version"  # the catalog version each icefloe run records
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
    clicks.append(_clicks(0, 30), snapshot_properties={VERSION: "1"})  # as collector runs
    clicks.append(_clicks(30, 12), snapshot_properties={VERSION: "2"})
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


# ------------------------------------------------ the table read without pyiceberg (#28)

LIGHT_FREE = ("pyiceberg", "pydantic", "pyarrow", "asyncio", "icefloe.store")


def test_a_cold_query_imports_no_pyiceberg_no_store_and_no_queue(lake):
    """Fails on the code before the cut: the query loaded the table with pyiceberg (its
    pydantic models), and the config pulled the manifest queue's package and the store."""
    probe = ("import json, sys\n"
             "from icefloe_app.cli import main\n"
             f"code = main(['query', '--config', {str(lake['file'])!r}, '--engine', "
             "'duckdb', '--format', 'json', 'SELECT count(*) AS c FROM web.clicks "
             "AT (VERSION => 1)'])\n"
             "print(json.dumps([code, sorted(sys.modules)]))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    answer, last = done.stdout.strip().splitlines()
    code, modules = json.loads(last)
    assert (code, json.loads(answer)) == (0, [{"c": 30}])
    assert [m for m in modules if m.split(".")[0] in LIGHT_FREE or
            m.startswith(LIGHT_FREE[-1])] == []
    assert [m for m in modules if m.startswith("icefloe.manifest")] == []
    assert "pipeline.read.local_table" in modules


def _rows_of(n: int) -> pa.Table:
    return pa.table({"k": pa.array(range(n, n + 3), pa.int64()),
                     "s": [f"s{i}" for i in range(n, n + 3)]})


@pytest.fixture(scope="module")
def history(lake: dict[str, Any]) -> dict[str, Any]:
    """h.log: appends, a delete (rewritten files: DELETED and EXISTING manifest entries),
    an overwrite, a rename and an added column, appends after them; h.nested: a struct
    column (pyiceberg reads it); h.zstd: manifests in a codec the light reader refuses;
    h.empty: never written; h.raw: uncompressed manifests."""
    from pyiceberg.types import IntegerType, NestedField, StructType

    config = lake["config"]
    catalog = open_catalog(config.catalog)
    catalog.create_namespace_if_not_exists("h")
    log = catalog.create_table("h.log", pa.schema([("k", pa.int64()), ("s", pa.string())]))
    runs = iter(range(1, 100))  # each commit as an icefloe run's: its catalog version

    def run() -> dict[str, str]:
        return {VERSION: str(next(runs))}
    log.append(_rows_of(0), snapshot_properties=run())
    log.append(_rows_of(3), snapshot_properties=run())
    log.delete("k = 1", snapshot_properties=run())
    log.append(_rows_of(6), snapshot_properties=run())
    log.overwrite(_rows_of(20), snapshot_properties=run())
    with log.update_schema() as update:
        update.rename_column("s", "name")
        update.add_column("extra", LongType())
    log.append(pa.table({"k": pa.array([30], pa.int64()), "name": ["x"],
                         "extra": pa.array([7], pa.int64())}), snapshot_properties=run())
    log.delete("k = 21", snapshot_properties=run())
    nested = catalog.create_table("h.nested", pa.schema([("k", pa.int64())]))
    with nested.update_schema() as update:
        update.add_column("pt", StructType(NestedField(10, "x", IntegerType(),
                                                        required=False)))
    nested.append(pa.table({"k": pa.array([1], pa.int64()),
                            "pt": pa.array([{"x": 5}], pa.struct([("x", pa.int32())]))}))
    zstd = catalog.create_table("h.zstd", pa.schema([("k", pa.int64()), ("s", pa.string())]),
                                properties={"write.avro.compression-codec": "zstd"})
    zstd.append(_rows_of(0))
    zstd.append(_rows_of(3))
    catalog.create_table("h.empty", pa.schema([("k", pa.int64())]))
    raw = catalog.create_table("h.raw", pa.schema([("k", pa.int64()), ("s", pa.string())]),
                               properties={"write.avro.compression-codec": "null"})
    raw.append(_rows_of(0))
    return {"config": config, "catalog": catalog}


def _answers(config: Config, sql: str) -> tuple[Any, dict[str, int | None], str]:
    """The embedded answer, the pinned snapshots and which kind of table planned it."""
    pinned = plan(sql, config)
    choice = choose(config, pinned, "duckdb")
    assert choice.duck_sql is not None
    assert choice.planned is not None
    result, _ = run_embedded(config, pinned, choice.duck_sql, choice.planned)
    kinds = {type(p.table).__name__ for p in choice.planned.values()}
    return result.to_pylist(), pinned.snapshots, ",".join(sorted(kinds))


def _both_paths(config: Config, sql: str, monkeypatch: pytest.MonkeyPatch
                ) -> tuple[tuple[Any, Any, str], tuple[Any, Any, str]]:
    """The same query on the light path and with pyiceberg loading every table."""
    from pipeline.read import embedded, query, tables

    light = _answers(config, sql)
    with monkeypatch.context() as patch:
        for module in (tables, query, embedded):  # each binds the name at import
            patch.setattr(module, "load_table_to_query", tables.load_table_to_read)
        heavy = _answers(config, sql)
    return light, heavy


def test_the_light_table_answers_what_pyiceberg_answers(history):
    """Snapshots, current snapshot, time travel by the log, each snapshot's schema and
    live files (same order), compared with pyiceberg on a table with deletes, an
    overwrite and a schema change."""
    from pipeline.read.local_table import LocalTable
    from pipeline.read.tables import load_table_to_query
    from pipeline.read.versions import snapshot_versions

    config = history["config"]
    light = load_table_to_query(config.catalog, "h.log")
    full = load_table(config.catalog, "h.log")
    assert isinstance(light, LocalTable)
    assert [(s.snapshot_id, s.sequence_number, s.timestamp_ms) for s in light.snapshots()] \
        == [(s.snapshot_id, s.sequence_number, s.timestamp_ms) for s in full.snapshots()]
    assert len(full.snapshots()) >= 7
    assert light.current_snapshot().snapshot_id == full.current_snapshot().snapshot_id
    assert {n: s.snapshot_id for n, s in snapshot_versions(light).items()} == \
        {n: s.snapshot_id for n, s in snapshot_versions(full).items()}
    for entry in full.history():
        for ms in (entry.timestamp_ms - 1, entry.timestamp_ms, entry.timestamp_ms + 1):
            mine, theirs = light.snapshot_as_of_timestamp(ms), full.snapshot_as_of_timestamp(ms)
            assert (mine and mine.snapshot_id) == (theirs and theirs.snapshot_id)
    for snapshot in full.snapshots():
        scan = full.scan(snapshot_id=snapshot.snapshot_id)
        expected = [(f.field_id, f.name, str(f.field_type)) for f in scan.projection().fields]
        got = [(f.field_id, f.name, f.field_type) for f in
               light.schema_at(snapshot.snapshot_id).fields]
        assert got == expected
        files = [(t.file.file_path, t.file.file_size_in_bytes, t.file.record_count,
                  str(t.file.file_format.value)) for t in scan.plan_files()]
        assert [(t.file.file_path, t.file.file_size_in_bytes, t.file.record_count,
                 t.file.file_format) for t in light.plan_files(snapshot.snapshot_id)] == files


@pytest.mark.parametrize("travel", ["AT (VERSION => {n})", "FOR VERSION AS OF {id}"])
def test_time_travel_answers_equal_the_pyiceberg_path(history, monkeypatch, travel):
    from pipeline.read.versions import introduced_versions

    config = history["config"]
    full = load_table(config.catalog, "h.log")
    versions = {n: full.snapshot_by_id(i) for i, n in introduced_versions(full).items()}
    assert len(versions) >= 7
    for n, snapshot in versions.items():
        clause = travel.format(n=n, id=snapshot.snapshot_id)
        for sql in (f"SELECT * FROM h.log {clause} ORDER BY k",
                    f"SELECT count(*) AS c, sum(k) AS s FROM h.log {clause}"):
            light, heavy = _both_paths(config, sql, monkeypatch)
            assert light[:2] == heavy[:2], sql
            assert (light[2], heavy[2]) == ("LocalTable", "Table")


def test_current_and_as_of_time_answers_equal_the_pyiceberg_path(history, monkeypatch):
    config = history["config"]
    full = load_table(config.catalog, "h.log")
    first = full.snapshots()[1].timestamp_ms
    when = dt.datetime.fromtimestamp(first / 1000, dt.UTC).isoformat()
    before_last = sorted(full.snapshots(), key=lambda s: s.sequence_number)[-2].snapshot_id
    for sql in ("SELECT * FROM h.log ORDER BY k",
                "SELECT name, count(*) AS c FROM h.log GROUP BY name ORDER BY name",
                f"SELECT count(*) AS c FROM h.log FOR TIMESTAMP AS OF '{when}'",
                "SELECT a.k, b.name FROM h.log AS a JOIN h.log FOR VERSION AS OF "
                f"{before_last} AS b ON a.k = b.k ORDER BY a.k"):
        light, heavy = _both_paths(config, sql, monkeypatch)
        assert light[:2] == heavy[:2], sql
        assert len(set(light[1].values())) == len(light[1])  # one snapshot per reference
    # overwritten to 20-22, 30 appended after the rename, 21 deleted last
    assert light[0] == [{"k": 20, "name": "s20"}, {"k": 22, "name": "s22"}, {"k": 30, "name": "x"}]


@pytest.mark.parametrize(("table", "sql", "expected"), [
    ("h.nested", "SELECT k FROM h.nested", [{"k": 1}]),
    ("h.zstd", "SELECT count(*) AS c, sum(k) AS s FROM h.zstd", [{"c": 6, "s": 15}]),
    ("h.empty", "SELECT count(*) AS c FROM h.empty", [{"c": 0}]),
    ("h.raw", "SELECT sum(k) AS s FROM h.raw", [{"s": 3}]),
])
def test_unusual_tables_are_read_by_pyiceberg_with_the_same_answer(history, monkeypatch,
                                                                  table, sql, expected):
    """A nested column (refused at load) and zstd manifests (refused when planning) go to
    pyiceberg, from the same metadata file; an empty table reads empty on both paths, and
    uncompressed manifests are read without pyiceberg."""
    from pipeline.read.local_table import LocalTable, Unusual
    from pipeline.read.tables import load_table_to_query

    config = history["config"]
    light, heavy = _both_paths(config, sql, monkeypatch)
    assert light[:2] == heavy[:2]
    assert light[0] == expected
    loaded = load_table_to_query(config.catalog, table)
    if table == "h.nested":
        assert not isinstance(loaded, LocalTable)
    elif table == "h.zstd":
        assert isinstance(loaded, LocalTable)
        assert light[2] == "Table"
        with pytest.raises(Unusual, match="codec"):
            loaded.plan_files(loaded.current_snapshot().snapshot_id)
    elif table == "h.raw":  # uncompressed manifests: read here
        assert light[2] == "LocalTable"
    else:
        assert isinstance(loaded, LocalTable)
        assert loaded.current_snapshot() is None
