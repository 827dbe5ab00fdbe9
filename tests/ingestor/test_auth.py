"""Hashed and scoped write tokens on a real ingestor, over HTTP and gRPC; none in the logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
import pytest
from ingest_support import ORDERS, PAGEVIEWS, TOKEN, TOKEN_HASH, make_config
from security_support import ingestor

from icefloe.client import AsyncGrpcClient, IngestRejected
from icefloe.config import Column, Config, RateLimit, StreamConfig, TokenConfig
from icefloe.logs import JsonFormatter
from icefloe.tokens import hash_token
from ingestor.auth import TokenAuthority
from ingestor.errors import Overloaded, PermissionDenied, Unauthenticated
from ingestor.runtime import IngestorRuntime

CLICKS = StreamConfig(name="clicks", table="web.clicks", columns=(Column("url", "string"),))
WEB_TOKEN = "ifl_web-frontend-token-0123456789"
ADMIN_TOKEN = "ifl_admin-token-9876543210"
WRONG_TOKEN = "ifl_WRONG-token-that-must-never-be-logged"


def scoped_config(tmp_path: Path, *tokens: TokenConfig, **ingestor_settings: Any) -> Config:
    config = make_config(tmp_path / "store", (PAGEVIEWS, ORDERS, CLICKS), **ingestor_settings)
    web = TokenConfig("web", hash_token(WEB_TOKEN, log2_n=10), ("clicks",),
                      RateLimit(events_per_s=1000))
    return type(config)(store=config.store, manifest=config.manifest,
                        ingestor=config.ingestor, streams=config.streams,
                        tokens=(web, *tokens))


async def post(port: int, stream: str, token: str | None = None,
               headers: dict[str, str] | None = None) -> httpx.Response:
    sent = {"authorization": f"Bearer {token}"} if token else {}
    body = b'{"order_id":"o-1"}' if stream == "orders" else b'{"user_id":"u","url":"/"}'
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(f"http://127.0.0.1:{port}/v1/streams/{stream}/events",
                                 content=body, headers={**sent, **(headers or {})})


async def publish(port: int, stream: str, token: str | None) -> grpc.StatusCode:
    event = {"order_id": "o-2"} if stream == "orders" else {"user_id": "u", "url": "/"}
    async with AsyncGrpcClient(f"127.0.0.1:{port}", token=token, retries=0) as client:
        try:
            await client.publish(stream, [event])
        except IngestRejected as exc:
            status = exc.status
        else:
            return grpc.StatusCode.OK
    assert isinstance(status, grpc.StatusCode)
    return status


@pytest.fixture
def all_logs() -> Iterator[list[str]]:
    """Every log line of the process as JSON, *without* the redacting filter: the code must
    not log tokens in the first place (the filter is only the last line of defence)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep(logging.DEBUG)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


# -- who may write where --------------------------------------------------------------------------

async def test_should_accept_hashed_tokens_and_refuse_wrong_or_missing_ones(tmp_path):
    async with ingestor(scoped_config(tmp_path)) as ports:
        expected = [
            ("pageviews", None, 202), ("orders", None, 401), ("orders", TOKEN, 202),
            ("orders", WRONG_TOKEN, 403), ("orders", WEB_TOKEN, 403), ("clicks", None, 401),
            ("clicks", WEB_TOKEN, 202), ("clicks", TOKEN, 403), ("clicks", WRONG_TOKEN, 403),
        ]
        got = [(s, t, (await post(ports.http, s, t)).status_code) for s, t, _ in expected]
        assert got == expected
        codes = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED,
                 202: grpc.StatusCode.OK}
        assert [(s, t, await publish(ports.grpc, s, t)) for s, t, _ in expected] == \
            [(s, t, codes[status]) for s, t, status in expected]


async def test_should_give_a_star_token_every_stream_and_close_open_ones(tmp_path):
    admin = TokenConfig("admin", hash_token(ADMIN_TOKEN, log2_n=10), ("*",))
    async with ingestor(scoped_config(tmp_path, admin)) as ports:
        assert (await post(ports.http, "pageviews")).status_code == 401
        for stream in ("pageviews", "orders", "clicks"):
            assert (await post(ports.http, stream, ADMIN_TOKEN)).status_code == 202
            assert await publish(ports.grpc, stream, ADMIN_TOKEN) == grpc.StatusCode.OK
        body = (await post(ports.http, "orders", WEB_TOKEN)).json()
        assert body == {"error": "permission_denied",
                        "message": "the token is not valid for stream 'orders'", "details": []}


