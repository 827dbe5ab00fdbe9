"""Ingestors follow the registry while they run: a new source is served within the poll
delay, rotated tokens are cut off, every batch records the version its events were
accepted under, and — with the collector — a sink added while events flow gets exactly the
events accepted after its creation. Real HTTP server and client, real local store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import msgspec
import pytest

from icefloe.config import Column, Config
from icefloe.registry import Registry, RegistryStore, ops
from icefloe.store import open_async_store
from icefloe.tokens import hash_token
from ingestor.runtime import IngestorRuntime
from tests.collector_support import assert_exact, drain, start
from tests.ingest_support import PAGEVIEWS, http_serving, make_config, read_manifest, running

POLL_S = 0.1
VIEWS_SINK = ops.SinkSpec(name="pageviews", table="web.pageviews", columns=PAGEVIEWS.columns)
URLS = ops.SinkSpec(name="urls", table="web.urls", columns=(
    Column("user_id", "string", required=True), Column("url", "string")))


def config_for(tmp_path: Path) -> Config:
    config = make_config(tmp_path / "store", (PAGEVIEWS,))
    return msgspec.structs.replace(config, admin=msgspec.structs.replace(
        config.admin, registry_poll_s=POLL_S))


async def change(config: Config, fn: Callable[[Registry], Registry]) -> Registry:
    store = open_async_store(config.store.url)
    try:
        return await RegistryStore(store, config.admin.registry_key).update(fn)
    finally:
        await store.close()


async def until_version(runtime: IngestorRuntime, version: int, timeout: float = 10) -> float:
    """Wait for the ingestor to apply ``version``; return how long it took."""
    started = time.monotonic()
    while runtime.service.registry_version < version:
        assert time.monotonic() - started < timeout, "the registry change was not picked up"
        await asyncio.sleep(POLL_S / 5)
    return time.monotonic() - started


def views(prefix: str, count: int) -> list[dict[str, object]]:
    return [{"user_id": f"{prefix}{i}", "url": f"/{prefix}/{i}"} for i in range(count)]


async def test_should_serve_new_sources_and_cut_off_rotated_tokens(tmp_path: Path) -> None:
    config = config_for(tmp_path)
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        assert runtime.service.registry_version == 0  # no registry: the config's streams
        assert (await client.post("/v1/streams/clicks/events", json={"user_id": "u"})
                ).status_code == 404
        await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
            id="clicks", sinks=(URLS,), tokens=(hash_token("first", log2_n=10),))))
        took = await until_version(runtime, 1)
        assert took < 2 * POLL_S + 1
        ready = (await client.get("/readyz")).json()
        assert ready["registry_version"] == 1
        # the registry now wins: pageviews is not one of its sources
        assert (await client.post("/v1/streams/pageviews/events", json={"user_id": "u"})
                ).status_code == 404
        assert (await client.post("/v1/streams/clicks/events", json={"user_id": "u"})
                ).status_code == 401
        ok = await client.post("/v1/streams/clicks/events", json={"user_id": "u"},
                               headers={"authorization": "Bearer first"})
        assert ok.status_code == 202, ok.text
        await change(config, lambda r: ops.set_tokens(r, "clicks", (hash_token(
            "second", log2_n=10),)))
        await until_version(runtime, 2)
        old = await client.post("/v1/streams/clicks/events", json={"user_id": "u"},
                                headers={"authorization": "Bearer first"})
        assert old.status_code == 403
        new = await client.post("/v1/streams/clicks/events", json={"user_id": "u"},
                                headers={"authorization": "Bearer second"})
        assert new.status_code == 202
        # a required column of the source's sinks is enforced at ingest
        bad = await client.post("/v1/streams/clicks/events", json={"url": "/x"},
                                headers={"authorization": "Bearer second"})
        assert bad.status_code == 400
        text = (await client.get("/metrics")).text
        assert "icefloe_ingest_registry_version 2.0" in text
    manifest = await read_manifest(config.store.url)
    assert [e.registry_version for e in manifest.entries] == [1, 2]


async def test_should_give_a_new_sink_exactly_the_events_accepted_after_it(tmp_path: Path
                                                                           ) -> None:
    from pipeline.load.run import LocalEngine

    config = config_for(tmp_path)
    store = open_async_store(config.store.url)
    await RegistryStore(store, config.admin.registry_key).seed(config.streams, None)
    await store.close()
    before, after = views("b", 30), views("a", 30)
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        await until_version(runtime, 1)

        async def send(events: list[dict[str, object]], key: str) -> None:
            for i in range(0, len(events), 10):
                response = await client.post("/v1/streams/pageviews/events",
                                             json=events[i:i + 10],
                                             headers={"idempotency-key": f"{key}{i}"})
                assert response.status_code == 202, response.text

        await send(before, "b")
        await change(config, lambda r: ops.create_sink(r, "pageviews", URLS))
        await until_version(runtime, 2)
        await send(after, "a")
    collector = await start(collector_config_of(config), LocalEngine())
    try:
        from collector.routing import Routes
        from icefloe.registry.watch import RegistryWatch

        watch = RegistryWatch(collector.store, config.admin.registry_key, lambda r: None)
        registry = await watch.check()
        assert registry is not None
        collector.routes = Routes(registry)
        await asyncio.to_thread(collector.prepare_tables)
        await drain(collector)
    finally:
        await collector.store.close()
    ids_before = {f"b{i}:{j}" for i in range(0, 30, 10) for j in range(10)}
    ids_after = {f"a{i}:{j}" for i in range(0, 30, 10) for j in range(10)}
    cfg = collector_config_of(config)
    assert_exact(cfg, "web.pageviews", ids_before | ids_after)
    assert_exact(cfg, "web.urls", ids_after)


def collector_config_of(config: Config) -> Config:
    from tests.collector_support import collector_config

    root = Path(config.store.url.removeprefix("file://")).parent
    base = collector_config(root, (PAGEVIEWS,), store={"url": config.store.url})
    return msgspec.structs.replace(base, admin=config.admin)


async def test_should_serve_a_registry_source_over_grpc(tmp_path: Path) -> None:
    import grpc

    from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
    from tests.ingest_support import grpc_serving

    config = config_for(tmp_path)
    async with grpc_serving(config) as (runtime, served):
        await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
            id="clicks", sinks=(URLS,))))
        await until_version(runtime, 1)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = ingest_pb2_grpc.IngestStub(channel)
            ok = await stub.Publish(ingest_pb2.PublishRequest(stream="clicks", events=[
                ingest_pb2.Event(json=b'{"user_id":"u1","url":"/"}')]), timeout=10)
            assert ok.accepted == 1
            with pytest.raises(grpc.aio.AioRpcError) as info:  # not a registry source
                await stub.Publish(ingest_pb2.PublishRequest(stream="pageviews", events=[
                    ingest_pb2.Event(json=b'{"user_id":"u1"}')]), timeout=10)
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
    manifest = await read_manifest(config.store.url)
    assert [(e.streams, e.registry_version) for e in manifest.entries] == [(("clicks",), 1)]


async def test_should_keep_verified_tokens_and_rate_buckets_across_registry_versions(
        tmp_path: Path) -> None:
    """A registry version that leaves a source's tokens as they were (here: a sink added)
    keeps the tokens this ingestor verified and the buckets of unchanged rate limits: no
    slow hash again for every client, no fresh burst. A rotation still cuts the old token
    off at once."""
    from icefloe.config import RateLimit

    config = config_for(tmp_path)
    limited = ops.SourceSpec(id="clicks", sinks=(URLS,), tokens=(hash_token(
        "first", log2_n=10),), rate_limit=RateLimit(events_per_s=1, burst_s=2))
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        await change(config, lambda r: ops.create_source(r, limited))
        await until_version(runtime, 1)
        auth = {"authorization": "Bearer first"}
        ok = await client.post("/v1/streams/clicks/events", json=views("x", 2), headers=auth)
        assert ok.status_code == 202, ok.text  # the bucket (2 events) is empty now
        verified = runtime.service.auth.verifications
        await change(config, lambda r: ops.create_sink(r, "clicks", ops.SinkSpec(
            name="more", table="web.more", columns=URLS.columns)))
        await until_version(runtime, 2)
        again = await client.post("/v1/streams/clicks/events", json=views("y", 2),
                                  headers=auth)
        assert again.status_code == 429, again.text  # the same bucket: still empty
        assert runtime.service.auth.verifications == verified  # no second slow hash
        await change(config, lambda r: ops.set_tokens(r, "clicks", (hash_token(
            "second", log2_n=10),)))
        await until_version(runtime, 3)
        old = await client.post("/v1/streams/clicks/events", json=views("z", 1), headers=auth)
        assert old.status_code == 403


async def test_should_judge_a_grpc_token_by_the_version_it_is_admitted_at(tmp_path: Path
                                                                          ) -> None:
    """A first-time token is verified (slowly) while a registry version that revokes it
    arrives: the publish is admitted at the new version, so the token is judged by it and
    refused, not accepted under the revoking version."""
    import grpc

    from icefloe.client import AsyncGrpcClient, IngestRejected
    from tests.ingest_support import grpc_serving

    config = config_for(tmp_path)
    await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(URLS,), tokens=(hash_token("first", log2_n=10),))))
    async with grpc_serving(config) as (runtime, served):
        await until_version(runtime, 1)
        verifying = runtime.service.auth
        original = verifying.authorize

        async def slow_first(*args: object, **kwargs: object) -> object:
            found = await original(*args, **kwargs)  # type: ignore[arg-type]
            await change(config, lambda r: ops.set_tokens(r, "clicks", (hash_token(
                "second", log2_n=10),)))
            await until_version(runtime, 2)  # revoked while this request was verified
            return found

        verifying.authorize = slow_first  # type: ignore[method-assign]
        async with AsyncGrpcClient(f"127.0.0.1:{served.port}", token="first",
                                   retries=0) as client:
            with pytest.raises(IngestRejected) as refused:
                await client.publish("clicks", views("g", 1))
        assert refused.value.status == grpc.StatusCode.PERMISSION_DENIED
    manifest = await read_manifest(config.store.url)
    assert not manifest.entries  # nothing stored
