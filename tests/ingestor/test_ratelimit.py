"""Rate limits per stream, token and client: the buckets alone, then on a real ingestor.

The end-to-end tests count accepted and refused requests, never time them: their buckets
refill so slowly (0.1 event/s) that a test running a few seconds long changes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import httpx
import msgspec
import pytest
from ingest_support import ORDERS, PAGEVIEWS, TOKEN, make_config
from prometheus_client.parser import text_string_to_metric_families
from security_support import ingestor

from icefloe.client import AsyncGrpcClient, AsyncHttpClient, IngestRejected
from icefloe.config import Config, RateLimit, TokenConfig
from icefloe.tokens import hash_token
from ingestor.errors import Overloaded
from ingestor.metrics import IngestMetrics
from ingestor.ratelimit import RateLimiter, TokenBucket

SLOW = 0.1  # refill per second: ~0.5 events over a whole test
WEB_TOKEN = "ifl_web-token-for-rate-limits"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the buckets ------------------------------------------------------------------------------

def test_should_allow_a_burst_then_hold_to_the_rate():
    bucket = TokenBucket(rate=10, burst_s=2, now=0)
    assert bucket.wait_s(20, 0) == 0
    bucket.take(20)
    assert bucket.wait_s(1, 0) == pytest.approx(0.1)
    assert bucket.wait_s(5, 0.3) == pytest.approx(0.2)
    assert bucket.wait_s(5, 0.5) == 0
    assert bucket.wait_s(1, 1000) == 0
    assert bucket.level == 20


def test_should_admit_an_oversized_request_when_full_and_then_owe():
    bucket = TokenBucket(rate=10, burst_s=1, now=0)
    assert bucket.wait_s(25, 0) == 0  # larger than the capacity: admitted when full
    bucket.take(25)
    assert bucket.wait_s(1, 0) == pytest.approx(1.6)  # 15 owed + 1 needed, at 10/s


def limiter(config: Config, clock: Clock) -> tuple[RateLimiter, IngestMetrics]:
    metrics = IngestMetrics()
    return RateLimiter(config, metrics, clock), metrics


def test_should_take_from_every_bucket_or_from_none(tmp_path):
    stream = msgspec.structs.replace(PAGEVIEWS, rate_limit=RateLimit(events_per_s=10,
                                                                     bytes_per_s=100))
    config = make_config(tmp_path, (stream,), client_rate_limit=RateLimit(events_per_s=5))
    clock = Clock()
    limits, metrics = limiter(config, clock)
    limits.admit("pageviews", None, "1.2.3.4", 5, 50)
    with pytest.raises(Overloaded) as info:
        limits.admit("pageviews", None, "1.2.3.4", 1, 10)  # the client bucket is empty
    assert info.value.code == "rate_limited"
    assert info.value.retry_after_s == pytest.approx(0.2)
    assert "this client address" in info.value.message
    limits.admit("pageviews", None, "5.6.7.8", 5, 50)  # the stream still had room for it
    with pytest.raises(Overloaded, match="stream 'pageviews'"):
        limits.admit("pageviews", None, "9.9.9.9", 1, 1)
    clock.now += 1
    limits.admit("pageviews", None, "9.9.9.9", 1, 1)
    refused = {(s.labels["stream"], s.labels["scope"]): s.value
               for s in metrics.rate_limited_requests.collect()[0].samples
               if s.name.endswith("_total")}
    assert refused == {("pageviews", "client"): 1, ("pageviews", "stream"): 1}


def test_should_give_an_ipv6_client_one_bucket_per_64(tmp_path):
    """A host owns its /64 and may send from any address in it: one address per request
    must not mean a fresh bucket per request."""
    config = make_config(tmp_path, (PAGEVIEWS,), client_rate_limit=RateLimit(events_per_s=2))
    limits, _ = limiter(config, Clock())
    limits.admit("pageviews", None, "2001:db8:1:2::1", 1, 1)
    limits.admit("pageviews", None, "2001:db8:1:2:ffff::9", 1, 1)
    with pytest.raises(Overloaded):
        limits.precheck_client("pageviews", "2001:db8:1:2:abcd::7")
    limits.admit("pageviews", None, "2001:db8:1:3::1", 1, 1)  # another /64: its own bucket
    limits.admit("pageviews", None, "198.51.100.1", 2, 2)


def test_should_only_check_without_taking_before_the_body(tmp_path):
    stream = msgspec.structs.replace(PAGEVIEWS, rate_limit=RateLimit(events_per_s=1,
                                                                     burst_s=1))
    limits, _ = limiter(make_config(tmp_path, (stream,)), Clock())
    for _ in range(3):
        limits.admit("pageviews", None, None, 1, 1, take=False)
    limits.admit("pageviews", None, None, 1, 1)
    with pytest.raises(Overloaded):
        limits.admit("pageviews", None, None, 1, 1, take=False)


# -- on a real ingestor ---------------------------------------------------------------------------

def limited(tmp_path: Path, *, stream: RateLimit | None = None, token: RateLimit | None = None,
            **ingestor_settings: Any) -> Config:
    pageviews = msgspec.structs.replace(PAGEVIEWS, rate_limit=stream)
    config = make_config(tmp_path / "store", (pageviews, ORDERS), **ingestor_settings)
    tokens = () if token is None else (
        TokenConfig("web", hash_token(WEB_TOKEN, log2_n=10), ("orders",), token),)
    return msgspec.structs.replace(config, tokens=tokens)


async def statuses(port: int, stream: str, count: int, events: int = 1,
                   headers: dict[str, str] | None = None) -> list[int]:
    event = b'{"order_id":"o"}' if stream == "orders" else b'{"user_id":"u"}'
    body = b"[" + b",".join([event] * events) + b"]"
    out = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        for _ in range(count):
            response = await client.post(f"/v1/streams/{stream}/events", content=body,
                                         headers=headers or {})
            out.append(response.status_code)
            if response.status_code == 429:
                assert response.json()["error"] == "rate_limited"
                assert int(response.headers["retry-after"]) >= 1
    return out


async def test_should_answer_429_beyond_a_stream_limit_over_http_and_grpc(tmp_path):
    config = limited(tmp_path, stream=RateLimit(events_per_s=SLOW, burst_s=100))  # 10 events
    async with ingestor(config) as ports:
        got = await statuses(ports.http, "pageviews", 8)
        assert got == [202] * 8
        async with AsyncGrpcClient(f"127.0.0.1:{ports.grpc}", retries=0) as client:
            assert await client.publish("pageviews", [{"user_id": "g"}] * 2) == 2
            with pytest.raises(IngestRejected) as info:
                await client.publish("pageviews", [{"user_id": "g"}])
        refused = info.value
        assert refused.status == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.code == "rate_limited"
        assert refused.retryable
        assert refused.retry_after_s == pytest.approx(1 / SLOW, rel=0.1)  # 1 event at 0.1/s
        assert await statuses(ports.http, "pageviews", 3) == [429] * 3
        assert await statuses(ports.http, "orders", 2, headers={
            "authorization": f"Bearer {TOKEN}"}) == [202, 202]  # other streams unaffected
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{ports.http}/metrics")).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    scope = (("scope", "stream"), ("stream", "pageviews"))
    assert samples[("icefloe_ingest_rate_limited_requests_total", scope)] == 4
    assert samples[("icefloe_ingest_rate_limit", (("measure", "events_per_s"),
                                                  ("name", "pageviews"),
                                                  ("scope", "stream")))] == SLOW
    assert samples[("icefloe_ingest_events_rejected_total",
                    (("reason", "rate_limited"), ("stream", "pageviews")))] == 4


async def test_should_limit_bytes_and_admit_one_oversized_batch_when_full(tmp_path):
    config = limited(tmp_path, stream=RateLimit(bytes_per_s=SLOW, burst_s=1000))  # 100 bytes
    async with ingestor(config) as ports:
        assert await statuses(ports.http, "pageviews", 2, events=10) == [202, 429]


async def test_should_limit_a_token_on_its_own(tmp_path):
    config = limited(tmp_path, token=RateLimit(events_per_s=SLOW, burst_s=30))  # 3 events
    async with ingestor(config) as ports:
        web = {"authorization": f"Bearer {WEB_TOKEN}"}
        assert await statuses(ports.http, "orders", 5, headers=web) == [202] * 3 + [429] * 2
        own = {"authorization": f"Bearer {TOKEN}"}
        assert await statuses(ports.http, "orders", 5, headers=own) == [202] * 5


async def test_should_let_the_client_retry_rate_limited_requests(tmp_path):
    config = limited(tmp_path, stream=RateLimit(events_per_s=SLOW, burst_s=10))  # 1 event
    async with ingestor(config) as ports, \
            AsyncHttpClient(f"http://127.0.0.1:{ports.http}", retries=0) as client:
            assert await client.send("pageviews", [{"user_id": "a"}]) == 1
            with pytest.raises(IngestRejected) as info:
                await client.send("pageviews", [{"user_id": "b"}])
    assert (info.value.status, info.value.code, info.value.retryable) == \
        (429, "rate_limited", True)
    assert info.value.retry_after_s == 10


# -- per client, behind trusted proxies -----------------------------------------------------------

CLIENT_LIMIT = RateLimit(events_per_s=SLOW, burst_s=20)  # 2 events per client address


async def test_should_limit_each_forwarded_client_when_the_proxy_is_trusted(tmp_path):
    config = limited(tmp_path, client_rate_limit=CLIENT_LIMIT, trusted_proxies=("127.0.0.1",))
    async with ingestor(config) as ports:
        alice = {"x-forwarded-for": "198.51.100.1"}
        bob = {"x-forwarded-for": "198.51.100.2:4711"}
        assert await statuses(ports.http, "pageviews", 3, headers=alice) == [202, 202, 429]
        assert await statuses(ports.http, "pageviews", 3, headers=bob) == [202, 202, 429]
        spoofed = {"x-forwarded-for": "203.0.113.9, 198.51.100.1"}  # bob cannot pose as new
        assert await statuses(ports.http, "pageviews", 1, headers=spoofed) == [429]


async def test_should_ignore_forwarded_headers_from_an_untrusted_peer(tmp_path):
    config = limited(tmp_path, client_rate_limit=CLIENT_LIMIT, trusted_proxies=("10.0.0.0/8",))
    async with ingestor(config) as ports:
        got = []
        for n in range(3):  # every request claims to come from someone else
            got += await statuses(ports.http, "pageviews", 1,
                                  headers={"x-forwarded-for": f"198.51.100.{n}"})
        assert got == [202, 202, 429]  # all counted against the peer, 127.0.0.1


async def test_should_not_let_a_client_name_itself_in_the_header_the_proxy_does_not_write(
        tmp_path):
    """The proxy appends to X-Forwarded-For and passes a client's ``Forwarded`` through:
    a fresh ``Forwarded`` per request must not give the client a fresh bucket."""
    config = limited(tmp_path, client_rate_limit=CLIENT_LIMIT, trusted_proxies=("127.0.0.1",))
    async with ingestor(config) as ports:
        got = []
        for n in range(3):
            got += await statuses(ports.http, "pageviews", 1, headers={
                "forwarded": f"for=203.0.113.{n}", "x-forwarded-for": "198.51.100.1"})
        assert got == [202, 202, 429]  # all counted against 198.51.100.1


async def test_should_limit_each_client_named_by_rfc_7239_when_configured(tmp_path):
    config = limited(tmp_path, client_rate_limit=CLIENT_LIMIT, trusted_proxies=("127.0.0.1",),
                     forwarded_header="forwarded")
    async with ingestor(config) as ports:
        bob = {"forwarded": 'for="198.51.100.2:4711";proto=https'}
        assert await statuses(ports.http, "pageviews", 3, headers=bob) == [202, 202, 429]
        carol = {"forwarded": "for=198.51.100.3", "x-forwarded-for": "198.51.100.2"}
        assert await statuses(ports.http, "pageviews", 1, headers=carol) == [202]
