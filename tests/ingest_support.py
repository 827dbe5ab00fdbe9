"""Builders for ingest tests: a config with realistic streams and a running runtime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec

from icefloe.config import (
    Column,
    Config,
    IngestorSection,
    ManifestSection,
    StoreSection,
    StreamConfig,
)
from icefloe.formats.batch import decode_block, iter_records
from icefloe.formats.envelope import Envelope, decode_envelope
from icefloe.manifest import Manifest, ManifestConfig, load
from icefloe.manifest.reader import fetch_batch
from icefloe.store import open_async_store
from icefloe.tokens import hash_token
from ingestor.runtime import IngestorRuntime

TOKEN = "s3cret-token"
"""The write token of stream ``orders``; the config holds only its hash."""
TOKEN_HASH = hash_token(TOKEN, log2_n=10)
"""Cheap scrypt parameters (N = 2**10): tests verify it often; real hashes use 2**14."""

PAGEVIEWS = StreamConfig(
    name="pageviews", table="web.pageviews",
    columns=(Column("user_id", "string", required=True), Column("url", "string"),
             Column("duration_ms", "long"), Column("ts", "timestamp")))
ORDERS = StreamConfig(
    name="orders", table="shop.orders", unknown_fields="reject", tokens=(TOKEN_HASH,),
    event_id_field="order_id",
    columns=(Column("order_id", "string", required=True), Column("amount", "double"),
             Column("qty", "int"), Column("paid", "boolean"), Column("day", "date"),
             Column("props", "json"), Column("at", "timestamp")))


def make_config(store_dir: Path, streams: tuple[StreamConfig, ...] = (PAGEVIEWS, ORDERS),
                **ingestor: Any) -> Config:
    """A config on a local store in ``store_dir``; ``ingestor`` overrides IngestorSection."""
    section = msgspec.structs.replace(IngestorSection(host="127.0.0.1", http_port=0,
                                                      grpc_port=0), **ingestor)
    return Config(store=StoreSection(url=store_dir.as_uri()), manifest=ManifestSection(),
                  ingestor=section, streams=streams)


@contextlib.asynccontextmanager
async def running(config: Config) -> AsyncIterator[IngestorRuntime]:
    runtime = await IngestorRuntime.start(config)
    try:
        yield runtime
    finally:
        await runtime.close(10)


async def read_manifest(url: str) -> Manifest:
    store = open_async_store(url)
    try:
        return (await load(store, ManifestConfig().key)).manifest
    finally:
        await store.close()


def manifest_now(url: str) -> Manifest:
    return asyncio.run(read_manifest(url))


async def stored_events(url: str) -> list[Envelope]:
    """Every event in batch files the manifest lists, verified, in sequence order."""
    store = open_async_store(url)
    try:
        manifest = (await load(store, ManifestConfig().key)).manifest
        events: list[Envelope] = []
        for entry in manifest.entries:
            block, count = decode_block(await fetch_batch(store, entry))
            events.extend(decode_envelope(record) for record in iter_records(block, count))
        return events
    finally:
        await store.close()


# -- gRPC front and fault-injected stores (tests/ingestor/test_grpc.py, tests/core/test_client.py)


def faulty_local_store(store_dir: Path, rules: list[Any], policy: Any = None) -> Any:
    """A local store with ``FaultRule``s injected *below* a retry layer using ``policy``.

    Returns ``(retrying_store, faulty_store)``; the runtime closes the store.
    """
    from icefloe.store.adapters import ThreadedAsyncStore
    from icefloe.store.faults import FaultyAsyncStore
    from icefloe.store.local import LocalStore
    from icefloe.store.retry import RetryingAsyncStore

    faulty = FaultyAsyncStore(ThreadedAsyncStore(LocalStore(store_dir)), rules)
    return RetryingAsyncStore(faulty, policy), faulty


@contextlib.asynccontextmanager
async def grpc_serving(config: Config, store: Any = None, probe: bool = True,
                       **server_options: Any) -> AsyncIterator[tuple[IngestorRuntime, Any]]:
    """A runtime (on ``store`` if given) and its gRPC server on 127.0.0.1, any free port.

    Yields ``(runtime, grpc_server)``: ``grpc_server.port``, ``.health`` and ``.server``.
    """
    from ingestor.grpc_app import start_grpc_server

    runtime = await IngestorRuntime.start(config, store=store, probe=probe)
    try:
        served = await start_grpc_server(runtime, "127.0.0.1", 0, **server_options)
        try:
            yield runtime, served
        finally:
            await served.server.stop(None)
    finally:
        await runtime.close(10)


@contextlib.asynccontextmanager
async def running_on(config: Config, store: Any, *, probe: bool = True
                     ) -> AsyncIterator[IngestorRuntime]:
    """Like :func:`running`, on a given store (e.g. one that injects faults)."""
    runtime = await IngestorRuntime.start(config, store=store, probe=probe)
    try:
        yield runtime
    finally:
        await runtime.close(10)



def production_config(runtime: IngestorRuntime, **changes: Any) -> Any:
    """The uvicorn config ``icefloe ingestor`` serves with (guarded protocol, fast lane,
    deadlines), for ``runtime`` at 127.0.0.1 on a free port; ``changes`` override
    ``[ingestor]`` settings (e.g. ``http_fast_lane=False``)."""
    from ingestor.http.app import HttpApp
    from ingestor.http.server import http_config, slow_client_guard

    ing = msgspec.structs.replace(runtime.config.ingestor, **changes)
    guard = slow_client_guard(ing)
    config = http_config(HttpApp(runtime, guard), ing, guard)
    config.host, config.port = "127.0.0.1", 0
    return config


@contextlib.asynccontextmanager
async def http_serving(runtime: IngestorRuntime) -> AsyncIterator[str]:
    """``ingestor.http.app.HttpApp`` as ``icefloe ingestor`` serves it, at 127.0.0.1 on a
    free port; yields its URL."""
    import socket

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    server = uvicorn.Server(production_config(runtime))
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task  # raise why it did not start
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()
