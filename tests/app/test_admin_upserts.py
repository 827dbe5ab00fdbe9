"""Upserts through the admin API's real HTTP routes: a sink created with ``primary_key``
and ``tombstone_field`` keeps the latest row per key for events sent over HTTP and gRPC
ingest; a PATCH that changes the key is refused (409 ``primary_key_fixed``), a bad key
with a 400 naming the entry. The collector decodes in process (LocalEngine)."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import msgspec
from ingest_support import grpc_serving, http_serving, running

from icefloe.registry import RegistryStore
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from tests.app.test_admin_api import ADMIN_TOKEN, Admin, admin  # noqa: F401  (the served API)
from tests.collector_support import drain, open_store_of, read_table, start

KEYED = {"name": "people", "table": "crm.people",
         "columns": [{"name": "user_id", "type": "string", "required": True},
                     {"name": "name", "type": "string"}, {"name": "gone", "type": "boolean"}],
         "primary_key": ["user_id"], "tombstone_field": "gone"}


def create_keyed_sink(admin: Admin) -> None:  # noqa: F811
    created = admin.client.post("/v1/sources/clicks/sinks", json=KEYED)
    assert admin.task(created)["state"] == "succeeded"


def test_a_keyed_sink_is_created_and_its_key_stays_fixed(admin: Admin) -> None:  # noqa: F811
    create_keyed_sink(admin)
    sink = admin.client.get("/v1/sources/clicks/sinks/people").json()["sink"]
    assert (sink["primary_key"], sink["tombstone_field"]) == (["user_id"], "gone")
    for patch in ({"primary_key": ["name"]}, {"tombstone_field": None}):
        refused = admin.client.patch("/v1/sources/clicks/sinks/people", json=patch)
        assert (refused.status_code, refused.json()["error"]) == (409, "primary_key_fixed")
        [detail] = refused.json()["details"]
        assert detail["field"] == next(iter(patch))
    same = admin.client.patch("/v1/sources/clicks/sinks/people",
                              json={"primary_key": ["user_id"]})
    assert same.status_code == 200, same.text  # naming the same key changes nothing


def test_a_bad_key_gets_a_400_naming_the_entry(admin: Admin) -> None:  # noqa: F811
    base = {k: v for k, v in KEYED.items() if k not in ("primary_key", "tombstone_field")}
    for body, field, reason in (
            ({"primary_key": ["nope"]}, "sink.primary_key[0]", "'nope' is not a declared"),
            ({"primary_key": ["name"]}, "sink.primary_key[0]", "required"),
            ({"tombstone_field": "gone"}, "sink.tombstone_field", "primary_key is not set"),
            ({"primary_key": ["user_id"], "tombstone_field": "name"}, "sink.tombstone_field",
             "boolean")):
        response = admin.client.post("/v1/sources/clicks/sinks", json={**base, **body})
        assert response.status_code == 400, response.text
        [detail] = response.json()["details"]
        assert detail["field"] == field, detail
        assert reason in detail["reason"], detail
    assert admin.client.get("/v1/sources/clicks/sinks/people").status_code == 404


def event(uid: str, name: str, gone: bool = False) -> dict[str, object]:
    return {"user_id": uid, "name": name, "gone": gone, "url": "/", "n": 1}


async def ingest_and_collect(admin: Admin) -> None:  # noqa: F811
    """Events of source ``clicks`` over HTTP, then updates and a delete over gRPC, each
    drained by a collector that routes by the registry the admin API wrote."""
    from collector.routing import Routes
    from pipeline.load.run import LocalEngine

    config = admin.config
    store = open_store_of(config)
    registry = RegistryStore(store, config.admin.registry_key)
    collector = await start(config, LocalEngine())
    await asyncio.to_thread(collector.apply_registry, await registry.read())
    assert isinstance(collector.routes, Routes)
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        sent = await client.post("/v1/streams/clicks/events", json=[
            event(f"u{i}", "v1") for i in range(4)] + [event("u0", "v2")])
        assert sent.status_code == 202, sent.text
    await drain(collector)
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        request = ingest_pb2.PublishRequest(stream="clicks", events=[
            ingest_pb2.Event(json=msgspec.json.encode(e))
            for e in (event("u1", "v3"), event("u2", "", gone=True), event("u4", "v1"))])
        assert (await ingest_pb2_grpc.IngestStub(channel).Publish(request)).accepted == 3
    await drain(collector)
    await collector.store.close()
    await store.close()


def test_events_over_http_and_grpc_land_as_upserts(admin: Admin) -> None:  # noqa: F811
    create_keyed_sink(admin)
    asyncio.run(ingest_and_collect(admin))
    rows = read_table(admin.config, "crm.people").to_pylist()
    assert sorted((r["user_id"], r["name"]) for r in rows) == [
        ("u0", "v2"), ("u1", "v3"), ("u3", "v1"), ("u4", "v1")]
    assert len(read_table(admin.config, "web.clicks")) == 8  # the append sink keeps all
