"""The gRPC front on a real grpc.aio server: acks, rich errors, streaming, health, reflection."""

from __future__ import annotations

import asyncio
import socket

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from ingest_support import (
    PAGEVIEWS,
    faulty_local_store,
    grpc_serving,
    make_config,
    read_manifest,
    stored_events,
)

from icefloe.config import StreamConfig
from icefloe.errors import ConfigError
from icefloe.formats.envelope import frame_events
from icefloe.store.faults import FaultRule
from icefloe.store.retry import RetryPolicy
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc
from ingestor.errors import BadRequest
from ingestor.grpc_app import SERVICE_NAME, error_status, start_grpc_server

TOKEN = (("authorization", "Bearer s3cret-token"),)
ONE_TRY = RetryPolicy(max_attempts=2, base_delay_s=0.001, max_delay_s=0.002, budget_s=1)
NO_RETRY = RetryPolicy(max_attempts=1)
Event = ingest_pb2.Event


def request(stream: str, *jsons: bytes, request_id: str = "",
            ids: tuple[str, ...] = ()) -> ingest_pb2.PublishRequest:
    events = [Event(json=j, event_id=ids[i] if i < len(ids) else "")
              for i, j in enumerate(jsons)]
    return ingest_pb2.PublishRequest(stream=stream, events=events, request_id=request_id)


def views(n: int, start: int = 0) -> list[bytes]:
    return [b'{"user_id":"u%d"}' % i for i in range(start, start + n)]


def rich(exc: grpc.aio.AioRpcError) -> status_pb2.Status:
    status = rpc_status.from_call(exc)
    assert status is not None, "no google.rpc.Status in the trailers"
    assert status.code == exc.code().value[0]
    assert status.message == exc.details()
    return status


def detail(status: status_pb2.Status, kind: type) -> object | None:
    for packed in status.details:
        if packed.Is(kind.DESCRIPTOR):
            message = kind()
            packed.Unpack(message)
            return message
    return None


def violations(status: status_pb2.Status) -> list[tuple[str, str]]:
    bad = detail(status, error_details_pb2.BadRequest)
    assert isinstance(bad, error_details_pb2.BadRequest)
    return [(v.field, v.description) for v in bad.field_violations]


def reason(status: status_pb2.Status) -> str:
    info = detail(status, error_details_pb2.ErrorInfo)
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert info.domain == "icefloe"
    return info.reason


def may_be_stored(status: status_pb2.Status) -> str | None:
    """The ErrorInfo's ``may_be_stored`` metadata (UNAVAILABLE only), else None."""
    info = detail(status, error_details_pb2.ErrorInfo)
    assert isinstance(info, error_details_pb2.ErrorInfo)
    return info.metadata.get("may_be_stored")


def retry_delay_s(status: status_pb2.Status) -> float | None:
    info = detail(status, error_details_pb2.RetryInfo)
    return None if info is None else info.retry_delay.ToTimedelta().total_seconds()


async def publish(port: int, req: ingest_pb2.PublishRequest,
                  metadata: tuple[tuple[str, str], ...] = ()) -> ingest_pb2.PublishResponse:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await ingest_pb2_grpc.IngestStub(channel).Publish(req, metadata=metadata,
                                                                  timeout=10)


async def refused(port: int, req: ingest_pb2.PublishRequest,
                  metadata: tuple[tuple[str, str], ...] = ()) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await publish(port, req, metadata)
    return info.value


async def publish_stream(port: int, requests: list[ingest_pb2.PublishRequest],
                         metadata: tuple[tuple[str, str], ...] = ()
                         ) -> list[ingest_pb2.PublishResponse]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = ingest_pb2_grpc.IngestStub(channel).PublishStream(iter(requests),
                                                                 metadata=metadata, timeout=20)
        return [response async for response in call]


# -- Publish ----------------------------------------------------------------------------------


