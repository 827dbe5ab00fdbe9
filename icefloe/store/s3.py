"""S3 and S3-compatible stores (AWS S3, MinIO, moto): boto3 for sync, aiobotocore for asyncio.

Why it looks like this:

* **One PUT, always.** Every write is a single ``PutObject``: multipart uploads and copies do
  not honour ``If-Match`` the same way, and the manifest's compare-and-swap depends on it.
  The body carries ``x-amz-checksum-crc32c`` so S3 rejects an upload corrupted in transit.
* **No botocore retries, no second checksum.** icefloe retries in its own layer with a time
  budget (:mod:`icefloe.store.retry`); botocore's retries would multiply attempts and hide
  ambiguity. botocore's automatic checksums are switched to "when required" so it neither
  adds a second checksum nor tries to validate one on download.
* **One error translation.** :func:`translate_error` turns every botocore/aiohttp failure into
  the :mod:`icefloe.errors` taxonomy for both classes, so the retry layer and the manifest
  see the same errors whichever client is in use.
* **Store clock.** ``store_time`` comes from the response's ``Date`` header: GC and deadlines
  compare the store's clock with ``Last-Modified``, never the local clock.
* **Credentials** come only from the standard AWS chain (env vars, shared files, instance or
  pod roles); nothing in :class:`S3Options` carries a secret, and no message prints one.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlparse

import boto3
import botocore.exceptions as bexc
from botocore.config import Config

from icefloe.checksum import crc32c_b64
from icefloe.errors import (
    NotFound,
    PermanentStoreError,
    PreconditionFailed,
    StoreError,
    TransientStoreError,
)
from icefloe.store.base import (
    AsyncObjectStore,
    GetResult,
    IfNoneMatch,
    ListResult,
    ObjectInfo,
    ObjectStore,
    PutResult,
    check_key,
)

__all__ = [
    "AsyncS3Store",
    "S3Options",
    "S3Store",
    "parse_s3_url",
    "translate_error",
]

_ADDRESSING_STYLES = ("auto", "path", "virtual")
# AWS rules plus the legacy us-east-1 names (capitals, underscores) some stores still accept.
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]")


@dataclass(frozen=True)
class S3Options:
    """How to reach the store. Credentials are deliberately absent: use the AWS chain.

    ``endpoint_url`` selects an S3-compatible server (MinIO, moto); None means AWS.
    ``addressing_style`` is botocore's: ``auto`` (path style for custom endpoints,
    virtual-hosted for AWS), ``path`` or ``virtual``.
    """

    endpoint_url: str | None = None
    region: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    addressing_style: str = "auto"
    max_pool_connections: int = 32

    def __post_init__(self) -> None:
        if self.addressing_style not in _ADDRESSING_STYLES:
            raise ValueError(f"S3Options.addressing_style must be one of {_ADDRESSING_STYLES}, "
                             f"not {self.addressing_style!r}")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("S3Options timeouts must be > 0 seconds")
        if self.max_pool_connections < 1:
            raise ValueError("S3Options.max_pool_connections must be >= 1")
        if self.endpoint_url is not None and urlparse(self.endpoint_url).scheme not in (
                "http", "https"):
            raise ValueError(f"S3 endpoint {self.endpoint_url!r} must be an http:// or "
                             "https:// URL, e.g. http://minio:9000")

    def describe_endpoint(self) -> str:
        """The endpoint as shown in error messages."""
        if self.endpoint_url:
            return self.endpoint_url
        return f"AWS S3 ({self.region})" if self.region else "AWS S3"

    def botocore_config(self) -> dict[str, Any]:
        """Keyword arguments for botocore's ``Config``/aiobotocore's ``AioConfig``."""
        return {
            "connect_timeout": self.connect_timeout_s,
            "read_timeout": self.read_timeout_s,
            "retries": {"total_max_attempts": 1},  # icefloe's retry layer owns retries
            "max_pool_connections": self.max_pool_connections,
            "s3": {"addressing_style": self.addressing_style},
            "request_checksum_calculation": "when_required",  # we send CRC32C ourselves
            "response_checksum_validation": "when_required",
            "user_agent_extra": "icefloe",
        }


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` → ``("bucket", "some/prefix/")``; ``s3://bucket`` → ``""``.

    The prefix never starts with ``/`` and is either empty or ends with ``/``.
    """
    parsed = urlparse(url)
    if parsed.scheme != "s3":
        raise ValueError(f"invalid S3 url {url!r}: expected s3://bucket/prefix")
    bucket = parsed.netloc
    if not bucket:
        raise ValueError(f"invalid S3 url {url!r}: no bucket name (expected s3://bucket/prefix)")
    if "@" in bucket or ":" in bucket:
        raise ValueError(f"invalid S3 url {url!r}: the bucket may not carry credentials or a "
                         "port; put the server in the endpoint setting instead")
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(f"invalid S3 url {url!r}: {bucket!r} is not a valid bucket name "
                         "(3-63 letters, digits, dots and hyphens)")
    if parsed.query or parsed.fragment or parsed.params:
        raise ValueError(f"invalid S3 url {url!r}: '?', '#' and ';' are not allowed in the "
                         "prefix")
    prefix = parsed.path.lstrip("/")
    if prefix:
        for part in prefix.rstrip("/").split("/"):
            if part in ("", ".", ".."):
                raise ValueError(f"invalid S3 url {url!r}: bad prefix segment {part!r}")
        if not prefix.endswith("/"):
            prefix += "/"
    return bucket, prefix


