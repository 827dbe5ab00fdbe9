"""Token-bucket rate limits per stream, per token and per client address.

Why token buckets: they allow a quiet client a burst (``burst_s`` seconds' worth) and hold
a busy one to the rate, and the time until a request fits follows directly from the level,
which becomes ``Retry-After`` (HTTP 429 ``rate_limited``) or ``RetryInfo`` (gRPC
RESOURCE_EXHAUSTED). Every limit is local to this process: with N ingestors behind a load
balancer the cluster admits up to N times the configured rate.

A request is admitted whole or not at all: every bucket that applies (stream, token, client;
events and bytes each) must have room, and only then is anything taken. A request larger
than a bucket's capacity is admitted when that bucket is full and leaves it in debt, so an
oversized batch is slowed down rather than refused forever. Bytes are the canonical JSON of
the events, the same measure on HTTP and gRPC. An IPv6 client's bucket is its /64 (one host
may use any address in it).

Not thread-safe: one instance belongs to one event loop (both fronts share it).
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from icefloe.config import Config, RateLimit
from ingestor.errors import Overloaded
from ingestor.metrics import IngestMetrics

MAX_CLIENTS = 65_536
"""Client addresses tracked at once; the least recently seen is forgotten beyond that (it
starts again with a full bucket)."""
IPV6_CLIENT_PREFIX = 64
"""IPv6 clients share one bucket per /64: a single host is routinely given a whole /64 and
may pick any source address in it, so a bucket per address would limit nothing."""
_EPSILON = 1e-9


class TokenBucket:
    """``rate`` units per second, holding at most ``rate * burst_s`` (full at start)."""

    __slots__ = ("capacity", "level", "rate", "stamp")

    def __init__(self, rate: float, burst_s: float, now: float) -> None:
        self.rate = rate
        self.capacity = rate * burst_s
        self.level = self.capacity
        self.stamp = now

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` fits (0: now). Capped at the capacity (debt allowed)."""
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now
        need = min(amount, self.capacity)
        if self.level + _EPSILON >= need:
            return 0.0
        return (need - self.level) / self.rate

    def take(self, amount: float) -> None:
        self.level -= amount


class Limit:
    """The events and bytes buckets of one limited thing (a stream, a token, a client)."""

    __slots__ = ("bytes", "events")

    def __init__(self, limit: RateLimit, now: float) -> None:
        self.events = None if limit.events_per_s is None else \
            TokenBucket(limit.events_per_s, limit.burst_s, now)
        self.bytes = None if limit.bytes_per_s is None else \
            TokenBucket(limit.bytes_per_s, limit.burst_s, now)

    def wait_s(self, events: int, nbytes: int, now: float) -> float:
        wait = 0.0
        if self.events is not None:
            wait = self.events.wait_s(events, now)
        if self.bytes is not None:
            wait = max(wait, self.bytes.wait_s(nbytes, now))
        return wait

    def take(self, events: int, nbytes: int) -> None:
        if self.events is not None:
            self.events.take(events)
        if self.bytes is not None:
            self.bytes.take(nbytes)


class _Applied(NamedTuple):
    scope: str
    name: str
    limit: Limit


