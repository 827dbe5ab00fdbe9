"""Broken and hostile input from real clients (httpx, raw sockets, grpc.aio channels) against
real ingestor servers on 127.0.0.1 (issue #29, items 3 and 5): every refusal is a 400 /
INVALID_ARGUMENT with a stable code, logs no traceback, is counted, and costs nothing that
was accepted around it; client-error log lines are rate-limited."""

from __future__ import annotations

import gzip
import logging

import grpc
import msgspec
import pytest
from grpc_status import rpc_status
from ingest_support import grpc_serving, make_config, stored_events
from test_grpc import publish, publish_stream, reason, refused, request, violations
from test_http import (
    AUTH,
    EVENTS,
    ORDERS_URL,
    error,
    exchange,
    http,  # noqa: F401  (the fixture: both HTTP lanes)
    payloads,
    post,
    sample,
)

from icefloe.clock import ManualClock
from icefloe.config import Column, StreamConfig
from icefloe.streams.types import MAX_JSON_DEPTH
from icefloe.v1 import ingest_pb2
from ingestor.client_errors import ClientErrorLog
from ingestor.errors import BadRequest
from ingestor.metrics import IngestMetrics
from tests.app.test_admin_api import admin  # noqa: F401  (the fixture: a served admin API)

ALLTYPES = "/v1/streams/alltypes/events"
NDJSON = {"Content-Type": "application/x-ndjson"}
GZIP = {"Content-Encoding": "gzip"}


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def deep_event(levels: int) -> bytes:
    """A valid event whose dropped (undeclared) field nests ``levels`` deep."""
    return b'{"user_id":"u","x":' + deep(levels) + b"}"


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    tracebacks = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


# -- HTTP: bodies -----------------------------------------------------------------------------

BAD_BODIES = [
    ("utf8-json", EVENTS, b'{"user_id":"\xff\xfe"}', {}, "invalid_utf8"),
    ("utf8-dropped-field", EVENTS, b'{"user_id":"a","x":"\xff"}', {}, "invalid_utf8"),
    ("utf8-json-column", ALLTYPES, b'{"j":{"k":"\xc3"}}', {}, "invalid_utf8"),
    ("utf8-ndjson", EVENTS, b'{"user_id":"a"}\n{"user_id":"\xff"}\n', NDJSON, "invalid_utf8"),
    ("utf8-gzip", EVENTS, gzip.compress(b'{"user_id":"\xff"}'), GZIP, "invalid_utf8"),
    ("utf8-ingest", "/ingest/pageviews", b'{"user_id":"\xff"}', {}, "invalid_utf8"),
    ("utf8-collect", "/collect/web/pageviews", b'{"user_id":"\xff"}', {}, "invalid_utf8"),
    ("empty-array", EVENTS, b"[]", {}, "empty_body"),
    ("empty-array-spaces", EVENTS, b" [ ] ", {}, "empty_body"),
    ("empty-array-batch", "/collect/web/pageviews/batch", b"[]", {}, "empty_body"),
    ("empty-array-gzip", EVENTS, gzip.compress(b"[]"), GZIP, "empty_body"),
    ("deep-1000", EVENTS, deep(1000), {}, "json_too_deep"),
    ("deep-5000", EVENTS, deep(5000), {}, "json_too_deep"),
    ("deep-field", EVENTS, deep_event(1000), {}, "json_too_deep"),
    ("deep-ndjson", EVENTS, b'{"user_id":"a"}\n' + deep_event(1000), NDJSON, "json_too_deep"),
    ("deep-gzip", EVENTS, gzip.compress(deep_event(2000)), GZIP, "json_too_deep"),
    ("deep-ingest", "/ingest/pageviews", deep_event(1000), {}, "json_too_deep"),
    ("deep-collect", "/collect/web/pageviews", deep_event(1000), {}, "json_too_deep"),
    ("deep-collect-batch", "/collect/web/pageviews/batch", b"[" + deep_event(1000) + b"]", {},
     "json_too_deep"),
    ("deep-json-column", ALLTYPES,
     b'{"j":' + deep(MAX_JSON_DEPTH + 1) + b"}", {}, "json_too_deep"),
    ("ts-past-9999-in-utc", EVENTS, b'{"user_id":"u","ts":"9999-12-31T23:59:59-01:00"}', {},
     "validation_failed"),
    ("ts-before-year-1-in-utc", EVENTS, b'{"user_id":"u","ts":"0001-01-01T00:00:00+01:00"}',
     {}, "validation_failed"),
    ("ts-epoch-ms-before-year-1", EVENTS, b'{"user_id":"u","ts":-62135596800001}', {},
     "validation_failed"),
    ("json-1e400", ALLTYPES, b'{"j":{"n":1e400}}', {}, "number_out_of_range"),
    ("json-big-int", ALLTYPES, b'{"j":[' + b"9" * 100_000 + b"]}", {},
     "number_out_of_range"),
    ("json-400-digits", ALLTYPES, b'{"j":' + b"9" * 400 + b"}", {}, "number_out_of_range"),
]