async def test_should_verify_each_distinct_token_once(tmp_path):
    runtimes: list[IngestorRuntime] = []
    async with ingestor(scoped_config(tmp_path), on_runtime=runtimes.append) as ports:
        for _ in range(5):
            assert (await post(ports.http, "orders", TOKEN)).status_code == 202
            assert await publish(ports.grpc, "orders", TOKEN) == grpc.StatusCode.OK
            assert (await post(ports.http, "orders", WRONG_TOKEN)).status_code == 403
        assert runtimes[0].service.auth.verifications == 2  # one right, one wrong


async def test_should_never_log_a_token(tmp_path, all_logs):
    async with ingestor(scoped_config(tmp_path)) as ports:
        for token in (WRONG_TOKEN, TOKEN, WEB_TOKEN):
            for stream in ("orders", "clicks"):
                await post(ports.http, stream, token)
                await post(ports.http, stream, headers={"authorization": f"Basic {token}"})
                await publish(ports.grpc, stream, token)
    text = "\n".join(all_logs)
    assert "refused a token for stream 'orders' from 127.0.0.1" in text  # logs were captured
    for token in (WRONG_TOKEN, TOKEN, WEB_TOKEN):
        assert token not in text
        assert token[4:20] not in text


# -- the authority on its own ---------------------------------------------------------------

async def test_should_refuse_new_tokens_when_too_many_wait_for_verification(tmp_path):
    config = make_config(tmp_path, (PAGEVIEWS, ORDERS))
    authority = TokenAuthority(config, max_waiting=0)
    with pytest.raises(Overloaded) as info:
        await authority.authorize("orders", TOKEN)
    assert info.value.code == "auth_busy"
    assert info.value.retry_after_s == 1.0
    assert await TokenAuthority(config).authorize("pageviews", None) is None
    with pytest.raises(Unauthenticated):
        await TokenAuthority(config).authorize("orders", "")
    assert TOKEN_HASH not in str(info.value)


async def test_should_remember_a_token_per_stream_it_was_refused_for(tmp_path):
    clicks_only = TokenConfig("web", hash_token(WEB_TOKEN, log2_n=10), ("clicks",))
    config = make_config(tmp_path, (PAGEVIEWS, ORDERS, CLICKS))
    config = type(config)(store=config.store, ingestor=config.ingestor,
                          streams=config.streams, tokens=(clicks_only,))
    authority = TokenAuthority(config)
    for _ in range(3):
        with pytest.raises(PermissionDenied):
            await authority.authorize("orders", WEB_TOKEN)
    credential = await authority.authorize("clicks", WEB_TOKEN)
    assert credential is not None
    assert credential.name == "web"
    assert authority.verifications == 2


async def test_should_accept_one_token_on_every_stream_whose_entries_it_matches(tmp_path):
    """The same hash line pasted into two streams' ``tokens``: a token verified (and cached)
    for the first stream must still be checked against the second's entries, not refused."""
    line = hash_token(WEB_TOKEN, log2_n=10)
    streams = tuple(msgspec.structs.replace(s, tokens=(line,)) for s in (PAGEVIEWS, CLICKS))
    authority = TokenAuthority(make_config(tmp_path, (*streams, ORDERS)))
    for stream in ("pageviews", "clicks", "pageviews", "clicks"):
        credential = await authority.authorize(stream, WEB_TOKEN)
        assert credential is not None
        assert credential.name == f"{stream}.tokens[0]"
    with pytest.raises(PermissionDenied):
        await authority.authorize("orders", WEB_TOKEN)
    assert authority.verifications == 3  # once per stream


async def test_should_charge_wrong_tokens_to_the_client_that_sends_them(tmp_path):
    """A flood of distinct wrong tokens from one address is cut off after its budget, so
    it cannot keep the slow verifications busy for everyone; other addresses, and tokens
    the flooding address already proved, keep working."""
    from ingestor.auth import FAILED_BURST

    authority = TokenAuthority(make_config(tmp_path, (PAGEVIEWS, ORDERS)))
    assert await authority.authorize("orders", TOKEN, "10.0.0.1") is not None  # proven
    for i in range(int(FAILED_BURST)):
        with pytest.raises(PermissionDenied):
            await authority.authorize("orders", f"ifl_wrong-{i}", "10.0.0.1")
    spent = authority.verifications
    with pytest.raises(Overloaded) as info:
        await authority.authorize("orders", "ifl_wrong-next", "10.0.0.1")
    assert info.value.code == "auth_throttled"
    assert info.value.retry_after_s >= 1.0
    assert authority.verifications == spent  # refused without hashing
    assert await authority.authorize("orders", TOKEN, "10.0.0.1") is not None  # cached
    with pytest.raises(PermissionDenied):  # another address still gets its verification
        await authority.authorize("orders", "ifl_wrong-other", "10.0.0.2")
    assert authority.verifications == spent + 1