# --- error translation ------------------------------------------------------------------

_PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_AUTH_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "ExpiredTokenException", "InvalidToken", "TokenRefreshRequired", "InvalidSecurity",
    "AllAccessDisabled", "AccountProblem", "UnauthorizedAccess", "401", "403",
})
_THROTTLE_CODES = frozenset({"SlowDown", "TooManyRequests", "RequestLimitExceeded", "429"})
_TRANSIENT_CODES = frozenset({
    "RequestTimeout", "InternalError", "ServiceUnavailable", "OperationAborted",
    "RequestTimeoutException", "500", "502", "503", "504",
    # the body arrived corrupted (checksum mismatch): the PUT was rejected, resend it
    "BadDigest", "XAmzContentChecksumMismatch",
})
_CREDENTIAL_HINT = ("check the credentials icefloe finds through the AWS chain "
                    "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the instance/pod "
                    "role) and that they may read and write this bucket")


def _bucket_of(url: str) -> str:
    try:
        return parse_s3_url(url)[0]
    except ValueError:
        return url


def _from_client_error(exc: bexc.ClientError, op: str, key: str, url: str,
                       endpoint: str) -> StoreError:
    error = exc.response.get("Error", {}) or {}
    code = str(error.get("Code", "") or "")
    message = str(error.get("Message", "") or "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    what = f"{op} {key!r} in {url}" if key else f"{op} on {url}"
    detail = f"{code or 'HTTP ' + str(status)}: {message}" if message else \
        (code or f"HTTP {status}")

    if code in _PRECONDITION_CODES or status == 412:
        return PreconditionFailed(f"{what}: precondition failed ({detail})", op=op, key=key)
    if code == "NoSuchBucket":
        bucket = error.get("BucketName") or _bucket_of(url)
        return PermanentStoreError(
            f"bucket {bucket!r} does not exist at {endpoint}: create it or fix [store] url "
            f"({what})", op=op, key=key)
    if code in _NOT_FOUND_CODES or (status == 404 and not code):
        return NotFound(f"no such key {key!r} in {url}", op=op, key=key)
    if code == "RequestTimeTooSkewed":
        return PermanentStoreError(
            f"{what} refused by {endpoint}: this host's clock differs from the store's by too "
            "much; fix the clock (NTP)", op=op, key=key)
    if code in _AUTH_CODES or status in (401, 403):
        hint = " (S3 also answers 403 for a missing key when s3:ListBucket is not allowed)" \
            if op in ("get", "head") else ""
        return PermanentStoreError(
            f"{what} denied by {endpoint} ({detail}): {_CREDENTIAL_HINT}{hint}", op=op, key=key)
    if code in _THROTTLE_CODES or code.startswith("Throttl"):
        return TransientStoreError(f"{what} throttled by {endpoint} ({detail})", op=op,
                                   key=key, ambiguous=False, code=code or str(status))
    if code in _TRANSIENT_CODES or status in (500, 502, 503, 504):
        return TransientStoreError(f"{what} failed at {endpoint} ({detail})", op=op, key=key,
                                   ambiguous=True, code=code or str(status))
    return PermanentStoreError(f"{what} failed at {endpoint} ({detail})", op=op, key=key)


def _unreachable(exc: BaseException, op: str, key: str, endpoint: str) -> StoreError:
    return TransientStoreError(
        f"the object store at {endpoint} is unreachable ({type(exc).__name__}: {exc}); check "
        "the [store] endpoint and that the store is running", op=op, key=key, ambiguous=False,
        code="Unreachable")


def translate_error(exc: BaseException, op: str, key: str, url: str,
                    endpoint: str | None = None) -> StoreError:
    """Map a botocore/aiohttp/socket failure of ``op`` on ``key`` to an icefloe StoreError.

    ``url`` is the store's ``s3://`` URL and ``endpoint`` the server as shown to operators
    (None = AWS). Secrets never appear: only codes and the server's own messages do.
    """
    endpoint = endpoint or "AWS S3"
    what = f"{op} {key!r} in {url}" if key else f"{op} on {url}"
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, bexc.ClientError):
        return _from_client_error(exc, op, key, url, endpoint)
    if isinstance(exc, bexc.NoCredentialsError | bexc.PartialCredentialsError
                  | bexc.CredentialRetrievalError | bexc.NoAuthTokenError):
        return PermanentStoreError(f"{what}: no usable credentials ({exc}): {_CREDENTIAL_HINT}",
                                   op=op, key=key)
    if isinstance(exc, bexc.SSLError):
        return PermanentStoreError(f"{what}: TLS with {endpoint} failed ({exc}); check the "
                                   "endpoint URL and the CA bundle", op=op, key=key)
    # The request never reached the store: retrying is safe and cannot duplicate anything.
    if isinstance(exc, bexc.ConnectTimeoutError | bexc.EndpointConnectionError
                  | bexc.ProxyConnectionError | ConnectionRefusedError):
        return _unreachable(exc, op, key, endpoint)
    # The request may have been applied although no answer arrived (TimeoutError is also
    # asyncio.TimeoutError since Python 3.11).
    ambiguous: tuple[type[BaseException], ...] = (
        bexc.ReadTimeoutError, bexc.ConnectionClosedError, bexc.HTTPClientError,
        bexc.IncompleteReadError, TimeoutError, ConnectionError,
    )
    aiohttp = sys.modules.get("aiohttp")  # only loaded when the async store is in use
    if aiohttp is not None:
        if isinstance(exc, aiohttp.ClientConnectorError):
            return _unreachable(exc, op, key, endpoint)
        ambiguous += (aiohttp.ClientError,)
    if isinstance(exc, ambiguous):
        return TransientStoreError(
            f"{what}: no complete answer from {endpoint} ({type(exc).__name__}: {exc})",
            op=op, key=key, ambiguous=True, code=type(exc).__name__)
    return PermanentStoreError(f"{what} failed ({type(exc).__name__}: {exc})", op=op, key=key)


