"""Write-token checks against the salted hashes in the config, fast after the first time.

Why a cache, and why keyed: a scrypt verification costs ~70 ms, far too much per request,
so each distinct presented token is verified once per stream and the outcome remembered.
The cache is keyed by the stream and a keyed BLAKE2b MAC of the token under a random
per-process key — never the token itself — so a heap dump or a debugger shows nothing
replayable, and an attacker cannot choose inputs that collide with a cached entry. (Keyed
BLAKE2b is a MAC like HMAC-SHA256, at half its cost: ~1 µs per request here.) Per stream,
because one token may match different entries for different streams (the same hash line
pasted into two streams' ``tokens``): each stream verifies it against its own candidates
once. The verification itself compares digests in constant time
(:meth:`icefloe.tokens.TokenHash.verify`).

Who may write where: a stream accepts requests without a token only when no token is valid
for it (neither its own ``tokens`` nor a ``[[tokens]]`` entry naming it or ``"*"``).
Missing token → :class:`Unauthenticated` (401); a token that is wrong, or valid only for
other streams → :class:`PermissionDenied` (403). Messages never contain the token.

Cost control: verifications run in worker threads (hashlib releases the GIL), at most
``max_parallel`` at once, so the event loop keeps serving requests whose token is cached;
beyond ``max_waiting`` queued verifications new unknown tokens get 429 ``auth_busy``. A
wrong token is remembered too (bounded), so retrying it costs nothing. A flood of distinct
wrong tokens therefore costs at most ``max_parallel`` cores and delays only first-time
tokens — and it is charged to the client that sends it: each client address may fail
``FAILED_BURST`` slow verifications at once and ``FAILED_PER_S`` per second after that;
beyond, its first-time tokens get 429 ``auth_throttled`` without being verified, so one
address cannot keep the verification threads busy for everyone else (tokens it already
proved stay cached and keep working). Not thread-safe: one instance belongs to one event
loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.config.security import ALL_STREAMS
from icefloe.tokens import TokenHash, parse_hash
from ingestor.errors import Overloaded, PermissionDenied, Unauthenticated

log = logging.getLogger("icefloe.ingestor.auth")

MAX_CACHED = 10_000
"""Distinct valid tokens remembered (a deployment has far fewer); refused ones likewise."""
MAX_PARALLEL = 2
MAX_WAITING = 64
FAILED_PER_S = 1.0
FAILED_BURST = 5.0
K = TypeVar("K")
V = TypeVar("V")


class NeedsVerification(Exception):
    """A token this process has not verified yet: only the awaiting path can decide."""

    def __init__(self, key: tuple[str, bytes]) -> None:
        super().__init__("token not verified yet")
        self.key = key


@dataclass(frozen=True, slots=True, eq=False)
class Credential:
    """One configured token hash: who it is (``name``, safe to log) and where it may write
    (``streams``; None = every stream)."""

    name: str
    hash: TokenHash
    streams: frozenset[str] | None
    named: bool
    """True for ``[[tokens]]`` entries (which may carry a per-token rate limit)."""

    def allows(self, stream: str) -> bool:
        return self.streams is None or stream in self.streams


def _identity(credential: Credential) -> tuple[object, ...]:
    """What makes two credentials (of two registry versions) the same one."""
    return (credential.name, credential.hash, credential.streams, credential.named)


def credentials(config: Config) -> list[Credential]:
    """Every configured token hash (the config was validated at load)."""
    found = [Credential(t.name, parse_hash(t.hash),
                        None if ALL_STREAMS in t.streams else frozenset(t.streams), True)
             for t in config.tokens]
    for stream in config.streams:
        found += [Credential(f"{stream.name}.tokens[{i}]", parse_hash(entry),
                             frozenset((stream.name,)), False)
                  for i, entry in enumerate(stream.tokens)]
    return found


class TokenAuthority:
    """Decides whether a presented token may write to a stream (see module docstring)."""

    def __init__(self, config: Config, *, max_cached: int = MAX_CACHED,
                 max_parallel: int = MAX_PARALLEL, max_waiting: int = MAX_WAITING,
                 clock: Clock = SYSTEM) -> None:
        self._key = secrets.token_bytes(32)
        self._clock = clock
        """What the failed-verification budget refills on."""
        self._max_cached = max_cached
        self._max_waiting = max_waiting
        self._max_parallel = max_parallel
        every = credentials(config)
        self._candidates: dict[str, tuple[Credential, ...]] = {
            s.name: tuple(c for c in every if c.allows(s.name)) for s in config.streams}
        self._known: OrderedDict[tuple[str, bytes], Credential] = OrderedDict()
        self._refused: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._slots: asyncio.Semaphore | None = None
        self._failures: OrderedDict[str, tuple[float, float]] = OrderedDict()
        """Per client address: failed-verification budget left, and when it was counted."""
        self._waiting = 0
        self.verifications = 0
        """Slow hash verifications run so far (tests and benchmarks read it)."""

    def carry(self, earlier: TokenAuthority) -> None:
        """Take over what ``earlier`` (the authority of the registry version before) learnt
        that still holds: its verified tokens whose credential this configuration still
        has for that stream, its refusals for streams whose tokens did not change, and the
        per-client failure budgets. Why: every registry version (any admin write, a parked
        table's retry) builds a new authority, and starting empty made every client's
        token be verified again (a slow hash each, two at a time: 429 ``auth_busy`` for
        many clients at once) and refilled the failure budgets."""
        self._key = earlier._key  # the cache is keyed by its MAC of the token
        for (stream, mac), credential in earlier._known.items():
            same = next((c for c in self._candidates.get(stream, ())
                         if _identity(c) == _identity(credential)), None)
            if same is not None:
                self._known[(stream, mac)] = same
        for stream, mac in earlier._refused:
            if [_identity(c) for c in self._candidates.get(stream, ())] == \
                    [_identity(c) for c in earlier._candidates.get(stream, ())]:
                self._refused[(stream, mac)] = None
        self._failures = earlier._failures
        self.verifications = earlier.verifications

    def protected(self, stream: str) -> bool:
        """Whether ``stream`` needs a token."""
        return bool(self._candidates.get(stream))

    def _mac(self, token: str) -> bytes:
        return hashlib.blake2b(token.encode("utf-8", "surrogatepass"), key=self._key,
                               digest_size=32).digest()

    async def authorize(self, stream: str, token: str | None, client: str | None = None
                        ) -> Credential | None:
        """The credential that lets ``token`` write to ``stream``; None for an open stream.

        ``client`` (an address) only goes into the log line of a first refusal.

        Raises:
            Unauthenticated: the stream needs a token and none was sent.
            PermissionDenied: the token is not valid for this stream.
            Overloaded: too many first-time tokens are being verified (``auth_busy``).
        """
        try:
            return self.authorize_known(stream, token)
        except NeedsVerification as first_time:
            credential = await self._verify(token or "", first_time.key,
                                            self._candidates[stream], client)
        if not credential.allows(stream):
            raise _denied(stream)
        return credential

    def authorize_known(self, stream: str, token: str | None) -> Credential | None:
        """:meth:`authorize` without awaiting, for callers that cannot wait (the HTTP fast
        lane): decides when the stream is open or the token's outcome is cached.

        Raises:
            NeedsVerification: a first-time token; :meth:`authorize` verifies it.
            Unauthenticated, PermissionDenied: as :meth:`authorize`.
        """
        candidates = self._candidates.get(stream)
        if not candidates:
            return None
        if not token:
            raise Unauthenticated(f"stream {stream!r} needs a write token: send "
                                  "'Authorization: Bearer <token>' (gRPC: 'authorization' "
                                  "metadata)")
        key = (stream, self._mac(token))
        credential = self._known.get(key)
        if credential is None:
            if key in self._refused:
                raise _denied(stream)
            raise NeedsVerification(key)
        if not credential.allows(stream):
            raise _denied(stream)
        return credential

    def _budget(self, client: str, now: float) -> float:
        """The client's failed-verification budget now (refilled since last counted)."""
        left, at = self._failures.get(client, (FAILED_BURST, now))
        return min(FAILED_BURST, left + (now - at) * FAILED_PER_S)

    async def _verify(self, token: str, key: tuple[str, bytes],
                      candidates: Sequence[Credential], client: str | None) -> Credential:
        stream = key[0]
        now = self._clock.monotonic()
        if client is not None and self._budget(client, now) < 1.0:
            wait = (1.0 - self._budget(client, now)) / FAILED_PER_S
            raise Overloaded("too many wrong tokens from this address; retry later",
                             code="auth_throttled", retry_after_s=max(1.0, wait))
        if self._waiting >= self._max_waiting:
            raise Overloaded("too many new tokens are being verified at once; retry shortly",
                             code="auth_busy", retry_after_s=1.0)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_parallel)
        self._waiting += 1
        try:
            async with self._slots:
                found = await asyncio.to_thread(_match, token, candidates)
        finally:
            self._waiting -= 1
        self.verifications += 1
        if found is None:
            _remember(self._refused, key, None, self._max_cached)
            if client is not None:
                now = self._clock.monotonic()
                _remember(self._failures, client, (self._budget(client, now) - 1.0, now),
                          self._max_cached)
            log.warning("refused a token for stream %r from %s: it matches no hash valid "
                        "for that stream (later refusals of it are not logged)", stream,
                        client or "an unknown address")
            raise _denied(stream)
        _remember(self._known, key, found, self._max_cached)
        log.info("token %r verified for stream %r (cached for this process)", found.name,
                 stream)
        return found


def _match(token: str, candidates: Sequence[Credential]) -> Credential | None:
    """The first credential whose hash ``token`` matches (runs in a worker thread)."""
    for credential in candidates:
        if credential.hash.verify(token):
            return credential
    return None


def _remember(cache: OrderedDict[K, V], key: K, value: V, bound: int) -> None:
    cache[key] = value
    if len(cache) > bound:
        cache.popitem(last=False)


def _denied(stream: str) -> PermissionDenied:
    return PermissionDenied(f"the token is not valid for stream {stream!r}")
