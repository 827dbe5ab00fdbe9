"""Generated event-id prefixes: monotonic ULIDs for ~0.3 µs instead of ~3 µs each.

Why: a request without ids or an idempotency key gets ``<ULID>-<index>`` ids, one ULID per
request. Building and encoding a fresh ULID (``str(ULID())``) costs ~3 µs — a tenth of a
whole single-event request in the HTTP fast lane. Here one random ULID is drawn per
millisecond with its low 20 bits zero, and the requests of that millisecond count up in
those bits (the ULID spec's monotonic mode: same timestamp, randomness + 1). Only the last
four characters change, taken from a table. Ids stay unique across processes (60 random bits
per millisecond and process) and sort by time like any ULID.
"""

from __future__ import annotations

import secrets
from typing import Final

from ulid import ULID

_ALPHABET: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford base32, as ULIDs use
_PAIRS: Final = tuple(a + b for a in _ALPHABET for b in _ALPHABET)  # 10 bits -> 2 chars
_COUNTER_BITS: Final = 20  # the last 4 of a ULID's 26 characters


class UlidSource:
    """Monotonic ULID strings for one process (one event loop: not thread-safe)."""

    __slots__ = ("_count", "_ms", "_stem")

    def __init__(self) -> None:
        self._ms = -1
        self._stem = ""
        self._count = 0

    def next(self, now_ms: int) -> str:
        """A ULID for ``now_ms``, greater than the earlier ones of this millisecond (after
        2^20 of them, a fresh random stem: unique still, no longer ordered)."""
        count = self._count
        if now_ms != self._ms or count >> _COUNTER_BITS:
            random_high = secrets.randbits(80 - _COUNTER_BITS) << _COUNTER_BITS
            self._stem = str(ULID.from_int((now_ms << 80) | random_high))[:22]
            self._ms, count = now_ms, 0
        self._count = count + 1
        return self._stem + _PAIRS[count >> 10] + _PAIRS[count & 1023]
