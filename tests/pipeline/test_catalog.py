"""Catalog opening and table creation/evolution against real catalogs.

Why three backends: the embedded default is SQLite, production runs PostgreSQL (JDBC-catalog
compatible) or Glue, and each fails and races in its own way. PostgreSQL is a real server
(``pgserver``), Glue and the S3 warehouse are the moto server from ``conftest.py``.
"""

from __future__ import annotations

import datetime as dt
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform
from pyiceberg.types import DoubleType, LongType, StringType

from icefloe.config import CatalogSection, Column, StreamConfig, load_config
from icefloe.errors import CatalogError, ConfigError, SchemaConflictError
from pipeline.columns import (
    DEAD_LETTER_TABLE,
    dead_letter_arrow_schema,
    table_arrow_schema,
)
from pipeline.iceberg.catalog import catalog_label, mask_uri, open_catalog
from pipeline.iceberg.tables import RETRIES_PROP, ensure_dead_letter_table, ensure_stream_table

UTC = dt.UTC
ALL_TYPES = ("string", "long", "int", "float", "double", "boolean", "timestamp", "date", "json")


# --- fixtures ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pg_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway PostgreSQL server (unix socket) for this module."""
    pgserver = pytest.importorskip("pgserver")
    try:
        server = pgserver.get_server(tmp_path_factory.mktemp("pg") / "data",
                                     cleanup_mode="delete")
    except Exception as exc:  # no binaries, no useradd as root, ...: say why
        pytest.skip(f"pgserver cannot start PostgreSQL in this environment: {exc!r}")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def _sqlite_section(tmp_path: Path, name: str = "icefloe") -> CatalogSection:
    return CatalogSection(type="sql", name=name,
                          uri=f"sqlite:///{tmp_path / 'nested' / 'catalog.db'}",
                          warehouse=(tmp_path / "wh" / "root").as_uri())


def _pg_section(pg_uri: str, tmp_path: Path) -> CatalogSection:
    # A unique catalog name isolates each test inside the shared database.
    return CatalogSection(type="sql", name=f"c{uuid.uuid4().hex[:10]}", uri=pg_uri,
                          warehouse=(tmp_path / "wh").as_uri())


def _glue_section(endpoint: str, warehouse: str, **extra: str) -> CatalogSection:
    creds = {"access-key-id": "testing", "secret-access-key": "testing",
             "region": "us-east-1"}
    props = {"glue.endpoint": endpoint, "s3.endpoint": endpoint,
             **{f"glue.{k}": v for k, v in creds.items()},
             **{f"s3.{k}": v for k, v in creds.items()}, **extra}
    return CatalogSection(type="glue", name="icefloe", warehouse=warehouse, properties=props)


@pytest.fixture(params=["sqlite", "postgres", "glue"])
def section(request: pytest.FixtureRequest, tmp_path: Path) -> CatalogSection:
    if request.param == "sqlite":
        return _sqlite_section(tmp_path)
    if request.param == "postgres":
        return _pg_section(request.getfixturevalue("pg_uri"), tmp_path)
    target = request.getfixturevalue("s3_bucket")
    return _glue_section(target.endpoint_url, target.url.rstrip("/"))


@pytest.fixture
def catalog(section: CatalogSection) -> Catalog:
    return open_catalog(section)


@pytest.fixture
def ns() -> str:
    """A fresh namespace: Glue (moto) and PostgreSQL state outlive a single test."""
    return f"t{uuid.uuid4().hex[:12]}"


def _stream(table: str, columns: dict[str, str], partition: str = "day") -> StreamConfig:
    return StreamConfig(name=table.replace(".", "-"), table=table, partition=partition,
                        columns=tuple(Column(name=n, type=t) for n, t in columns.items()))


