"""Bad OTLP input and refusals (issue #41): the precise answer, nothing stored, the process up.

Every refusal is answered as the OTLP specification says an exporter understands it: on
OTLP/HTTP a status code (400 malformed, never retried; 401/403 token; 404 path; 405; 413
oversize; 415 type or encoding; 429/503 with ``Retry-After``, retried) and a
``google.rpc.Status`` body in the request's encoding; on OTLP/gRPC the status code with
``RetryInfo`` where a retry helps. After each refusal the store holds nothing, and a good
export right after is accepted.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status
from ingest_support import TOKEN, make_config
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from otlp_support import otlp_config, stored_rows
from security_support import ingestor

from icefloe.config import Config, RateLimit
from icefloe.store.failpoints import FAULTS_ENV

LOGS_EXPORT = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
PROTOBUF = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
OTHER_TOKEN = "another-token"


def logs_request(user: str = "zoë", records: int = 1) -> bytes:
    request = logs_service_pb2.ExportLogsServiceRequest()
    scope = request.resource_logs.add().scope_logs.add()
    for i in range(records):
        record = scope.log_records.add(time_unix_nano=1764680000000000000 + i)
        record.body.string_value = f"record {i}"
        record.attributes.add(key="user").value.string_value = user
    return request.SerializeToString()


GOOD = logs_request()
INVALID_UTF8 = GOOD.replace("zoë".encode(), b"zo\xff\xfe")


def status_of(answer: httpx.Response) -> status_pb2.Status:
    """The ``google.rpc.Status`` body, decoded from the answer's own content type."""
    if answer.headers["content-type"] == "application/json":
        body = answer.json()
        return status_pb2.Status(code=body["code"], message=body["message"])
    assert answer.headers["content-type"] == "application/x-protobuf"
    return status_pb2.Status.FromString(answer.content)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return otlp_config(tmp_path / "store", max_body_bytes=64 * 1024)


