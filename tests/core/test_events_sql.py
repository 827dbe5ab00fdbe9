"""Streams declared as ``models/SCHEMA/NAME.sql`` files headed ``-- @kind: events``: the
column list read by sqlglot, the type map, refusals by name, and how they join
``icefloe.toml``'s ``[[streams]]`` (issue #26, item 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from icefloe.config.load import load_config
from icefloe.errors import ConfigError
from icefloe.streams.events_sql import is_events_file, parse_column_list
from icefloe.streams.model import Column
from pipeline.models.spec import load_models

EVENTS = """-- @kind: events
-- @description: what the site sends
event_name VARCHAR NOT NULL,
page_url VARCHAR,   -- where it happened
user_id VARCHAR NULL,
received_at TIMESTAMPTZ
"""
TOML = """[[streams]]
name = "{name}"
table = "{table}"
columns = [{{ name = "a", type = "string" }}]
"""


def project(tmp_path: Path, toml: str = "", files: dict[str, str] | None = None) -> Path:
    for name, text in (files or {"raw/events.sql": EVENTS}).items():
        path = tmp_path / "models" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    config = tmp_path / "icefloe.toml"
    config.write_text(toml)
    return config


def test_an_events_file_declares_a_stream_and_its_table(tmp_path):
    config = load_config(project(tmp_path))
    [stream] = config.streams
    assert (stream.name, stream.table) == ("raw.events", "raw.events")
    assert stream.columns == (Column("event_name", "string", required=True),
                              Column("page_url", "string"), Column("user_id", "string"),
                              Column("received_at", "timestamp"))


@pytest.mark.parametrize(("sql", "ours"), [
    ("VARCHAR", "string"), ("TEXT", "string"), ("STRING", "string"), ("CHAR", "string"),
    ("BIGINT", "long"), ("INT8", "long"), ("INTEGER", "int"), ("INT", "int"),
    ("FLOAT", "float"), ("REAL", "float"), ("DOUBLE", "double"), ("FLOAT8", "double"),
    ("BOOLEAN", "boolean"), ("BOOL", "boolean"), ("TIMESTAMPTZ", "timestamp"),
    ("TIMESTAMP WITH TIME ZONE", "timestamp"), ("DATE", "date"), ("JSON", "json"),
])
def test_sql_types_map_to_icefloe_types(sql, ours):
    assert parse_column_list(f"x {sql} NOT NULL", "f.sql") == (Column("x", ours, True),)


@pytest.mark.parametrize(("columns", "named"), [
    ("x DECIMAL(10, 2)", "type DECIMAL(10, 2) has no icefloe column type"),
    ("x SMALLINT", "type SMALLINT has no icefloe column type"),
    ("x UUID", "type UUID has no icefloe column type"),
    ("x INTEGER[]", "type INT[] has no icefloe column type"),
    ("x TIMESTAMP", "type TIMESTAMP has no icefloe column type; write TIMESTAMPTZ"),
    ("x VARCHAR DEFAULT 'a'", "DEFAULT 'a' is not supported"),
    ("x INT PRIMARY KEY", "PRIMARY KEY is not supported"),
    ("x INT, PRIMARY KEY (x)", "'PRIMARY KEY (x)' is not a column"),
    ("x", "column 'x' needs a type"),
    ("x VARCHAR, x INT", "duplicate column 'x'"),
    ("", "an events file lists its columns"),
])
def test_what_icefloe_would_not_honour_is_refused_by_name(tmp_path, columns, named):
    config = project(tmp_path, files={"raw/events.sql": f"-- @kind: events\n{columns}\n"})
    with pytest.raises(ConfigError, match=r"models/raw/events\.sql") as error:
        load_config(config)
    assert named in str(error.value)


def test_unknown_directives_and_misplaced_files_are_refused(tmp_path):
    audit = project(tmp_path / "a", files={"raw/e.sql": "-- @kind: events\n-- @audit: SELECT 1"
                                                          "\nx VARCHAR"})
    with pytest.raises(ConfigError, match="directive `-- @audit` is not supported"):
        load_config(audit)
    top = project(tmp_path / "b", files={"events.sql": EVENTS})
    with pytest.raises(ConfigError, match="sits in a schema folder"):
        load_config(top)


@pytest.mark.parametrize(("name", "table"), [("web", "raw.events"), ("raw.events", "raw.x")])
def test_a_stream_in_both_the_toml_and_a_file_is_refused_naming_both(tmp_path, name, table):
    config = project(tmp_path, TOML.format(name=name, table=table))
    with pytest.raises(ConfigError) as error:
        load_config(config)
    message = str(error.value)
    assert f"streams[0] (stream '{name}', table {table})" in message
    assert "models/raw/events.sql (stream 'raw.events', table raw.events)" in message


def test_toml_streams_and_events_files_combine(tmp_path):
    config = load_config(project(tmp_path, TOML.format(name="web", table="web.views")))
    assert [(s.name, s.table) for s in config.streams] == [("web", "web.views"),
                                                            ("raw.events", "raw.events")]


def test_the_models_folder_comes_from_collector_models_dir(tmp_path):
    config = project(tmp_path, '[collector]\nmodels_dir = "elsewhere"\n')
    assert load_config(config).streams == ()
    (tmp_path / "models").rename(tmp_path / "elsewhere")
    assert [s.name for s in load_config(config).streams] == ["raw.events"]


def test_events_files_are_streams_not_models(tmp_path):
    project(tmp_path, files={"raw/events.sql": EVENTS,
                             "staging/sessions.sql": "-- @kind: view\nSELECT 1 AS a"})
    assert [m.name for m in load_models(tmp_path / "models")] == ["staging.sessions"]
    assert is_events_file("-- a comment\n--  @KIND:  Events\nx INT")
    assert not is_events_file("-- @kind: view\nSELECT 1\n-- @kind: events")


async def test_events_files_seed_the_registry_and_a_registry_writer_conflict_is_refused(
        tmp_path):
    from icefloe.config import AdminSection, StreamConfig
    from icefloe.registry.store import RegistryStore
    from icefloe.registry.watch import RegistryWatch
    from icefloe.store import open_async_store

    streams = load_config(project(tmp_path)).streams
    key = AdminSection().registry_key
    for seed, conflict in ((streams, False),
                           ((StreamConfig("web", "raw.events", streams[0].columns),), True)):
        store = open_async_store((tmp_path / f"store-{conflict}").as_uri())
        try:
            seeded = await RegistryStore(store, key).seed(seed, "elsewhere.toml")
            assert seeded.version == 1
            watch = RegistryWatch(store, key, lambda registry: None, config_streams=streams)
            if not conflict:  # seeded from these very files: they agree
                assert (await watch.check()) is not None
                continue
            with pytest.raises(ConfigError) as error:
                await watch.check()
            assert "stream 'raw.events' of the config and source 'web' of the registry both " \
                   "write table raw.events" in str(error.value)
        finally:
            await store.close()
