"""Realistic events for ``icefloe demo``, generated from a stream's declared columns.

Why names *and* types: column names pick the flavour (``user_id`` from a small pool so there
are repeats to group by, ``url`` from a site map, ``amount`` log-normal with 2 decimals,
currencies, timestamps just before now, small JSON objects), while the declared *type*
always decides what is sent, so any config gets valid events. Required columns are always
present, optional ones are sometimes left out, and the ``event_id_field`` gets a unique id.
All randomness comes from one seeded generator, so a seed reproduces the events and ids.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from icefloe.config import Column, StreamConfig
from icefloe.streams.mappings import place_value

OMIT_RATE = 0.05
"""Share of optional columns left out of an event."""
SITE_MAP: tuple[tuple[str, int], ...] = (
    ("/", 30), ("/pricing", 10), ("/docs", 8), ("/docs/quickstart", 8),
    ("/docs/configuration", 5), ("/docs/exactly-once", 4), ("/blog", 5),
    ("/blog/ingest-without-a-broker", 6), ("/blog/iceberg-for-event-data", 4),
    ("/products/floe-one", 6), ("/products/floe-pro", 4), ("/cart", 4), ("/checkout", 3),
    ("/search?q=iceberg", 3), ("/about", 2), ("/careers", 1), ("/login", 3), ("/signup", 2),
)
REFERRERS: tuple[tuple[str | None, int], ...] = (
    (None, 35), ("https://www.google.com/", 30), ("https://duckduckgo.com/", 5),
    ("https://news.ycombinator.com/", 8), ("https://github.com/", 6), ("https://t.co/", 4),
    ("https://www.linkedin.com/", 4), ("https://icefloe.example/blog", 8),
)
CURRENCIES: tuple[tuple[str, int], ...] = (
    ("USD", 50), ("EUR", 30), ("GBP", 10), ("JPY", 5), ("CHF", 5))
COUNTRIES: tuple[tuple[str, int], ...] = (
    ("US", 40), ("DE", 12), ("GB", 10), ("FR", 8), ("JP", 6), ("BR", 6), ("IN", 10),
    ("CH", 3), ("NL", 5))
AGENTS: tuple[tuple[str, int], ...] = (
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/131.0", 40),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) Safari/605.1.15", 25),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) Mobile/15E148", 20),
    ("Mozilla/5.0 (X11; Linux x86_64) Firefox/133.0", 10), ("curl/8.11.0", 5))
STATUSES: tuple[tuple[str, int], ...] = (
    ("paid", 70), ("pending", 15), ("shipped", 10), ("refunded", 5))
ACTIONS: tuple[tuple[str, int], ...] = (
    ("view", 50), ("click", 30), ("scroll", 10), ("submit", 5), ("share", 5))
CHANNELS: tuple[tuple[str, int], ...] = (
    ("web", 55), ("ios", 20), ("android", 20), ("email", 5))
COUPONS: tuple[tuple[str | None, int], ...] = (
    (None, 80), ("WELCOME10", 10), ("SPRING25", 6), ("FREESHIP", 4))
TAGS = ("new", "repeat", "mobile", "promo", "b2b", "gift")
WORDS = ("alpha", "bravo", "delta", "echo", "glacier", "harbor", "iceberg", "floe", "tundra",
         "polar", "aurora", "fjord")
USER_POOL = 50
SESSION_POOL = 200

Maker = Callable[[], Any]


def _weighted(rng: random.Random, options: Sequence[tuple[Any, int]]) -> Maker:
    """A picker from ``(value, weight)`` pairs (cumulative weights computed once)."""
    values = [v for v, _ in options]
    cumulative = list(itertools.accumulate(w for _, w in options))
    return lambda: rng.choices(values, cum_weights=cumulative)[0]


def _has(name: str, *parts: str) -> bool:
    """Whether a column name mentions any of ``parts``.

    Short parts (``ip``, ``lat``, ``ms``) must be a whole ``_``-separated word — else
    ``shipped`` would be an IP address and ``latency`` a latitude; longer ones may appear
    inside a word (``referrer_url``, ``pageviews``).
    """
    lowered = name.lower()
    words = set(lowered.split("_"))
    return any(part in words if len(part) <= 3 else part in lowered for part in parts)


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


class EventFactory:
    """Realistic events for one stream, from its declared columns and a seeded generator.

    Why one maker per column, chosen once: generation must keep up with thousands of events
    per second on one core, so the name heuristics run at start, not per event.
    """

    def __init__(self, stream: StreamConfig, rng: random.Random) -> None:
        self.stream = stream
        self.rng = rng
        self._users = [f"u_{i:04d}" for i in rng.sample(range(1, 10_000), USER_POOL)]
        # Zipf-like: a few heavy users, a long tail (repeats to group by).
        self._user_weights = list(itertools.accumulate(1 / (i + 1) for i in range(USER_POOL)))
        self._sessions = [f"s_{rng.getrandbits(48):012x}" for _ in range(SESSION_POOL)]
        self._columns: list[tuple[Column, bool, Maker]] = [
            (c, c.required or c.name == stream.event_id_field,
             self._id_maker(c) if c.name == stream.event_id_field else self._maker(c))
            for c in stream.columns if c.mapping in (None, "path")]

    def make(self) -> dict[str, Any]:
        """One event: required columns always, optional ones now and then left out."""
        event: dict[str, Any] = {}
        for column, always, maker in self._columns:
            if not always and self.rng.random() < OMIT_RATE:
                continue
            value = maker()
            if value is None and not always:
                continue  # e.g. a direct visit has no referrer
            place_value(event, column, value)  # a path column's value goes where it reads
        return event

    # -- per column ----------------------------------------------------------------------------

    def _id_maker(self, column: Column) -> Maker:
        """Unique values for the event id column: retries then reuse, never collide."""
        rng = self.rng
        if column.type == "string":
            return lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if column.type in ("long", "int"):
            top = 2**62 if column.type == "long" else 2**30
            counter = itertools.count(rng.randrange(1, top))
            return lambda: next(counter)
        return self._maker(column)  # an odd id type: values are at least valid

    def _maker(self, column: Column) -> Maker:
        kind = {"string": self._string, "long": self._integer, "int": self._integer,
                "float": self._decimal, "double": self._decimal, "boolean": self._boolean,
                "timestamp": self._timestamp, "date": self._date, "json": self._json}
        return kind[column.type](column)

    def _user(self, prefix: str) -> Maker:
        rng, users, weights = self.rng, self._users, self._user_weights
        if prefix == "u_":
            return lambda: rng.choices(users, cum_weights=weights)[0]
        return lambda: prefix + rng.choices(users, cum_weights=weights)[0][2:]

    def _string(self, column: Column) -> Maker:
        rng, name = self.rng, column.name
        # Most specific first: ``user_agent`` is an agent and ``customer_email`` an email.
        if _has(name, "email"):
            return lambda: f"{rng.choice(self._users)}@example.com"
        if _has(name, "agent", "browser"):
            return _weighted(rng, AGENTS)
        if _has(name, "ip"):
            return lambda: f"203.0.113.{rng.randrange(1, 255)}"
        if _has(name, "referrer", "referer", "ref"):
            return _weighted(rng, REFERRERS)
        if _has(name, "url", "path", "page", "uri", "route"):
            return _weighted(rng, SITE_MAP)
        if _has(name, "session"):
            return lambda: rng.choice(self._sessions)
        if _has(name, "currency"):
            return _weighted(rng, CURRENCIES)
        if _has(name, "country"):
            return _weighted(rng, COUNTRIES)
        if _has(name, "customer", "buyer", "client"):
            return self._user("cus_")
        if _has(name, "user", "visitor", "account", "member"):
            return self._user("u_")
        if _has(name, "status", "state"):
            return _weighted(rng, STATUSES)
        if _has(name, "channel", "platform", "source"):
            return _weighted(rng, CHANNELS)
        if _has(name, "event", "action", "kind", "type"):
            return _weighted(rng, ACTIONS)
        if name.lower() == "id" or name.lower().endswith("_id"):
            prefix = name.lower().removesuffix("_id")[:4] or "id"
            return lambda: f"{prefix}_{rng.getrandbits(40):010x}"
        return lambda: f"{rng.choice(WORDS)}-{rng.randrange(1000)}"

    def _integer(self, column: Column) -> Maker:
        rng, name = self.rng, column.name
        top = 2**31 - 1 if column.type == "int" else 2**63 - 1
        if _has(name, "duration", "latency", "elapsed", "ms", "time"):
            # Log-normal: most page views take seconds, a few minutes.
            return lambda: min(top, int(rng.lognormvariate(8.0, 1.0)))
        if _has(name, "cents"):
            return lambda: min(top, int(rng.lognormvariate(3.6, 0.9) * 100))
        if _has(name, "item", "qty", "quantity", "count", "units") or name.lower() == "n":
            return _weighted(rng, ((1, 50), (2, 25), (3, 12), (4, 7), (5, 4), (8, 2)))
        if _has(name, "age"):
            return lambda: rng.randint(18, 80)
        if _has(name, "year"):
            return lambda: rng.randint(2019, dt.date.today().year)
        return lambda: rng.randrange(0, 1000)

    def _decimal(self, column: Column) -> Maker:
        rng, name = self.rng, column.name
        if _has(name, "amount", "price", "total", "revenue", "cost", "value", "sum"):
            # Log-normal basket values, median ~36.60, with cents.
            return lambda: round(rng.lognormvariate(3.6, 0.9), 2)
        if _has(name, "ratio", "rate", "score", "pct", "percent", "prob", "share"):
            return lambda: round(rng.random(), 3)
        if _has(name, "lat"):
            return lambda: round(rng.uniform(-55.0, 70.0), 5)
        if _has(name, "lon", "lng"):
            return lambda: round(rng.uniform(-180.0, 180.0), 5)
        return lambda: round(rng.uniform(0.0, 100.0), 2)

    def _boolean(self, column: Column) -> Maker:
        rng = self.rng
        likely = _has(column.name, "paid", "success", "ok", "valid", "active", "is", "has")
        threshold = 0.85 if likely else 0.5
        return lambda: rng.random() < threshold

    def _timestamp(self, column: Column) -> Maker:
        rng = self.rng
        # Events happened moments before they are sent (clients buffer, networks lag).
        return lambda: _rfc3339(time.time() - rng.expovariate(1 / 2.0))

    def _date(self, column: Column) -> Maker:
        rng = self.rng
        return lambda: (dt.date.today() - dt.timedelta(days=rng.randrange(31))).isoformat()

    def _json(self, column: Column) -> Maker:
        rng = self.rng
        channel, coupon = _weighted(rng, CHANNELS), _weighted(rng, COUPONS)

        def attributes() -> dict[str, Any]:
            value: dict[str, Any] = {"channel": channel(), "gift": rng.random() < 0.1,
                                     "tags": rng.sample(TAGS, rng.randrange(3))}
            code = coupon()
            if code is not None:
                value["coupon"] = code
            return value

        return attributes


