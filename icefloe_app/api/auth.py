"""Bearer tokens of the admin API, checked against the salted hashes of ``[admin] tokens``.

Why a cache: a scrypt verification costs tens of milliseconds; each distinct presented
token is verified once and the outcome kept under a keyed BLAKE2b MAC of the token, never
the token itself; wrong tokens are remembered too, so hammering one costs nothing.

Why one thread and a failure budget: verifications run on a single thread of their own, so
a flood of distinct wrong tokens can take at most one core and never the default thread
pool (which the collector's commits use under ``icefloe up``); and each client address may
fail ``FAILED_BURST`` verifications at once and ``FAILED_PER_S`` per second after that —
beyond, its unknown tokens are refused (429) without being verified. Proven tokens stay
cached, so an operator under attack keeps working: they are kept apart from the refused
ones (which a flood of distinct wrong tokens churns) and evicted least recently used. An
IPv6 client's budget is its /64, as the ingestors' rate limits count it (a host is
routinely given a whole /64).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from icefloe.clock import SYSTEM, Clock
from icefloe.tokens import TokenHash, hash_token, parse_hash
from ingestor.ratelimit import client_key

MAX_CACHED = 256
FAILED_BURST = 10
FAILED_PER_S = 1.0
MAX_CLIENTS = 10_000


class Throttled(Exception):
    """This client failed too many token checks lately; it may retry later."""


class AdminAuth:
    def __init__(self, hashes: Sequence[str], *, clock: Clock = SYSTEM) -> None:
        self._clock = clock
        """Refills the failure budgets (injected so a test's budget does not refill
        while a loaded machine runs it)."""
        self._hashes: list[TokenHash] = [parse_hash(h) for h in hashes]
        self._key = secrets.token_bytes(32)
        self._proven: OrderedDict[bytes, None] = OrderedDict()
        """MACs of admin tokens verified, least recently used first."""
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        """MACs of wrong tokens, oldest first (apart: they never evict a proven one)."""
        self._failures: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="admin-auth")

    async def check(self, token: str, client: str | None = None) -> bool:
        """Whether ``token`` is an admin token. Raises :class:`Throttled` for a client
        over its failure budget presenting a token not seen before."""
        mac = hashlib.blake2b(token.encode(), key=self._key, digest_size=32).digest()
        if mac in self._proven:
            self._proven.move_to_end(mac)
            return True
        if mac in self._refused:
            return False
        client = client_key(client or "-")
        now = self._clock.monotonic()
        if self._budget(client, now) < 1:
            raise Throttled(client)
        known = await asyncio.get_running_loop().run_in_executor(
            self._pool, self._verify, token)
        cache = self._proven if known else self._refused
        cache[mac] = None
        while len(cache) > MAX_CACHED:
            cache.popitem(last=False)
        if not known:
            self._failures[client] = (self._budget(client, now) - 1, now)
            self._failures.move_to_end(client)
            while len(self._failures) > MAX_CLIENTS:
                self._failures.popitem(last=False)
        return known

    def _budget(self, client: str, now: float) -> float:
        """Failures this client may still make (a token bucket refilling per second)."""
        left, at = self._failures.get(client, (float(FAILED_BURST), now))
        return min(float(FAILED_BURST), left + (now - at) * FAILED_PER_S)

    async def hash_in_pool(self, token: str) -> str:
        """Hash a new token off the event loop (scrypt is slow on purpose)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, hash_token, token)

    def _verify(self, token: str) -> bool:
        return any(h.verify(token) for h in self._hashes)
