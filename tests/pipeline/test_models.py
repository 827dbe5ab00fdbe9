"""SQL models: parsing, the DAG, dialects, every materialization, change detection,
incremental correctness (also after a crash between compute and commit), time travel.

Spark tests share the session ``spark`` fixture and keep data tiny: a ``web.pageviews``
table (the example config's stream) in a fresh SQLite catalog per test, written with
pyiceberg directly, one append per "collector commit" with increasing ``_sequence``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from icefloe.config import Config, load_config
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.models import (
    ModelError,
    load_models,
    parse_model,
    plan_project,
    prepare,
    run_models,
    topological_order,
)
from pipeline.models.state import last_run
from pipeline.models.write import write_result
from pipeline.read.query import AsOf, QueryError, plan, run_query

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = ROOT / "examples" / "icefloe.toml"
EXAMPLE_MODELS = ROOT / "examples" / "models"
DAY = dt.datetime(2026, 11, 20, 9, 0, tzinfo=dt.UTC)


# ----------------------------------------------------------------------------- helpers


def lake_config(root: Path) -> Config:
    """The example config's streams on a SQLite catalog and a store under ``root`` (where
    ``--data-dir root`` puts them)."""
    example = load_config(EXAMPLE_CONFIG)
    return msgspec.structs.replace(example, catalog=msgspec.structs.replace(
        example.catalog, uri=f"sqlite:///{root / 'catalog.db'}",
        warehouse=(root / "warehouse").as_uri()),
        store=msgspec.structs.replace(example.store, url=(root / "store").as_uri()))


def pageviews(config: Config, views: list[tuple[int, int, str, int]],
              properties: dict[str, str] | None = None, *, versioned: bool = True) -> None:
    """Append one commit of page views: ``(sequence, day offset, url, session)`` each; as
    a collector run does, it claims the next catalog version and records it (unless not
    ``versioned``: a commit by another engine)."""
    stream = config.stream("pageviews")
    assert stream is not None
    table = ensure_stream_table(open_catalog(config.catalog), stream)
    rows = [{"user_id": f"u{session}", "session_id": f"s{session}", "url": url,
             "referrer": None, "duration_ms": 10, "ts": DAY + dt.timedelta(days=day),
             "_event_id": f"e{sequence}-{index}", "_received_at": DAY,
             "_sequence": sequence}
            for index, (sequence, day, url, session) in enumerate(views)]
    props = dict(properties or {})
    if versioned:
        from icefloe.catalog_version import VERSION_PROP, claim_version_sync
        from icefloe.store import open_store

        props[VERSION_PROP] = str(claim_version_sync(open_store(config.store.url), epoch=None))
    table.append(pa.Table.from_pylist(rows, schema=table_arrow_schema(stream)),
                 snapshot_properties=props)


def write_model(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.sql"
    path.write_text(text)
    return path


def target_rows(config: Config, identifier: str, key: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = open_catalog(config.catalog).load_table(identifier).scan().to_arrow().to_pylist()
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in key))


def states(outcomes: list[Any]) -> dict[str, str]:
    return {o.name: o.state for o in outcomes}


# ------------------------------------------------------------------ files and the DAG


def test_should_read_the_header_and_default_the_rest(tmp_path: Path) -> None:
    path = write_model(tmp_path, "daily", "-- Daily numbers.\n-- materialized: merge\n"
                       "-- unique_key: day, url\n\nSELECT day, url FROM web.pageviews\n")
    model = parse_model(path)
    assert (model.materialized, model.unique_key, model.target, model.dialect) == (
        "merge", ("day", "url"), "models.daily", "spark")
    plain = parse_model(write_model(tmp_path, "plain", "SELECT 1 AS x"))
    assert (plain.materialized, plain.target) == ("view", "models.plain")


@pytest.mark.parametrize(("header", "message"), [
    ("-- materialised: table", "unknown header key 'materialised'"),
    ("-- materialized: merge", "needs `-- unique_key"),
    ("-- materialized: table\n-- unique_key: a", "unique_key only applies"),
    ("-- dialect: mysql", "dialect must be one of"),
    ("-- target: nonamespace", "target must be namespace.table"),
])
def test_should_refuse_a_bad_header(tmp_path: Path, header: str, message: str) -> None:
    path = write_model(tmp_path, "bad", f"{header}\nSELECT 1 AS a")
    with pytest.raises(ModelError, match=message):
        parse_model(path)


def test_should_refuse_sql_that_is_not_one_select(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not a DELETE statement"):
        parse_model(write_model(tmp_path, "d", "DELETE FROM web.pageviews"))
    with pytest.raises(ModelError, match="does not parse"):
        parse_model(write_model(tmp_path, "p", "SELECT FROM WHERE ("))


def test_should_order_models_after_what_they_read(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "a_mart", "-- materialized: table\nSELECT * FROM b_middle")
    write_model(folder, "b_middle", "SELECT * FROM staging.c")
    write_model(folder, "c_first", "-- target: staging.c\nSELECT * FROM web.pageviews")
    write_model(folder, "d_alone", "WITH x AS (SELECT 1 AS n) SELECT * FROM x")
    project = plan_project(load_models(folder), lake_config(tmp_path))
    assert list(project.models) == ["c_first", "b_middle", "a_mart", "d_alone"]
    assert project.upstream("a_mart") == ["b_middle"]
    assert project.refs["d_alone"] == ()  # a CTE is not a reference


def test_should_name_the_cycle() -> None:
    with pytest.raises(ModelError, match="cycle: a → b → c → a"):
        topological_order({"a": ["b"], "b": ["c"], "c": ["a"], "d": []})


def test_should_refuse_a_cycle_between_model_files(tmp_path: Path) -> None:
    write_model(tmp_path, "x", "SELECT * FROM y")
    write_model(tmp_path, "y", "SELECT * FROM models.x")
    with pytest.raises(ModelError, match="cycle: x → y → x"):
        plan_project(load_models(tmp_path), lake_config(tmp_path))


def test_should_refuse_unknown_tables_before_running(tmp_path: Path) -> None:
    config = lake_config(tmp_path)
    write_model(tmp_path / "m1", "m", "SELECT * FROM nosuchthing")
    with pytest.raises(ModelError, match="model m: unknown table 'nosuchthing'"):
        prepare(tmp_path / "m1", config)
    pageviews(config, [(1, 0, "/a", 1)])
    write_model(tmp_path / "m2", "m", "SELECT * FROM web.pageviews JOIN web.missing USING (url)")
    with pytest.raises(ModelError, match=r"model m: table 'web\.missing' does not exist"):
        prepare(tmp_path / "m2", config)


def test_should_refuse_a_model_that_writes_a_stream_table(tmp_path: Path) -> None:
    write_model(tmp_path, "evil", "-- materialized: table\n-- target: web.pageviews\nSELECT 1")
    with pytest.raises(ModelError, match="is an icefloe stream table"):
        plan_project(load_models(tmp_path), lake_config(tmp_path))


@pytest.mark.parametrize(("dialect", "sql", "spark_sql"), [
    ("duckdb", "SELECT epoch_ms(n) AS t FROM x", "SELECT TIMESTAMP_MILLIS(n) AS t FROM x"),
    ("duckdb", "SELECT strftime(ts, '%Y-%m') AS m FROM x",
     "SELECT DATE_FORMAT(ts, 'yyyy-MM') AS m FROM x"),
    ("duckdb", "SELECT ts::DATE AS d FROM x", "SELECT CAST(ts AS DATE) AS d FROM x"),
    ("postgres", "SELECT string_agg(url, ',') AS u FROM x",
     "SELECT LISTAGG(url, ',') AS u FROM x"),
    ("postgres", "SELECT ts::date AS d, url ILIKE '/a%' AS a FROM x",
     "SELECT CAST(ts AS DATE) AS d, url ILIKE '/a%' AS a FROM x"),
    ("spark", "SELECT date_format(ts, 'yyyy') AS y FROM x",
     "SELECT DATE_FORMAT(ts, 'yyyy') AS y FROM x"),
])
def test_should_transpile_dialects_to_spark(tmp_path: Path, dialect: str, sql: str,
                                            spark_sql: str) -> None:
    model = parse_model(write_model(tmp_path, "t", f"-- dialect: {dialect}\n{sql}"))
    assert model.tree.sql(dialect="spark") == spark_sql


def test_should_hash_what_decides_the_result(tmp_path: Path) -> None:
    one = parse_model(write_model(tmp_path / "1", "m", "SELECT url FROM web.pageviews"))
    spaced = parse_model(write_model(tmp_path / "2", "m", "select  url\nfrom web.pageviews"))
    other = parse_model(write_model(tmp_path / "3", "m", "SELECT user_id FROM web.pageviews"))
    assert one.sql_hash == spaced.sql_hash != other.sql_hash


@pytest.mark.parametrize(("rows", "message"), [
    ({"day": [1, 1], "url": ["/a", "/a"]}, "occur more than once"),
    ({"day": [1, None], "url": ["/a", "/b"]}, "day is null in 1 row"),
])
def test_should_refuse_a_merge_result_without_a_usable_key(tmp_path: Path, rows: Any,
                                                           message: str) -> None:
    from pipeline.models.runner import check_unique_key

    model = parse_model(write_model(tmp_path, "m", "-- materialized: merge\n"
                                    "-- unique_key: day, url\nSELECT 1 AS day, 'a' AS url"))
    check_unique_key(model, pa.table({"day": [1, 1], "url": ["/a", "/b"]}))
    with pytest.raises(ModelError, match=message):
        check_unique_key(model, pa.table(rows))


def test_should_export_everything_public() -> None:
    import pipeline.models as package

    assert sorted(package.__all__) == sorted(
        n for n in vars(package) if not n.startswith("_") and n not in
        {"dag", "runner", "spec", "state", "bind", "write", "audit", "watermarks",
         "annotations"})


# ------------------------------------------------------------------------ on Spark


@pytest.fixture
def lake(tmp_path: Path) -> Config:
    config = lake_config(tmp_path)
    pageviews(config, [(1, 0, "/A", 1), (1, 0, "/a", 1), (1, 0, "/b", 2), (1, 1, "/a", 3)])
    return config


def test_should_run_the_example_incrementally(spark: Any, lake: Config, tmp_path: Path
                                              ) -> None:
    folder = tmp_path / "models"
    shutil.copytree(EXAMPLE_MODELS, folder)
    project = prepare(folder, lake)
    first = run_models(spark, project, lake)
    assert states(first) == {"staging_sessions": "view", "mart_daily_traffic": "ran"}
    key = ("day", "url")
    day0, day1 = DAY.date(), (DAY + dt.timedelta(days=1)).date()
    assert [(r["day"], r["url"], r["views"], r["sessions"]) for r in
            target_rows(lake, "mart.daily_traffic", key)] == [
        (day0, "/a", 2, 1), (day0, "/b", 1, 1), (day1, "/a", 1, 1)]
    assert not open_catalog(lake.catalog).table_exists("staging.sessions")  # a view stores nothing

    again = run_models(spark, project, lake)
    assert states(again)["mart_daily_traffic"] == "up to date"

    pageviews(lake, [(2, 0, "/a", 4), (2, 2, "/c", 1)])
    third = run_models(spark, project, lake)
    assert states(third)["mart_daily_traffic"] == "ran"
    assert third[1].rows == 2  # only the touched keys were recomputed and upserted
    assert [(r["day"], r["url"], r["views"], r["sessions"]) for r in
            target_rows(lake, "mart.daily_traffic", key)] == [
        (day0, "/a", 3, 2), (day0, "/b", 1, 1), (day1, "/a", 1, 1),
        ((DAY + dt.timedelta(days=2)).date(), "/c", 1, 1)]
    state = last_run(open_catalog(lake.catalog).load_table("mart.daily_traffic"))
    assert state is not None
    source = open_catalog(lake.catalog).load_table("web.pageviews").current_snapshot()
    assert (state.name, state.rows, state.watermarks) == ("mart_daily_traffic", 2,
                                                          {"web.pageviews": 2})
    assert state.sources == {"web.pageviews": source.snapshot_id}
    assert state.run_id
    assert len(state.sql_hash) == 16


APPEND = """-- materialized: append
-- target: mart.views
SELECT url, _sequence FROM web.pageviews
"""


def test_should_append_only_new_rows_even_after_a_crash(spark: Any, lake: Config,
                                                        tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "views", APPEND)
    project = prepare(folder, lake)
    assert run_models(spark, project, lake)[0].rows == 4

    pageviews(lake, [(2, 0, "/x", 1), (2, 0, "/y", 1)])

    def crash(*args: Any, **kwargs: Any) -> None:
        raise ModelError("injected: the process died before the commit")

    failed = run_models(spark, project, lake, write=crash)
    assert (failed[0].state, failed[0].reason) == ("failed", "injected: the process died "
                                                   "before the commit")
    pageviews(lake, [(3, 0, "/z", 1)])
    rerun = run_models(spark, project, lake)
    assert (rerun[0].state, rerun[0].rows) == ("ran", 3)
    rows = target_rows(lake, "mart.views", ("_sequence", "url"))
    assert [r["_sequence"] for r in rows] == [1, 1, 1, 1, 2, 2, 3]  # nothing twice, nothing lost
    state = last_run(open_catalog(lake.catalog).load_table("mart.views"))
    assert state is not None
    assert state.watermarks == {"web.pageviews": 3}
    assert states(run_models(spark, project, lake)) == {"views": "up to date"}


def orders(config: Config, sequence: int, count: int, customer: str = "c") -> None:
    """Append one commit of ``count`` orders of ``customer`` with ``_sequence`` =
    ``sequence``."""
    stream = config.stream("orders")
    assert stream is not None
    table = ensure_stream_table(open_catalog(config.catalog), stream)
    rows = [{"order_id": f"o{sequence}-{i}", "customer_id": customer, "amount": 1.0,
             "_event_id": f"o{sequence}-{i}", "_received_at": DAY, "_sequence": sequence}
            for i in range(count)]
    table.append(pa.Table.from_pylist(rows, schema=table_arrow_schema(stream)))


def test_should_keep_one_watermark_per_source(spark: Any, lake: Config, tmp_path: Path
                                              ) -> None:
    orders(lake, 1, 2)
    folder = tmp_path / "models"
    write_model(folder, "events", "-- materialized: append\n"
                "SELECT 'view' AS kind, _sequence FROM web.pageviews "
                "UNION ALL SELECT 'order' AS kind, _sequence FROM shop.orders")
    project = prepare(folder, lake)
    assert run_models(spark, project, lake)[0].rows == 6
    orders(lake, 5, 3)
    assert run_models(spark, project, lake)[0].rows == 3
    pageviews(lake, [(7, 0, "/n", 1)])
    assert run_models(spark, project, lake)[0].rows == 1
    state = last_run(open_catalog(lake.catalog).load_table("models.events"))
    assert state is not None
    assert state.watermarks == {"shop.orders": 5, "web.pageviews": 7}
    kinds = [r["kind"] for r in target_rows(lake, "models.events", ("kind",))]
    assert (kinds.count("order"), kinds.count("view")) == (5, 5)


def test_should_merge_without_double_counting_after_a_crash(spark: Any, lake: Config,
                                                            tmp_path: Path) -> None:
    folder = tmp_path / "models"
    shutil.copytree(EXAMPLE_MODELS, folder)
    project = prepare(folder, lake)
    run_models(spark, project, lake)
    pageviews(lake, [(2, 0, "/a", 9)])
    calls: list[str] = []

    def crash_after_write(*args: Any, **kwargs: Any) -> None:
        calls.append(kwargs["mode"])
        raise RuntimeError("injected crash")  # any exception: the model fails alone

    failed = run_models(spark, project, lake, write=crash_after_write)
    assert states(failed)["mart_daily_traffic"] == "failed"
    assert calls == ["merge"]
    assert run_models(spark, project, lake)[1].state == "ran"
    views = {r["url"]: r["views"] for r in target_rows(lake, "mart.daily_traffic", ("day", "url"))
             if r["day"] == DAY.date()}
    assert views == {"/a": 3, "/b": 1}


def test_should_refuse_a_commit_when_another_run_committed_first(spark: Any, lake: Config,
                                                                 tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "views", APPEND)
    project = prepare(folder, lake)
    run_models(spark, project, lake)
    pageviews(lake, [(2, 0, "/x", 1)])

    def racing(catalog: Any, identifier: str, result: pa.Table, **kwargs: Any) -> None:
        run_models(spark, project, lake)  # another run sneaks in and commits the rows
        write_result(catalog, identifier, result, **kwargs)

    outcome = run_models(spark, project, lake, write=racing)[0]
    assert outcome.state == "failed"
    assert "changed while the model ran" in outcome.reason
    assert len(target_rows(lake, "mart.views", ("_sequence", "url"))) == 5


def test_should_overwrite_a_table_model_and_rebuild_on_full_refresh(spark: Any, lake: Config,
                                                                    tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "per_url", "-- materialized: table\n-- dialect: postgres\n"
                "SELECT lower(url) AS url, count(*)::int AS n FROM pageviews GROUP BY 1")
    write_model(folder, "views", APPEND)
    project = prepare(folder, lake)
    run_models(spark, project, lake)
    pageviews(lake, [(2, 0, "/b", 1)])
    assert states(run_models(spark, project, lake, ["per_url"])) == {"per_url": "ran"}
    assert target_rows(lake, "models.per_url", ("url",)) == [
        {"url": "/a", "n": 3}, {"url": "/b", "n": 2}]
    refreshed = run_models(spark, project, lake, full_refresh=True)
    assert [(o.name, o.state, o.rows) for o in refreshed] == [
        ("per_url", "ran", 2), ("views", "ran", 5)]
    assert len(target_rows(lake, "mart.views", ("_sequence", "url"))) == 5


def test_should_fail_one_model_and_skip_what_reads_it(spark: Any, lake: Config,
                                                      tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "broken", "SELECT no_such_column FROM web.pageviews")
    write_model(folder, "downstream", "-- materialized: table\nSELECT * FROM broken")
    write_model(folder, "fine", "-- materialized: table\nSELECT count(*) AS n FROM pageviews")
    outcomes = {o.name: o for o in run_models(spark, prepare(folder, lake), lake)}
    assert outcomes["broken"].state == "failed"
    assert "no_such_column" in outcomes["broken"].reason
    assert (outcomes["downstream"].state, outcomes["downstream"].reason) == (
        "skipped", "upstream model broken failed")
    assert outcomes["fine"].state == "ran"


def test_should_travel_in_time_in_models_and_queries(spark: Any, lake: Config,
                                                     tmp_path: Path) -> None:
    catalog = open_catalog(lake.catalog)
    first = catalog.load_table("web.pageviews").current_snapshot().snapshot_id
    pageviews(lake, [(2, 0, "/new", 1)])
    sql = (f"SELECT cur.n AS now_n, old.n AS then_n FROM "
           f"(SELECT count(*) AS n FROM web.pageviews) cur CROSS JOIN "
           f"(SELECT count(*) AS n FROM web.pageviews FOR VERSION AS OF {first}) old")
    result, _, pinned = run_query(spark, lake, sql)
    assert result.to_pylist() == [{"now_n": 5, "then_n": 4}]
    assert f"web.pageviews@{first}" in pinned.snapshots
    folder = tmp_path / "models"
    write_model(folder, "old", "-- materialized: table\nSELECT count(*) AS n FROM "
                f"web.pageviews FOR VERSION AS OF {first}")
    when = dt.datetime.now(dt.UTC).isoformat()
    write_model(folder, "at", "-- materialized: table\nSELECT count(*) AS n FROM "
                f"pageviews FOR TIMESTAMP AS OF '{when}'")
    project = prepare(folder, lake)
    run_models(spark, project, lake)
    assert target_rows(lake, "models.old", ("n",)) == [{"n": 4}]
    assert target_rows(lake, "models.at", ("n",)) == [{"n": 5}]
    state = last_run(catalog.load_table("models.old"))
    assert state is not None
    assert state.sources == {f"web.pageviews@{first}": first}
    assert states(run_models(spark, project, lake)) == {"at": "up to date", "old": "up to date"}


def test_should_refuse_time_travel_to_nowhere(lake: Config) -> None:
    with pytest.raises(QueryError, match="a version is a number"):
        plan("SELECT * FROM web.pageviews AT (VERSION => 'x')", lake)
    with pytest.raises(QueryError, match="FOR VERSION AS OF takes a snapshot id"):
        plan("SELECT * FROM web.pageviews FOR VERSION AS OF 'x'", lake)
    with pytest.raises(QueryError, match="has no snapshot 42; for catalog version 42 write"):
        plan("SELECT * FROM web.pageviews FOR VERSION AS OF 42", lake)
    with pytest.raises(QueryError, match="no catalog version 42 yet; the newest is 1"):
        plan("SELECT * FROM web.pageviews AT (VERSION => 42)", lake)
    with pytest.raises(QueryError, match="had no snapshot at 2000"):
        plan("SELECT * FROM pageviews FOR TIMESTAMP AS OF '2000-01-01T00:00:00Z'", lake,
             AsOf(snapshot_id=None))


def test_should_record_json_state(lake: Config) -> None:
    from pipeline.models.state import SOURCES, RunState

    props = RunState("m", "h", 3, "r", {"web.pageviews": 7}, {"web.pageviews": 2}).properties()
    assert json.loads(props[SOURCES]) == {"web.pageviews": 7}


def test_should_list_show_and_run_from_the_command_line(spark: Any, lake: Config,
                                                        tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from icefloe_app.cli import main

    base = ["--config", str(EXAMPLE_CONFIG), "--data-dir", str(tmp_path)]
    assert main(["models", "run", *base]) == 0  # default folder: models/ beside the config
    out = capsys.readouterr().out
    assert "mart_daily_traffic  ran" in out
    assert "staging_sessions    view" in out
    assert main(["models", "run", *base, "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert [(o["name"], o["state"]) for o in ran] == [
        ("staging_sessions", "view"), ("mart_daily_traffic", "up to date")]
    assert main(["models", "list", *base, "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)}
    assert listed["mart_daily_traffic"]["depends_on"] == ["staging_sessions"]
    assert listed["mart_daily_traffic"]["last_run"].endswith(", 3 rows")
    assert main(["models", "show", "mart_daily_traffic", *base, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["last_run"]["watermarks"] == {"web.pageviews": 1}
    assert main(["models", "show", "nope", *base]) == 1
    assert "no model named 'nope'" in capsys.readouterr().err


def test_should_say_how_to_recover_from_a_changed_column_type(spark: Any, lake: Config,
                                                              tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "n", "-- materialized: table\nSELECT count(*) AS n FROM pageviews")
    assert run_models(spark, prepare(folder, lake), lake)[0].state == "ran"
    write_model(folder, "n", "-- materialized: table\nSELECT 'many' AS n FROM pageviews")
    outcome = run_models(spark, prepare(folder, lake), lake)[0]
    assert outcome.state == "failed"
    assert "model n: table models.n: column 'n' cannot change from long to string" \
        in outcome.reason


def test_should_recompute_in_full_after_a_dead_letter_redrive(spark: Any, lake: Config,
                                                              tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "views", APPEND)
    project = prepare(folder, lake)
    run_models(spark, project, lake)
    pageviews(lake, [(5, 0, "/later", 1)])
    assert run_models(spark, project, lake)[0].rows == 1
    # A redrive lands rows with their original sequence, below the watermark (5).
    pageviews(lake, [(2, 0, "/redriven", 1)], {"icefloe.redrive": "true"})
    outcome = run_models(spark, project, lake)[0]
    assert (outcome.state, outcome.rows) == ("ran", 6)
    assert outcome.reason == "recomputed in full after a dead-letter redrive"
    urls = [r["url"] for r in target_rows(lake, "mart.views", ("_sequence", "url"))]
    assert sorted(urls) == sorted(["/A", "/a", "/b", "/a", "/redriven", "/later"])
    assert run_models(spark, project, lake)[0].state == "up to date"


# ------------------------------------------- OndatraSQL directives, schema subfolders (#26)


def test_should_read_ondatrasql_directives(tmp_path: Path) -> None:
    model = parse_model(write_model(tmp_path, "daily", "-- @kind: merge\n"
                                    "-- @unique_key: day\n-- @description: per day\n"
                                    "SELECT day FROM web.pageviews"))
    assert (model.materialized, model.unique_key, model.description) == ("merge", ("day",),
                                                                         "per day")


@pytest.mark.parametrize(("header", "message"), [
    ("-- @grain: day", "unknown directive `-- @grain`"),
    ("-- @kind: events", "@kind must be one of view, table, append, merge (got 'events')"),
    ("-- @kind merge", "directive `-- @kind` is not understood"),
    ("-- @kind: table\n-- materialized: view", "given twice"),
    ("-- @unique_key: day", "unique_key only applies to materialized: merge"),
])
def test_should_refuse_a_directive_it_does_not_understand(tmp_path: Path, header: str,
                                                          message: str) -> None:
    with pytest.raises(ModelError, match=re.escape(message)):
        parse_model(write_model(tmp_path, "bad", f"{header}\nSELECT 1 AS a"))


def test_should_refuse_a_directive_below_the_sql(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="directive `-- @kind` below the SQL"):
        parse_model(write_model(tmp_path, "late", "SELECT 1 AS a\n-- @kind: table\n"))


def test_should_take_the_schema_from_the_subfolder(tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder / "staging", "sessions", "-- @kind: view\nSELECT url FROM pageviews")
    write_model(folder / "mart", "daily", "-- @kind: table\nSELECT count(*) AS n "
                "FROM staging.sessions")
    write_model(folder, "top", "SELECT 1 AS x")
    models = {m.name: m for m in load_models(folder)}
    assert {n: m.target for n, m in models.items()} == {
        "mart.daily": "mart.daily", "staging.sessions": "staging.sessions",
        "top": "models.top"}
    project = plan_project(list(models.values()), lake_config(tmp_path))
    assert list(project.models) == ["staging.sessions", "mart.daily", "top"]
    assert project.upstream("mart.daily") == ["staging.sessions"]


@pytest.mark.parametrize(("files", "message"), [
    ({"staging/sessions.sql": "SELECT 1 AS a",
      "sessions.sql": "-- target: staging.sessions\nSELECT 1 AS a"},
     "models 'sessions' and 'staging.sessions' both write staging.sessions"),
    ({"staging/sessions.sql": "-- target: mart.sessions\nSELECT 1 AS a"},
     "staging/sessions.sql: target mart.sessions is outside schema 'staging'"),
    ({"a/b/c.sql": "SELECT 1 AS a"}, "a/b/c.sql: models nest one folder deep"),
    ({"my-schema/c.sql": "SELECT 1 AS a"}, "subfolder is a schema name"),
])
def test_should_refuse_subfolder_clashes(tmp_path: Path, files: dict[str, str], message: str
                                         ) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    with pytest.raises(ModelError, match=re.escape(message)):
        load_models(tmp_path)


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT * FROM web.pageviews WITH (NOLOCK)", "table hint WITH (NOLOCK)"),
    ("SELECT * FROM web.pageviews AT (OFFSET => -1)", "AT (OFFSET => -1)"),
    ("SELECT * FROM web.pageviews AT (VERSION => 9)",
     "there is no catalog version 9 yet; the newest is 1"),
    ("SELECT * FROM web.pageviews AT (TIMESTAMP => '2000-01-01')", "had no snapshot at 2000"),
    ("SELECT array_agg(url ORDER BY ts) AS a FROM web.pageviews", "Spark cannot order"),
    ("SELECT url FROM web.pageviews FOR UPDATE", "FOR UPDATE/SHARE"),
])
def test_should_refuse_what_a_model_cannot_honour_before_running(lake: Config, tmp_path: Path,
                                                                 sql: str, message: str
                                                                 ) -> None:
    folder = tmp_path / "models"
    write_model(folder, "m", f"-- @kind: table\n{sql}")
    with pytest.raises(ModelError, match=f"model m: .*{re.escape(message)}"):
        prepare(folder, lake)


def test_should_run_subfolder_models_with_directives_and_versions(spark: Any, lake: Config,
                                                                  tmp_path: Path) -> None:
    pageviews(lake, [(2, 0, "/a", 4)])
    folder = tmp_path / "models"
    write_model(folder / "staging", "sessions", "-- @kind: view\n"
                "SELECT CAST(ts AS DATE) AS day, url, _sequence FROM pageviews")
    write_model(folder / "mart", "daily", "-- @kind: merge\n-- @unique_key: day\n"
                "SELECT day, count(*) AS views FROM staging.sessions GROUP BY day")
    write_model(folder / "mart", "first", "-- @kind: table\n"
                "SELECT count(*) AS n FROM web.pageviews AT (VERSION => 1)")
    outcomes = run_models(spark, prepare(folder, lake), lake)
    assert states(outcomes) == {"staging.sessions": "view", "mart.daily": "ran",
                                "mart.first": "ran"}
    assert [(r["day"], r["views"]) for r in target_rows(lake, "mart.daily", ("day",))] == [
        (DAY.date(), 4), ((DAY + dt.timedelta(days=1)).date(), 1)]
    assert target_rows(lake, "mart.first", ("n",)) == [{"n": 4}]


def test_should_fail_models_run_in_one_line_before_spark(lake: Config, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    from icefloe_app.cli import main

    del lake
    folder = tmp_path / "models"
    write_model(folder / "mart", "old", "-- @kind: table\n"
                "SELECT count(*) AS n FROM web.pageviews AT (VERSION => 9)")
    code = main(["models", "run", "--models", str(folder), "--config", str(EXAMPLE_CONFIG),
                 "--data-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.count("\n") == 0
    assert "model mart.old: AT (VERSION => 9): there is no catalog version 9 yet" in err
    assert "starting Spark" not in err


def test_should_keep_one_watermark_per_manifest_shard(spark: Any, lake: Config,
                                                      tmp_path: Path) -> None:
    """``_sequence`` is ordered within a manifest shard only: a new row of shard 0 below
    shard 1's highest sequence, and a first row of shard 2, are still new."""
    folder = tmp_path / "models"
    write_model(folder, "views", APPEND)
    project = prepare(folder, lake)

    def on_shard(shard: int, sequence: int, url: str) -> None:
        stream = lake.stream("pageviews")
        assert stream is not None
        table = open_catalog(lake.catalog).load_table(stream.table)
        row = {"user_id": "u9", "session_id": "s9", "url": url, "referrer": None,
               "duration_ms": 10, "ts": DAY, "_event_id": f"{url}-{shard}-{sequence}",
               "_received_at": DAY, "_sequence": sequence}
        rows = pa.Table.from_pylist([row], schema=table_arrow_schema(stream))
        table.append(rows.append_column("_shard", pa.array([shard], pa.int32())))

    on_shard(1, 5, "/s1")
    assert run_models(spark, project, lake)[0].rows == 5
    state = last_run(open_catalog(lake.catalog).load_table("mart.views"))
    assert state is not None
    assert state.watermarks == {"web.pageviews": 1, "web.pageviews#1": 5}
    pageviews(lake, [(2, 0, "/x", 1)])  # shard 0 (no _shard: null), below shard 1's 5
    on_shard(2, 0, "/y")
    on_shard(1, 5, "/old")  # at shard 1's watermark: not new
    rerun = run_models(spark, project, lake)
    assert (rerun[0].state, rerun[0].rows) == ("ran", 2)
    urls = sorted(r["url"] for r in target_rows(lake, "mart.views", ("_sequence", "url")))
    assert urls == ["/A", "/a", "/a", "/b", "/s1", "/x", "/y"]
    state = last_run(open_catalog(lake.catalog).load_table("mart.views"))
    assert state is not None
    assert state.watermarks == {"web.pageviews": 2, "web.pageviews#1": 5,
                                "web.pageviews#2": 0}


