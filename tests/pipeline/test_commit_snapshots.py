"""Every icefloe commit is ONE snapshot, and time travel only lands on whole commits.

Issue #37: a ``table`` model's rerun and a ``merge`` model's commit went through pyiceberg's
``overwrite``/``upsert``, which commit a ``delete`` (maybe an ``overwrite``) and one or two
``append`` snapshots in one transaction. Each got its own version and timestamp, so
``AT (VERSION => n)`` / ``AT (TIMESTAMP => t)`` between them read an empty table, or one
missing rows that exist before and after. Here: a commit adds exactly one snapshot; every
version (``tables history``, ``icefloe query``, pyiceberg, Spark) reads a complete state;
and a table an older icefloe wrote with several snapshots per commit still travels only
to whole commits.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from icefloe.config import Config
from pipeline.iceberg.catalog import open_catalog
from pipeline.models import prepare, run_models
from pipeline.models.state import NAME, RUN_ID
from pipeline.read.query import AsOf, QueryError, pin, plan, run_query
from pipeline.read.tables import load_table_to_query
from pipeline.read.versions import introduced_versions, snapshot_versions
from tests.pipeline.test_models import (
    DAY,
    EXAMPLE_CONFIG,
    EXAMPLE_MODELS,
    lake_config,
    pageviews,
    write_model,
)

PER_URL = "-- materialized: table\nSELECT url, count(*) AS n FROM web.pageviews GROUP BY url"


@pytest.fixture
def lake(tmp_path: Path) -> Config:
    config = lake_config(tmp_path)
    pageviews(config, [(1, 0, "/A", 1), (1, 0, "/a", 1), (1, 0, "/b", 2), (1, 1, "/a", 3)])
    return config


def rows_at(config: Config, identifier: str, snapshot_id: int | None) -> list[dict[str, Any]]:
    """The table's rows at ``snapshot_id`` through pyiceberg, sorted."""
    table = open_catalog(config.catalog).load_table(identifier)
    rows = table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def history(config: Config, identifier: str, capsys: pytest.CaptureFixture[str]
            ) -> list[dict[str, Any]]:
    """``icefloe tables history --json`` of ``identifier`` (lake_config's data dir)."""
    from icefloe_app.cli import main

    data_dir = Path(config.catalog.uri.split(":///", 1)[1]).parent
    assert main(["tables", "history", identifier, "--config", str(EXAMPLE_CONFIG),
                 "--data-dir", str(data_dir), "--json", "--limit", "0"]) == 0
    return json.loads(capsys.readouterr().out)["snapshots"]


def pinned(config: Config, sql: str) -> int | None:
    return next(iter(plan(sql, config).snapshots.values()))


def assert_only_whole_commits(config: Config, identifier: str,
                              whole: list[list[dict[str, Any]]],
                              capsys: pytest.CaptureFixture[str]) -> None:
    """Every catalog version ``tables history`` lists, every number up to the last, every
    snapshot id (``FOR VERSION AS OF``), and every moment around each snapshot reads one of
    the ``whole`` states (or is refused), and every whole state is some commit's end (and
    some version's, when the table records versions)."""
    table = open_catalog(config.catalog).load_table(identifier)
    snapshots = list(table.snapshots())
    listed = [r["version"] for r in history(config, identifier, capsys)
              if r["version"] is not None]
    seen = []
    for version in listed:
        at = pinned(config, f"SELECT * FROM {identifier} AT (VERSION => {version})")
        seen.append(rows_at(config, identifier, at))
        assert seen[-1] in whole, f"version {version} reads a state no reader saw"
    if listed:
        assert sorted(map(str, seen)) == sorted(map(str, whole))
    ends = [s.snapshot_id for s in snapshot_versions(table).values()]
    assert sorted(map(str, (rows_at(config, identifier, pinned(
        config, f"SELECT * FROM {identifier} FOR VERSION AS OF {end}")) for end in ends))) == \
        sorted(map(str, whole))
    top = max([*listed, *(s.sequence_number for s in snapshots)])
    asked = [f"AT (VERSION => {n})" for n in range(1, top + 1)] + \
        [f"FOR VERSION AS OF {s.snapshot_id}" for s in snapshots]
    for clause in asked:
        try:
            at = pinned(config, f"SELECT * FROM {identifier} {clause}")
        except QueryError:
            continue  # refused by name: never a wrong answer
        assert rows_at(config, identifier, at) in whole, clause
    for snapshot in snapshots:
        for ms in (snapshot.timestamp_ms - 1, snapshot.timestamp_ms,
                   snapshot.timestamp_ms + 1):
            when = dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(
                timespec="milliseconds")
            try:
                at = pinned(config, f"SELECT * FROM {identifier} AT (TIMESTAMP => '{when}')")
            except QueryError:
                continue  # before the first commit
            assert rows_at(config, identifier, at) in whole, f"AT (TIMESTAMP => {when})"


