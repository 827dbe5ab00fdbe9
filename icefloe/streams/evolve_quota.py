"""Evolution quotas: how many columns each client has added to a table, per hour and in
total, and whether it may add one more.

Why a ledger in the table's properties: the counts must survive a collector restart or a
takeover, and the one place that already changes atomically with the columns is the
table's metadata. The collector writes the ledger in the same metadata commit as the
columns it charges (a commit that asserts the schema it planned against), so a column and
its charge land together or not at all; a re-run after a crash finds the columns and
charges nothing. Hours are clock hours (UTC) of the collector's injected clock.

A *client* is ``<source>/<token name>``: the write token an event came with (its config
name, e.g. ``pages.tokens[1]`` or a ``[[tokens]]`` entry's name; the ingestor puts it in
the payload member :data:`~icefloe.streams.evolution.CLIENT_FIELD`), or
``<source>/-`` for an event sent without one (an open stream, or a batch written before
the client was recorded). The source bounds count every client of the source.

Property :data:`PROPERTY`, a JSON object::

    {"v": 1, "hour": 493372, "clients": {"pages/pages.tokens[0]": [12, 3]},
     "sources": {"pages": [12, 3]}}

per key ``[total, added in "hour"]``; ``hour`` is ``floor(unix seconds / 3600)``. Counts of
an earlier hour read as 0 for the current one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec

from icefloe.streams.model import EvolveQuota

PROPERTY = "icefloe.evolve.added"
ANONYMOUS = "-"
"""The token part of a client that sent no token."""
DEFAULT_QUOTA = EvolveQuota()


def client_key(source: str, token: str | None) -> str:
    """The ledger key of a client: ``<source>/<token name or ->``."""
    return f"{source}/{token or ANONYMOUS}"


def source_of(client: str) -> str:
    return client.rsplit("/", 1)[0]


@dataclass
class Ledger:
    """The counts of one table, as of clock hour ``hour``."""

    hour: int
    clients: dict[str, list[int]] = field(default_factory=dict)
    sources: dict[str, list[int]] = field(default_factory=dict)
    charged: bool = False
    """Whether :meth:`charge` changed it (then it must be committed with the columns)."""

    def over(self, client: str, quota: EvolveQuota) -> str | None:
        """Why ``client`` may not add one more column now (naming the key), or None."""
        total, in_hour = self.clients.get(client, (0, 0))
        source = source_of(client)
        s_total, s_hour = self.sources.get(source, (0, 0))
        for used, bound, key, who in (
                (in_hour, quota.token_columns_per_hour, "token_columns_per_hour", client),
                (total, quota.token_columns_total, "token_columns_total", client),
                (s_hour, quota.source_columns_per_hour, "source_columns_per_hour", source),
                (s_total, quota.source_columns_total, "source_columns_total", source)):
            if bound and used >= bound:
                return (f"client {who!r} has added {used} columns (evolve_quota.{key} = "
                        f"{bound})")
        return None

    def charge(self, client: str) -> None:
        """Count one new column against ``client`` and its source."""
        for book, key in ((self.clients, client), (self.sources, source_of(client))):
            counts = book.setdefault(key, [0, 0])
            counts[0] += 1
            counts[1] += 1
        self.charged = True

    def dump(self) -> str:
        return msgspec.json.encode({"v": 1, "hour": self.hour, "clients": self.clients,
                                    "sources": self.sources}).decode()


def hour_of(now: float) -> int:
    return math.floor(now / 3600)


def load(text: str | None, now: float) -> Ledger:
    """The ledger in a table's :data:`PROPERTY` (None: nothing added yet) as of ``now``
    (seconds, the injected clock). An unreadable value is treated as empty and logged by
    the caller's schema commit, which rewrites it: quotas are a guard, not an offset."""
    hour = hour_of(now)
    ledger = Ledger(hour)
    if not text:
        return ledger
    try:
        data = msgspec.json.decode(text, type=dict[str, object])
        stored_hour = data.get("hour")
        same = stored_hour == hour
        for name in ("clients", "sources"):
            book = data.get(name) or {}
            assert isinstance(book, dict)
            getattr(ledger, name).update(
                {str(k): [int(v[0]), int(v[1]) if same else 0] for k, v in book.items()})
    except (msgspec.DecodeError, AssertionError, TypeError, ValueError, IndexError, KeyError):
        return Ledger(hour)
    return ledger
