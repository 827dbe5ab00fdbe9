"""One contract for every object store: local directory (in threads, inline on the loop,
and in a helper process), S3 via boto3, S3 via aiobotocore.

The suite is written once against :class:`AsyncObjectStore` and parametrized over the
backends, so a behaviour the manifest relies on (CAS semantics, NotFound, listing order)
cannot silently differ between them. S3 runs against a real moto server over HTTP (see
``conftest.py``). The S3-only tests at the end pin the error translation and the request
shape (one PUT with a CRC32C header, no botocore retries).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import pytest
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from icefloe.checksum import crc32c, crc32c_b64
from icefloe.errors import (
    NotFound,
    PermanentStoreError,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
)
from icefloe.formats.batch import BatchBuilder, Compression, decode_batch
from icefloe.store.adapters import InlineAsyncStore, ThreadedAsyncStore
from icefloe.store.base import AsyncObjectStore, ObjectStore
from icefloe.store.local import LocalStore
from icefloe.store.s3 import AsyncS3Store, S3Options, S3Store, parse_s3_url, translate_error
from ingestor.store_helper import ProcessAsyncStore

T = TypeVar("T")
Scenario = Callable[[AsyncObjectStore], Awaitable[T]]
SANE_CLOCK_S = 60.0  # store clocks (moto, local fs) must be within a minute of ours


@dataclass(frozen=True)
class Backend:
    """A named way to open a fresh, empty store; ``run`` drives a scenario on it."""

    name: str
    open: Callable[[], AsyncObjectStore]

    def run(self, scenario: Scenario[T]) -> T:
        """Open the store inside a new event loop, run ``scenario``, close the store."""

        async def main() -> T:
            store = self.open()
            try:
                return await scenario(store)
            finally:
                await store.close()

        return asyncio.run(main())


def s3_options(endpoint_url: str, **overrides: Any) -> S3Options:
    return S3Options(endpoint_url=endpoint_url, region="us-east-1", **overrides)


@pytest.fixture(params=[
    pytest.param("local"),
    pytest.param("local-helper"),
    pytest.param("local-inline"),
    pytest.param("s3-boto3", marks=pytest.mark.s3),
    pytest.param("s3-aiobotocore", marks=pytest.mark.s3),
])
def backend(request: pytest.FixtureRequest, tmp_path) -> Backend:
    """Every store implementation behind the async interface, each on an empty location."""
    if request.param == "local":
        return Backend("local", lambda: ThreadedAsyncStore(LocalStore(tmp_path / "store")))
    if request.param == "local-helper":  # the ingestor's default: I/O in a helper process
        return Backend(request.param, lambda: ProcessAsyncStore(tmp_path / "store"))
    if request.param == "local-inline":  # what the helper's publishing jobs run on
        return Backend(request.param, lambda: InlineAsyncStore(LocalStore(tmp_path / "store")))
    target = request.getfixturevalue("s3_bucket")
    options = s3_options(target.endpoint_url)
    if request.param == "s3-boto3":
        return Backend(request.param,
                       lambda: ThreadedAsyncStore(S3Store(target.url, options)))
    return Backend(request.param, lambda: AsyncS3Store(target.url, options))


def assert_recent(store_time: float) -> None:
    assert abs(store_time - time.time()) < SANE_CLOCK_S, store_time


# --- round trips -------------------------------------------------------------------------

def test_should_round_trip_bytes_with_etag_and_store_time(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        put = await store.put("batches/one", b"hello world")
        assert put.etag
        assert_recent(put.store_time)
        got = await store.get("batches/one")
        assert got.data == b"hello world"
        assert got.etag == put.etag
        assert_recent(got.store_time)
        assert_recent(got.last_modified)

    backend.run(scenario)


def test_should_change_etag_when_bytes_change(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        first = await store.put("k", b"A")
        second = await store.put("k", b"B")
        assert first.etag != second.etag
        assert (await store.get("k")).etag == second.etag

    backend.run(scenario)


def test_should_round_trip_an_empty_object(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        await store.put("empty", b"")
        assert (await store.get("empty")).data == b""
        assert (await store.head("empty")).size == 0

    backend.run(scenario)


def test_should_round_trip_a_5_mib_object_in_one_put(backend):
    data = os.urandom(5 * 1024 * 1024)

    async def scenario(store: AsyncObjectStore) -> None:
        put = await store.put("big/blob", data)
        got = await store.get("big/blob")
        assert got.data == data
        assert got.etag == put.etag
        assert (await store.head("big/blob")).size == len(data)

    backend.run(scenario)


@pytest.mark.parametrize("raw_bytes", [3000, 600_000])  # inline, and in a thread by default
def test_should_store_an_encoded_body_and_report_its_size_and_crc32c(backend, raw_bytes):
    records = [b"%06d" % i + b"x" * 94 for i in range(raw_bytes // 104)]
    builder = BatchBuilder()
    builder.extend(records)
    block = builder.to_block(Compression.ZSTD, 3)

    async def scenario(store: AsyncObjectStore) -> None:
        stored = await store.put_encoded("batches/encoded.ifb", block)
        got = await store.get("batches/encoded.ifb")
        assert got.data == builder.finish(Compression.ZSTD, 3)  # the very batch file
        assert stored.size == len(got.data) < len(block)
        assert stored.crc32c == crc32c(got.data)
        assert stored.result.etag == got.etag
        assert_recent(stored.result.store_time)
        assert decode_batch(got.data) == records

    backend.run(scenario)


# --- conditional writes -------------------------------------------------------------------

def test_should_create_once_with_if_none_match_star(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        created = await store.put("manifest", b"v1", if_none_match="*")
        with pytest.raises(PreconditionFailed):
            await store.put("manifest", b"v2", if_none_match="*")
        got = await store.get("manifest")
        assert (got.data, got.etag) == (b"v1", created.etag)

    backend.run(scenario)


def test_should_write_with_current_etag_and_refuse_a_stale_one(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        v1 = await store.put("manifest", b"v1")
        v2 = await store.put("manifest", b"v2", if_match=v1.etag)
        assert v2.etag != v1.etag
        with pytest.raises(PreconditionFailed):
            await store.put("manifest", b"v3", if_match=v1.etag)
        got = await store.get("manifest")
        assert (got.data, got.etag) == (b"v2", v2.etag)

    backend.run(scenario)


def test_should_refuse_if_match_on_a_missing_key_as_precondition_failed(backend):
    """Every backend says PreconditionFailed (moto/S3 answer 404; the S3 stores translate)."""

    async def scenario(store: AsyncObjectStore) -> None:
        etag = (await store.put("other", b"x")).etag
        with pytest.raises(PreconditionFailed):
            await store.put("missing", b"y", if_match=etag)
        with pytest.raises(NotFound):
            await store.get("missing")

    backend.run(scenario)


def test_should_reject_if_none_match_values_other_than_star(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        with pytest.raises(ValueError, match=r"'\*'"):
            await store.put("k", b"x", if_none_match='"abc"')  # type: ignore[arg-type]

    backend.run(scenario)


@pytest.mark.parametrize("condition", ["if_match", "if_none_match"])
def test_should_let_exactly_one_of_many_concurrent_conditional_puts_win(backend, condition):
    writers = 16

    async def scenario(store: AsyncObjectStore) -> None:
        if condition == "if_match":
            start = await store.put("cas", b"start")
            kwargs: dict[str, Any] = {"if_match": start.etag}
        else:
            kwargs = {"if_none_match": "*"}
        results = await asyncio.gather(
            *(store.put("cas", f"writer-{i}".encode(), **kwargs) for i in range(writers)),
            return_exceptions=True)
        winners = [(i, r) for i, r in enumerate(results) if not isinstance(r, BaseException)]
        losers = [r for r in results if isinstance(r, BaseException)]
        assert len(winners) == 1, results
        assert all(isinstance(r, PreconditionFailed) for r in losers), losers
        index, put = winners[0]
        got = await store.get("cas")
        assert (got.data, got.etag) == (f"writer-{index}".encode(), put.etag)

    backend.run(scenario)


# --- head, get, delete ---------------------------------------------------------------------

def test_should_head_size_etag_and_last_modified(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        put = await store.put("a/b", b"12345")
        info = await store.head("a/b")
        assert (info.key, info.size, info.etag) == ("a/b", 5, put.etag)
        assert_recent(info.last_modified)

    backend.run(scenario)


def test_should_raise_not_found_for_missing_keys(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        with pytest.raises(NotFound):
            await store.get("nope")
        with pytest.raises(NotFound):
            await store.head("nope/deeper")

    backend.run(scenario)


def test_should_delete_and_tolerate_deleting_a_missing_key(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        await store.put("doomed", b"x")
        await store.delete("doomed")
        with pytest.raises(NotFound):
            await store.get("doomed")
        with pytest.raises(NotFound):
            await store.head("doomed")
        await store.delete("doomed")
        await store.delete("never/existed")
        await store.put("doomed", b"again", if_none_match="*")  # the name is free again

    backend.run(scenario)


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "", "a/", "./a", "a/../b"])
def test_should_reject_invalid_keys_with_value_error(backend, key):
    async def scenario(store: AsyncObjectStore) -> None:
        with pytest.raises(ValueError, match="invalid object key"):
            await store.put(key, b"x")
        with pytest.raises(ValueError, match="invalid object key"):
            await store.get(key)
        with pytest.raises(ValueError, match="invalid object key"):
            await store.head(key)
        with pytest.raises(ValueError, match="invalid object key"):
            await store.delete(key)

    backend.run(scenario)


# --- listing ------------------------------------------------------------------------------

LISTED = {"a/b/c": b"1", "a/b/d": b"22", "a/bz": b"333", "a/x": b"4444",
          "batches/2": b"55555", "batches/10": b"666666", "zeta": b""}
LIST_CASES = [
    ("", sorted(LISTED)),
    ("a/b/", ["a/b/c", "a/b/d"]),
    ("a/b", ["a/b/c", "a/b/d", "a/bz"]),
    ("ba", ["batches/10", "batches/2"]),  # a prefix may end in the middle of a segment
    ("batches/", ["batches/10", "batches/2"]),
    ("a/b/c", ["a/b/c"]),
    ("nope/", []),
    ("zz", []),
]


def test_should_list_by_prefix_sorted_with_sizes(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        etags = {}
        for key in sorted(LISTED, reverse=True):  # write out of order
            etags[key] = (await store.put(key, LISTED[key])).etag
        for prefix, expected in LIST_CASES:
            listed = await store.list(prefix)
            assert [o.key for o in listed.objects] == expected, prefix
            for info in listed.objects:
                assert info.size == len(LISTED[info.key])
                assert info.etag in (None, etags[info.key])
                assert_recent(info.last_modified)
            assert_recent(listed.store_time)

    backend.run(scenario)


def test_should_list_an_empty_store(backend):
    async def scenario(store: AsyncObjectStore) -> None:
        listed = await store.list()
        assert listed.objects == []
        assert_recent(listed.store_time)

    backend.run(scenario)


# --- S3 specifics: URL parsing, key mapping, request shape ---------------------------------

@pytest.mark.parametrize(("url", "expected"), [
    ("s3://bucket", ("bucket", "")),
    ("s3://bucket/", ("bucket", "")),
    ("s3://bucket/prefix", ("bucket", "prefix/")),
    ("s3://bucket/a/b/", ("bucket", "a/b/")),
    ("s3://bucket//a/b", ("bucket", "a/b/")),
    ("s3://my.bucket-1/x", ("my.bucket-1", "x/")),
])
def test_should_parse_s3_urls(url, expected):
    assert parse_s3_url(url) == expected


@pytest.mark.parametrize(("url", "message"), [
    ("https://bucket/prefix", "expected s3://"),
    ("bucket/prefix", "expected s3://"),
    ("s3:///prefix", "no bucket"),
    ("s3://ab/x", "not a valid bucket"),
    ("s3://bad bucket/x", "not a valid bucket"),
    ("s3://key:secret@bucket/x", "credentials"),
    ("s3://bucket/a//b/", "bad prefix segment"),
    ("s3://bucket/a/../b", "bad prefix segment"),
    ("s3://bucket/a?versionId=1", "not allowed"),
])
def test_should_reject_bad_s3_urls(url, message):
    with pytest.raises(ValueError, match=message):
        parse_s3_url(url)


def test_should_validate_s3_options():
    with pytest.raises(ValueError, match="addressing_style"):
        S3Options(addressing_style="sideways")
    with pytest.raises(ValueError, match="timeouts"):
        S3Options(read_timeout_s=0)
    with pytest.raises(ValueError, match="http"):
        S3Options(endpoint_url="minio:9000")


@pytest.mark.s3
def test_should_keep_keys_relative_to_the_url_prefix(s3_bucket):
    raw = boto3.client("s3", endpoint_url=s3_bucket.endpoint_url, region_name="us-east-1")
    store = S3Store(s3_bucket.url, s3_options(s3_bucket.endpoint_url))
    try:
        store.put("k/v", b"x")
        assert raw.head_object(Bucket=s3_bucket.bucket, Key=f"{s3_bucket.prefix}k/v")
        raw.put_object(Bucket=s3_bucket.bucket, Key="outside", Body=b"o")
        raw.put_object(Bucket=s3_bucket.bucket, Key=f"{s3_bucket.prefix}dir/", Body=b"")
        raw.put_object(Bucket=s3_bucket.bucket, Key=f"{s3_bucket.prefix}.icefloe-tmp", Body=b"")
        assert [o.key for o in store.list().objects] == ["k/v"]  # foreign keys are skipped
        whole = S3Store(f"s3://{s3_bucket.bucket}", s3_options(s3_bucket.endpoint_url))
        assert [o.key for o in whole.list("data/k").objects] == ["data/k/v"]
        whole.close()
    finally:
        store.close()
        raw.close()


@pytest.mark.s3
def test_should_paginate_listings(s3_bucket):
    keys = [f"p/{i:02d}" for i in range(7)]
    store = S3Store(s3_bucket.url, s3_options(s3_bucket.endpoint_url))
    store.list_page_size = 2
    sent: list[Any] = []
    try:
        for key in reversed(keys):
            store.put(key, b"")
        _capture_requests(store._client, sent)
        assert [o.key for o in store.list("p/").objects] == keys
        assert len(sent) == 4  # 2 + 2 + 2 + 1

        async def async_list() -> list[str]:
            async_store = AsyncS3Store(s3_bucket.url, s3_options(s3_bucket.endpoint_url))
            async_store.list_page_size = 3
            try:
                return [o.key for o in (await async_store.list("p/")).objects]
            finally:
                await async_store.close()

        assert asyncio.run(async_list()) == keys
    finally:
        store.close()


def _capture_requests(client: Any, sent: list[Any]) -> None:
    client.meta.events.register("before-send.s3.*", lambda request, **_: sent.append(request))


@pytest.mark.s3
def test_should_send_one_put_with_our_crc32c_and_no_botocore_checksum(s3_bucket):
    data = b"checksummed bytes"
    sync_sent: list[Any] = []
    store = S3Store(s3_bucket.url, s3_options(s3_bucket.endpoint_url))
    _capture_requests(store._client, sync_sent)
    store.put("k", data, if_match=None, if_none_match="*")
    store.close()

    async def async_put() -> list[Any]:
        sent: list[Any] = []
        async_store = AsyncS3Store(s3_bucket.url, s3_options(s3_bucket.endpoint_url))
        try:
            await async_store.head("k")  # creates the client
            _capture_requests(async_store._client, sent)
            await async_store.put("k2", data, if_none_match="*")
        finally:
            await async_store.close()
        return sent

    for sent in (sync_sent, asyncio.run(async_put())):
        assert [r.method for r in sent] == ["PUT"]
        headers = {k.lower(): v for k, v in sent[0].headers.items()}
        value = headers["x-amz-checksum-crc32c"]
        assert (value.decode() if isinstance(value, bytes) else value) == crc32c_b64(data)
        assert "x-amz-trailer" not in headers
        assert "x-amz-sdk-checksum-algorithm" not in headers
        assert not any(h.startswith("x-amz-checksum-") and h != "x-amz-checksum-crc32c"
                       for h in headers)


@pytest.mark.s3
def test_moto_answers_if_match_on_a_missing_key_with_404_no_such_key(s3_bucket):
    """Pins the raw server behaviour that ``S3Store.put`` translates to PreconditionFailed."""
    raw = boto3.client("s3", endpoint_url=s3_bucket.endpoint_url, region_name="us-east-1")
    try:
        with pytest.raises(ClientError) as caught:
            raw.put_object(Bucket=s3_bucket.bucket, Key="missing", Body=b"x",
                           IfMatch='"0123456789abcdef0123456789abcdef"')
    finally:
        raw.close()
    assert caught.value.response["Error"]["Code"] == "NoSuchKey"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


# --- S3 error translation against the real server ------------------------------------------

def _sync_and_async(url: str, options: S3Options) -> list[Backend]:
    return [Backend("s3-boto3", lambda: ThreadedAsyncStore(S3Store(url, options))),
            Backend("s3-aiobotocore", lambda: AsyncS3Store(url, options))]


@pytest.mark.s3
@pytest.mark.parametrize("op", ["get", "put", "list", "delete"])
def test_should_name_a_missing_bucket_as_permanent(moto_server, op):
    bucket = "icefloe-no-such-bucket"

    async def scenario(store: AsyncObjectStore) -> None:
        call = {"get": lambda: store.get("k"), "put": lambda: store.put("k", b"x"),
                "list": lambda: store.list(), "delete": lambda: store.delete("k")}[op]
        with pytest.raises(PermanentStoreError) as caught:
            await call()
        message = str(caught.value)
        assert bucket in message
        assert "does not exist" in message
        assert moto_server in message
        assert caught.value.op == op

    for backend in _sync_and_async(f"s3://{bucket}/p/", s3_options(moto_server)):
        backend.run(scenario)


@pytest.fixture
def closed_port_endpoint() -> str:
    """An http endpoint on a localhost port nothing listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.s3
