"""What OndatraSQL users type works: ``curl -d`` on ``/collect``, ``GET /health``, and a
``received_at`` column filled with the receive time (issue #26, item 1).

Real uvicorn servers on 127.0.0.1 (once with the fast lane, once with every request on the
ASGI path: both fronts run the same steps and must answer alike), real ``curl`` processes
as the clients, outcomes read back from the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from ingest_support import make_config, production_config, running, stored_events

from icefloe.config import Column, StreamConfig
from icefloe.config.load import load_config
from icefloe.errors import ConfigError

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")

EVENTS = StreamConfig(
    name="events", table="raw.events",
    columns=(Column("event_name", "string", required=True), Column("page_url", "string"),
             Column("user_id", "string"), Column("received_at", "timestamp")))
OPTED_IN = StreamConfig(name="optin", table="raw.optin", form_body="json",
                        columns=(Column("event_name", "string"),))
REFUSING = StreamConfig(name="strict", table="raw.strict", form_body="refuse",
                        columns=(Column("event_name", "string"),))
ORIGIN = "https://app.example"


@contextlib.asynccontextmanager
async def _uvicorn(config: Any) -> AsyncIterator[str]:
    import uvicorn

    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:  # uvicorn offers no event for it
            if task.done():
                await task
            await asyncio.sleep(0.005)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture(params=["fast-lane", "asgi-only"])
async def served(tmp_path: Path, request: Any) -> AsyncIterator[tuple[str, str]]:
    """(base URL, store URL) of an ingestor serving the three streams."""
    config = make_config(tmp_path / "store", (EVENTS, OPTED_IN, REFUSING),
                         cors_origins=(ORIGIN,))
    async with running(config) as runtime, _uvicorn(production_config(
            runtime, http_fast_lane=request.param == "fast-lane")) as url:
        yield url, config.store.url


async def curl(*args: str) -> tuple[int, dict[str, Any]]:
    """Run curl (its own defaults: ``-d`` sends application/x-www-form-urlencoded over a
    keep-alive HTTP/1.1 connection); the status and the JSON body."""
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-w", "\n%{http_code}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    body, _, status = out.rpartition(b"\n")
    return int(status), msgspec.json.decode(body) if body else {}


async def test_curl_d_on_collect_is_read_as_json(served):
    url, store = served
    status, body = await curl("-X", "POST", f"{url}/collect/raw/events", "-d",
                              '{"event_name":"pageview","page_url":"/home","user_id":"u1",'
                              '"received_at":"2026-01-02T03:04:05Z"}')
    assert (status, body) == (202, {"accepted": 1})
    status, body = await curl(f"{url}/collect/raw/events/batch", "-d",
                              '[{"event_name":"click","received_at":"2026-01-02T03:04:06Z"}]')
    assert (status, body) == (202, {"accepted": 1})
    assert [e.payload for e in await stored_events(store)] == [
        b'{"event_name":"pageview","page_url":"/home","user_id":"u1",'
        b'"received_at":"2026-01-02T03:04:05Z"}',
        b'{"event_name":"click","received_at":"2026-01-02T03:04:06Z"}']


async def test_a_form_body_that_is_not_json_is_a_400_with_the_json_error(served):
    url, store = served
    status, body = await curl(f"{url}/collect/raw/events", "-d", "event_name=pageview&x=1")
    assert status == 400
    assert body["error"] == "invalid_json"
    assert set(body) == {"error", "message", "details"}
    assert await stored_events(store) == []


async def test_form_body_opt_in_and_refusal_per_stream(served):
    url, store = served
    event = '{"event_name":"e"}'
    status, body = await curl(f"{url}/v1/streams/events/events", "-d", event)
    assert status == 415, body  # only /collect reads the form type unless the stream opts in
    assert "form_body" in body["message"]
    status, body = await curl(f"{url}/v1/streams/optin/events", "-d", event)
    assert (status, body) == (202, {"accepted": 1})
    status, body = await curl(f"{url}/collect/raw/strict", "-d", event)
    assert (status, body["error"]) == (415, "unsupported_media_type")
    assert len(await stored_events(store)) == 1


async def test_a_form_body_from_a_foreign_page_is_refused_like_text_plain(served):
    """A form type needs no CORS preflight, so a page the origins list does not allow
    must not be able to write with it."""
    url, store = served
    event = '{"event_name":"e"}'
    status, body = await curl(f"{url}/collect/raw/events", "-H", "Origin: https://evil.example",
                              "-d", event)
    assert (status, body["error"]) == (415, "unsupported_media_type")
    status, _ = await curl(f"{url}/collect/raw/events", "-H", f"Origin: {ORIGIN}", "-d", event)
    assert status == 202
    assert len(await stored_events(store)) == 1


async def test_get_health_answers_like_healthz(served):
    url, _ = served
    async with httpx.AsyncClient(base_url=url) as client:
        health, healthz = await client.get("/health"), await client.get("/healthz")
    assert (health.status_code, health.json()) == (healthz.status_code, healthz.json())
    assert health.status_code == 200
    assert health.headers["content-type"] == "application/json"
    status, body = await curl(f"{url}/health")
    assert (status, body) == (200, {"status": "ok"})


async def test_received_at_gets_the_receive_time_unless_the_client_sends_one(served):
    url, store = served
    before = dt.datetime.now(dt.UTC)
    status, _ = await curl(f"{url}/collect/raw/events/batch", "-d",
                           '[{"event_name":"left_out"},'
                           '{"event_name":"null","received_at":null},'
                           '{"event_name":"sent","received_at":"2020-05-06T07:08:09Z"}]')
    after = dt.datetime.now(dt.UTC)
    assert status == 202
    rows = [msgspec.json.decode(e.payload) for e in await stored_events(store)]
    assert [r["event_name"] for r in rows] == ["left_out", "null", "sent"]
    for row in rows[:2]:
        stamped = dt.datetime.fromisoformat(row["received_at"])
        assert before - dt.timedelta(seconds=1) <= stamped <= after
    assert rows[2]["received_at"] == "2020-05-06T07:08:09Z"


def test_form_body_is_validated_when_the_config_loads(tmp_path):
    path = tmp_path / "icefloe.toml"
    path.write_text('[[streams]]\nname = "e"\ntable = "raw.e"\nform_body = "always"\n'
                    'columns = [{ name = "a", type = "string" }]\n')
    with pytest.raises(ConfigError, match="form_body"):
        load_config(path)


def test_received_at_is_filled_on_every_entry_point_from_the_injected_clock():
    """The gRPC front and NDJSON decode through the same validator: same rule."""
    from icefloe.clock import ManualClock
    from ingestor.validate import CompiledStream

    clock = ManualClock(1_800_000_000.0)
    stream = CompiledStream(EVENTS, clock=clock)
    stamped = b'{"event_name":"a","received_at":"2027-01-15T08:00:00Z"}'
    for canonical in (stream.from_events([b'{"event_name":"a"}']),
                      stream.from_ndjson(b'{"event_name":"a","received_at":null}\n'),
                      stream.from_json(b'[{"event_name":"a"}]')):
        assert canonical.payloads == [stamped]
    assert stream.from_events([b'{"event_name":"a","received_at":0}']).payloads == [
        b'{"event_name":"a","received_at":"1970-01-01T00:00:00Z"}']