# --- shared request/response handling ----------------------------------------------------

def _store_time(response: dict[str, Any]) -> float:
    """The store's clock from the ``Date`` header, or the local clock when absent."""
    raw = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if raw:
        try:
            moment = parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            pass
        else:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            return moment.timestamp()
    return time.time()


def _epoch(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


class _S3Base:
    """Key mapping, request building and result parsing common to both clients."""

    list_page_size = 1000  # ListObjectsV2 MaxKeys (S3's maximum); tests lower it

    def __init__(self, url: str, options: S3Options) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}"
        self.options = options
        self.endpoint = options.describe_endpoint()

    def _client_kwargs(self) -> dict[str, Any]:
        return {"endpoint_url": self.options.endpoint_url, "region_name": self.options.region}

    def _error(self, exc: BaseException, op: str, key: str) -> StoreError:
        return translate_error(exc, op, key, self.url, self.endpoint)

    def _object_key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _put_kwargs(self, key: str, data: bytes, if_match: str | None,
                    if_none_match: IfNoneMatch) -> dict[str, Any]:
        if if_none_match not in (None, "*"):
            raise ValueError("if_none_match only supports '*'")
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._object_key(key),
                                  "Body": data, "ChecksumCRC32C": crc32c_b64(data)}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if if_none_match is not None:
            kwargs["IfNoneMatch"] = if_none_match
        return kwargs

    def _put_error(self, exc: BaseException, key: str, if_match: str | None) -> StoreError:
        error = self._error(exc, "put", key)
        if isinstance(error, NotFound) and if_match is not None:
            # S3 (and moto) answer 404 NoSuchKey to If-Match on a missing key: for a
            # compare-and-swap that is a lost race like any other.
            return PreconditionFailed(f"{key!r} does not exist in {self.url} (If-Match)",
                                      op="put", key=key)
        return error

    def _list_kwargs(self, prefix: str, token: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix,
                                  "MaxKeys": self.list_page_size}
        if token:
            kwargs["ContinuationToken"] = token
        return kwargs

    def _list_page(self, page: dict[str, Any], into: list[ObjectInfo]) -> str | None:
        """Append a ListObjectsV2 page's objects; return the next continuation token."""
        for item in page.get("Contents", ()):
            key = item["Key"][len(self.prefix):]
            try:
                check_key(key)
            except ValueError:
                continue  # "dir/" markers and other keys icefloe never writes
            into.append(ObjectInfo(key=key, size=int(item.get("Size", 0)),
                                   last_modified=_epoch(item.get("LastModified")),
                                   etag=item.get("ETag")))
        return page.get("NextContinuationToken") if page.get("IsTruncated") else None

    def _etag(self, response: dict[str, Any], op: str, key: str) -> str:
        etag = response.get("ETag")
        if not etag:
            raise PermanentStoreError(
                f"{op} {key!r} in {self.url}: {self.endpoint} returned no ETag, so conditional "
                "writes cannot work against it; use AWS S3 or a current MinIO release",
                op=op, key=key)
        return str(etag)

    @staticmethod
    def _head_info(key: str, response: dict[str, Any]) -> ObjectInfo:
        return ObjectInfo(key=key, size=int(response.get("ContentLength", 0)),
                          last_modified=_epoch(response.get("LastModified")),
                          etag=response.get("ETag"))