async def refused(config, ports, path: str, body: bytes, headers: dict[str, str],
                  method: str = "POST") -> httpx.Response:
    """POST (or ``method``) once; then check that nothing was stored and that a good export
    is still accepted (the process is up, the refusal left no state behind)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports.http}") as client:
        answer = await client.request(method, path, content=body, headers=headers)
        assert await stored_rows(config) == {}
        good = await client.post("/v1/logs", content=GOOD, headers=PROTOBUF)
        assert good.status_code == 200, good.text
    return answer


BOMB = gzip.compress(b"\x00" * (10 * 1024 * 1024))
"""10 MiB of zeros in ~10 KiB: over the 64 KiB limit only once inflated."""
BAD_HEX = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
    {"traceId": "not-hex", "body": {"stringValue": "x"}}]}]}]}).encode()


def json_logs(**record: object) -> bytes:
    return json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"body": {"stringValue": "x"}, **record}]}]}]}).encode()


def json_span(**span: object) -> bytes:
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
         "name": "x", **span}]}]}]}).encode()


@pytest.mark.parametrize(("path", "body", "headers", "status", "code", "words"), [
    ("/v1/logs", b"\x0a\xff\xff\xff", PROTOBUF, 400, 3, "not a valid OTLP"),
    ("/v1/logs", INVALID_UTF8, PROTOBUF, 400, 3, "UTF-8"),
    ("/v1/logs", b'{"resourceLogs": [', JSON, 400, 3, "not valid JSON"),
    ("/v1/logs", BAD_HEX, JSON, 400, 3, "'not-hex' is not a hex string"),
    ("/v1/logs", json_logs(traceId="5b8efff7"), JSON, 400, 3,
     "'5b8efff7' is not 32 hex digits"),
    ("/v1/logs", json_logs(spanId="eee19b7e c3c1b174"), JSON, 400, 3,
     "is not 16 hex digits"),
    ("/v1/logs", b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": '
                 b'{"stringValue": "\\ud800x"}}]}]}]}', JSON, 400, 3,
     "without its pair (a lone UTF-16 surrogate)"),
    ("/v1/logs", json_logs(severityNumber="ERROR"), JSON, 400, 3,
     "severityNumber: 'ERROR' is not a SeverityNumber"),
    ("/v1/traces", json_span(kind="SERVER"), JSON, 400, 3, "kind: 'SERVER' is not a SpanKind"),
    ("/v1/traces", json_span(status={"code": "ERROR"}), JSON, 400, 3,
     "status.code: 'ERROR' is not a StatusCode"),
    ("/v1/profiles", GOOD, PROTOBUF, 404, 12, "no route POST /v1/profiles"),
    ("/v1/logs", b"x" * (64 * 1024 + 1), PROTOBUF, 413, 3, "65536-byte limit"),
    ("/v1/logs", BOMB, {**PROTOBUF, "Content-Encoding": "gzip"}, 413, 3,
     "decompressed body exceeds the 65536-byte limit"),
    ("/v1/logs", GOOD, {**PROTOBUF, "Content-Type": "text/plain"}, 415, 3,
     "send application/x-protobuf or application/json"),
    ("/v1/logs", GOOD, {**PROTOBUF, "Content-Encoding": "br"}, 415, 3, "'br' is not supported"),
    ("/v1/logs", GOOD, {"Content-Type": "application/x-protobuf"}, 401, 16, "token"),
    ("/v1/logs", GOOD, {**PROTOBUF, "Authorization": f"Bearer {OTHER_TOKEN}"}, 403, 7, ""),
], ids=["malformed-protobuf", "invalid-utf8", "bad-json", "bad-hex-id", "short-trace-id",
        "spaced-span-id", "lone-surrogate", "severity-short-name", "kind-short-name",
        "status-short-name", "unknown-path",
        "oversize", "gzip-bomb", "content-type", "encoding", "no-token", "wrong-token"])
async def test_should_refuse_bad_http_exports_precisely(config, path, body, headers, status,
                                                        code, words):
    async with ingestor(config) as ports:
        answer = await refused(config, ports, path, body, headers)
    assert answer.status_code == status, answer.text
    found = status_of(answer)
    assert found.code == code
    assert words in found.message
    assert "retry-after" not in answer.headers


async def test_should_answer_405_with_allow_and_json_status(config):
    async with ingestor(config) as ports:
        answer = await refused(config, ports, "/v1/traces", b"", JSON, method="GET")
    assert answer.status_code == 405
    assert answer.headers["allow"] == "OPTIONS, POST"
    assert "POSTed" in answer.json()["message"]


async def test_should_answer_404_when_otlp_is_off(tmp_path):
    config = make_config(tmp_path / "store")
    async with ingestor(config) as ports, httpx.AsyncClient() as client:
        answer = await client.post(f"http://127.0.0.1:{ports.http}/v1/logs", content=GOOD,
                                   headers=PROTOBUF)
    assert answer.status_code == 404
    assert "[otlp] enabled = true" in status_of(answer).message


async def test_should_answer_429_with_retry_after_over_the_rate_limit(tmp_path):
    config = otlp_config(tmp_path / "store",
                         otlp={"rate_limit": RateLimit(events_per_s=0.01, burst_s=100)})
    async with ingestor(config) as ports, httpx.AsyncClient() as client:
        url = f"http://127.0.0.1:{ports.http}/v1/logs"
        first = await client.post(url, content=logs_request(), headers=PROTOBUF)
        second = await client.post(url, content=logs_request(records=2), headers=PROTOBUF)
    assert first.status_code == 200
    assert second.status_code == 429
    assert int(second.headers["retry-after"]) >= 1
    assert status_of(second).code == 8  # RESOURCE_EXHAUSTED
    assert len((await stored_rows(config))["otlp.logs"]) == 1


@pytest.fixture
def store_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A faults file the ingestor's store reads (every put fails while it holds a rule)."""
    faults = tmp_path / "faults.json"
    faults.write_text("{}")
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    return faults


async def test_should_answer_503_with_retry_after_when_the_store_is_down(tmp_path, store_down):
    config = otlp_config(tmp_path / "store", flush_timeout_s=1.0)
    async with ingestor(config) as ports, httpx.AsyncClient(timeout=30) as client:
        store_down.write_text(json.dumps({"rules": [
            {"kind": "fail", "ops": ["put"], "times": None}]}))
        await _wait_for_faults(store_down)
        answer = await client.post(f"http://127.0.0.1:{ports.http}/v1/logs", content=GOOD,
                                   headers=JSON | {"Content-Type": "application/x-protobuf"})
        store_down.write_text("{}")
        await _wait_for_faults(store_down)
    assert answer.status_code == 503, answer.text
    assert int(answer.headers["retry-after"]) >= 1
    assert status_of(answer).code == 14  # UNAVAILABLE


