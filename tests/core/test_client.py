"""``icefloe.client`` against real servers: safe retries, typed refusals, streams."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import threading
import time
from typing import Any

import grpc
import pytest
from ingest_support import (
    faulty_local_store,
    grpc_serving,
    http_serving,
    make_config,
    read_manifest,
    stored_events,
)

from icefloe.client import (
    AsyncGrpcClient,
    AsyncHttpClient,
    Backoff,
    GrpcClient,
    HttpClient,
    IngestRejected,
    response_error,
)
from icefloe.client.grpc import _rpc_rejected
from icefloe.client.http import retry_after
from icefloe.formats.envelope import frame_events
from icefloe.store.faults import FaultRule
from icefloe.store.retry import RetryPolicy
from icefloe.v1 import ingest_pb2
from ingestor.grpc_app import start_grpc_server

FAST = Backoff(base_s=0.01, max_s=0.05)
NO_RETRY = RetryPolicy(max_attempts=1)
TOKEN = "s3cret-token"


def failing_batches(tmp_path, times: int | None):
    """A store whose first ``times`` batch PUTs fail, with no retry inside the ingestor."""
    return faulty_local_store(tmp_path / "store", [FaultRule(
        "fail", ops=frozenset({"put"}), key_prefix="batches/", times=times)], NO_RETRY)


def views(n: int, start: int = 0) -> list[dict[str, str]]:
    return [{"user_id": f"u{i}"} for i in range(start, start + n)]


def payloads(n: int, start: int = 0) -> list[bytes]:
    return [b'{"user_id":"u%d"}' % i for i in range(start, start + n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- gRPC -------------------------------------------------------------------------------------


async def test_should_retry_publish_through_unavailable_and_store_the_events_once(tmp_path):
    store, faulty = failing_batches(tmp_path, times=2)
    config = make_config(tmp_path / "store", retry_after_s=0)
    async with grpc_serving(config, store, probe=False) as (_, served):
        with GrpcClient(f"127.0.0.1:{served.port}", backoff=FAST) as client:
            assert await asyncio.to_thread(client.publish, "pageviews", views(3)) == 3
            assert await asyncio.to_thread(client.publish, "pageviews",
                                           [b'{"user_id":"u3"}'], "mine") == 1
    assert faulty.injected["fail"] == 2  # two refused attempts, then success
    events = await stored_events(store.url)
    assert [e.payload for e in events] == payloads(4)
    key = events[0].event_id.rsplit(":", 1)[0]  # one generated key for all three attempts
    assert [e.event_id for e in events] == [f"{key}:0", f"{key}:1", f"{key}:2", "mine"]


async def test_should_raise_a_refusal_at_once_with_its_details(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        with GrpcClient(f"127.0.0.1:{served.port}", backoff=FAST) as client:
            with pytest.raises(IngestRejected) as bad:
                await asyncio.to_thread(client.publish, "pageviews",
                                        [{"user_id": "ok"}, {"user_id": 5}])
            with pytest.raises(IngestRejected) as denied:
                await asyncio.to_thread(client.publish, "orders", [{"order_id": "o"}])
        with GrpcClient(f"127.0.0.1:{served.port}", token=TOKEN) as client:
            assert await asyncio.to_thread(client.publish, "orders", [{"order_id": "o"}]) == 1
        refusals = runtime.metrics.requests.labels("grpc", "pageviews", "INVALID_ARGUMENT")
        assert refusals._value.get() == 1  # sent once: never retried
    error = bad.value
    assert (error.status, error.code, error.retryable, error.attempts) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_failed", False, 1)
    assert [(d["index"], d["field"]) for d in error.details] == [(1, "user_id")]
    assert denied.value.status == grpc.StatusCode.UNAUTHENTICATED
    assert denied.value.code == "unauthenticated"


async def test_should_give_up_after_the_retries_with_the_last_answer(tmp_path):
    store, faulty = failing_batches(tmp_path, times=None)
    config = make_config(tmp_path / "store", retry_after_s=0)
    async with grpc_serving(config, store, probe=False) as (_, served):
        with GrpcClient(f"127.0.0.1:{served.port}", retries=2, backoff=FAST) as client, \
                pytest.raises(IngestRejected) as info:
            await asyncio.to_thread(client.publish, "pageviews", views(1))
    assert (info.value.code, info.value.retryable, info.value.attempts) == (
        "store_unavailable", True, 3)
    assert info.value.may_be_stored is False  # every batch write was refused outright
    assert faulty.injected["fail"] == 3
    assert (await read_manifest(store.url)).entries == ()


def manifest_answer_lost(tmp_path):
    """A store that applies the next manifest write but loses its answer (that flush may
    have landed), then refuses every batch write outright (those flushes did not)."""
    store, faulty = faulty_local_store(tmp_path / "store", [], NO_RETRY)

    async def refuse_batches_from_now_on() -> None:
        faulty.add(FaultRule("fail", ops=frozenset({"put"}), key_prefix="batches/",
                             times=None))

    lost = FaultRule("lose_response", ops=frozenset({"put"}), key_prefix="manifest",
                     on_fire=refuse_batches_from_now_on)
    return store, faulty, lost


@pytest.mark.parametrize("front", ["grpc", "http"])
async def test_should_say_the_events_may_be_stored_when_any_attempt_said_so(tmp_path, front):
    """The first attempt's flush may have landed (the server says so), the retry is refused
    outright (the server says it was not stored): the client's final refusal still says
    ``may_be_stored`` -- and the events are in the manifest once, under the call's key."""
    store, faulty, lost = manifest_answer_lost(tmp_path)
    config = make_config(tmp_path / "store", retry_after_s=0)
    async with grpc_serving(config, store, probe=False) as (runtime, served), \
            http_serving(runtime) as url:
        if front == "grpc":
            async with AsyncGrpcClient(f"127.0.0.1:{served.port}", retries=1,
                                       backoff=FAST) as client:
                assert await client.publish("pageviews", views(1)) == 1  # warm: no reads
                faulty.add(lost)
                with pytest.raises(IngestRejected) as info:
                    await client.publish("pageviews", views(1, 1), "k")
        else:
            async with AsyncHttpClient(url, retries=1, backoff=FAST) as client:
                assert await client.send("pageviews", views(1)) == 1
                faulty.add(lost)
                with pytest.raises(IngestRejected) as info:
                    await client.send("pageviews", views(1, 1), "k")
    assert (info.value.code, info.value.attempts) == ("store_unavailable", 2)
    assert "injected fail on put 'batches/" in info.value.message  # the last answer: clean
    assert info.value.may_be_stored is True
    assert lost.fired == 1
    assert [e.event_id for e in await stored_events(store.url)][1:] == ["k"]