async def test_should_ack_durable_events_with_ids_from_body_event_request_or_generated(
        tmp_path):
    url = (tmp_path / "store").as_uri()
    async with grpc_serving(make_config(tmp_path / "store")) as (_, served):
        first = await publish(served.port, request("pageviews", *views(3), request_id="req-1",
                                                   ids=("explicit",)))
        assert (first.accepted, first.request_id) == (3, "req-1")
        assert len((await read_manifest(url)).entries) == 1  # durable before the ack
        second = await publish(served.port, request("pageviews", *views(2, 3)))
        assert (second.accepted, second.request_id) == (2, "")
        orders = await publish(served.port, request(
            "orders", b'{"order_id":"o-1","amount":9.5}', b'{"order_id":"o-2"}',
            request_id="req-2", ids=("ignored", "ignored-too")), TOKEN)
        assert orders.accepted == 2
        single = await publish(served.port, request("pageviews", *views(1, 5),
                                                    request_id="solo"))
        assert single.accepted == 1
    events = await stored_events(url)
    assert [e.payload for e in events[:5]] == views(5)
    ids = [e.event_id for e in events]
    assert ids[:3] == ["explicit", "req-1:1", "req-1:2"]
    generated = ids[3:5]
    assert [event_id[-2:] for event_id in generated] == ["-0", "-1"]
    assert generated[0][:-2] == generated[1][:-2]  # one generated prefix per request
    assert ids[5:] == ["o-1", "o-2", "solo"]  # the body's id field wins over Event.event_id
    assert [e.stream for e in events] == ["pageviews"] * 5 + ["orders"] * 2 + ["pageviews"]


async def test_should_refuse_a_request_with_bad_events_listing_each_and_store_nothing(
        tmp_path):
    url = (tmp_path / "store").as_uri()
    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        exc = await refused(served.port, request(
            "pageviews", b'{"user_id":"ok"}', b'{"user_id":1}', b'{"user_id":"ok2"}',
            b'{"url":"x"}', b'{"user_id":"u","duration_ms":"long"}'))
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = rich(exc)
        assert reason(status) == "validation_failed"
        assert retry_delay_s(status) is None
        fields = violations(status)
        assert [field for field, _ in fields] == [
            "events[1].user_id", "events[3].user_id", "events[4].duration_ms"]
        assert all(description for _, description in fields)
        malformed = await refused(served.port, request("pageviews", b'{"user_id":"a"}',
                                                       b"{not json"))
        assert malformed.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason(rich(malformed)) == "invalid_json"
        assert [f for f, _ in violations(rich(malformed))] == ["events[1]"]
        empty = await refused(served.port, request("pageviews"))
        assert reason(rich(empty)) == "empty_body"
        rejected = runtime.metrics.events_rejected.labels("pageviews", "validation_failed")
        assert rejected._value.get() == 5
    assert (await read_manifest(url)).entries == ()


async def test_should_refuse_an_event_over_the_per_event_limit(tmp_path):
    config = make_config(tmp_path / "store", max_event_bytes=64)
    async with grpc_serving(config) as (_, served):
        big = b'{"user_id":"%s"}' % (b"x" * 100)
        exc = await refused(served.port, request("pageviews", b'{"user_id":"a"}', big))
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = rich(exc)
        assert reason(status) == "event_too_large"
        assert [f for f, _ in violations(status)] == ["events[1]"]


async def test_should_refuse_event_data_on_a_json_stream_naming_each_event(tmp_path):
    """``Event.data`` is for a typed stream: a JSON stream refuses an event that sets it,
    alone or beside ``json``, naming the event and the field (a typed stream refuses json
    and data together the same way) — even with ``on_invalid = "dead_letter"``, where
    dead-lettering it would keep an empty payload in place of the bytes sent."""
    url = (tmp_path / "store").as_uri()
    lenient = StreamConfig(name="lenient", table="web.lenient", on_invalid="dead_letter",
                           columns=PAGEVIEWS.columns)
    config = make_config(tmp_path / "store", (PAGEVIEWS, lenient))
    async with grpc_serving(config) as (runtime, served):
        for stream in ("pageviews", "lenient"):
            both = ingest_pb2.PublishRequest(stream=stream, events=[
                Event(json=b'{"user_id":"a"}'),
                Event(json=b'{"user_id":"b"}', data=b"\x08\x01")])
            exc = await refused(served.port, both)
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            status = rich(exc)
            assert reason(status) == "invalid_payload"
            assert status.message.startswith("event 1 sets data;"), status.message
            assert violations(status) == [
                ("events[1].data", "json and data both set; a JSON stream takes json only")]
            alone = ingest_pb2.PublishRequest(stream=stream, events=[
                Event(json=b'{"user_id":"a"}'), Event(data=b"\x08\x01"),
                Event(data=b"\x08\x02", event_id="e3")])
            exc = await refused(served.port, alone)
            assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
            status = rich(exc)
            assert reason(status) == "invalid_payload"
            assert violations(status) == [
                ("events[1].data", "data set; a JSON stream takes json"),
                ("events[2].data", "data set; a JSON stream takes json")]
        # what the stream does dead-letter: an invalid JSON event, kept as it was sent
        kept = await publish(served.port, request("lenient", b'{"user_id":"c"}',
                                                  b'{"user_id":1}'))
        assert (kept.accepted, kept.dead_lettered) == (1, 1)
        assert runtime.metrics.events_rejected.labels(
            "lenient", "invalid_payload")._value.get() == 5
    events = await stored_events(url)
    assert [(e.stream, e.payload) for e in events if e.stream == "lenient"] == [
        ("lenient", b'{"user_id":"c"}')]
    [dead] = [e for e in events if e.stream != "lenient"]
    assert b'"raw":"{\\"user_id\\":1}"' in dead.payload