async def _wait_for_faults(_: Path) -> None:
    """The faults file is re-read at most every 0.2 s."""
    await asyncio.sleep(0.3)


# -- gRPC -----------------------------------------------------------------------------------

async def grpc_export(port: int, body: bytes, token: str | None = TOKEN) -> grpc.aio.AioRpcError:
    """Call LogsService/Export with raw bytes; the refusal it must end in."""
    metadata = [("authorization", f"Bearer {token}")] if token else []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(LOGS_EXPORT)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(body, metadata=metadata)
    return info.value


@pytest.mark.parametrize(("body", "token", "code", "words"), [
    (b"\x0a\xff\xff\xff", TOKEN, grpc.StatusCode.INVALID_ARGUMENT, "not a valid OTLP"),
    (INVALID_UTF8, TOKEN, grpc.StatusCode.INVALID_ARGUMENT, "UTF-8"),
    (GOOD, None, grpc.StatusCode.UNAUTHENTICATED, "token"),
    (GOOD, OTHER_TOKEN, grpc.StatusCode.PERMISSION_DENIED, ""),
], ids=["malformed", "invalid-utf8", "no-token", "wrong-token"])
async def test_should_refuse_bad_grpc_exports_precisely(config, body, token, code, words):
    async with ingestor(config) as ports:
        error = await grpc_export(ports.grpc, body, token)
        assert await stored_rows(config) == {}
    assert error.code() == code
    assert words in (error.details() or "")


async def test_should_answer_resource_exhausted_with_retry_info_over_the_rate_limit(tmp_path):
    config = otlp_config(tmp_path / "store",
                         otlp={"rate_limit": RateLimit(events_per_s=0.01, burst_s=100)})
    async with ingestor(config) as ports:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports.grpc}") as channel:
            await channel.unary_unary(LOGS_EXPORT)(
                GOOD, metadata=[("authorization", f"Bearer {TOKEN}")])
        error = await grpc_export(ports.grpc, logs_request(records=2))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    status = rpc_status.from_call(error)
    assert status is not None
    infos = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(infos) == 1
    trailers = dict(error.trailing_metadata() or ())
    retry = error_details_pb2.RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"])
    assert retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9 > 0


async def test_should_refuse_an_oversize_grpc_export(config):
    async with ingestor(config) as ports:
        error = await grpc_export(ports.grpc, logs_request(user="x" * 70_000))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await stored_rows(config) == {}


async def test_should_store_an_export_without_its_rows_over_the_event_limit(tmp_path):
    """One log record whose row is over ``max_event_bytes``: not a refusal of the export
    (which the exporter would drop whole) but a partial success naming it; the other
    records are stored, each under the id its index gives (a retry stores nothing more)."""
    config = otlp_config(tmp_path / "store", max_event_bytes=4096)
    request = logs_service_pb2.ExportLogsServiceRequest.FromString(logs_request(records=3))
    big = request.resource_logs[0].scope_logs[0].log_records[1]
    big.body.string_value = "y" * 5000
    body = request.SerializeToString()
    async with ingestor(config) as ports, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports.http}") as client:
        for _ in range(2):  # the same export retried: the same rows, stored once
            answer = await client.post("/v1/logs", content=body, headers=PROTOBUF)
            assert answer.status_code == 200, answer.text
            got = logs_service_pb2.ExportLogsServiceResponse.FromString(answer.content)
            assert got.partial_success.rejected_log_records == 1
            assert "1 logs row(s) refused: over ingestor.max_event_bytes (4096)" in \
                got.partial_success.error_message
            assert "logs row 1 (" in got.partial_success.error_message
        stored = await stored_rows(config)
    (rows,) = stored.values()
    assert sorted(r["body"] for _, r in rows) == ["record 0", "record 0", "record 2",
                                                  "record 2"]
    assert len({event_id for event_id, _ in rows}) == 2  # the retry's rows: the same ids
    assert sorted(event_id.rsplit(":", 1)[1] for event_id, _ in rows) == ["0", "0", "2", "2"]