class S3Store(_S3Base, ObjectStore):
    """A synchronous store on ``s3://bucket/prefix/`` (boto3; thread-safe)."""

    def __init__(self, url: str, options: S3Options | None = None) -> None:
        super().__init__(url, options or S3Options())
        try:
            session = boto3.session.Session()
            self._client = session.client(
                "s3", config=Config(**self.options.botocore_config()), **self._client_kwargs())
        except Exception as exc:
            raise PermanentStoreError(
                f"cannot create an S3 client for {self.url} at {self.endpoint}: {exc}; fix "
                "the [store] endpoint/region", op="open") from exc

    def get(self, key: str) -> GetResult:
        object_key = self._object_key(key)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=object_key)
            with contextlib.closing(response["Body"]) as body:
                data = body.read()
        except Exception as exc:
            raise self._error(exc, "get", key) from exc
        return GetResult(data=data, etag=self._etag(response, "get", key),
                         last_modified=_epoch(response.get("LastModified")),
                         store_time=_store_time(response))

    def put(self, key: str, data: bytes, *, if_match: str | None = None,
            if_none_match: IfNoneMatch = None) -> PutResult:
        kwargs = self._put_kwargs(key, data, if_match, if_none_match)
        try:
            response = self._client.put_object(**kwargs)
        except Exception as exc:
            raise self._put_error(exc, key, if_match) from exc
        return PutResult(etag=self._etag(response, "put", key),
                         store_time=_store_time(response))

    def delete(self, key: str) -> None:
        object_key = self._object_key(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=object_key)
        except Exception as exc:
            error = self._error(exc, "delete", key)
            if not isinstance(error, NotFound):
                raise error from exc

    def list(self, prefix: str = "") -> ListResult:
        objects: list[ObjectInfo] = []
        store_time: float | None = None
        token: str | None = None
        try:
            while True:
                page = self._client.list_objects_v2(**self._list_kwargs(prefix, token))
                if store_time is None:  # the first page's clock: the conservative one for GC
                    store_time = _store_time(page)
                token = self._list_page(page, objects)
                if token is None:
                    break
        except Exception as exc:
            raise self._error(exc, "list", prefix) from exc
        objects.sort(key=lambda info: info.key)
        return ListResult(objects=objects, store_time=store_time or time.time())

    def head(self, key: str) -> ObjectInfo:
        object_key = self._object_key(key)
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=object_key)
        except Exception as exc:
            raise self._error(exc, "head", key) from exc
        return self._head_info(key, response)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception as exc:
            raise self._error(exc, "close", "") from exc