@pytest.mark.parametrize(("stream", "metadata", "code", "error"), [
    ("nope", (), grpc.StatusCode.NOT_FOUND, "unknown_stream"),
    ("orders", (), grpc.StatusCode.UNAUTHENTICATED, "unauthenticated"),
    ("orders", (("authorization", "Basic s3cret-token"),), grpc.StatusCode.UNAUTHENTICATED,
     "unauthenticated"),
    ("orders", (("authorization", "Bearer wrong"),), grpc.StatusCode.PERMISSION_DENIED,
     "permission_denied"),
])
async def test_should_refuse_unknown_streams_and_bad_tokens(tmp_path, stream, metadata, code,
                                                            error):
    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        exc = await refused(served.port, request(stream, b'{"order_id":"o"}'), metadata)
        assert exc.code() == code
        assert reason(rich(exc)) == error
        label = stream if stream == "orders" else "-"  # bounded label cardinality
        counted = runtime.metrics.requests.labels("grpc", label, code.name)
        assert counted._value.get() == 1


async def test_should_answer_resource_exhausted_with_retry_info_when_the_buffer_is_full(
        tmp_path):
    first = request("pageviews", *views(1), request_id="a")
    second = request("pageviews", *views(2, 1), request_id="b")
    size = [len(frame_events("pageviews", 0, [r.request_id] * len(r.events),
                             [e.json for e in r.events])) for r in (first, second)]
    store, faulty = faulty_local_store(tmp_path / "store", [FaultRule(
        "delay", ops=frozenset({"put"}), key_prefix="batches/", times=1,
        delay_s=(0.5, 0.5))])
    config = make_config(tmp_path / "store", buffer_max_bytes=max(size) + min(size) // 2,
                         retry_after_s=3)
    async with grpc_serving(config, store, probe=False) as (_, served):
        slow = asyncio.create_task(publish(served.port, first))
        while not faulty.injected["delay"]:  # the first request is being flushed
            await asyncio.sleep(0.005)
        exc = await refused(served.port, second)
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status = rich(exc)
        assert reason(status) == "buffer_full"
        assert retry_delay_s(status) == 3
        assert (await slow).accepted == 1
        assert (await publish(served.port, second)).accepted == 2  # room again
    assert [e.event_id for e in await stored_events(store.url)] == ["a", "b:0", "b:1"]


async def test_should_answer_unavailable_and_ack_nothing_when_the_store_is_down(tmp_path):
    store, faulty = faulty_local_store(tmp_path / "store", [
        FaultRule("fail", ops=frozenset({"put"}), times=None)], ONE_TRY)
    async with grpc_serving(make_config(tmp_path / "store"), store, probe=False) as (
            runtime, served):
        exc = await refused(served.port, request("pageviews", *views(2), request_id="r"))
        assert exc.code() == grpc.StatusCode.UNAVAILABLE
        status = rich(exc)
        assert reason(status) == "store_unavailable"
        assert may_be_stored(status) == "false"  # every write was refused
        assert retry_delay_s(status) == 1
        assert runtime.metrics.events_accepted.labels("pageviews")._value.get() == 0
        assert faulty.injected["fail"] >= 1
    assert (await read_manifest(store.url)).entries == ()