def _rows(schema: pa.Schema, rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


T0 = dt.datetime(2024, 5, 1, 12, 30, tzinfo=UTC)


def _meta(i: int) -> dict[str, Any]:
    return {"_event_id": f"e{i}", "_received_at": T0 + dt.timedelta(days=i), "_sequence": i}


# --- opening catalogs ----------------------------------------------------------------------

def test_sqlite_catalog_creates_parent_and_warehouse(tmp_path: Path) -> None:
    section = _sqlite_section(tmp_path)
    catalog = open_catalog(section)
    assert (tmp_path / "nested" / "catalog.db").is_file()
    assert (tmp_path / "wh" / "root").is_dir()
    assert catalog.list_namespaces() == []


def test_unreachable_postgres_is_a_one_line_catalog_error(tmp_path: Path) -> None:
    port = _closed_port()
    section = CatalogSection(type="sql", uri=f"postgresql://ice:s3cr3t@127.0.0.1:{port}/db",
                             warehouse=(tmp_path / "wh").as_uri())
    with pytest.raises(CatalogError) as info:
        open_catalog(section)
    message = str(info.value)
    assert "\n" not in message
    assert "s3cr3t" not in message
    assert f"sql catalog 'icefloe' at postgresql://ice:***@127.0.0.1:{port}/db" in message
    assert "refused" in message.lower()
    assert "PostgreSQL is running" in message


def test_unknown_catalog_type(tmp_path: Path) -> None:
    section = CatalogSection(type="hive", warehouse=(tmp_path / "wh").as_uri())  # type: ignore[arg-type]
    with pytest.raises(CatalogError, match=r"catalog\.type: unknown catalog type 'hive'"):
        open_catalog(section)


def test_unreachable_glue(tmp_path: Path, aws_test_env: None) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    section = _glue_section(endpoint, (tmp_path / "wh").as_uri(),
                            **{"glue.max-retries": "0"})
    with pytest.raises(CatalogError, match=r"glue catalog 'icefloe' at http://127") as info:
        open_catalog(section)
    assert "testing" not in str(info.value)
    assert "glue.endpoint" in str(info.value)


def test_glue_max_retries_is_a_number(tmp_path: Path, aws_test_env: None) -> None:
    # Config properties are strings; botocore needs the retry count as a number.
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    bad = _glue_section(endpoint, (tmp_path / "wh").as_uri(), **{"glue.max-retries": "x"})
    with pytest.raises(ConfigError, match=r"glue\.max-retries"):
        open_catalog(bad)
    section = _glue_section(endpoint, (tmp_path / "wh").as_uri(),
                            **{"glue.max-retries": "0"})
    with pytest.raises(CatalogError, match="Could not connect") as info:
        open_catalog(section)  # reaches the network (the count was accepted)
    assert "not supported between" not in str(info.value)


def test_labels_and_masking() -> None:
    assert mask_uri("postgresql://u:pw@h:5432/db?sslmode=require&password=x") == (
        "postgresql://u:***@h:5432/db?sslmode=require&password=***")
    assert mask_uri("sqlite:////a/b.db") == "sqlite:////a/b.db"
    rest = CatalogSection(type="rest", uri="https://cat.example/api?token=abc")
    assert catalog_label(rest) == "rest catalog 'icefloe' at https://cat.example/api?token=***"
    glue = CatalogSection(type="glue", properties={"glue.region": "eu-west-1"})
    assert catalog_label(glue) == "glue catalog 'icefloe' at the AWS endpoint (eu-west-1)"


# --- creating tables and writing every type ------------------------------------------------

def test_every_column_type_appends_to_partitioned_table(
        catalog: Catalog, section: CatalogSection, ns: str) -> None:
    stream = _stream(f"{ns}.events", {f"c_{t}": t for t in ALL_TYPES})
    table = ensure_stream_table(catalog, stream)

    assert table.properties[RETRIES_PROP] == "0"
    assert table.metadata.format_version == 2
    (field,) = table.spec().fields
    assert isinstance(field.transform, DayTransform)
    assert table.schema().find_column_name(field.source_id) == "_received_at"
    if section.type == "glue":
        assert table.location().startswith(section.warehouse + "/")

    values = {"c_string": "s", "c_long": 2**40, "c_int": 7, "c_float": 1.5, "c_double": 2.25,
              "c_boolean": True, "c_timestamp": T0, "c_date": dt.date(2024, 5, 1),
              "c_json": '{"a": [1, 2]}'}
    rows = [{**values, **_meta(0)}, {**{k: None for k in values}, **_meta(1)}]
    table.append(_rows(table_arrow_schema(stream), rows))

    again = ensure_stream_table(catalog, stream)  # idempotent: no new metadata
    assert again.metadata_location == catalog.load_table(stream.table).metadata_location
    back = sorted(again.scan().to_arrow().to_pylist(), key=lambda r: r["_sequence"])
    assert back == [{**row, "_shard": None} for row in rows]  # written without it: shard 0
    assert len(again.inspect.partitions()) == 2


def test_dead_letter_table(catalog: Catalog) -> None:
    table = ensure_dead_letter_table(catalog)
    assert ".".join(table.name()) == DEAD_LETTER_TABLE
    assert table.properties[RETRIES_PROP] == "0"
    (field,) = table.spec().fields
    assert table.schema().find_column_name(field.source_id) == "received_at"
    row = {"stream": "s", "sequence": 3, "location": "batches/x", "record_index": 0,
           "event_id": None, "reason": "bad_json", "message": "m", "raw": b"\x00{",
           "received_at": T0}
    before = len(table.scan().to_arrow())  # moto's Glue outlives a test
    table.append(_rows(dead_letter_arrow_schema(), [row]))
    assert len(ensure_dead_letter_table(catalog).scan().to_arrow()) == before + 1


@pytest.mark.parametrize(("partition", "transform"),
                         [("hour", HourTransform), ("month", MonthTransform), ("none", None)])
def test_partition_option(tmp_path: Path, partition: str, transform: type | None) -> None:
    catalog = open_catalog(_sqlite_section(tmp_path))
    stream = _stream("app.clicks", {"x": "long"}, partition)
    table = ensure_stream_table(catalog, stream)
    fields = table.spec().fields
    if transform is None:
        assert fields == ()
    else:
        assert isinstance(fields[0].transform, transform)
    table.append(_rows(table_arrow_schema(stream), [{"x": 1, **_meta(0)}]))
    assert len(table.scan().to_arrow()) == 1


def test_partition_must_be_known(tmp_path: Path) -> None:
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "s"\ntable = "app.s"\npartition = "week"\n'
                    'columns = [{name = "a", type = "long"}]\n')
    with pytest.raises(ConfigError, match=r"streams\[0\]\.partition: unknown partition 'week'"):
        load_config(path, env={})


