"""An Avro stream's single-object records keep the exact writer schema they were accepted
under (#39): the ingestor keeps the stream's schema in the schema registry document and
stores each record with that id, so a record still queued when the stream's ``.avsc``
changes is read with its own writer schema and resolved into the new one, never read as
if the new schema had written it (fields swapped, a body cut short). A writer schema the
document lost is dead-lettered naming its id; one the ingestor cannot keep is a 503."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from collector_support import collect_all, collector_config, read_table
from ingest_support import faulty_local_store, grpc_serving, stored_events

from icefloe.client import AsyncGrpcClient, IngestRejected
from icefloe.config import Config, StreamConfig
from icefloe.config.typed_streams import with_typed_columns
from icefloe.schemas.model import SchemaDocument
from icefloe.store import open_async_store
from icefloe.store.faults import FaultRule
from icefloe.store.retry import RetryPolicy
from icefloe.streams.model import TypedSchema
from icefloe.typed.avro import AvroType
from icefloe.v1 import ingest_pb2

pytest.importorskip("fastavro")

SCHEMAS_KEY = "registry/schemas.json"
V1 = {"type": "record", "name": "Person", "namespace": "acme", "fields": [
    {"name": "first", "type": "string"}, {"name": "last", "type": "string"}]}
SWAPPED = {**V1, "fields": [V1["fields"][1], V1["fields"][0]]}
"""Compatible with v1 (Avro resolves by name): a v1 body read as if SWAPPED wrote it
gives first = "Lovelace"."""
ADDED = {**V1, "fields": [*V1["fields"],
                          {"name": "title", "type": "string", "default": "Dr"}]}
"""Compatible with v1 (the new field has a default): a v1 body read as if ADDED wrote it
runs short."""
PEOPLE = [{"first": "Ada", "last": "Lovelace"}, {"first": "Alan", "last": "Turing"}]


def config_with(tmp_path: Path, schema: dict[str, Any]) -> Config:
    """The ``people`` stream with ``schema`` as its ``.avsc`` (the file rewritten: a schema
    change as an operator makes it)."""
    (tmp_path / "person.avsc").write_text(json.dumps(schema))
    stream = StreamConfig(name="people", table="web.people", columns=(), format="avro",
                          schema=TypedSchema(schema_file="person.avsc"))
    return collector_config(tmp_path, streams=with_typed_columns((stream,), tmp_path, "t"))


def single_object(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return b"\xc3\x01" + AvroType(schema).fingerprint() + out.getvalue()


@contextlib.asynccontextmanager
async def sender(config: Config, store: Any = None, **options: Any
                 ) -> AsyncIterator[AsyncGrpcClient]:
    async with grpc_serving(config, store, probe=store is None) as (_, served), \
            AsyncGrpcClient(f"127.0.0.1:{served.port}", **options) as client:
        yield client


def events(*payloads: bytes) -> list[ingest_pb2.Event]:
    return [ingest_pb2.Event(data=p) for p in payloads]


async def schema_document(config: Config) -> SchemaDocument:
    store = open_async_store(config.store.url)
    try:
        return SchemaDocument.decode((await store.get(SCHEMAS_KEY)).data)
    finally:
        await store.close()


def rows(config: Config) -> list[dict[str, Any]]:
    return sorted(read_table(config, "web.people").to_pylist(), key=lambda r: r["first"])


@pytest.mark.parametrize("v2", [SWAPPED, ADDED], ids=["fields_swapped", "field_added"])
async def test_records_queued_across_a_schema_change_keep_their_writer_schema(tmp_path, v2):
    from pipeline.load.run import LocalEngine

    v1 = config_with(tmp_path, V1)
    async with sender(v1) as client:
        assert await client.publish("people", events(
            *[single_object(V1, p) for p in PEOPLE])) == 2
    # the .avsc changes while both records are still queued; a producer of v2 follows
    v2_config = config_with(tmp_path, v2)
    async with sender(v2_config) as client:
        assert await client.publish("people", events(
            single_object(v2, {"first": "Grace", "last": "Hopper", "title": "RAdm"}))) == 1
    await collect_all(v2_config, LocalEngine())
    assert read_table(v2_config, "icefloe.dead_letters").to_pylist() == []
    got = rows(v2_config)
    assert [(r["first"], r["last"]) for r in got] == [
        ("Ada", "Lovelace"), ("Alan", "Turing"), ("Grace", "Hopper")]
    if v2 is ADDED:
        assert [r["title"] for r in got] == ["Dr", "Dr", "RAdm"]  # v1's from the default
    # how: each record names its writer by its id in the schema registry document
    doc = await schema_document(v1)
    [kept] = [r for r in doc.schemas if r.canonical == AvroType(V1).text]
    assert not any(s.versions for s in doc.subjects)  # kept under no subject
    ids = [e.schema_id for e in await stored_events(v1.store.url)]
    assert ids[:2] == [kept.id, kept.id]
    assert ids[2] not in (0, kept.id)  # v2's own id


async def test_a_writer_schema_missing_from_the_document_is_dead_lettered_naming_it(
        tmp_path):
    """The registry document lost the record (restored from an older copy): the rows are
    dead letters naming the id, never read with the stream's schema of the moment."""
    from pipeline.load.run import LocalEngine

    config = config_with(tmp_path, V1)
    async with sender(config) as client:
        assert await client.publish("people", events(single_object(V1, PEOPLE[0]))) == 1
    doc = await schema_document(config)
    [kept] = doc.schemas
    store = open_async_store(config.store.url)
    try:
        await store.put(SCHEMAS_KEY, SchemaDocument(next_id=doc.next_id).encode())
    finally:
        await store.close()
    config = config_with(tmp_path, SWAPPED)
    await collect_all(config, LocalEngine())
    assert read_table(config, "web.people").num_rows == 0
    [dead] = read_table(config, "icefloe.dead_letters").to_pylist()
    assert (dead["stream"], dead["reason"]) == ("people", "unknown_schema")
    assert f"writer schema id {kept.id} is not one of the stream's schemas" in dead["message"]
    assert "schema registry document" in dead["message"]


async def test_a_schema_the_ingestor_cannot_keep_is_a_retry_naming_its_fingerprint(
        tmp_path):
    config = config_with(tmp_path, V1)
    refused = FaultRule("fail", ops=frozenset({"put"}), key_prefix=SCHEMAS_KEY, times=None)
    store, faulty = faulty_local_store(
        tmp_path / "store", [refused],
        RetryPolicy(max_attempts=1, base_delay_s=0.001, max_delay_s=0.002, budget_s=1))
    payload = single_object(V1, PEOPLE[0])
    async with grpc_serving(config, store, probe=False) as (_, served):
        async with AsyncGrpcClient(f"127.0.0.1:{served.port}", retries=0) as client:
            with pytest.raises(IngestRejected) as caught:
                await client.publish("people", events(payload))
            assert caught.value.code == "schema_not_yet_known", caught.value
            assert AvroType(V1).fingerprint().hex() in str(caught.value)
            assert faulty.injected["fail"] >= 1
            assert await stored_events(config.store.url) == []
            faulty.rules.clear()  # the store takes the write again: a retry is accepted
        async with AsyncGrpcClient(f"127.0.0.1:{served.port}") as client:
            assert await client.publish("people", events(payload)) == 1
    [kept] = (await schema_document(config)).schemas
    assert [e.schema_id for e in await stored_events(config.store.url)] == [kept.id]