def test_should_report_an_unreachable_endpoint_as_unambiguous_transient(
        closed_port_endpoint, aws_test_env):
    options = s3_options(closed_port_endpoint, connect_timeout_s=1.0)

    async def scenario(store: AsyncObjectStore) -> None:
        for call in (lambda: store.get("k"), lambda: store.put("k", b"x", if_none_match="*"),
                     lambda: store.list()):
            with pytest.raises(TransientStoreError) as caught:
                await call()
            assert caught.value.ambiguous is False
            assert "unreachable" in str(caught.value)
            assert closed_port_endpoint in str(caught.value)

    started = time.monotonic()
    for backend in _sync_and_async("s3://bucket/p/", options):
        backend.run(scenario)
    assert time.monotonic() - started < 5  # botocore did not retry behind our back


@pytest.mark.s3
def test_should_not_let_botocore_retry(closed_port_endpoint, aws_test_env):
    sent: list[Any] = []
    store = S3Store("s3://bucket/p/", s3_options(closed_port_endpoint))
    _capture_requests(store._client, sent)
    with pytest.raises(TransientStoreError):
        store.get("k")
    store.close()
    assert len(sent) == 1


# --- translate_error unit tests ------------------------------------------------------------

def client_error(code: str, status: int, message: str = "msg",
                 operation: str = "PutObject") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, operation)