# --- evolution -----------------------------------------------------------------------------

def test_evolution_adds_and_widens_and_keeps_dropped_columns(
        catalog: Catalog, ns: str) -> None:
    v1 = _stream(f"{ns}.orders", {"a": "int", "b": "float", "c": "string"})
    table = ensure_stream_table(catalog, v1)
    old = [{"a": 1, "b": 0.5, "c": "old", **_meta(0)}]
    table.append(_rows(table_arrow_schema(v1), old))

    v2 = _stream(f"{ns}.orders", {"a": "long", "b": "double", "d": "string", "e": "json"})
    table = ensure_stream_table(catalog, v2)
    schema = table.schema()
    assert [f.name for f in schema.fields] == [
        "a", "b", "c", "_event_id", "_received_at", "_sequence", "_shard", "d", "e"]
    assert schema.find_type("a") == LongType()
    assert schema.find_type("b") == DoubleType()
    assert schema.find_type("c") == StringType()  # left alone, not dropped
    assert all(not f.required for f in schema.fields)

    table.append(_rows(table_arrow_schema(v2),
                       [{"a": 2**40, "b": 1.25, "d": "new", "e": "{}", **_meta(1)}]))
    back = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["_sequence"])
    assert back[0] | {"_received_at": None} == {
        "a": 1, "b": 0.5, "c": "old", "d": None, "e": None, "_event_id": "e0",
        "_received_at": None, "_sequence": 0, "_shard": None}
    assert (back[1]["a"], back[1]["c"], back[1]["d"]) == (2**40, None, "new")


@pytest.mark.parametrize(("was", "now"), [("string", "long"), ("long", "int"),
                                          ("timestamp", "date"), ("double", "float")])
def test_incompatible_type_change_is_refused(
        catalog: Catalog, ns: str, was: str, now: str) -> None:
    table = ensure_stream_table(catalog, _stream(f"{ns}.t", {"k": was}))
    with pytest.raises(SchemaConflictError) as info:
        ensure_stream_table(catalog, _stream(f"{ns}.t", {"k": now, "extra": "long"}))
    message = str(info.value)
    assert f"table {ns}.t: column 'k' is {was} in the table but configured as {now}" in message
    assert "new column name" in message
    after = catalog.load_table(f"{ns}.t")
    assert after.metadata_location == table.metadata_location  # nothing was committed


