"""A ``format = "avro"`` stream the whole way (#39): a Confluent producer (confluent-kafka's
own ``AvroSerializer`` registering its schemas in icefloe's schema registry on the admin
port) and a single-object-encoding producer send records written under three schema
versions; the ingestor checks each against its writer schema from the registry and keeps
the bytes with the writer's id; the collector reads every record through Avro's resolution
rules into the stream's schema (logical types native) and commits one table, read back by
pyiceberg, ``icefloe query`` and Spark. A schema registered after the ingestor started is
picked up on a retry; bad records are refused naming the field, nothing stored."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import httpx
import msgspec
import pytest
from collector_support import collect_all, collector_config, output_engine, read_table
from ingest_support import grpc_serving, http_serving, running, stored_events

from icefloe.client import AsyncGrpcClient, IngestRejected
from icefloe.config import Config, StreamConfig
from icefloe.config.typed_streams import with_typed_columns
from icefloe.streams.model import TypedSchema
from icefloe.tokens import hash_token
from icefloe.typed.avro import AvroType
from icefloe.v1 import ingest_pb2
from icefloe_app.cli import main
from tests.admin_support import admin_server

pytest.importorskip("confluent_kafka.schema_registry")

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

UTC = dt.UTC
TOKEN = "ifl_admin-avro-stream-token"
SUBJECT = "clicks-value"
BASE = [
    {"name": "user_id", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9,
                                "scale": 2}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
]
V1 = {"type": "record", "name": "Click", "namespace": "acme", "fields": [
    *BASE, {"name": "n", "type": "int"}]}
V2 = {"type": "record", "name": "Click", "namespace": "acme", "fields": [
    *BASE, {"name": "n", "type": "int"},
    {"name": "url", "type": ["null", "string"], "default": None}]}
READER = {"type": "record", "name": "Click", "namespace": "acme", "fields": [
    *BASE, {"name": "n", "type": "long"},
    {"name": "url", "type": ["null", "string"], "default": None},
    {"name": "channel", "type": "string", "default": "web"}]}
"""The stream's schema: reads v1 (no url: null; n promoted to long) and v2; ``channel``
comes from its default for every record written without it."""
V3 = {"type": "record", "name": "Click", "namespace": "acme", "fields": [
    *BASE, {"name": "n", "type": "int"},
    {"name": "channel", "type": "string", "default": "web"}]}
"""Registered after the ingestor started: known to it only on a retry."""
REF = uuid.UUID("6f1c2b4e-8a0d-4c1e-9b7f-0123456789ab")


def click(i: int, **extra: Any) -> dict[str, Any]:
    return {"user_id": f"u{i}", "amount": Decimal(f"{i}.25"), "ref": str(REF),
            "day": dt.date(2026, 11, 20 + i % 5),
            "at": dt.datetime(2026, 11, 23, 10, i, tzinfo=UTC),
            "local": dt.datetime(2026, 11, 23, 11, i, 7, 123000), "n": i, **extra}


def typed_config(tmp_path: Path, id_field: str | None = None) -> Config:
    (tmp_path / "click.avsc").write_text(json.dumps(READER))
    stream = StreamConfig(name="clicks", table="web.clicks", columns=(), format="avro",
                          schema=TypedSchema(schema_file="click.avsc"),
                          event_id_field=id_field)
    config = collector_config(tmp_path, streams=with_typed_columns((stream,), tmp_path, "t"))
    return msgspec.structs.replace(config, admin=msgspec.structs.replace(
        config.admin, port=0, tokens=(hash_token(TOKEN, log2_n=10),)))


@contextlib.contextmanager
def registry(config: Config) -> Iterator[SchemaRegistryClient]:
    with admin_server(config) as url:
        yield SchemaRegistryClient({"url": url, "basic.auth.user.info": f"me:{TOKEN}",
                                    "max.retries": 0})


def confluent(client: SchemaRegistryClient, schema: dict[str, Any], record: dict[str, Any],
              topic: str = "clicks") -> bytes:
    """What a Confluent producer sends: its serializer registers ``schema`` (once, under
    ``<topic>-value``) and frames the datum with the id."""
    serializer = AvroSerializer(client, json.dumps(schema))
    data = serializer(record, SerializationContext(topic, MessageField.VALUE))
    assert data is not None
    return data


def single_object(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\xc3\x01" + AvroType(schema).fingerprint() + out.getvalue()


@contextlib.asynccontextmanager
async def grpc_client(config: Config, **options: Any) -> AsyncIterator[AsyncGrpcClient]:
    async with grpc_serving(config) as (_, served), \
            AsyncGrpcClient(f"127.0.0.1:{served.port}", **options) as client:
        yield client


async def test_records_of_three_schema_versions_land_in_one_table(tmp_path, spark, capsys):
    config = typed_config(tmp_path)
    with registry(config) as client:
        v1 = [confluent(client, V1, click(i)) for i in (1, 2)]
        v2 = [confluent(client, V2, click(3, url="/three"))]
        async with grpc_client(config) as sender:
            assert await sender.publish("clicks", [ingest_pb2.Event(data=d)
                                                   for d in v1 + v2]) == 3
            # registered now, after the ingestor read the registry: a 503, then a retry
            late = confluent(client, V3, click(4, channel="app"))
            assert await sender.publish("clicks", [ingest_pb2.Event(data=late)]) == 1
        async with running(config) as runtime, http_serving(runtime) as url, \
                httpx.AsyncClient(base_url=url) as http:
            posted = await http.post("/v1/streams/clicks/events",
                                     content=single_object(READER, {
                                         **click(5), "url": None, "channel": "mail"}),
                                     headers={"content-type": "application/vnd.apache.avro"
                                                              "+binary"})
            assert posted.status_code == 202, posted.text
    stored = await stored_events(config.store.url)
    assert {e.format for e in stored} == {2}
    assert len({e.schema_id for e in stored}) == 4  # three registry ids, the file schema's
    await collect_all(config, output_engine(spark, "embedded"))
    from pipeline.iceberg.catalog import open_catalog

    schema = open_catalog(config.catalog).load_table("web.clicks").schema()
    kinds = {f.name: str(f.field_type) for f in schema.fields}
    assert (kinds["amount"], kinds["ref"], kinds["day"]) == ("decimal(9, 2)", "uuid", "date")
    assert (kinds["at"], kinds["local"], kinds["n"]) == ("timestamptz", "timestamp", "long")
    rows = {r["user_id"]: r for r in read_table(config, "web.clicks").to_pylist()}
    assert sorted(rows) == ["u1", "u2", "u3", "u4", "u5"]
    for i in range(1, 6):
        row = rows[f"u{i}"]
        assert row["amount"] == Decimal(f"{i}.25")
        assert row["day"] == dt.date(2026, 11, 20 + i % 5)
        assert row["at"] == dt.datetime(2026, 11, 23, 10, i, tzinfo=UTC)
        assert row["local"] == dt.datetime(2026, 11, 23, 11, i, 7, 123000)
        assert row["n"] == i
    assert [rows[f"u{i}"]["url"] for i in range(1, 6)] == [None, None, "/three", None, None]
    assert [rows[f"u{i}"]["channel"] for i in range(1, 6)] == [
        "web", "web", "web", "app", "mail"]
    from pipeline.read.iceberg_source import read_table as spark_read_table

    frame = spark_read_table(spark, config.catalog, "web.clicks")
    seen = {r["user_id"]: r.asDict() for r in frame.collect()}
    assert seen["u4"]["channel"] == "app"
    assert seen["u2"]["amount"] == Decimal("2.25")
    assert seen["u1"]["local"] == dt.datetime(2026, 11, 23, 11, 1, 7, 123000)
    path = tmp_path / "query.toml"
    path.write_text(f'[catalog]\nuri = "{config.catalog.uri}"\n'
                    f'warehouse = "{config.catalog.warehouse}"\n'
                    '[store]\nurl = "file:///tmp/unused-store"\n')
    capsys.readouterr()
    assert main(["query", "--config", str(path), "--format", "json",
                 "SELECT user_id, n, channel FROM web.clicks ORDER BY user_id"]) == 0
    assert json.loads(capsys.readouterr().out)[3] == {"user_id": "u4", "n": 4,
                                                      "channel": "app"}


async def test_bad_avro_records_are_refused_naming_why_and_nothing_is_stored(tmp_path):
    config = typed_config(tmp_path)
    incompatible = {**V1, "fields": [{"name": "user_id", "type": "int"}, *V1["fields"][1:]]}
    with registry(config) as client:
        good = confluent(client, V1, click(1))
        # the registry refuses it under clicks-value (BACKWARD): a producer of another topic
        wrong_type = confluent(client, incompatible, {**click(2), "user_id": 7}, "other")
        json_id = client.register_schema("json-value", Schema('{"type": "object"}', "JSON"))
        async with grpc_client(config, retries=0) as sender:
            for data, needle in [
                    (good[:-4], "event 1 (field local)"),
                    (wrong_type, "user_id"),
                    (b"\x00" + json_id.to_bytes(4, "big") + good[5:], "JSON schema"),
                    (b"\xc3\x01" + b"\x01" * 8 + good[5:], "fingerprint"),
                    (b"\x7f" + good, "single-object")]:
                with pytest.raises(IngestRejected) as caught:
                    await sender.publish("clicks", [ingest_pb2.Event(data=good),
                                                    ingest_pb2.Event(data=data)])
                assert caught.value.code == "invalid_payload", caught.value
                assert needle in str(caught.value), (needle, str(caught.value))
            with pytest.raises(IngestRejected) as unknown:  # an id above every known one
                await sender.publish("clicks", [ingest_pb2.Event(
                    data=b"\x00\x00\x00\x03\xe7" + good[5:])])
            assert unknown.value.code == "schema_not_yet_known"
            with pytest.raises(IngestRejected) as json_refused:
                await sender.publish("clicks", [{"user_id": "u1"}])
            assert "Avro" in str(json_refused.value)
        async with grpc_client(config) as retrying:  # the retry after the registry's read
            with pytest.raises(IngestRejected) as never:
                await retrying.publish("clicks", [ingest_pb2.Event(
                    data=b"\x00\x00\x00\x03\xe7" + good[5:])])
            assert never.value.code == "invalid_payload"
            assert "not in the schema registry" in str(never.value)
    assert await stored_events(config.store.url) == []


async def test_an_event_id_field_deduplicates_records_of_any_writer_version(tmp_path):
    """``event_id_field = "user_id"``: the same click sent again, once written with v1
    (Confluent) and once in single-object encoding, is one row."""
    from pipeline.load.run import LocalEngine

    config = typed_config(tmp_path, id_field="user_id")
    with registry(config) as client:
        first = confluent(client, V1, click(1))
        async with grpc_client(config) as sender:
            assert await sender.publish("clicks", [ingest_pb2.Event(data=first)]) == 1
            again = single_object(READER, {**click(1), "url": None, "channel": "web"})
            assert await sender.publish("clicks", [ingest_pb2.Event(data=again),
                                                   ingest_pb2.Event(data=confluent(
                                                       client, V1, click(2)))]) == 2
    assert [e.event_id for e in await stored_events(config.store.url)] == ["u1", "u1", "u2"]
    await collect_all(config, LocalEngine())
    assert sorted(r["user_id"] for r in read_table(config, "web.clicks").to_pylist()) == [
        "u1", "u2"]