def shard_rows(lake: Config, rows: list[tuple[int | None, int]],
               properties: dict[str, str] | None = None) -> Any:
    """Append one data file of page views, ``(shard, sequence)`` each; the table."""
    stream = lake.stream("pageviews")
    assert stream is not None
    table = ensure_stream_table(open_catalog(lake.catalog), stream)
    if properties:
        with table.transaction() as tx:
            tx.set_properties(properties)
    body = [{"user_id": "u", "session_id": "s", "url": f"/{n}", "referrer": None,
             "duration_ms": 1, "ts": DAY, "_event_id": f"e{shard}-{sequence}-{n}",
             "_received_at": DAY, "_sequence": sequence}
            for n, (shard, sequence) in enumerate(rows)]
    table_rows = pa.Table.from_pylist(body, schema=table_arrow_schema(stream))
    table.append(table_rows.append_column(
        "_shard", pa.array([shard for shard, _ in rows], pa.int32())))
    return open_catalog(lake.catalog).load_table(stream.table)


def test_should_read_watermarks_from_file_statistics_when_exact(lake: Config) -> None:
    """One shard per file (what the collector writes per shard): the files' bounds give
    each shard's highest sequence (a null ``_shard`` is shard 0), no Spark job needed."""
    from pipeline.models.watermarks import shard_maxima

    shard_rows(lake, [(1, 5), (1, 9), (1, 7)])
    shard_rows(lake, [(None, 3), (0, 4)])
    table = shard_rows(lake, [(2, 0), (2, 11)])
    rows = table.scan().to_arrow().to_pylist()
    expected: dict[int, int] = {}
    for row in rows:
        shard = row["_shard"] or 0
        expected[shard] = max(expected.get(shard, row["_sequence"]), row["_sequence"])
    assert shard_maxima(table, table.current_snapshot().snapshot_id) == expected == {
        0: 4, 1: 9, 2: 11}
    assert shard_maxima(table, None) == {}