def test_existing_table_gets_retries_pinned(tmp_path: Path) -> None:
    catalog = open_catalog(_sqlite_section(tmp_path))
    stream = _stream("app.legacy", {"x": "long"})
    catalog.create_namespace("app")
    from pipeline.iceberg.tables import table_iceberg_schema

    catalog.create_table(stream.table, table_iceberg_schema(stream),
                         properties={RETRIES_PROP: "4"})
    table = ensure_stream_table(catalog, stream)
    assert table.properties[RETRIES_PROP] == "0"
    assert catalog.load_table(stream.table).properties[RETRIES_PROP] == "0"


# --- concurrency ---------------------------------------------------------------------------

def _race(catalogs: list[Catalog], stream: StreamConfig) -> list[Any]:
    """Run ensure_stream_table on every catalog at once; return the tables or the errors."""
    barrier = threading.Barrier(len(catalogs))
    results: list[Any] = []

    def run(catalog: Catalog) -> None:
        barrier.wait()
        try:
            results.append(ensure_stream_table(catalog, stream))
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in catalogs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_concurrent_creators_and_evolvers_all_succeed(
        request: pytest.FixtureRequest, tmp_path: Path, backend: str, ns: str) -> None:
    section = (_sqlite_section(tmp_path) if backend == "sqlite"
               else _pg_section(request.getfixturevalue("pg_uri"), tmp_path))
    catalogs = [open_catalog(section) for _ in range(4)]  # one engine each, like processes

    created = _race(catalogs, _stream(f"{ns}.race", {"x": "int"}))
    assert not [r for r in created if isinstance(r, Exception)]
    assert len({str(t.metadata.table_uuid) for t in created}) == 1

    evolved = _race(catalogs, _stream(f"{ns}.race", {"x": "long", "y": "string"}))
    assert not [r for r in evolved if isinstance(r, Exception)]
    table = catalogs[0].load_table(f"{ns}.race")
    assert table.schema().find_type("x") == LongType()
    assert len(table.metadata.schemas) == 2  # one evolution, not one per process


def test_lost_races_are_resolved_by_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                            ) -> None:
    """Deterministic version of the race: the other process wins between check and create."""
    catalog = open_catalog(_sqlite_section(tmp_path))
    stream = _stream("app.race", {"x": "long"})
    winner = ensure_stream_table(open_catalog(_sqlite_section(tmp_path)), stream)

    real_exists, real_load = catalog.namespace_exists, catalog.load_table
    calls = {"exists": 0, "load": 0}

    def stale_exists(namespace: str) -> bool:
        calls["exists"] += 1
        return False if calls["exists"] == 1 else real_exists(namespace)

    def stale_load(identifier: str) -> Any:
        calls["load"] += 1
        if calls["load"] == 1:
            raise NoSuchTableError(identifier)
        return real_load(identifier)

    monkeypatch.setattr(catalog, "namespace_exists", stale_exists)
    monkeypatch.setattr(catalog, "load_table", stale_load)
    table = ensure_stream_table(catalog, stream)  # IntegrityError + TableAlreadyExists paths
    assert table.metadata.table_uuid == winner.metadata.table_uuid
    assert calls["load"] >= 2


def test_glue_warehouse_objects_land_in_s3(s3_bucket, ns: str) -> None:
    section = _glue_section(s3_bucket.endpoint_url, s3_bucket.url.rstrip("/"))
    catalog = open_catalog(section)
    stream = _stream(f"{ns}.s3", {"x": "long"})
    table = ensure_stream_table(catalog, stream)
    table.append(_rows(table_arrow_schema(stream), [{"x": 1, **_meta(0)}]))
    bucket, prefix = section.warehouse[len("s3://"):].split("/", 1)
    client = boto3.client("s3", endpoint_url=section.properties["s3.endpoint"],
                          region_name="us-east-1")
    keys = [o["Key"] for o in client.list_objects_v2(
        Bucket=bucket, Prefix=f"{prefix}/{ns}.db/s3/")["Contents"]]
    assert any(k.endswith(".parquet") for k in keys)
    assert any(k.endswith(".metadata.json") for k in keys)