class RateLimiter:
    """All configured limits of one ingestor process; see the module docstring."""

    def __init__(self, config: Config, metrics: IngestMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.metrics = metrics
        now = clock()
        self.streams = {s.name: Limit(s.rate_limit, now) for s in config.streams
                        if s.rate_limit is not None}
        self.tokens = {t.name: Limit(t.rate_limit, now) for t in config.tokens
                       if t.rate_limit is not None}
        self.client_limit = config.ingestor.client_rate_limit
        self.clients: OrderedDict[str, Limit] = OrderedDict()
        self.enabled = bool(self.streams or self.tokens or self.client_limit)
        self._configured = {("stream", s.name): s.rate_limit for s in config.streams
                            if s.rate_limit is not None}
        self._configured.update({("token", t.name): t.rate_limit for t in config.tokens
                                 if t.rate_limit is not None})
        self._export(config)

    def carry(self, earlier: RateLimiter) -> None:
        """Keep ``earlier``'s buckets (the registry version before) for every limit that
        did not change, and its clients' when the client limit did not. Why: a new
        registry version (any admin write) would otherwise refill every bucket, letting
        each stream, token and client burst again."""
        for scope, table in (("stream", self.streams), ("token", self.tokens)):
            old_table = earlier.streams if scope == "stream" else earlier.tokens
            for name in list(table):
                same = earlier._configured.get((scope, name)) == \
                    self._configured.get((scope, name))
                if same and name in old_table:
                    table[name] = old_table[name]
        if self.client_limit == earlier.client_limit:
            self.clients = earlier.clients

    def _export(self, config: Config) -> None:
        """The configured limits as a gauge (per process), so dashboards can show usage
        against them."""
        gauge = self.metrics.rate_limit
        limits = [("stream", s.name, s.rate_limit) for s in config.streams]
        limits += [("token", t.name, t.rate_limit) for t in config.tokens]
        limits.append(("client", "*", config.ingestor.client_rate_limit))
        for scope, name, limit in limits:
            if limit is None:
                continue
            for measure, value in (("events_per_s", limit.events_per_s),
                                   ("bytes_per_s", limit.bytes_per_s)):
                if value is not None:
                    gauge.labels(scope, name, measure).set(value)

    def admit(self, stream: str, token: str | None, client: str | None, events: int,
              nbytes: int, *, take: bool = True) -> None:
        """Take ``events`` and ``nbytes`` from every bucket that applies, or none of them.

        ``take=False`` only checks (used before reading a body: an empty bucket refuses
        the request before it costs anything).

        Raises:
            Overloaded: ``rate_limited``, with ``retry_after_s`` from the fullest bucket.
        """
        if not self.enabled:
            return
        now = self.clock()
        applied = self._applied(stream, token, client, now)
        self._refuse_if_short(stream, applied, events, nbytes, now)
        if take:
            for item in applied:
                item.limit.take(events, nbytes)

    def precheck_client(self, stream: str, client: str | None) -> None:
        """Refuse a client whose own bucket is empty, before its token is even looked at
        (a client over its limit cannot make the ingestor verify tokens for it).

        Raises:
            Overloaded: ``rate_limited``.
        """
        if self.client_limit is None or client is None:
            return
        now = self.clock()
        applied = [_Applied("client", client, self._client(client, now))]
        self._refuse_if_short(stream, applied, 1, 1, now)

    def _refuse_if_short(self, stream: str, applied: list[_Applied], events: int,
                         nbytes: int, now: float) -> None:
        worst: _Applied | None = None
        wait = 0.0
        for item in applied:
            item_wait = item.limit.wait_s(events, nbytes, now)
            if item_wait > wait:
                wait, worst = item_wait, item
        if worst is not None:
            self.metrics.rate_limited_requests.labels(stream, worst.scope).inc()
            raise _rate_limited(worst, wait)

    def _applied(self, stream: str, token: str | None, client: str | None, now: float
                 ) -> list[_Applied]:
        applied: list[_Applied] = []
        limit = self.streams.get(stream)
        if limit is not None:
            applied.append(_Applied("stream", stream, limit))
        if token is not None and (limit := self.tokens.get(token)) is not None:
            applied.append(_Applied("token", token, limit))
        if client is not None and self.client_limit is not None:
            applied.append(_Applied("client", client, self._client(client, now)))
        return applied

    def _client(self, client: str, now: float) -> Limit:
        client = client_key(client)
        limit = self.clients.get(client)
        if limit is None:
            if len(self.clients) >= MAX_CLIENTS:
                self.clients.popitem(last=False)
            # (called only with a client limit set: see the caller)
            limit = self.clients[client] = Limit(self.client_limit, now)  # type: ignore[arg-type]
        else:
            self.clients.move_to_end(client)
        return limit


def client_key(client: str) -> str:
    """The bucket of a client address: itself (IPv4, or not an address), or its IPv6 /64."""
    if ":" not in client:
        return client
    try:
        address = ipaddress.IPv6Address(client)
    except ValueError:
        return client
    return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))


def _rate_limited(item: _Applied, wait_s: float) -> Overloaded:
    what = {"stream": f"stream {item.name!r}", "token": f"token {item.name!r}",
            "client": "this client address"}[item.scope]
    return Overloaded(f"{what} is over its rate limit on this ingestor; retry after "
                      f"{wait_s:.2f} s", code="rate_limited", retry_after_s=wait_s)
