"""Moose's dead-letter queue, typed as its users do (#37): ``POST /ingest/<Model>`` with a
batch where some records do not fit the model. With ``on_invalid = "dead_letter"`` the valid
ones land, the invalid ones land in ``icefloe.dead_letters`` with their reason, and the
answer (HTTP and gRPC) says how many; without it (the default, ``reject``) the request is
refused whole, as always. The dead letters ride the manifest like any row, so a collector
that dies after its commits and is replaced writes each exactly once.

Real ingestor (HTTP server, gRPC server), real collector on the local engine, real SQLite
catalog and local store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
import pytest
from collector_support import (
    Crash,
    collect_all,
    collector_config,
    crash_at,
    drain,
    read_table,
    start,
)
from ingest_support import grpc_serving, http_serving, running

from icefloe.config import Column, Config, StreamConfig
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from pipeline.load.run import LocalEngine


def user_events(on_invalid: str) -> StreamConfig:
    """Moose's ``UserEvent { id: Key<string>; name: string; age: number }``."""
    return StreamConfig(name="UserEvent", table="app.user_events", partition="none",
                        on_invalid=on_invalid,  # type: ignore[arg-type]
                        columns=(Column("id", "string", required=True),
                                 Column("name", "string"), Column("age", "long")))


BATCH = [
    {"id": "u1", "name": "Ada", "age": 36},
    {"name": "no id"},                       # required field missing
    {"id": "u3", "name": "Bob", "age": "old"},  # wrong type
    {"id": "u4", "name": "Cy"},
]


def config_of(tmp_path: Path, on_invalid: str) -> Config:
    return collector_config(tmp_path, streams=(user_events(on_invalid),))


async def post(config: Config, body: Any, **headers: str) -> httpx.Response:
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        return await client.post("/ingest/UserEvent", json=body, headers=headers)


def dead_letters(config: Config) -> list[dict[str, Any]]:
    rows = read_table(config, "icefloe.dead_letters").to_pylist()
    return sorted(rows, key=lambda row: row["record_index"])


async def test_invalid_records_go_to_the_dead_letter_table(tmp_path: Path) -> None:
    config = config_of(tmp_path, "dead_letter")
    reply = await post(config, BATCH, **{"Idempotency-Key": "batch-1"})
    assert reply.status_code == 202, reply.text
    assert reply.json() == {"accepted": 2, "dead_lettered": 2}
    await collect_all(config, LocalEngine())
    rows = read_table(config, "app.user_events").select(["id", "name", "age"]).to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == [
        {"id": "u1", "name": "Ada", "age": 36}, {"id": "u4", "name": "Cy", "age": None}]
    dead = dead_letters(config)
    assert [(d["stream"], d["reason"], d["event_id"]) for d in dead] == [
        ("UserEvent", "invalid_event", "batch-1:1"), ("UserEvent", "invalid_event", "batch-1:2")]
    assert "id" in dead[0]["message"]
    assert "age" in dead[1]["message"]
    assert [msgspec.json.decode(d["raw"]) for d in dead] == [BATCH[1], BATCH[2]]


async def test_the_default_still_refuses_the_request_whole(tmp_path: Path) -> None:
    config = config_of(tmp_path, "reject")
    reply = await post(config, BATCH)
    assert reply.status_code == 400
    assert {d["index"] for d in reply.json()["details"]} == {1, 2}
    await collect_all(config, LocalEngine())
    assert dead_letters(config) == []
    assert read_table(config, "app.user_events").num_rows == 0


async def test_a_valid_request_says_none_were_dead_lettered(tmp_path: Path) -> None:
    config = config_of(tmp_path, "dead_letter")
    reply = await post(config, BATCH[:1])
    assert reply.status_code == 202
    assert reply.json() == {"accepted": 1, "dead_lettered": 0}


async def test_grpc_answers_how_many_were_dead_lettered(tmp_path: Path) -> None:
    config = config_of(tmp_path, "dead_letter")
    request = ingest_pb2.PublishRequest(stream="UserEvent", request_id="grpc-1", events=[
        ingest_pb2.Event(json=msgspec.json.encode(record)) for record in BATCH])
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        answer = await ingest_pb2_grpc.IngestStub(channel).Publish(request, timeout=10)
    assert (answer.accepted, answer.dead_lettered) == (2, 2)
    await collect_all(config, LocalEngine())
    assert [d["event_id"] for d in dead_letters(config)] == ["grpc-1:1", "grpc-1:2"]


async def test_dead_letters_land_once_across_a_crash_after_commit(tmp_path: Path) -> None:
    config = config_of(tmp_path, "dead_letter")
    assert (await post(config, BATCH)).json() == {"accepted": 2, "dead_lettered": 2}
    crashing = await start(config, LocalEngine(), hook=crash_at("after_commits"))
    try:
        with pytest.raises(Crash):
            await drain(crashing)  # committed, never acknowledged: the entry comes again
    finally:
        await crashing.store.close()
    await collect_all(config, LocalEngine())
    assert len(dead_letters(config)) == 2
    assert read_table(config, "app.user_events").num_rows == 2


async def test_a_body_too_deep_to_split_is_refused_whole_not_a_500(tmp_path: Path) -> None:
    """A dead-letter stream splits a refused body into its events; one that nests past the
    decoder cannot be split: it is refused whole with its code (it was a 500)."""
    config = config_of(tmp_path, "dead_letter")
    body = b'[{"id":"u1","name":' + b"[" * 1200 + b"]" * 1200 + b"}]"
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        reply = await client.post("/ingest/UserEvent", content=body,
                                  headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == "json_too_deep"