def query_cli(config: Config, sql: str, capsys: pytest.CaptureFixture[str]) -> list[Any]:
    """``icefloe query --format json`` (the embedded engine picks itself)."""
    from icefloe_app.cli import main

    data_dir = Path(config.catalog.uri.split(":///", 1)[1]).parent
    assert main(["query", "--config", str(EXAMPLE_CONFIG), "--data-dir", str(data_dir),
                 "--format", "json", sql]) == 0
    out = json.loads(capsys.readouterr().out)
    return out["rows"] if isinstance(out, dict) else out


# ------------------------------------------------------------------ today's commits


def test_a_table_model_rerun_is_one_snapshot_and_every_version_is_whole(
        spark: Any, lake: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "models"
    write_model(folder, "per_url", PER_URL)
    project = prepare(folder, lake)
    target = "models.per_url"
    run_models(spark, project, lake)
    first = rows_at(lake, target, None)
    pageviews(lake, [(2, 0, "/b", 1)])
    assert run_models(spark, project, lake)[0].state == "ran"
    second = rows_at(lake, target, None)
    assert second == [{"url": "/A", "n": 1}, {"url": "/a", "n": 2}, {"url": "/b", "n": 2}]
    assert_only_whole_commits(lake, target, [first, second], capsys)
    table = open_catalog(lake.catalog).load_table(target)
    assert len(table.snapshots()) == 2  # one per commit
    assert [s.summary.operation.value for s in table.snapshots()] == ["append", "overwrite"]
    # Spark and the CLI read the same whole states at every version
    for version, rows in zip(sorted(introduced_versions(table).values()), (first, second),
                             strict=True):
        result, _, _ = run_query(spark, lake, f"SELECT url, n FROM {target} "
                                 f"AT (VERSION => {version}) ORDER BY url")
        assert result.to_pylist() == sorted(rows, key=lambda r: r["url"])
        got = query_cli(lake, f"SELECT url, n FROM {target} AT (VERSION => {version}) "
                        "ORDER BY url", capsys)
        assert got == sorted(rows, key=lambda r: r["url"])


def test_a_merge_model_commit_is_one_snapshot_and_every_version_is_whole(
        spark: Any, lake: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "models"
    shutil.copytree(EXAMPLE_MODELS, folder)
    project = prepare(folder, lake)
    target = "mart.daily_traffic"
    run_models(spark, project, lake)
    first = rows_at(lake, target, None)
    pageviews(lake, [(2, 0, "/a", 4), (2, 2, "/c", 1)])  # one key updated, one added
    assert run_models(spark, project, lake)[1].state == "ran"
    second = rows_at(lake, target, None)
    assert len(second) == len(first) + 1
    assert [r["views"] for r in second if r["day"] == DAY.date() and r["url"] == "/a"] == [3]
    assert_only_whole_commits(lake, target, [first, second], capsys)
    table = open_catalog(lake.catalog).load_table(target)
    assert len(table.snapshots()) == 2  # one per commit
    assert table.current_snapshot().summary.operation.value == "overwrite"
    pageviews(lake, [(3, 3, "/d", 1)])  # only a new key: one append
    run_models(spark, project, lake)
    table = open_catalog(lake.catalog).load_table(target)
    assert len(table.snapshots()) == 3
    assert table.current_snapshot().summary.operation.value == "append"


# --------------------------------------------------- tables an older icefloe wrote

OLD = "old.traffic"
SCHEMA = pa.schema([pa.field("url", pa.string()), pa.field("views", pa.int64())])


def model_props(run: str) -> dict[str, str]:
    return {NAME: "traffic", RUN_ID: run, "icefloe.model.rows": "2"}


def old_style_table(config: Config) -> list[list[dict[str, Any]]]:
    """Written as icefloe before #37 did (pyiceberg's overwrite and upsert in one
    transaction, the run's properties on every snapshot). Returns the whole states."""
    catalog = open_catalog(config.catalog)
    catalog.create_namespace("old")
    table = catalog.create_table(OLD, SCHEMA)
    table.append(pa.Table.from_pylist([{"url": "/a", "views": 1}, {"url": "/b", "views": 1}],
                                      SCHEMA), snapshot_properties=model_props("r1"))
    with table.transaction() as tx:  # a `table` model's rerun
        tx.overwrite(pa.Table.from_pylist([{"url": "/a", "views": 2},
                                           {"url": "/b", "views": 1}], SCHEMA),
                     snapshot_properties=model_props("r2"))
    table = catalog.load_table(OLD)
    with table.transaction() as tx:  # a `merge` model's commit: /a changes, /c is new
        tx.upsert(pa.Table.from_pylist([{"url": "/a", "views": 3}, {"url": "/c", "views": 1}],
                                       SCHEMA), join_cols=["url"],
                  snapshot_properties=model_props("r3"))
    return [
        [{"url": "/a", "views": 1}, {"url": "/b", "views": 1}],
        [{"url": "/a", "views": 2}, {"url": "/b", "views": 1}],
        [{"url": "/a", "views": 3}, {"url": "/b", "views": 1}, {"url": "/c", "views": 1}],
    ]


def test_an_older_table_travels_only_to_whole_commits(
        lake: Config, capsys: pytest.CaptureFixture[str]) -> None:
    whole = [sorted(s, key=lambda r: json.dumps(r, sort_keys=True)) for s in
             old_style_table(lake)]
    table = open_catalog(lake.catalog).load_table(OLD)
    assert len(table.snapshots()) > 3  # the old pattern: several snapshots per commit
    assert len(snapshot_versions(table)) == 3
    assert_only_whole_commits(lake, OLD, whole, capsys)
    rows = history(lake, OLD, capsys)
    assert [r["version"] for r in rows] == [None] * len(rows)  # no catalog versions
    from icefloe_app.cli import main

    data_dir = Path(lake.catalog.uri.split(":///", 1)[1]).parent
    assert main(["tables", "history", OLD, "--config", str(EXAMPLE_CONFIG),
                 "--data-dir", str(data_dir)]) == 0
    text = capsys.readouterr().out
    assert "VERSION -: the middle of one commit an older icefloe wrote" in text
    assert text.count("traffic  -  run r3") == 1  # one model-commit line per commit
    # both readers (pyiceberg's table, the query's own LocalTable) agree
    local = load_table_to_query(lake.catalog, OLD)
    for snapshot in table.snapshots():
        for reader in (table, local):
            try:
                got = pin(reader, OLD, AsOf(timestamp_ms=snapshot.timestamp_ms))
            except QueryError:
                continue
            assert rows_at(lake, OLD, got) in whole


def test_a_version_in_the_middle_of_an_older_commit_is_refused_by_name(lake: Config) -> None:
    old_style_table(lake)
    table = open_catalog(lake.catalog).load_table(OLD)
    versions = snapshot_versions(table)
    middle = next(s for s in table.snapshots()
                  if s.snapshot_id not in {v.snapshot_id for v in versions.values()})
    end = versions[min(n for n in versions if n > middle.sequence_number)].snapshot_id
    with pytest.raises(QueryError, match=rf"snapshot {middle.snapshot_id} is the middle "
                       rf"of one commit .* the commit ends at snapshot {end}"):
        plan(f"SELECT * FROM {OLD} FOR VERSION AS OF {middle.snapshot_id}", lake)
    with pytest.raises(QueryError, match=rf"snapshot {middle.snapshot_id} is the middle"):
        plan(f"SELECT * FROM {OLD}", lake, AsOf(snapshot_id=middle.snapshot_id))


def test_separate_commits_with_the_same_properties_stay_separate_versions(
        lake: Config) -> None:
    """Two overflow redrives in a row carry equal properties; each one's end stays a
    version, and a stream table's appends (no icefloe properties) are all versions."""
    catalog = open_catalog(lake.catalog)
    catalog.create_namespace("old")
    table = catalog.create_table(OLD, SCHEMA)
    table.append(pa.Table.from_pylist([{"url": "/a", "views": 1}], SCHEMA))
    table.append(pa.Table.from_pylist([{"url": "/b", "views": 1}], SCHEMA))
    for views in (2, 3):
        table = catalog.load_table(OLD)
        with table.transaction() as tx:
            tx.overwrite(pa.Table.from_pylist([{"url": "/a", "views": views}], SCHEMA),
                         snapshot_properties={"icefloe.redrive": "overflow"})
    table = catalog.load_table(OLD)
    ends = [s.snapshot_id for s in snapshot_versions(table).values()]
    assert len(ends) == 4
    assert [rows_at(lake, OLD, s) for s in ends] == [
        [{"url": "/a", "views": 1}], [{"url": "/a", "views": 1}, {"url": "/b", "views": 1}],
        [{"url": "/a", "views": 2}], [{"url": "/a", "views": 3}]]


def test_one_model_pass_is_one_catalog_version_across_its_targets(
        spark: Any, lake: Config, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both targets of a pass record the pass's version; the source's next commit (a
    collector run) takes the next one, and the pass after it the one after (#37)."""
    folder = tmp_path / "models"
    write_model(folder, "per_url", PER_URL)
    write_model(folder, "total", "-- materialized: table\nSELECT count(*) AS n FROM "
                "web.pageviews")
    project = prepare(folder, lake)
    catalog = open_catalog(lake.catalog)

    def versions(identifier: str) -> list[int]:
        return sorted(introduced_versions(catalog.load_table(identifier)).values())

    assert versions("web.pageviews") == [1]  # the fixture's commit
    run_models(spark, project, lake)
    pageviews(lake, [(2, 0, "/b", 1)])
    run_models(spark, project, lake)
    assert versions("models.per_url") == versions("models.total") == [2, 4]
    assert versions("web.pageviews") == [1, 3]
    for version, expected in ((2, {"total": 4, "source": 4}), (3, {"total": 4, "source": 5}),
                              (4, {"total": 5, "source": 5})):
        got = query_cli(lake, f"SELECT t.n AS total, p.n AS source FROM models.total "
                        f"AT (VERSION => {version}) t CROSS JOIN (SELECT count(*) AS n FROM "
                        f"web.pageviews AT (VERSION => {version})) p", capsys)
        assert got == [expected], version