@pytest.mark.parametrize(("path", "body", "headers", "code"),
                         [case[1:] for case in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
async def test_bad_bodies_are_400_with_a_stable_code_and_no_traceback(
        http, caplog, path, body, headers, code):  # noqa: F811
    r = await http.client.post(path, content=body, headers=headers)
    error(r, 400, code)
    no_traceback(caplog)
    metrics = (await http.client.get("/metrics")).text
    assert sample(metrics, "icefloe_ingest_client_errors_total", code=code) == 1
    assert await stored_events(http.store_url) == []


async def test_the_nesting_limit_is_inclusive_and_reported_per_event(http):  # noqa: F811
    at_limit = b'{"j":' + deep(MAX_JSON_DEPTH) + b"}"
    too_deep = b'{"j":{"a":' + deep(MAX_JSON_DEPTH) + b"}}"
    body = b"[" + b",".join([at_limit, too_deep, at_limit, too_deep]) + b"]"
    r = await http.client.post(ALLTYPES, content=body)
    details = error(r, 400, "json_too_deep")["details"]
    assert [(d["index"], d["field"]) for d in details] == [(1, "j"), (3, "j")]
    mixed = b"[" + b",".join([too_deep, b'{"j":[1e999]}']) + b"]"
    details = error(await http.client.post(ALLTYPES, content=mixed), 400,
                    "validation_failed")["details"]
    assert [d["reason"][:6] for d in details] == ["nested", "number"]
    r = await http.client.post(ALLTYPES, content=at_limit)
    assert r.status_code == 202, r.text
    # brackets inside strings are not nesting
    text = b'{"j":{"s":"' + b"[" * 500 + b'\\"\\\\' + b"{" * 500 + b'"}}'
    assert (await http.client.post(ALLTYPES, content=text)).status_code == 202


async def test_numbers_inside_the_double_range_and_lookalikes_in_strings_are_kept(
        http):  # noqa: F811
    body = b'{"j":{"big":1e308,"int":' + b"9" * 300 + b',"s":"1e999 ' + b"9" * 400 + b'"}}'
    assert (await http.client.post(ALLTYPES, content=body)).status_code == 202
    (event,) = await stored_events(http.store_url)
    stored = msgspec.json.decode(msgspec.json.decode(event.payload)["j"])
    assert stored["big"] == 1e308
    assert stored["s"].startswith("1e999")


async def test_nul_characters_in_strings_are_kept_and_raw_nul_bytes_refused(
        http):  # noqa: F811
    """The README's rule: an escaped NUL (\\u0000) is an ordinary character, stored as
    sent; a raw NUL byte is not JSON (400 invalid_json)."""
    r = await http.client.post(ALLTYPES, content=b'{"s":"a\\u0000b","j":{"k":"\\u0000"}}')
    assert r.status_code == 202, r.text
    (event,) = await stored_events(http.store_url)
    decoded = msgspec.json.decode(event.payload)
    assert decoded["s"] == "a\x00b"
    assert msgspec.json.decode(decoded["j"]) == {"k": "\x00"}
    error(await http.client.post(ALLTYPES, content=b'{"s":"a\x00b"}'), 400, "invalid_json")


async def test_refusals_cost_nothing_accepted_on_the_same_connection(http, caplog):  # noqa: F811
    """Good, bad (each kind), good on one keep-alive connection: the good ones are acked
    and stored, each bad one answered 400, and the connection keeps serving."""
    bad = [b'{"user_id":"\xff"}', b"[]", deep(3000), deep_event(1200)]
    wire = post(EVENTS, b'{"user_id":"first"}')
    for body in bad:
        wire += post(EVENTS, body)
    wire += post(EVENTS, b'{"user_id":"last"}')
    answers = await exchange(http.port, wire, responses=len(bad) + 2)
    statuses = [head.split(b" ", 2)[1] for head, _ in answers]
    assert statuses == [b"202", *[b"400"] * len(bad), b"202"]
    codes = [msgspec.json.decode(body)["error"] for _, body in answers[1:-1]]
    assert codes == ["invalid_utf8", "empty_body", "json_too_deep", "json_too_deep"]
    assert payloads(await stored_events(http.store_url)) == [
        b'{"user_id":"first"}', b'{"user_id":"last"}']
    no_traceback(caplog)


# -- HTTP: headers and ids ----------------------------------------------------------------------

async def test_a_repeated_authorization_or_idempotency_key_header_is_refused(
        http, caplog):  # noqa: F811
    body = b'{"order_id":"o-1"}'
    twice = [("Authorization", "Bearer s3cret-token"), ("Authorization", "Bearer other")]
    r = await http.client.post(ORDERS_URL, content=body, headers=twice)
    assert error(r, 400, "duplicate_header")["details"][0]["field"] == "Authorization"
    same = [("Authorization", "Bearer s3cret-token")] * 2
    error(await http.client.post(ORDERS_URL, content=body, headers=same), 400,
          "duplicate_header")
    keys = [*AUTH.items(), ("Idempotency-Key", "k-1"), ("Idempotency-Key", "k-2")]
    r = await http.client.post(ORDERS_URL, content=body, headers=keys)
    assert error(r, 400, "duplicate_header")["details"][0]["field"] == "Idempotency-Key"
    assert await stored_events(http.store_url) == []
    assert (await http.client.post(ORDERS_URL, content=body, headers=AUTH)).status_code == 202
    no_traceback(caplog)


async def test_control_characters_in_event_ids_are_refused_by_field(http):  # noqa: F811
    body = b'[{"order_id":"ok-1"},{"order_id":"bad\\u0007id"},{"order_id":"n\\u0085l"}]'
    r = await http.client.post(ORDERS_URL, content=body, headers=AUTH)
    details = error(r, 400, "invalid_event_id")["details"]
    assert [(d["index"], d["field"]) for d in details] == [(1, "event_id"), (2, "event_id")]
    assert await stored_events(http.store_url) == []
    ok = b'[{"order_id":"ok-1"},{"order_id":"caf\xc3\xa9 \xe2\x9c\x93"}]'
    assert (await http.client.post(ORDERS_URL, content=ok, headers=AUTH)).status_code == 202


@pytest.mark.parametrize("key", [b"k\tey", b"k\xc2\x9bey"])
async def test_control_characters_in_the_idempotency_key_are_refused(http, key):  # noqa: F811
    """Tab and C1 controls (UTF-8) pass the HTTP parser; icefloe refuses them (the parser
    itself refuses the other C0 controls and DEL)."""
    (head, body), = await exchange(http.port, post(EVENTS, b'{"user_id":"a"}',
                                                   b"Idempotency-Key: " + key))
    assert head.startswith(b"HTTP/1.1 400"), head
    decoded = msgspec.json.decode(body)
    assert decoded["error"] == "invalid_idempotency_key"
    assert decoded["details"][0]["field"] == "idempotency_key"
    assert await stored_events(http.store_url) == []


# -- HTTP: the log ----------------------------------------------------------------------------

async def test_client_errors_are_logged_sparingly_and_counted(http, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="icefloe")
    for _ in range(30):
        error(await http.client.post(EVENTS, content=b'{"user_id":"\xff"}'), 400,
              "invalid_utf8")
    lines = [r for r in caplog.records if r.name == "icefloe.ingestor.refused"]
    assert len(lines) == 10
    assert all("invalid_utf8" in r.getMessage() and not r.exc_info for r in lines)
    metrics = (await http.client.get("/metrics")).text
    assert sample(metrics, "icefloe_ingest_client_errors_total", code="invalid_utf8") == 30
    assert sample(metrics, "icefloe_ingest_client_error_logs_suppressed_total") == 20
    no_traceback(caplog)


def test_the_log_says_how_many_lines_it_left_out_once_the_window_ends(caplog):
    caplog.set_level(logging.INFO, logger="icefloe")
    metrics, clock = IngestMetrics(), ManualClock()
    sampled = ClientErrorLog(metrics.client_errors, metrics.client_error_logs_suppressed,
                             lines_per_window=2, window_s=60, clock=clock)
    refusal = BadRequest("bad", code="invalid_json")
    for _ in range(5):
        sampled.record("s", refusal)
    sampled.record("s", BadRequest("other", code="empty_body"))  # its own budget
    assert len(caplog.records) == 3
    clock.advance(60)
    sampled.record("s", refusal)
    messages = [r.getMessage() for r in caplog.records[3:]]
    assert messages[0] == "3 more invalid_json refusal(s) were not logged in the last 60 s"
    assert "refused a request to stream s: bad" in messages[1]


# -- gRPC -------------------------------------------------------------------------------------

GRPC_BAD = [
    ("empty-json", [b""], "invalid_json"),
    ("blank-json", [b'{"user_id":"a"}', b"  "], "invalid_json"),
    ("two-objects-in-one", [b'{"user_id":"a"},{"user_id":"b"}'], "invalid_json"),
    ("utf8", [b'{"user_id":"a"}', b'{"user_id":"\xff"}'], "invalid_utf8"),
    ("utf8-dropped-field", [b'{"user_id":"a","x":"\xc3("}'], "invalid_utf8"),
    ("deep", [deep_event(1000)], "json_too_deep"),
    ("deep-second", [b'{"user_id":"a"}', deep_event(5000)], "json_too_deep"),
    ("deep-array-not-object", [deep(5000)], "validation_failed"),
]


@pytest.mark.parametrize(("jsons", "code"), [c[1:] for c in GRPC_BAD],
                         ids=[c[0] for c in GRPC_BAD])
async def test_grpc_bad_events_are_invalid_argument_without_exception_text(
        tmp_path, caplog, jsons, code):
    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        exc = await refused(served.port, request("pageviews", *jsons))
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason(rpc_status.from_call(exc)) == code
        assert "Error" not in exc.details()
        assert "Traceback" not in exc.details()
        ok = await publish(served.port, request("pageviews", b'{"user_id":"ok"}'))
        assert ok.accepted == 1
        assert payloads(await stored_events(runtime.config.store.url)) == [
            b'{"user_id":"ok"}']
    no_traceback(caplog)


async def raw_unary(port: int, data: bytes) -> grpc.aio.AioRpcError:
    """Send ``data`` as the Publish request message, bytes as they are."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/icefloe.v1.Ingest/Publish",
                                   response_deserializer=ingest_pb2.PublishResponse.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(data, timeout=10)
        return info.value


@pytest.mark.parametrize("data", [b"\xff\xff\xff\xff", b"\x0a\x05pa", b"\x0a\x01\xff",
                                  b"\x1a\x02\xc3\x28", b"\x12\x03\x12\x01\xff"],
                         ids=["garbage", "truncated", "stream-not-utf8",
                              "request-id-not-utf8", "event-id-not-utf8"])
async def test_grpc_malformed_protobuf_is_invalid_argument(tmp_path, caplog, data):
    async with grpc_serving(make_config(tmp_path / "store")) as (_, served):
        exc = await raw_unary(served.port, data)
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, exc
        assert reason(rpc_status.from_call(exc)) == "invalid_protobuf"
    no_traceback(caplog)


async def test_grpc_stream_answers_a_malformed_message_and_goes_on(tmp_path, caplog):
    good = [request("pageviews", b'{"user_id":"a"}', request_id="r1").SerializeToString(),
            b"\x0a\x01\xff",
            request("pageviews", b'{"user_id":"\xff"}', request_id="r3").SerializeToString(),
            request("pageviews", b'{"user_id":"b"}', request_id="r4").SerializeToString()]
    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            call = channel.stream_stream(
                "/icefloe.v1.Ingest/PublishStream",
                response_deserializer=ingest_pb2.PublishResponse.FromString)(iter(good))
            answers = [answer async for answer in call]
        assert [(a.request_id, a.accepted) for a in answers] == [
            ("r1", 1), ("", 0), ("r3", 0), ("r4", 1)]
        assert [reason(a.error) for a in answers[1:3]] == ["invalid_protobuf", "invalid_utf8"]
        assert payloads(await stored_events(runtime.config.store.url)) == [
            b'{"user_id":"a"}', b'{"user_id":"b"}']
    no_traceback(caplog)


async def test_grpc_refuses_a_repeated_authorization(tmp_path):
    twice = (("authorization", "Bearer s3cret-token"), ("authorization", "Bearer other"))
    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        exc = await refused(served.port, request("orders", b'{"order_id":"o-1"}'), twice)
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason(rpc_status.from_call(exc)) == "duplicate_header"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await publish_stream(served.port, [request("orders", b'{"order_id":"o-2"}')],
                                 twice)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert await stored_events(runtime.config.store.url) == []


async def test_grpc_control_characters_in_ids_and_request_id_are_refused(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        exc = await refused(served.port, request("pageviews", b'{"user_id":"a"}',
                                                 b'{"user_id":"b"}', ids=("ok", "b\x1bd")))
        status = rpc_status.from_call(exc)
        assert reason(status) == "invalid_event_id"
        assert [field for field, _ in violations(status)] == ["events[1].event_id"]
        exc = await refused(served.port, request("pageviews", b'{"user_id":"a"}',
                                                 request_id="r\x00"))
        assert reason(rpc_status.from_call(exc)) == "invalid_idempotency_key"
        assert await stored_events(runtime.config.store.url) == []


# -- the admin API ----------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "code"), [
    (b'{"id":"\xff"}', "invalid_utf8"),
    (b'{"id":"s","description":"ok","x":"\xc3("}', "invalid_utf8"),
    (b'{"id":"s","sinks":[{"name":"x","table":"a.x","columns":[{"name":"c","type":"json",'
     b'"default":' + deep(5000) + b"}]}]}", "json_too_deep"),
], ids=["utf8", "utf8-unknown-field", "deep"])
def test_admin_refuses_bad_bodies_with_400_json(admin, caplog, body, code):  # noqa: F811
    r = admin.client.post("/v1/sources", content=body,
                          headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"] == code
    assert set(r.json()) == {"error", "message", "details"}
    no_traceback(caplog)


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/v1/sources", "GET, HEAD, POST"),
    ("PUT", "/v1/sources/clicks/sinks/main", "DELETE, GET, HEAD, PATCH"),
    ("POST", "/v1/sources/clicks", "DELETE, GET, HEAD, PATCH"),
    ("DELETE", "/healthz", "GET, HEAD"),
])
def test_admin_405_names_every_allowed_method(admin, method, path, allow):  # noqa: F811
    r = admin.client.request(method, path)
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    assert r.json()["error"] == "method_not_allowed"


MAPPED = StreamConfig(
    name="mapped", table="lab.mapped",
    columns=(Column("user", "string", path="$.user.id"),
             Column("props", "json", path="$.data.props"),
             Column("first", "json", path="$.list[0]"),
             Column("whole", "json", source="body")))


@pytest.mark.parametrize(("event", "field", "code"), [
    (b'{"user":{"id":"u"},"data":{"props":' + deep(MAX_JSON_DEPTH + 1) + b"}}", "props",
     "json_too_deep"),
    (b'{"user":{"id":"u"},"data":{"props":{"n":1e400}}}', "props", "number_out_of_range"),
    (b'{"user":{"id":"u"},"list":[[' + b"9" * 400 + b"]]}", "first", "number_out_of_range"),
    (b'{"user":{"id":"u"},"list":[1e999]}', "first", "number_out_of_range"),
    (b'{"user":{"id":"u"},"x":' + deep(MAX_JSON_DEPTH + 1) + b"}", "whole", "json_too_deep"),
], ids=["path-deep", "path-1e400", "index-path-big-int", "index-path-1e999", "body-deep"])
async def test_mapped_json_columns_refuse_what_readers_could_not_parse(
        tmp_path, caplog, event, field, code):
    config = make_config(tmp_path / "store", (MAPPED,))
    async with grpc_serving(config) as (runtime, served):
        exc = await refused(served.port, request("mapped", b'{"user":{"id":"ok"}}', event))
        status = rpc_status.from_call(exc)
        assert (exc.code(), reason(status)) == (grpc.StatusCode.INVALID_ARGUMENT, code)
        assert [f for f, _ in violations(status)] == [f"events[1].{field}"]
        assert (await publish(served.port, request("mapped", b'{"user":{"id":"ok"}}'))
                ).accepted == 1
        assert len(await stored_events(runtime.config.store.url)) == 1
    no_traceback(caplog)


async def test_grpc_internal_errors_carry_no_exception_text(tmp_path, monkeypatch, caplog):
    """A bug is INTERNAL with a fixed message; its text and traceback go to the log only."""
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("secret-detail at /srv/icefloe")

    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        monkeypatch.setattr(runtime.service, "admit", broken)
        exc = await refused(served.port, request("pageviews", b'{"user_id":"a"}'))
        assert exc.code() == grpc.StatusCode.INTERNAL
        assert "secret-detail" not in exc.details()
        assert "RuntimeError" not in exc.details()
    assert any(r.exc_info and "secret-detail" in str(r.exc_info[1]) for r in caplog.records)
