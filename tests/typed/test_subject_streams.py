"""Streams whose type is a subject of icefloe's schema registry (#39): ``schema = {
subject = "clicks-value" }``. The producers are confluent-kafka's own serializers
registering in icefloe's registry (the admin port); the ingestor resolves the subject's
latest version (at start, and again when a record names an id it does not know yet), the
collector re-resolves it once per run and evolves the table before that run's rows land.
Refusals name the stream, the subject, the id or the message index; nothing is stored."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc_tools
import msgspec
import pytest
from collector_support import drain, read_table, start
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from ingest_support import grpc_serving, stored_events

from icefloe.client import AsyncGrpcClient, IngestRejected
from icefloe.config import Config, StreamConfig, load_config
from icefloe.config.typed_streams import with_typed_columns
from icefloe.errors import ConfigError
from icefloe.registry.subjects import SubjectError, resolve
from icefloe.schemas.store import SchemaStore, schema_key
from icefloe.store import open_async_store
from icefloe.streams.model import TypedSchema
from icefloe.tokens import hash_token
from icefloe.v1 import ingest_pb2
from pipeline.load.run import LocalEngine
from tests.admin_support import admin_server
from tests.collector_support import CLICKS, collector_config

pytest.importorskip("confluent_kafka.schema_registry")

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

TOKEN = "ifl_admin-subject-stream-token"
V1 = {"type": "record", "name": "Visit", "namespace": "acme", "fields": [
    {"name": "user_id", "type": "string"}, {"name": "n", "type": "int"}]}
V2 = {**V1, "fields": [*V1["fields"],
                       {"name": "url", "type": ["null", "string"], "default": None}]}
ORDERS_V1 = """syntax = "proto3";
package acme.orders.v1;
message Note { string text = 1; }
message OrderPlaced {
  string order_id = 1;
  int64 amount_cents = 2;
}
"""
ORDERS_V2 = """syntax = "proto3";
package acme.orders.v1;
message Note { string text = 1; }
message OrderPlaced {
  string order_id = 1;
  int64 total_cents = 2;
  string currency = 3;
}
"""
"""``amount_cents`` renamed (same number: the same column) and ``currency`` added."""


def subject_config(tmp_path: Path, *streams: StreamConfig) -> Config:
    config = collector_config(tmp_path, streams=with_typed_columns(streams, tmp_path, "t"))
    return msgspec.structs.replace(config, admin=msgspec.structs.replace(
        config.admin, port=0, tokens=(hash_token(TOKEN, log2_n=10),)))


def visits(subject: str = "visits-value") -> StreamConfig:
    return StreamConfig(name="visits", table="web.visits", columns=(), format="avro",
                        schema=TypedSchema(subject=subject))


def orders() -> StreamConfig:
    return StreamConfig(name="orders", table="shop.orders", columns=(), format="protobuf",
                        schema=TypedSchema(subject="orders-value",
                                           message="acme.orders.v1.OrderPlaced"))


@contextlib.contextmanager
def registry(config: Config) -> Iterator[SchemaRegistryClient]:
    with admin_server(config) as url:
        yield client_of(url)


def client_of(url: str) -> SchemaRegistryClient:
    """A registry client (each has its own cache: registering a schema again after its
    subject was deleted needs a client that has not registered it yet)."""
    return SchemaRegistryClient({"url": url, "basic.auth.user.info": f"me:{TOKEN}",
                                 "max.retries": 0})


def avro(client: SchemaRegistryClient, schema: dict[str, Any], record: dict[str, Any],
         topic: str = "visits") -> bytes:
    data = AvroSerializer(client, json.dumps(schema))(
        record, SerializationContext(topic, MessageField.VALUE))
    assert data is not None
    return data


@contextlib.asynccontextmanager
async def sender(config: Config, **options: Any) -> AsyncIterator[AsyncGrpcClient]:
    async with grpc_serving(config) as (_, served), \
            AsyncGrpcClient(f"127.0.0.1:{served.port}", **options) as client:
        yield client


def events(*payloads: bytes) -> list[ingest_pb2.Event]:
    return [ingest_pb2.Event(data=p) for p in payloads]


async def test_avro_subject_stream_evolves_its_table_before_a_new_versions_rows(tmp_path,
                                                                               spark):
    config = subject_config(tmp_path, visits())
    assert config.streams[0].columns == ()  # the loader does not read the registry
    collector = await start(config, LocalEngine())  # before any version: no table yet
    try:
        with registry(config) as client:
            async with sender(config) as producer:  # started before version 1 either
                # the serializer registers version 1, the ingestor answers 503 until it
                # has read it, the client's retry is accepted
                assert await producer.publish("visits", events(*[
                    avro(client, V1, {"user_id": f"u{i}", "n": i}) for i in (1, 2)])) == 2
                assert await drain(collector) == 1
                table = collector.catalog.load_table("web.visits")
                assert [f.name for f in table.schema().fields][:2] == ["user_id", "n"]
                assert "url" not in {f.name for f in table.schema().fields}
                # version 2 (an added optional field), registered by its producer
                assert await producer.publish("visits", events(
                    avro(client, V2, {"user_id": "u3", "n": 3, "url": "/three"}),
                    avro(client, V1, {"user_id": "u4", "n": 4}))) == 2
            assert await drain(collector) == 1
    finally:
        await collector.store.close()
    table = collector.catalog.load_table("web.visits")
    assert {f.name: str(f.field_type) for f in table.schema().fields}["url"] == "string"
    rows = {r["user_id"]: r for r in read_table(config, "web.visits").to_pylist()}
    assert [rows[f"u{i}"]["url"] for i in (1, 2, 3, 4)] == [None, None, "/three", None]
    assert [rows[f"u{i}"]["n"] for i in (1, 2, 3, 4)] == [1, 2, 3, 4]
    stored = await stored_events(config.store.url)
    assert len({e.schema_id for e in stored}) == 2  # each record keeps its writer's id
    from pipeline.read.iceberg_source import read_table as spark_read_table

    seen = {r["user_id"]: r.asDict() for r in spark_read_table(
        spark, config.catalog, "web.visits").collect()}
    assert [seen[f"u{i}"]["url"] for i in (1, 2, 3, 4)] == [None, None, "/three", None]


async def test_avro_subject_stream_refuses_ids_of_other_subjects_and_other_types(tmp_path):
    config = subject_config(tmp_path, visits())
    with registry(config) as client:
        good = avro(client, V1, {"user_id": "u1", "n": 1})
        other = avro(client, V1, {"user_id": "u1", "n": 1}, topic="elsewhere")
        other_v = avro(client, {**V1, "name": "Other"}, {"user_id": "u1", "n": 1},
                       topic="elsewhere2")
        assert other[1:5] == good[1:5]  # the same schema: the same id, in both subjects
        async with sender(config, retries=0) as producer:
            with pytest.raises(IngestRejected) as caught:
                await producer.publish("visits", events(good, other_v))
            assert caught.value.code == "invalid_payload"
            other_id = int.from_bytes(other_v[1:5], "big")
            assert (f"schema id {other_id} is not a version of subject 'visits-value'"
                    in str(caught.value)), str(caught.value)
    assert await stored_events(config.store.url) == []
    # a subject holding another schema type: every request refused, naming it; a subject
    # nobody registered: 503 naming it (a producer's retry after it registers is
    # accepted: the first test)
    (tmp_path / "other").mkdir()
    jsonish = msgspec.structs.replace(visits("json-value"), name="jsonish", table="web.j")
    nobody = msgspec.structs.replace(visits("nobody-value"), name="nobody", table="web.n")
    other_config = subject_config(tmp_path / "other", jsonish, nobody)
    with registry(other_config) as client:
        client.register_schema("json-value", Schema('{"type": "object"}', "JSON"))
        async with sender(other_config, retries=0) as producer:
            with pytest.raises(IngestRejected) as typed:
                await producer.publish("jsonish", events(good))
            assert typed.value.code == "invalid_payload"
            assert "subject 'json-value' holds a JSON schema" in str(typed.value)
            with pytest.raises(IngestRejected) as unknown:
                await producer.publish("nobody", events(good))
            assert unknown.value.code == "schema_not_yet_known"
            assert "'nobody-value'" in str(unknown.value)
    assert await stored_events(other_config.store.url) == []
    config = other_config
    # the resolver names the stream and the subject
    store = open_async_store(config.store.url)
    try:
        schemas = SchemaStore(store, schema_key(config.admin.registry_key))
        doc = await schemas.read()
        for stream, needle in [(visits("nobody-value"), "has no version"),
                               (visits("json-value"), "holds a JSON schema"),
                               (msgspec.structs.replace(orders(), schema=TypedSchema(
                                   subject="json-value", message="acme.orders.v1.X")),
                                "a format = 'protobuf' stream needs PROTOBUF")]:
            with pytest.raises(SubjectError) as info:
                resolve((stream,), doc, schemas)
            assert f"stream {stream.name!r}" in str(info.value)
            assert needle in str(info.value)
    finally:
        await store.close()


def test_a_subject_stream_loads_from_toml_without_columns_and_a_file_with_it_is_refused(
        tmp_path):
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "orders"\ntable = "shop.orders"\n'
                    'format = "protobuf"\nschema = { subject = "orders-value", '
                    'message = "acme.orders.v1.OrderPlaced" }\n')
    loaded = load_config(path).streams[0]
    assert loaded.columns == ()
    assert loaded.schema == TypedSchema(subject="orders-value",
                                        message="acme.orders.v1.OrderPlaced")
    both = StreamConfig(name="v", table="t.v", columns=(), format="avro",
                        schema=TypedSchema(subject="v-value", schema_file="v.avsc"))
    with pytest.raises(ConfigError, match=r"`subject`.*not both: remove `schema_file`"):
        with_typed_columns((both,), tmp_path, "t")
    no_message = StreamConfig(name="o", table="t.o", columns=(), format="protobuf",
                              schema=TypedSchema(subject="o-value"))
    with pytest.raises(ConfigError, match="names its message"):
        with_typed_columns((no_message,), tmp_path, "t")


# -- Protobuf --------------------------------------------------------------------------------


def message_class(root: Path, text: str) -> Any:
    """``acme.orders.v1.OrderPlaced`` of ``text`` as a class of its own descriptor pool
    (two versions of one .proto side by side, as two producers would have them)."""
    root.mkdir(parents=True)
    (root / "acme_orders.proto").write_text(text)
    include = Path(grpc_tools.__file__).parent / "_proto"
    out = root / "set.binpb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"-I{include}",
                    f"--descriptor_set_out={out}", "acme_orders.proto"], check=True)
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:
        pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("acme.orders.v1.OrderPlaced"))


async def test_protobuf_subject_stream_from_the_confluent_serializer_renames_and_adds(
        tmp_path):
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer

    v1, v2 = message_class(tmp_path / "v1", ORDERS_V1), message_class(tmp_path / "v2",
                                                                       ORDERS_V2)
    config = subject_config(tmp_path, orders(), CLICKS)
    ctx = SerializationContext("orders", MessageField.VALUE)
    with registry(config) as client:
        first = ProtobufSerializer(v1, client, {"use.deprecated.format": False})
        one = first(v1(order_id="o-1", amount_cents=100), ctx)
        assert one[5:6] == b"\x02" or one[5:6] == b"\x00"  # message index: OrderPlaced
        collector = await start(config, LocalEngine())
        try:
            async with sender(config) as producer:
                assert await producer.publish("orders", events(
                    one, v1(order_id="o-2", amount_cents=200).SerializeToString())) == 2
                assert await drain(collector) == 1
                second = ProtobufSerializer(v2, client, {"use.deprecated.format": False})
                assert await producer.publish("orders", events(second(
                    v2(order_id="o-3", total_cents=300, currency="EUR"), ctx))) == 1
            assert await drain(collector) == 1
        finally:
            await collector.store.close()
        other = avro(client, V1, {"user_id": "u", "n": 1}, topic="visits")
        async with sender(config, retries=0) as producer:
            # index [0] names message Note, not the stream's OrderPlaced ([1])
            wrong_index = one[:5] + b"\x00" + one[6:]
            for data, needle in [
                    (wrong_index, "message index [0]"),
                    (other[:5] + one[5:], "is not a version of subject 'orders-value'")]:
                with pytest.raises(IngestRejected) as caught:
                    await producer.publish("orders", events(one, data))
                assert caught.value.code == "invalid_payload"
                assert needle in str(caught.value), str(caught.value)
    table = collector.catalog.load_table("shop.orders")
    names = [f.name for f in table.schema().fields]
    assert "total_cents" in names
    assert "amount_cents" not in names
    assert "currency" in names
    rows = {r["order_id"]: r for r in read_table(config, "shop.orders").to_pylist()}
    assert [rows[f"o-{i}"]["total_cents"] for i in (1, 2, 3)] == [100, 200, 300]
    assert [rows[f"o-{i}"]["currency"] for i in (1, 2, 3)] == [None, None, "EUR"]


async def test_a_deleted_subject_parks_only_its_table_until_it_is_back(tmp_path):
    from tests.collector_support import click

    config = subject_config(tmp_path, visits(), CLICKS)
    config = msgspec.structs.replace(config, collector=msgspec.structs.replace(
        config.collector, park_retry_s=3600))

    def clicks(i: int) -> list[Any]:
        return [json.loads(click(i)[3])]

    with admin_server(config) as url:
        client = client_of(url)
        collector = await start(config, LocalEngine())
        try:
            async with sender(config) as producer:
                assert await producer.publish("visits", events(
                    avro(client, V1, {"user_id": "u1", "n": 1}))) == 1
                assert await drain(collector) == 1
                client.delete_subject("visits-value")  # soft: its records still read
                assert await producer.publish("clicks", clicks(1)) == 1
                assert await drain(collector) == 1
                reason = collector.bulkheads.parked["web.visits"].reason
                assert "stream 'visits': schema registry subject 'visits-value' has no " \
                    "version" in reason, reason
                assert collector.metrics.health.body()["parked"] == {"web.visits": reason}
                # a record the ingestor accepted before it read the registry again
                assert await producer.publish("visits", events(
                    avro(client, V1, {"user_id": "u2", "n": 2}))) == 1
                assert await producer.publish("clicks", clicks(2)) == 1
                assert await drain(collector) == 1  # parked, not stuck: acknowledged
            assert sorted(r["n"] for r in read_table(config, "web.clicks").to_pylist()) == [1, 2]
            assert [r["n"] for r in read_table(config, "web.visits").to_pylist()] == [1]
            # still gone: the retry fails and the table stays parked, its rows staged
            collector.bulkheads.retry_all_now()
            assert await asyncio.to_thread(collector.commit_due_staged) == {}
            assert collector.bulkheads.is_parked("web.visits")
            # registered again (a new version): the retry reads it and imports the rows
            avro(client, V2, {"user_id": "u9", "n": 9})
            collector.bulkheads.retry_all_now()
            assert await asyncio.to_thread(collector.commit_due_staged) == {"web.visits": 1}
            assert not collector.bulkheads.is_parked("web.visits")
            # deleted and back again with nothing staged: the next run unparks it at once
            client.delete_subject("visits-value")
            async with sender(config) as producer:
                assert await producer.publish("clicks", clicks(3)) == 1
                assert await drain(collector) == 1
                assert collector.bulkheads.is_parked("web.visits")
                avro(client_of(url), V2, {"user_id": "u9", "n": 9})
                assert await producer.publish("clicks", clicks(4)) == 1
                assert await drain(collector) == 1
                assert not collector.bulkheads.is_parked("web.visits")
                # deleted with a record queued, and a collector that never saw a version:
                # its runs fail naming the stream and subject (never skipped) until the
                # subject is back
                assert await producer.publish("visits", events(
                    avro(client, V1, {"user_id": "u3", "n": 3}))) == 1
                client.delete_subject("visits-value")  # this ingestor has not read it
                assert await producer.publish("visits", events(
                    avro(client, V1, {"user_id": "u4", "n": 4}))) == 1
        finally:
            await collector.store.close()
        fresh = await start(config, LocalEngine())
        try:
            with pytest.raises(SubjectError, match=r"stream 'visits': schema registry "
                               r"subject 'visits-value' has no version .* manifest entry"):
                await fresh.run_once()
            avro(client_of(url), V1, {"user_id": "u9", "n": 9})
            assert await drain(fresh) == 1
        finally:
            await fresh.store.close()
    rows = sorted(read_table(config, "web.visits").to_pylist(), key=lambda r: r["n"])
    assert [(r["user_id"], r["url"]) for r in rows] == [
        ("u1", None), ("u2", None), ("u3", None), ("u4", None)]