async def test_should_say_unavailable_may_be_stored_when_the_manifest_write_may_have_landed(
        tmp_path):
    """The manifest append is applied, its answer lost, and every retry and read-back
    fails: UNAVAILABLE with ``may_be_stored = "true"`` in the ErrorInfo, as the HTTP 503
    body says it -- and the events are in the manifest."""
    lost = FaultRule("lose_response", ops=frozenset({"put"}), key_prefix="manifest")
    down = FaultRule("fail", ops=frozenset({"put", "get"}), key_prefix="manifest",
                     times=None, skip=1)  # not the first put: that one is lost instead
    store, faulty = faulty_local_store(tmp_path / "store", [], ONE_TRY)
    async with grpc_serving(make_config(tmp_path / "store"), store, probe=False) as (
            _, served):
        # a first request: the producer knows its shard and its last write (no reads)
        assert (await publish(served.port, request("pageviews", *views(1)))).accepted == 1
        faulty.rules += [lost, down]
        exc = await refused(served.port, request("pageviews", *views(2), request_id="r"))
        assert exc.code() == grpc.StatusCode.UNAVAILABLE
        status = rich(exc)
        assert (reason(status), may_be_stored(status)) == ("store_unavailable", "true")
        assert lost.fired == 1
    assert len((await read_manifest(store.url)).entries) == 2