async def test_should_wait_out_a_full_buffer(tmp_path):
    store, faulty = faulty_local_store(tmp_path / "store", [FaultRule(
        "delay", ops=frozenset({"put"}), key_prefix="batches/", times=1,
        delay_s=(0.3, 0.3))])
    one = len(frame_events("pageviews", 0, ["a"], payloads(1)))  # room for one request
    config = make_config(tmp_path / "store", buffer_max_bytes=one + one // 2, retry_after_s=0)
    async with grpc_serving(config, store, probe=False) as (runtime, served):
        async with AsyncGrpcClient(f"127.0.0.1:{served.port}", retries=20,
                                   backoff=Backoff(0.02, 0.1)) as client:
            first = asyncio.create_task(client.publish("pageviews", views(1), "a"))
            while not faulty.injected["delay"]:
                await asyncio.sleep(0.005)
            assert await client.publish("pageviews", views(1, 1), "b") == 1
            assert await first == 1
        full = runtime.metrics.requests.labels("grpc", "pageviews", "RESOURCE_EXHAUSTED")
        assert full._value.get() >= 1
    assert [e.event_id for e in await stored_events(store.url)] == ["a", "b"]


async def test_should_not_retry_resource_exhausted_without_retry_info(tmp_path):
    config = make_config(tmp_path / "store", max_body_bytes=1000)
    async with grpc_serving(config) as (_, served):
        with GrpcClient(f"127.0.0.1:{served.port}", backoff=FAST) as client, \
                pytest.raises(IngestRejected) as info:
            await asyncio.to_thread(client.publish, "pageviews", views(100))
    assert info.value.status == grpc.StatusCode.RESOURCE_EXHAUSTED  # message over the limit
    assert (info.value.retryable, info.value.attempts) == (False, 1)


async def test_should_stream_in_order_and_hand_back_refusals(tmp_path):
    requests = [ingest_pb2.PublishRequest(stream="pageviews", events=[
        ingest_pb2.Event(json=p) for p in payloads(2, 2 * i)]) for i in range(10)]
    requests[4] = ingest_pb2.PublishRequest(stream="pageviews", request_id="bad",
                                            events=[ingest_pb2.Event(json=b'{"user_id":4}')])
    async with grpc_serving(make_config(tmp_path / "store")) as (_, served):
        with GrpcClient(f"127.0.0.1:{served.port}") as client:
            responses = await asyncio.to_thread(
                lambda: list(client.publish_stream(iter(requests))))
    assert [r.accepted for r in responses] == [2] * 4 + [0] + [2] * 5
    assert all(r.request_id for r in responses)  # a fresh id for every request without one
    assert responses[4].request_id == "bad"
    refusal = response_error(responses[4])
    assert refusal is not None
    assert (refusal.status, refusal.code, refusal.retryable) == (
        grpc.StatusCode.INVALID_ARGUMENT, "validation_failed", False)
    assert [(d["index"], d["field"]) for d in refusal.details] == [(0, "user_id")]
    assert [response_error(r) for r in responses if r.request_id != "bad"] == [None] * 9
    events = await stored_events((tmp_path / "store").as_uri())
    assert [e.payload for e in events] == [p for i, p in enumerate(payloads(20))
                                           if i // 2 != 4]
    by_request = {r.request_id for r in responses} - {"bad"}
    assert {e.event_id.rsplit(":", 1)[0] for e in events} == by_request


async def restart_after(runtime: Any, served: Any, responses: list[Any], count: int,
                        gate: asyncio.Event | threading.Event) -> Any:
    """Once ``count`` responses are in, stop the gRPC server (the client's stream breaks:
    UNAVAILABLE), serve again on the same port and let the source go on; the new server."""
    while len(responses) < count:
        await asyncio.sleep(0.005)
    await served.server.stop(None)
    replacement = await start_grpc_server(runtime, "127.0.0.1", served.port)
    gate.set()
    return replacement


async def test_should_resume_a_broken_stream_resending_what_was_not_acked(tmp_path):
    gate = threading.Event()

    def source():
        for i in range(10):
            if i == 5:
                gate.wait(10)  # the rest only once the server was replaced
            yield ingest_pb2.PublishRequest(stream="pageviews", events=[
                ingest_pb2.Event(json=payloads(1, i)[0])])

    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        client = GrpcClient(f"127.0.0.1:{served.port}", backoff=FAST, retries=20)
        responses: list[ingest_pb2.PublishResponse] = []

        def consume() -> None:
            for response in client.publish_stream(source()):
                responses.append(response)

        consumer = asyncio.create_task(asyncio.to_thread(consume))
        replacement = await restart_after(runtime, served, responses, 5, gate)
        try:
            await asyncio.wait_for(consumer, 15)
        finally:
            client.close()
            await replacement.server.stop(None)
    assert [r.accepted for r in responses] == [1] * 10  # the last 5 from the new server
    assert len({r.request_id for r in responses}) == 10
    stored = {(e.event_id, e.payload) for e in await stored_events(
        (tmp_path / "store").as_uri())}
    # every event at least once, and a resent one always under the same id
    assert stored == {(r.request_id, p) for r, p in zip(responses, payloads(10), strict=True)}


async def test_should_resume_a_broken_stream_with_the_async_client(tmp_path):
    gate = asyncio.Event()

    async def source():
        for i in range(6):
            if i == 3:
                await gate.wait()
            yield ingest_pb2.PublishRequest(stream="pageviews", request_id=f"r{i}", events=[
                ingest_pb2.Event(json=payloads(1, i)[0])])

    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, served):
        responses: list[ingest_pb2.PublishResponse] = []

        async def consume() -> None:
            async with AsyncGrpcClient(f"127.0.0.1:{served.port}", backoff=FAST,
                                       retries=20) as client:
                async for response in client.publish_stream(source()):
                    responses.append(response)

        consumer = asyncio.create_task(consume())
        replacement = await restart_after(runtime, served, responses, 3, gate)
        try:
            await asyncio.wait_for(consumer, 15)
        finally:
            await replacement.server.stop(None)
    assert [(r.request_id, r.accepted) for r in responses] == [(f"r{i}", 1) for i in range(6)]
    stored = {(e.event_id, e.payload) for e in await stored_events(
        (tmp_path / "store").as_uri())}
    assert stored == {(f"r{i}", p) for i, p in enumerate(payloads(6))}


async def test_should_raise_the_sources_error_after_answering_what_was_sent(tmp_path):
    def source():
        yield ingest_pb2.PublishRequest(stream="pageviews", events=[
            ingest_pb2.Event(json=payloads(1)[0])])
        raise KeyError("source broke")

    async with grpc_serving(make_config(tmp_path / "store")) as (_, served):
        with GrpcClient(f"127.0.0.1:{served.port}") as client:
            responses: list[ingest_pb2.PublishResponse] = []
            with pytest.raises(KeyError, match="source broke"):
                await asyncio.to_thread(lambda: responses.extend(
                    client.publish_stream(source())))
        async with AsyncGrpcClient(f"127.0.0.1:{served.port}") as aclient:
            async def asource():
                yield ingest_pb2.PublishRequest(stream="pageviews", events=[
                    ingest_pb2.Event(json=payloads(1, 1)[0])])
                raise KeyError("async source broke")

            answered: list[ingest_pb2.PublishResponse] = []

            async def collect() -> None:
                async for response in aclient.publish_stream(asource()):
                    answered.append(response)

            with pytest.raises(KeyError, match="async source broke"):
                await collect()
    assert [r.accepted for r in responses] == [1]
    assert [r.accepted for r in answered] == [1]


async def test_should_stream_and_retry_with_the_async_client(tmp_path):
    store, faulty = failing_batches(tmp_path, times=1)
    config = make_config(tmp_path / "store", retry_after_s=0)

    async def requests():
        for i in range(5):
            yield ingest_pb2.PublishRequest(stream="pageviews", request_id=f"s{i}",
                                            events=[ingest_pb2.Event(json=payloads(1, 2 + i)[0])])

    async with grpc_serving(config, store, probe=False) as (_, served), \
            AsyncGrpcClient(f"127.0.0.1:{served.port}", backoff=FAST) as client:
        assert await client.publish("pageviews", views(2), "k") == 2  # after one retry
        got = [r async for r in client.publish_stream(requests())]
    assert [(r.request_id, r.accepted) for r in got] == [(f"s{i}", 1) for i in range(5)]
    assert faulty.injected["fail"] == 1
    events = await stored_events(store.url)
    assert [e.event_id for e in events] == ["k:0", "k:1"] + [f"s{i}" for i in range(5)]


# -- HTTP -------------------------------------------------------------------------------------


async def test_should_retry_an_http_send_through_a_503_and_store_the_events_once(tmp_path):
    store, faulty = failing_batches(tmp_path, times=1)
    async with grpc_serving(make_config(tmp_path / "store"), store, probe=False) as (
            runtime, _), http_serving(runtime) as url:
        with HttpClient(url, backoff=FAST) as client:
            started = time.monotonic()
            sent = await asyncio.to_thread(client.send, "pageviews",
                                           [*views(2), b'{"user_id":"u2"}'])
            waited = time.monotonic() - started
        assert runtime.metrics.requests.labels("http", "pageviews", "503")._value.get() == 1
    assert sent == 3
    assert faulty.injected["fail"] == 1
    assert waited >= 1.0  # Retry-After: 1 was honoured
    events = await stored_events(store.url)
    assert [e.payload for e in events] == payloads(3)
    key = events[0].event_id.rsplit(":", 1)[0]
    assert [e.event_id for e in events] == [f"{key}:{i}" for i in range(3)]


async def test_should_raise_http_refusals_at_once(tmp_path):
    async with grpc_serving(make_config(tmp_path / "store")) as (runtime, _), \
            http_serving(runtime) as url:
        with HttpClient(url, backoff=FAST) as client:
            with pytest.raises(IngestRejected) as bad:
                await asyncio.to_thread(client.send, "pageviews",
                                        [{"user_id": "a"}, {"url": "no user"}], "key-1")
            with pytest.raises(IngestRejected) as missing:
                await asyncio.to_thread(client.send, "nope", views(1))
            with pytest.raises(IngestRejected) as unauthenticated:
                await asyncio.to_thread(client.send, "orders", [{"order_id": "o"}])
        async with AsyncHttpClient(url, token=TOKEN, backoff=FAST) as aclient:
            assert await aclient.send("orders", [{"order_id": "o-1"}], "k") == 1
        assert runtime.metrics.requests.labels("http", "pageviews", "400")._value.get() == 1
    assert (bad.value.status, bad.value.code, bad.value.retryable, bad.value.attempts) == (
        400, "validation_failed", False, 1)
    assert [(d["index"], d["field"]) for d in bad.value.details] == [(1, "user_id")]
    assert (missing.value.status, missing.value.code) == (404, "unknown_stream")
    assert (unauthenticated.value.status, unauthenticated.value.code) == (
        401, "unauthenticated")
    assert [e.event_id for e in await stored_events((tmp_path / "store").as_uri())] == ["o-1"]


def test_should_retry_connection_failures_then_raise_typed():
    port = free_port()  # nothing listens here
    with HttpClient(f"http://127.0.0.1:{port}", retries=2, backoff=FAST) as client, \
            pytest.raises(IngestRejected) as http_info:
        client.send("pageviews", views(1))
    assert (http_info.value.status, http_info.value.code, http_info.value.retryable,
            http_info.value.attempts) == (None, "connection_failed", True, 3)
    assert http_info.value.may_be_stored is False  # never connected: nothing was sent
    with GrpcClient(f"127.0.0.1:{port}", retries=1, timeout=2, backoff=FAST) as client, \
            pytest.raises(IngestRejected) as grpc_info:
        client.publish("pageviews", views(1))
    assert (grpc_info.value.status, grpc_info.value.retryable, grpc_info.value.attempts) == (
        grpc.StatusCode.UNAVAILABLE, True, 2)
    assert grpc_info.value.may_be_stored is False, grpc_info.value.message


# -- pieces -----------------------------------------------------------------------------------


def test_should_never_retry_sooner_than_the_server_asks():
    backoff = Backoff(base_s=0.1, max_s=1.0)
    for retry in range(1, 8):
        assert 0 <= backoff.delay(retry) <= min(1.0, 0.1 * 2 ** (retry - 1))
        assert 2.0 <= backoff.delay(retry, 2.0) <= 2.4
    assert backoff.delay(1, 3600) <= 72  # an absurd hint is capped at a minute (+ jitter)


def test_should_read_retry_after_as_seconds_or_a_date():
    assert retry_after("3") == 3
    assert retry_after(None) is None
    assert retry_after("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < (retry_after(later) or 0) <= 30


class _Broken(grpc.RpcError):
    """What grpc.aio raises for a call: its code, details and trailing metadata."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_should_retry_grpc_cores_own_internal_error_but_not_the_servers():
    """A connection broken under a stream surfaced once as INTERNAL "Internal error from
    Core" (grpc core's words, no status details): a transport failure, retried like
    UNAVAILABLE; an INTERNAL the server answered (its own message) is not retried."""
    broken = _rpc_rejected(_Broken(grpc.StatusCode.INTERNAL, "Internal error from Core"))
    assert broken.retryable
    assert broken.code == "transport_broken"
    served = _rpc_rejected(_Broken(grpc.StatusCode.INTERNAL,
                                   "internal error; the ingestor logged it"))
    assert not served.retryable