@pytest.mark.parametrize(("rows", "properties"), [
    ([(1, 5), (2, 9)], None),  # one file, two shards: its bounds cannot split them
    ([(None, 5), (2, 9)], None),  # a null (shard 0) beside shard 2
    ([(1, 5)], {"write.metadata.metrics.default": "none"}),  # no bounds written
])
def test_should_leave_watermarks_to_spark_when_statistics_cannot_tell(
        lake: Config, rows: list[tuple[int | None, int]], properties: dict[str, str] | None
) -> None:
    from pipeline.models.watermarks import shard_maxima

    table = shard_rows(lake, rows, properties)
    assert shard_maxima(table, table.current_snapshot().snapshot_id) is None


# --------------------------------- commit metadata, audits, schema evolution (#26 item 3)


def snapshot_props(config: Config, identifier: str) -> dict[str, str]:
    snapshot = open_catalog(config.catalog).load_table(identifier).current_snapshot()
    assert snapshot is not None
    assert snapshot.summary is not None
    return dict(snapshot.summary.additional_properties)


def test_should_record_what_each_model_commit_is(spark: Any, lake: Config, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Name, kind, sha256 of the normalized SQL, columns, rows, duration and one run id
    shared by the pass; the existing keys stay."""
    import hashlib

    from icefloe_app.cli import main

    folder = tmp_path / "models"
    write_model(folder / "mart", "n", "-- @kind: table\n"
                "SELECT   count(*) AS n,\n  CAST(max(ts) AS DATE) AS day -- last day\n"
                "FROM web.pageviews")
    write_model(folder / "mart", "views", "-- @kind: append\nSELECT url, _sequence "
                "FROM web.pageviews")
    project = prepare(folder, lake)
    assert states(run_models(spark, project, lake, run_id="pass-1")) == {
        "mart.n": "ran", "mart.views": "ran"}
    n, views = snapshot_props(lake, "mart.n"), snapshot_props(lake, "mart.views")
    normalized = project.models["mart.n"].tree.sql(dialect="spark", comments=False)
    assert "last day" not in normalized
    assert n["icefloe.model.sql-sha256"] == hashlib.sha256(normalized.encode()).hexdigest()
    assert (n["icefloe.model.name"], n["icefloe.model.kind"], n["icefloe.model.rows"],
            n["icefloe.model.run-id"]) == ("mart.n", "table", "1", "pass-1")
    assert n["icefloe.model.columns"] == '["n:long","day:date"]'
    assert int(n["icefloe.model.duration-ms"]) >= 0
    assert (views["icefloe.model.kind"], views["icefloe.model.rows"],
            views["icefloe.model.run-id"]) == ("append", "4", "pass-1")
    assert views["icefloe.model.columns"] == '["url:string","_sequence:long"]'
    assert json.loads(views["icefloe.model.watermarks"]) == {"web.pageviews": 1}
    assert "icefloe.model.sources" in views
    assert "icefloe.model.sql-hash" in views

    base = ["--config", str(EXAMPLE_CONFIG), "--data-dir", str(tmp_path)]
    assert main(["tables", "history", "mart.views", *base]) == 0
    out = capsys.readouterr().out
    assert "mart.views  append  run pass-1  4 rows" in out
    assert "url:string, _sequence:long" in out
    assert main(["tables", "history", "mart.n", *base, "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["snapshots"][0]["model"]
    assert (model["kind"], model["run_id"], model["columns"]) == ("table", "pass-1",
                                                                  ["n:long", "day:date"])


def test_should_give_every_model_of_a_pass_one_run_id(spark: Any, lake: Config,
                                                      tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "a", "-- @kind: table\nSELECT count(*) AS n FROM web.pageviews")
    write_model(folder, "b", "-- @kind: table\nSELECT n + 1 AS m FROM a")
    run_models(spark, prepare(folder, lake), lake)
    a, b = snapshot_props(lake, "models.a"), snapshot_props(lake, "models.b")
    assert a["icefloe.model.run-id"] == b["icefloe.model.run-id"]


AUDITED = """-- @kind: append
-- @target: mart.views
-- @audit: SELECT * FROM this WHERE url IS NULL
-- @audit: SELECT url, count(*) AS n FROM this WHERE url = lower(url) GROUP BY url
SELECT url, _sequence FROM web.pageviews
"""


def test_should_abort_the_commit_when_an_audit_returns_rows(spark: Any, lake: Config,
                                                            tmp_path: Path) -> None:
    folder = tmp_path / "models"
    write_model(folder, "views", AUDITED.replace("= lower(url)", "= '/nope'"))
    assert run_models(spark, prepare(folder, lake), lake)[0].state == "ran"  # audits pass
    table = open_catalog(lake.catalog).load_table("mart.views")
    before = (table.current_snapshot().snapshot_id, last_run(table))  # type: ignore[union-attr]

    pageviews(lake, [(2, 0, "/c", 1), (2, 0, "/C", 2), (2, 1, "/d", 1), (2, 1, "/d", 3)])
    write_model(folder, "views", AUDITED)
    outcome = run_models(spark, prepare(folder, lake), lake)[0]
    assert outcome.state == "failed"
    assert ("model views: audit failed, nothing committed: `SELECT url, count(*) AS n FROM "
            "this WHERE url = lower(url) GROUP BY url` (line 4) returned 2 row(s): "
            in outcome.reason)
    assert '{"url":"/d","n":2}' in outcome.reason
    assert '{"url":"/c","n":1}' in outcome.reason
    table = open_catalog(lake.catalog).load_table("mart.views")
    assert (table.current_snapshot().snapshot_id, last_run(table)) == before  # type: ignore[union-attr]
    assert not [t for t in spark.catalog.listTables() if t.name.startswith("__icefloe_this")]


def test_should_show_at_most_five_failing_rows(spark: Any, lake: Config, tmp_path: Path
                                               ) -> None:
    folder = tmp_path / "models"
    write_model(folder, "t", "-- @kind: table\n-- @audit: SELECT this.x FROM this\n"
                "SELECT explode(sequence(1, 2)) AS x, url FROM web.pageviews")
    outcome = run_models(spark, prepare(folder, lake), lake)[0]
    assert "returned 8 row(s) (first 5 shown): " in outcome.reason
    assert outcome.reason.count('{"x":') == 5
    assert not open_catalog(lake.catalog).table_exists("models.t")


@pytest.mark.parametrize(("audit", "message"), [
    ("SELECT * FROM this WHERE", "t.sql line 2: audit: SQL does not parse as spark"),
    ("SELECT * FROM web.pageviews", "t.sql line 2: audit reads web.pageviews; an audit "
                                    "reads only the model's new rows, as the table `this`"),
    ("DELETE FROM this", "t.sql line 2: audit: a model is a read-only query"),
])
def test_should_check_audits_when_the_model_is_read(tmp_path: Path, audit: str,
                                                    message: str) -> None:
    with pytest.raises(ModelError, match=re.escape(message)):
        parse_model(write_model(tmp_path, "t", f"-- @kind: table\n-- @audit: {audit}\n"
                                "SELECT 1 AS a"))


def test_should_read_several_audits(tmp_path: Path) -> None:
    model = parse_model(write_model(tmp_path, "t", AUDITED))
    assert [(a.line, a.sql) for a in model.audits] == [
        (3, "SELECT * FROM this WHERE url IS NULL"),
        (4, "SELECT url, count(*) AS n FROM this WHERE url = lower(url) GROUP BY url")]


EVOLVING = "-- @kind: append\n-- @target: mart.e\nSELECT {} FROM web.pageviews"


@pytest.mark.parametrize(("before", "after", "columns", "old_row"), [
    ("url, _sequence", "url, _sequence, upper(url) AS shout",
     ["url:string", "_sequence:long", "shout:string"], {"shout": None}),
    ("url, _sequence", "url AS page, _sequence",
     ["page:string", "_sequence:long"], {"page": "/A"}),
    ("url, CAST(_sequence AS INT) AS s", "url, CAST(_sequence AS BIGINT) AS s",
     ["url:string", "s:long"], {"s": 1}),
    ("url, _sequence, duration_ms", "url, _sequence",
     ["url:string", "_sequence:long"], {"url": "/A"}),
], ids=["add", "rename", "promote", "drop"])
def test_should_evolve_the_schema_in_the_data_commit(spark: Any, lake: Config,
                                                     tmp_path: Path, before: str, after: str,
                                                     columns: list[str],
                                                     old_row: dict[str, Any]) -> None:
    folder = tmp_path / "models"
    write_model(folder, "e", EVOLVING.format(before))
    assert run_models(spark, prepare(folder, lake), lake)[0].state == "ran"
    table = open_catalog(lake.catalog).load_table("mart.e")
    snapshots, metadata_log = len(table.snapshots()), len(table.metadata.metadata_log)
    old_schema = table.metadata.current_schema_id

    pageviews(lake, [(2, 0, "/z", 1)])
    write_model(folder, "e", EVOLVING.format(after))
    outcome = run_models(spark, prepare(folder, lake), lake)[0]
    assert (outcome.state, outcome.rows) == ("ran", 1), outcome.reason
    table = open_catalog(lake.catalog).load_table("mart.e")
    assert len(table.snapshots()) == snapshots + 1  # one new snapshot ...
    assert len(table.metadata.metadata_log) == metadata_log + 1  # ... in one commit
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert snapshot.schema_id == table.metadata.current_schema_id
    assert snapshot.schema_id != old_schema
    assert [f"{f.name}:{f.field_type}" for f in table.schema().fields] == columns
    assert json.loads(snapshot_props(lake, "mart.e")["icefloe.model.columns"]) == columns
    rows = table.scan().to_arrow().to_pylist()
    assert len(rows) == 5
    first = next(r for r in rows if r.get("url", r.get("page")) == "/A")
    assert {k: first[k] for k in old_row} == old_row


@pytest.mark.parametrize(("before", "after", "column", "types"), [
    ("url, _sequence", "CAST(_sequence AS STRING) AS url_x, CAST(1 AS INT) AS url",
     "url", "string to int"),
    ("url, _sequence", "url, CAST(_sequence AS INT) AS _sequence", "_sequence",
     "long to int"),
], ids=["string-to-int", "narrowing"])
def test_should_refuse_an_incompatible_change_and_commit_nothing(
        spark: Any, lake: Config, tmp_path: Path, before: str, after: str, column: str,
        types: str) -> None:
    folder = tmp_path / "models"
    write_model(folder, "e", EVOLVING.format(before))
    run_models(spark, prepare(folder, lake), lake)
    table = open_catalog(lake.catalog).load_table("mart.e")
    was = (table.metadata.metadata_log, table.schema(), last_run(table))
    pageviews(lake, [(2, 0, "/z", 1)])
    write_model(folder, "e", EVOLVING.format(after))
    outcome = run_models(spark, prepare(folder, lake), lake)[0]
    assert outcome.state == "failed"
    assert f"model e: table mart.e: column '{column}' cannot change from {types}" \
        in outcome.reason
    table = open_catalog(lake.catalog).load_table("mart.e")
    assert (table.metadata.metadata_log, table.schema(), last_run(table)) == was


# ------------------------------- merges the new rows alone cannot recompute: in full (#37)


def test_should_recompute_a_merge_with_having_in_full(spark: Any, lake: Config,
                                                      tmp_path: Path) -> None:
    """``HAVING count(*) >= 3``: a url with two old views and two new ones has 4, but only
    2 among the new rows; recomputed from the new rows' keys it would never appear."""
    folder = tmp_path / "models"
    write_model(folder, "popular", "-- materialized: merge\n-- unique_key: url\n"
                "SELECT url, count(*) AS views FROM web.pageviews GROUP BY url "
                "HAVING count(*) >= 3")
    project = prepare(folder, lake)
    run_models(spark, project, lake)  # /a has 2 views: not yet there
    assert target_rows(lake, "models.popular", ("url",)) == []
    pageviews(lake, [(2, 0, "/a", 5), (2, 0, "/b", 6)])
    outcome = run_models(spark, project, lake)[0]
    assert outcome.reason.startswith("recomputed in full: a merge with HAVING"), outcome.reason
    assert target_rows(lake, "models.popular", ("url",)) == [{"url": "/a", "views": 3}]


def test_should_recompute_a_merge_joining_two_streams_in_full(spark: Any, lake: Config,
                                                              tmp_path: Path) -> None:
    """A new order of a session whose page views are old: the new rows of both sources
    join nothing, so only a full recompute counts it."""
    orders(lake, 1, 0)
    folder = tmp_path / "models"
    write_model(folder, "joined", "-- materialized: merge\n-- unique_key: url\n"
                "SELECT p.url, count(o.order_id) AS orders FROM web.pageviews p "
                "JOIN shop.orders o ON o.customer_id = p.user_id GROUP BY p.url")
    project = prepare(folder, lake)
    run_models(spark, project, lake)
    assert target_rows(lake, "models.joined", ("url",)) == []
    orders(lake, 9, 1, customer="u1")
    outcome = run_models(spark, project, lake)[0]
    assert "2 incremental sources" in outcome.reason, outcome.reason
    assert target_rows(lake, "models.joined", ("url",)) == [
        {"url": "/A", "orders": 1}, {"url": "/a", "orders": 1}]


def test_should_recompute_in_full_when_a_source_had_rows_replaced(spark: Any, lake: Config,
                                                                 tmp_path: Path) -> None:
    """A row deleted from a source (a keyed table's upsert or a change stream's delete
    commits an overwrite): the new rows do not show it left, so the model recomputes."""
    from pyiceberg.expressions import EqualTo

    folder = tmp_path / "models"
    write_model(folder, "views", APPEND)
    project = prepare(folder, lake)
    assert run_models(spark, project, lake)[0].rows == 4
    table = open_catalog(lake.catalog).load_table("web.pageviews")
    table.delete(EqualTo("url", "/b"), snapshot_properties={"icefloe.sequence": "9"})
    outcome = run_models(spark, project, lake)[0]
    assert "web.pageviews had rows replaced or deleted" in outcome.reason, outcome.reason
    urls = sorted(r["url"] for r in target_rows(lake, "mart.views", ("url",)))
    assert urls == sorted(["/A", "/a", "/a"])
    assert run_models(spark, project, lake)[0].state == "up to date"


@pytest.mark.parametrize(("text", "message"), [
    ("/* daily mart */\n-- materialized: merge\n-- unique_key: day\nSELECT 1 AS day",
     "header key `-- materialized:` below the start of the query (line 2 of it)"),
    ("-- materialized = table\nSELECT 1 AS a", "'-- materialized = table' (line 1) is "
                                                "not read: write `-- materialized: value`"),
    ("SELECT 1 AS a\n-- @kind merge\n", "directive `-- @kind` below the SQL"),
])
def test_should_refuse_a_header_that_would_make_the_model_a_silent_view(
        tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ModelError, match=re.escape(message)):
        parse_model(write_model(tmp_path, "m", text))
    plain = parse_model(write_model(tmp_path, "ok", "-- a note: free text\n"
                                    "-- the materialized mart\nSELECT 1 AS a -- keep: this\n"))
    assert plain.materialized == "view"


# ------------------------------------------- CTE names, audits' dialect, overflow redrive


def test_should_match_cte_names_as_sql_does_ignoring_case(tmp_path: Path) -> None:
    """``WITH Recent AS (...) ... FROM recent`` reads the CTE (it was an unknown table)."""
    from pipeline.models.dag import Ref, check_model_sql, references

    folder = tmp_path / "models"
    write_model(folder, "m", "WITH Recent AS (SELECT url FROM web.pageviews) "
                "SELECT * FROM recent JOIN RECENT r2 USING (url)")
    project = plan_project(load_models(folder), lake_config(tmp_path))
    assert project.refs["m"] == (Ref("table", "web.pageviews"),)
    model = parse_model(write_model(tmp_path, "t", "WITH C AS (SELECT 1 AS x) "
                                    "SELECT * FROM c FOR VERSION AS OF 1"))
    assert [t.name for t in references(model.tree)] == []
    with pytest.raises(ModelError, match="'c' is a CTE"):
        check_model_sql(model)
    clash = parse_model(write_model(tmp_path, "p", '-- dialect: postgres\nWITH "Recent" AS '
                                    "(SELECT 1 AS x) SELECT * FROM recent"))
    with pytest.raises(ModelError, match="recent matches a CTE only ignoring case"):
        check_model_sql(clash)


@pytest.mark.parametrize(("audit", "construct"), [
    ("SELECT * FROM this WHERE dayofweek(ts) = 0", "DAYOFWEEK(ts)"),
    ("SELECT * FROM this WHERE substring(url, 0, 2) = '/'", "SUBSTRING(url, 0, 2)"),
    ("SELECT url FROM this GROUP BY url HAVING array_agg(referrer) <> []",
     "ARRAY_AGG(referrer)"),
])
def test_should_refuse_in_an_audit_what_spark_would_answer_differently(
        tmp_path: Path, audit: str, construct: str) -> None:
    """A ``-- dialect: duckdb`` model's audits went to Spark by ``tree.sql``, past the
    checks its SQL gets: an audit ran by Spark's rules. Now refused before Spark starts."""
    from pipeline.models.audit import audit_sql
    from pipeline.models.dag import check_model_sql

    text = f"-- dialect: duckdb\n-- @audit: {audit}\nSELECT url, ts, referrer FROM web.pageviews"
    model = parse_model(write_model(tmp_path, "m", text))
    with pytest.raises(ModelError, match=re.escape(construct)) as error:
        check_model_sql(model)
    assert "model m: audit `" in str(error.value)
    assert "(line 2)" in str(error.value)
    with pytest.raises(ModelError, match=re.escape(construct)):
        audit_sql(model.audits[0], "__view", model.dialect)
    write_model(tmp_path / "models", "m", text)
    with pytest.raises(ModelError, match=re.escape(construct)):
        plan_project(load_models(tmp_path / "models"), lake_config(tmp_path))


def test_should_write_an_audit_as_spark_sql_through_the_models_path(tmp_path: Path) -> None:
    from pipeline.models.audit import audit_sql

    model = parse_model(write_model(
        tmp_path, "m", "-- dialect: duckdb\n-- @audit: SELECT * FROM this WHERE "
        "strftime(ts, '%a') = 'Sun'\nSELECT ts FROM web.pageviews"))
    sql = audit_sql(model.audits[0], "__view", model.dialect)
    assert "FROM __view AS this" in sql
    assert "DATE_FORMAT(ts, 'EEE') = 'Sun'" in sql
    spark_model = parse_model(write_model(
        tmp_path, "s", "-- @audit: SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY n) "
        "AS p FROM this HAVING p > 5\nSELECT 1 AS n"))
    assert "PERCENTILE_CONT(0.9) WITHIN GROUP" in audit_sql(spark_model.audits[0], "__v")


@pytest.mark.parametrize(("value", "redriven"), [
    ("overflow", True), ("true", True), ("false", False), (None, False)])
def test_should_count_an_overflow_redrive_as_a_redrive(tmp_path: Path, value: str | None,
                                                       redriven: bool) -> None:
    """``icefloe tables redrive-overflow`` rewrites rows with their old ``_sequence`` under
    ``icefloe.redrive = "overflow"``: incremental models recompute in full, as after a
    dead-letter redrive (only ``"true"`` counted)."""
    from pipeline.models.state import redriven_since

    config = lake_config(tmp_path)
    pageviews(config, [(1, 0, "/a", 1)], versioned=False)
    table = open_catalog(config.catalog).load_table("web.pageviews")
    before = table.current_snapshot().snapshot_id  # type: ignore[union-attr]
    pageviews(config, [(1, 0, "/b", 1)], {"icefloe.redrive": value} if value else None,
              versioned=False)
    pageviews(config, [(9, 0, "/c", 1)], versioned=False)  # a later plain commit
    table = open_catalog(config.catalog).load_table("web.pageviews")
    assert redriven_since(table, before) is redriven
    assert redriven_since(table, table.current_snapshot().snapshot_id) is False  # type: ignore[union-attr]