async def test_should_keep_the_trailer_small_when_a_request_has_many_bad_events(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store")) as (_, served):
        bad = [b'{"user_id":%d,"url":"%s"}' % (i, b"x" * 50) for i in range(300)]
        exc = await refused(served.port, request("pageviews", *bad))
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT  # not a metadata-size error
        fields = violations(rich(exc))
        assert 10 < len(fields) < 100
        assert fields[0][0] == "events[0].user_id"
        assert fields[-1][0] == "events"
        assert "more violation(s)" in fields[-1][1]


def test_should_map_every_detail_of_an_ingest_error_into_the_status():
    error = BadRequest("two bad", details=[{"index": 0, "field": None, "reason": "r0"},
                                           {"index": 7, "field": "a.b", "reason": "r7"}])
    status = error_status(error, retry_after_s=2)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert violations(status) == [("events[0]", "r0"), ("events[7].a.b", "r7")]
    assert retry_delay_s(status) is None  # no retry hint on a client error


# -- PublishStream ----------------------------------------------------------------------------


async def test_should_ack_a_stream_in_request_order_with_pipelined_group_commits(tmp_path):
    store, _ = faulty_local_store(tmp_path / "store", [FaultRule(
        "delay", ops=frozenset({"put"}), key_prefix="batches/", times=None,
        delay_s=(0.05, 0.05))])
    requests = [request("pageviews", *views(3, 3 * i), request_id=f"r{i}") for i in range(60)]
    async with grpc_serving(make_config(tmp_path / "store"), store, probe=False) as (
            _, served):
        loop = asyncio.get_running_loop()
        started = loop.time()
        responses = await publish_stream(served.port, requests)
        elapsed = loop.time() - started
    assert [(r.request_id, r.accepted, r.HasField("error")) for r in responses] == [
        (f"r{i}", 3, False) for i in range(60)]
    entries = (await read_manifest(store.url)).entries
    assert len(entries) <= 10  # requests rode shared flushes, not one 50 ms PUT each
    assert elapsed < 60 * 0.05 / 2
    events = await stored_events(store.url)
    assert [e.payload for e in events] == views(180)
    assert [e.event_id for e in events][:4] == ["r0:0", "r0:1", "r0:2", "r1:0"]


async def test_should_answer_bad_requests_in_a_stream_and_go_on(tmp_path):
    good = [request("pageviews", *views(2, 2 * i), request_id=f"ok{i}") for i in range(4)]
    requests = [good[0],
                request("pageviews", b'{"user_id":"a"}', b'{"user_id":2}', request_id="bad"),
                good[1],
                request("nope", b"{}", request_id="lost"),
                request("orders", b'{"order_id":"o"}', request_id="auth"),
                good[2],
                request("pageviews", request_id="empty"),
                good[3]]
    async with grpc_serving(make_config(tmp_path / "store"), max_inflight=2) as (_, served):
        responses = await publish_stream(served.port, requests)
    assert [r.request_id for r in responses] == [r.request_id for r in requests]
    assert [r.accepted for r in responses] == [2, 0, 2, 0, 0, 2, 0, 2]
    errors = {r.request_id: r.error for r in responses if r.HasField("error")}
    assert {k: (s.code, reason(s)) for k, s in errors.items()} == {
        "bad": (grpc.StatusCode.INVALID_ARGUMENT.value[0], "validation_failed"),
        "lost": (grpc.StatusCode.NOT_FOUND.value[0], "unknown_stream"),
        "auth": (grpc.StatusCode.UNAUTHENTICATED.value[0], "unauthenticated"),
        "empty": (grpc.StatusCode.INVALID_ARGUMENT.value[0], "empty_body"),
    }
    assert [f for f, _ in violations(errors["bad"])] == ["events[1].user_id"]
    events = await stored_events((tmp_path / "store").as_uri())
    assert [e.event_id for e in events] == [f"ok{i}:{j}" for i in range(4) for j in range(2)]


async def test_should_report_backpressure_inside_a_stream_with_retry_info(tmp_path):
    store, _ = faulty_local_store(tmp_path / "store", [
        FaultRule("fail", ops=frozenset({"put"}), key_prefix="batches/", times=1)], NO_RETRY)
    config = make_config(tmp_path / "store")
    async with grpc_serving(config, store, probe=False) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        call = ingest_pb2_grpc.IngestStub(channel).PublishStream(timeout=10)
        await call.write(request("pageviews", *views(1), request_id="first"))
        first = await call.read()
        await call.write(request("pageviews", *views(1), request_id="first"))  # the retry
        again = await call.read()
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    assert first.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert (first.accepted, reason(first.error), retry_delay_s(first.error)) == (
        0, "store_unavailable", 1)
    assert (again.accepted, again.request_id, again.HasField("error")) == (1, "first", False)
    assert [e.event_id for e in await stored_events(store.url)] == ["first"]


async def test_should_send_tokens_once_per_stream(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store")) as (_, served):
        responses = await publish_stream(served.port, [
            request("orders", b'{"order_id":"o%d"}' % i) for i in range(5)], TOKEN)
    assert [r.accepted for r in responses] == [1] * 5


async def test_should_end_streams_with_unavailable_on_graceful_shutdown(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store")) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        call = stub.PublishStream(timeout=10)
        for i in range(3):
            await call.write(request("pageviews", *views(1, i), request_id=f"r{i}"))
        answered = [await call.read() for _ in range(3)]
        await served.health.enter_graceful_shutdown()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
        later = stub.PublishStream(timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as refused_stream:
            await later.read()
        unary = await publish(served.port, request("pageviews", *views(1, 3)))
    assert [(r.request_id, r.accepted) for r in answered] == [(f"r{i}", 1) for i in range(3)]
    for exc in (ended.value, refused_stream.value):
        assert exc.code() == grpc.StatusCode.UNAVAILABLE
        assert reason(rich(exc)) == "shutting_down"
        assert retry_delay_s(rich(exc)) == 1
    assert unary.accepted == 1  # unary calls still finish within the grace period


# -- health, reflection, binding --------------------------------------------------------------


async def test_should_report_serving_until_graceful_shutdown(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store")) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        await served.health.enter_graceful_shutdown()
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_should_list_the_ingest_service_through_reflection(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store")) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter([
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="icefloe.v1.Ingest")]))
        listed, described = [answer async for answer in call]
    names = {s.name for s in listed.list_services_response.service}
    assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names
    assert described.file_descriptor_response.file_descriptor_proto


async def test_should_refuse_a_grpc_port_already_in_use(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store",
                                        streams=(PAGEVIEWS,))) as (runtime, served):
        with pytest.raises(ConfigError, match=f"gRPC port {served.port} on 127.0.0.1 is "
                                              "already in use"):
            await start_grpc_server(runtime, "127.0.0.1", served.port)
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            with pytest.raises(ConfigError, match=f"gRPC port {port} .* already in use"):
                await start_grpc_server(runtime, "127.0.0.1", port)
        # the first server is untouched and still the only one answering
        assert (await publish(served.port, request("pageviews", *views(1)))).accepted == 1
