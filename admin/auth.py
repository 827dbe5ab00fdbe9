"""Bearer tokens of the admin API, checked against the salted hashes of ``[admin] tokens``.

Why a cache: a scrypt verification costs tens of milliseconds; each distinct presented
token is verified once (in a worker thread) and the outcome kept under a keyed BLAKE2b MAC
of the token, never the token itself. The admin API has few callers, so a small bound
suffices; wrong tokens are remembered too, so hammering one costs nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections import OrderedDict
from collections.abc import Sequence

from icefloe.tokens import TokenHash, parse_hash

MAX_CACHED = 256


class AdminAuth:
    def __init__(self, hashes: Sequence[str]) -> None:
        self._hashes: list[TokenHash] = [parse_hash(h) for h in hashes]
        self._key = secrets.token_bytes(32)
        self._cache: OrderedDict[bytes, bool] = OrderedDict()

    async def check(self, token: str) -> bool:
        mac = hashlib.blake2b(token.encode(), key=self._key, digest_size=32).digest()
        known = self._cache.get(mac)
        if known is None:
            known = await asyncio.to_thread(self._verify, token)
            self._cache[mac] = known
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        return known

    def _verify(self, token: str) -> bool:
        return any(h.verify(token) for h in self._hashes)