class AsyncS3Store(_S3Base, AsyncObjectStore):
    """An asyncio store on ``s3://bucket/prefix/`` (aiobotocore).

    The client is created on first use inside the running event loop and bound to it: use
    one store per loop, and ``await close()`` before the loop ends.
    """

    def __init__(self, url: str, options: S3Options | None = None) -> None:
        super().__init__(url, options or S3Options())
        self._client: Any = None
        self._stack: AsyncExitStack | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client_lock = asyncio.Lock()

    async def _get_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is not None:
            if loop is not self._loop:
                raise RuntimeError("AsyncS3Store is bound to the event loop that first used "
                                   "it; create one store per event loop")
            return self._client
        async with self._client_lock:
            if self._client is None:
                from aiobotocore.config import AioConfig  # lazy: aiobotocore
                from aiobotocore.session import get_session  # lazy: aiobotocore

                stack = AsyncExitStack()
                try:
                    client = await stack.enter_async_context(get_session().create_client(
                        "s3", config=AioConfig(**self.options.botocore_config()),
                        **self._client_kwargs()))
                except Exception as exc:
                    await stack.aclose()
                    raise PermanentStoreError(
                        f"cannot create an S3 client for {self.url} at {self.endpoint}: "
                        f"{exc}; fix the [store] endpoint/region", op="open") from exc
                self._stack, self._client, self._loop = stack, client, loop
        return self._client

    async def get(self, key: str) -> GetResult:
        object_key = self._object_key(key)
        client = await self._get_client()
        try:
            response = await client.get_object(Bucket=self.bucket, Key=object_key)
            async with response["Body"] as body:
                data = await body.read()
        except Exception as exc:
            raise self._error(exc, "get", key) from exc
        return GetResult(data=data, etag=self._etag(response, "get", key),
                         last_modified=_epoch(response.get("LastModified")),
                         store_time=_store_time(response))

    async def put(self, key: str, data: bytes, *, if_match: str | None = None,
                  if_none_match: IfNoneMatch = None) -> PutResult:
        kwargs = self._put_kwargs(key, data, if_match, if_none_match)
        client = await self._get_client()
        try:
            response = await client.put_object(**kwargs)
        except Exception as exc:
            raise self._put_error(exc, key, if_match) from exc
        return PutResult(etag=self._etag(response, "put", key),
                         store_time=_store_time(response))

    async def delete(self, key: str) -> None:
        object_key = self._object_key(key)
        client = await self._get_client()
        try:
            await client.delete_object(Bucket=self.bucket, Key=object_key)
        except Exception as exc:
            error = self._error(exc, "delete", key)
            if not isinstance(error, NotFound):
                raise error from exc

    async def list(self, prefix: str = "") -> ListResult:
        client = await self._get_client()
        objects: list[ObjectInfo] = []
        store_time: float | None = None
        token: str | None = None
        try:
            while True:
                page = await client.list_objects_v2(**self._list_kwargs(prefix, token))
                if store_time is None:
                    store_time = _store_time(page)
                token = self._list_page(page, objects)
                if token is None:
                    break
        except Exception as exc:
            raise self._error(exc, "list", prefix) from exc
        objects.sort(key=lambda info: info.key)
        return ListResult(objects=objects, store_time=store_time or time.time())

    async def head(self, key: str) -> ObjectInfo:
        object_key = self._object_key(key)
        client = await self._get_client()
        try:
            response = await client.head_object(Bucket=self.bucket, Key=object_key)
        except Exception as exc:
            raise self._error(exc, "head", key) from exc
        return self._head_info(key, response)

    async def close(self) -> None:
        stack, self._stack, self._client, self._loop = self._stack, None, None, None
        self._client_lock = asyncio.Lock()
        if stack is None:
            return
        try:
            await stack.aclose()
        except Exception as exc:
            raise self._error(exc, "close", "") from exc