URL = "s3://bucket/prefix/"


def translate(exc: BaseException, op: str = "put") -> StoreError:
    return translate_error(exc, op, "key", URL, "http://minio:9000")


@pytest.mark.parametrize(("code", "status"), [
    ("ConditionalRequestConflict", 409),
    ("PreconditionFailed", 412),
    ("", 412),
])
def test_should_translate_lost_races_to_precondition_failed(code, status):
    error = translate(client_error(code, status))
    assert type(error) is PreconditionFailed
    assert (error.op, error.key) == ("put", "key")


@pytest.mark.parametrize(("code", "status", "ambiguous"), [
    ("SlowDown", 503, False),
    ("ThrottlingException", 400, False),
    ("ServiceUnavailable", 503, True),
    ("InternalError", 500, True),
    ("RequestTimeout", 400, True),
    ("", 502, True),
    ("", 504, True),
])
def test_should_translate_throttling_and_5xx_to_transient(code, status, ambiguous):
    error = translate(client_error(code, status))
    assert type(error) is TransientStoreError
    assert error.code == (code or str(status))
    assert error.ambiguous is ambiguous


@pytest.mark.parametrize(("code", "status"), [
    ("AccessDenied", 403), ("InvalidAccessKeyId", 403), ("SignatureDoesNotMatch", 403),
    ("ExpiredToken", 400), ("", 401),
])
def test_should_translate_auth_failures_to_permanent_with_a_credentials_hint(
        code, status, monkeypatch):
    secret = "sEcReT-value-that-must-never-be-printed"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    error = translate(client_error(code, status))
    assert type(error) is PermanentStoreError
    message = str(error)
    assert "AWS_ACCESS_KEY_ID" in message
    assert "role" in message
    assert secret not in message


