"""The HTTP ingest client: ``POST /v1/streams/{stream}/events`` with an idempotency key.

Retried (see :mod:`icefloe.client.retry` for why that is duplicate-free): 429 and 503 (the
ingestor's backpressure, rate limits and "not acknowledged" answers), 408 (an upload the
ingestor found too slow), 502/504 (a gateway in front of it), and transport errors:
connection refused/reset, timeouts. Anything else is raised at once as
:class:`~icefloe.client.retry.IngestRejected`.

TLS: an ``https://`` URL encrypts; a :class:`~icefloe.client.tls.ClientTls` names the CA to
trust and, for ingestors that require mutual TLS, this client's certificate and key.
:class:`HttpClient` is thread-safe (httpx clients are); :class:`AsyncHttpClient` belongs to
one event loop.
"""

from __future__ import annotations

import email.utils
import ssl
from collections.abc import Iterable
from urllib.parse import quote

import httpx
import msgspec

from icefloe.client.retry import Backoff, EventLike, IngestRejected, Retrying, event_json, new_key
from icefloe.client.tls import ClientTls
from icefloe.clock import SYSTEM, Clock

__all__ = ["RETRYABLE_HTTP", "AsyncHttpClient", "HttpClient", "retry_after"]

RETRYABLE_HTTP = frozenset({408, 429, 502, 503, 504})


def retry_after(value: str | None, clock: Clock = SYSTEM) -> float | None:
    """``Retry-After``: delta-seconds or an HTTP date (seconds from ``clock``'s now)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - clock.time())


def _http_rejected(response: httpx.Response, clock: Clock = SYSTEM) -> IngestRejected:
    status = response.status_code
    try:
        body = msgspec.json.decode(response.content)
        code, message = str(body["error"]), str(body.get("message", ""))
        details = list(body.get("details") or [])
        stored = body.get("may_be_stored") is True
    except (msgspec.DecodeError, KeyError, TypeError, AttributeError):  # a proxy's page
        code, message, details = f"http_{status}", response.text[:500], []
        # a gateway's timeout page: the ingestor may have stored what it was sent
        stored = status in (502, 504)
    return IngestRejected(status, code, message, details,
                          retry_after_s=retry_after(response.headers.get("retry-after"),
                                                    clock),
                          retryable=status in RETRYABLE_HTTP, may_be_stored=stored)


_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
"""Transport errors raised before the request left: it cannot have been stored."""


def _transport_rejected(exc: httpx.TransportError) -> IngestRejected:
    code = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection_failed"
    return IngestRejected(None, code, f"{type(exc).__name__}: {exc}", retryable=True,
                          may_be_stored=not isinstance(exc, _NOT_SENT))


class _HttpBase(Retrying):
    def __init__(self, base_url: str, token: str | None, timeout: float, retries: int,
                 backoff: Backoff | None, clock: Clock) -> None:
        super().__init__(retries, backoff, clock)
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"content-type": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"

    def _prepare(self, stream: str, events: Iterable[EventLike], key: str | None
                 ) -> tuple[str, bytes, dict[str, str]]:
        body = b"[" + b",".join(event_json(event) for event in events) + b"]"
        headers = {**self._headers, "idempotency-key": key or new_key()}
        return f"/v1/streams/{quote(stream, safe='')}/events", body, headers

    def _accepted(self, response: httpx.Response) -> int:
        if response.is_success:
            return int(msgspec.json.decode(response.content)["accepted"])
        raise _http_rejected(response, self.clock)


def _verify(tls: ClientTls | None) -> ssl.SSLContext | bool:
    return True if tls is None else tls.ssl_context()


class HttpClient(_HttpBase):
    """POSTs events to ``{base_url}/v1/streams/{stream}/events`` (a JSON array).

    ``timeout`` bounds each attempt (seconds); ``retries`` counts retries after the first
    attempt; ``tls`` configures verification and the client certificate of an ``https://``
    URL; ``clock`` is what the backoff waits on (tests: a manual clock). Use it as a context
    manager, or call :meth:`close`.
    """

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 10,
                 retries: int = 5, *, backoff: Backoff | None = None,
                 tls: ClientTls | None = None, clock: Clock = SYSTEM) -> None:
        super().__init__(base_url, token, timeout, retries, backoff, clock)
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, verify=_verify(tls))

    def send(self, stream: str, events: Iterable[EventLike],
             idempotency_key: str | None = None) -> int:
        """Send one request; return how many events are durable (all of them).

        Raises:
            IngestRejected: refused (at once) or still failing after the retries.
        """
        path, body, headers = self._prepare(stream, events, idempotency_key)

        def attempt() -> int:
            try:
                response = self._http.post(path, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise _transport_rejected(exc) from exc
            return self._accepted(response)

        return self._retry(attempt)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HttpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncHttpClient(_HttpBase):
    """The asyncio twin of :class:`HttpClient` (``await send(...)``, ``async with``)."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 10,
                 retries: int = 5, *, backoff: Backoff | None = None,
                 tls: ClientTls | None = None, clock: Clock = SYSTEM) -> None:
        super().__init__(base_url, token, timeout, retries, backoff, clock)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout,
                                       verify=_verify(tls))

    async def send(self, stream: str, events: Iterable[EventLike],
                   idempotency_key: str | None = None) -> int:
        """See :meth:`HttpClient.send`."""
        path, body, headers = self._prepare(stream, events, idempotency_key)

        async def attempt() -> int:
            try:
                response = await self._http.post(path, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise _transport_rejected(exc) from exc
            return self._accepted(response)

        result: int = await self._retry_async(attempt)
        return result

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
