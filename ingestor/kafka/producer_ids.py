"""Kafka producer ids, unique across every ingestor and every restart, forever.

Why: an idempotent Kafka producer asks for an id (``InitProducerId``) and tags every batch
with it; the broker side must never give two producers the same id, or one producer's
sequence numbers would be checked against another's. Ingestors keep no state, so the only
place to remember which ids are taken is the object store.

How: one small JSON object holds the next free id. An ingestor claims a whole *block* of
ids with one compare-and-swap (``If-None-Match: *`` to create the object, ``If-Match`` on
its ETag afterwards) and hands them out from memory, so the store sees one write per
``block_size`` producers, not one per producer. A block is claimed by moving ``next`` past
it; a claim whose write may have landed without us seeing the answer only leaves a gap (its
block is never used), never a duplicate, because ids come only from a write we saw succeed.

The object must never be deleted or rewritten by hand: with it gone, ids would start again
at 1 and collide with producers still alive. A corrupt object is refused with an error
naming it, never overwritten. Unused tails of blocks (an ingestor that stops) are lost, by
design: int64 has room for ~9·10^15 blocks of 1000.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from icefloe.backoff import RetryPolicy
from icefloe.clock import SYSTEM, Clock
from icefloe.config import Config
from icefloe.errors import PermanentStoreError, TransientStoreError
from icefloe.store.base import AsyncObjectStore
from icefloe.store.cas import CasStats, Versioned, cas_document

__all__ = ["CLAIM_RETRY", "DEFAULT_BLOCK_SIZE", "FIRST_ID", "FORMAT", "MAX_ID", "SLOTS",
           "ProducerIds", "ProducerIdsDocument", "producer_ids_key"]

FORMAT = 1
"""Version of the object's layout; an object with another version is refused, not guessed."""
FIRST_ID = 1
"""Kafka reads producer id -1 as "none" and 0 is easy to mistake for unset: start at 1."""
MAX_ID = 2**63 - 1
"""Producer ids are int64 on the wire."""
SLOTS = 64
"""How many distinct :attr:`ProducerIds.slot` values there are (6 bits of an offset)."""
DEFAULT_BLOCK_SIZE = 1000
CLAIM_RETRY = RetryPolicy(max_attempts=10, base_delay_s=0.02, max_delay_s=1.0, budget_s=15.0)
"""Lost races when claiming a block: many ingestors starting together all race for the same
object, so a few losses in a row are normal; ten in a row mean sustained contention."""