def test_should_translate_missing_keys_and_buckets():
    assert type(translate(client_error("NoSuchKey", 404), "get")) is NotFound
    assert type(translate(client_error("404", 404, "Not Found"), "head")) is NotFound
    error = translate(client_error("NoSuchBucket", 404), "list")
    assert type(error) is PermanentStoreError
    assert "bucket 'bucket' does not exist at http://minio:9000" in str(error)


def test_should_translate_transport_failures_by_ambiguity():
    unreachable = [EndpointConnectionError(endpoint_url="http://minio:9000/b/k"),
                   ConnectTimeoutError(endpoint_url="http://minio:9000/b/k"),
                   ConnectionRefusedError(111, "Connection refused")]
    for exc in unreachable:
        error = translate(exc)
        assert type(error) is TransientStoreError, exc
        assert error.ambiguous is False
        assert "the object store at http://minio:9000 is unreachable" in str(error)

    import aiohttp

    maybe_applied = [ReadTimeoutError(endpoint_url="http://minio:9000/b/k"),
                     aiohttp.ServerDisconnectedError(), aiohttp.ClientPayloadError("cut"),
                     TimeoutError(), ConnectionResetError(104, "reset")]
    for exc in maybe_applied:
        error = translate(exc)
        assert type(error) is TransientStoreError, exc
        assert error.ambiguous is True


def test_should_translate_anything_else_to_permanent_with_the_original_message():
    error = translate(client_error("InvalidArgument", 400, "bad header value"))
    assert type(error) is PermanentStoreError
    assert "bad header value" in str(error)
    error = translate(BotoCoreError())
    assert type(error) is PermanentStoreError
    assert "An unspecified error occurred" in str(error)
    already = NotFound("x", op="get", key="k")
    assert translate(already) is already


def test_should_implement_both_interfaces():
    assert issubclass(S3Store, ObjectStore)
    assert issubclass(AsyncS3Store, AsyncObjectStore)


def test_should_encode_large_bodies_in_a_thread_except_on_the_inline_store(tmp_path):
    """A thread hop pays off beside a busy event loop, not on the helper's job loop."""
    builder = BatchBuilder()
    builder.extend([b"x" * 1000] * 300)  # ~300 KiB raw: past the inline bound
    block = builder.to_block()
    assert not ThreadedAsyncStore(LocalStore(tmp_path)).encodes_inline(block)
    assert InlineAsyncStore(LocalStore(tmp_path)).encodes_inline(block)
    small = BatchBuilder()
    small.add(b"x")
    assert ThreadedAsyncStore(LocalStore(tmp_path)).encodes_inline(small.to_block())