class ProducerIdsDocument(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The stored object: ``next`` is the first id nobody has claimed, ``block`` the size of
    the last block claimed, ``claims`` how many blocks were claimed so far (the index of the
    next block: what :attr:`ProducerIds.slot` derives from)."""

    format: int = FORMAT
    next: int = FIRST_ID
    block: int = 0
    claims: int = 0

    def encode(self) -> bytes:
        return msgspec.json.encode(self)


def producer_ids_key(config: Config) -> str:
    """The object's key: ``kafka/producer-ids.json`` in the registry document's folder.

    Why there: it is cluster state of the same kind (one small CAS document every ingestor
    reads), so it lives, and is backed up or split to the control store, with the registry.
    """
    folder = posixpath.dirname(config.admin.registry_key)
    return posixpath.join(folder, "kafka", "producer-ids.json")


def _corrupt(key: str, reason: str) -> PermanentStoreError:
    return PermanentStoreError(
        f"kafka producer ids object {key!r} is corrupt ({reason}); refusing to hand out "
        "producer ids rather than risk reusing one. Restore the object from a backup, or "
        "replace it by hand with "
        f'{{"format": {FORMAT}, "next": N, "block": 0, "claims": 0}} where N is above '
        "every producer id ever handed out; never delete it", op="get", key=key)


def _decoder(key: str) -> Callable[[bytes], ProducerIdsDocument]:
    """A decoder that refuses anything but a well-formed object of this format, naming
    ``key``: a half-understood counter could hand out an id twice."""
    def decode(data: bytes) -> ProducerIdsDocument:
        try:
            doc = msgspec.json.decode(data, type=ProducerIdsDocument)
        except msgspec.MsgspecError as exc:
            raise _corrupt(key, f"not a producer ids document: {exc}") from None
        if doc.format != FORMAT:
            raise PermanentStoreError(
                f"kafka producer ids object {key!r} has format {doc.format}; this icefloe "
                f"reads format {FORMAT}: upgrade icefloe", op="get", key=key)
        if not FIRST_ID <= doc.next <= MAX_ID + 1:
            raise _corrupt(key, f"next = {doc.next} is outside {FIRST_ID}..{MAX_ID + 1}")
        if doc.claims < 0 or doc.block < 0:
            raise _corrupt(key, f"claims = {doc.claims}, block = {doc.block} must be >= 0")
        return doc
    return decode


@dataclass(frozen=True, slots=True)
class _Block:
    """Ids ``first`` up to ``end`` (exclusive), the ``index``-th block ever claimed."""

    first: int
    end: int
    index: int


class ProducerIds:
    """Hands out Kafka producer ids from blocks claimed in the store at ``key``.

    Call :meth:`start` once (it claims the first block, so :attr:`slot` is known), then
    :meth:`next_id` for each ``InitProducerId``. Safe for many concurrent callers on one
    event loop; ids are unique across processes because blocks are.
    """

    def __init__(self, store: AsyncObjectStore, key: str, *,
                 block_size: int = DEFAULT_BLOCK_SIZE, clock: Clock = SYSTEM,
                 backoff: RetryPolicy = CLAIM_RETRY) -> None:
        if not 1 <= block_size <= 2**31:
            raise ValueError(f"ProducerIds block_size {block_size} must be in 1..2**31")
        self.store = store
        self.key = key
        self.block_size = block_size
        self.clock = clock
        self.backoff = backoff
        self.stats = CasStats()
        """Block claims written and races lost (for metrics)."""
        self._lock = asyncio.Lock()
        self._block: _Block | None = None
        self._first_index: int | None = None
        self._next = 0
        self._claimed = 0

    async def start(self) -> None:
        """Claim the first block (idempotent): afterwards :attr:`slot` is known."""
        async with self._lock:
            if self._block is None:
                await self._claim()

    @property
    def slot(self) -> int:
        """``(index of this process's first block) % 64``: distinct for up to 64 processes
        that started one after another, which keeps their synthetic offsets apart."""
        if self._first_index is None:
            raise RuntimeError("ProducerIds.slot is known only after `await start()`")
        return self._first_index % SLOTS

    @property
    def blocks_claimed(self) -> int:
        """How many blocks this process claimed."""
        return self._claimed

    @property
    def block(self) -> range | None:
        """The ids of the block being handed out (None before the first claim)."""
        return None if self._block is None else range(self._block.first, self._block.end)

    @property
    def remaining(self) -> int:
        """Ids of the current block not handed out yet."""
        return 0 if self._block is None else self._block.end - self._next

    async def next_id(self) -> int:
        """The next unused producer id (> 0), claiming a new block when this one is spent.

        The lock makes concurrent callers wait for one claim instead of each claiming a
        block (and wasting it) or two of them taking the same id.
        """
        async with self._lock:
            if self._block is None or self._next >= self._block.end:
                await self._claim()
            value = self._next
            self._next += 1
            return value

    async def _claim(self) -> None:
        """Move ``next`` past one more block by CAS and make that block current."""
        try:
            loaded, new = await cas_document(
                self.store, self.key, _decoder(self.key), ProducerIdsDocument,
                self._advance, backoff=self.backoff, stats=self.stats,
                what="kafka producer ids", clock=self.clock)
        except TransientStoreError as exc:
            # a claim that may have landed only leaves a gap: nothing is ambiguous to callers
            raise TransientStoreError(
                f"kafka producer ids {self.key!r}: could not claim a block of "
                f"{self.block_size} ids: {exc}. No producer id was handed out; the Kafka "
                "client retries InitProducerId, and the store's health needs a look if this "
                "persists", op=exc.op or "put", key=self.key, ambiguous=False,
                code=exc.code) from exc
        assert new is not None  # _advance always writes
        block = _Block(loaded.value.next, new.next, loaded.value.claims)
        if self._first_index is None:
            self._first_index = block.index
        self._block, self._next = block, block.first
        self._claimed += 1

    def _advance(self, loaded: Versioned[ProducerIdsDocument]) -> ProducerIdsDocument:
        """The document with one more block of ``block_size`` ids claimed (pure: the CAS
        loop re-runs it on a fresh read after a lost race)."""
        doc = loaded.value
        end = doc.next + self.block_size
        if end - 1 > MAX_ID:
            raise PermanentStoreError(
                f"kafka producer ids {self.key!r}: int64 producer ids are exhausted (next = "
                f"{doc.next}); no more ids can be handed out", op="put", key=self.key)
        return ProducerIdsDocument(FORMAT, end, self.block_size, doc.claims + 1)
