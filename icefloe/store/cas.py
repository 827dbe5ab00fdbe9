"""Compare-and-swap of one whole JSON-like document in the object store.

Why one loop for every such document (the manifest queue, the stream registry): each
change has the same shape — read the object and its ETag, compute the new value, PUT it
with ``If-Match`` (``If-None-Match: *`` to create), and on a lost race start over from a
fresh read. The mutation is a pure function of what was read, so re-running it after a
conflict or an ambiguous write is always safe, and a check it makes (a full queue, a table
already owned) always sees the latest document.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import NotFound, PreconditionFailed, StoreError, TransientStoreError
from icefloe.store.base import AsyncObjectStore, PutResult
from icefloe.store.retry import RetryPolicy


class Document(Protocol):
    def encode(self) -> bytes: ...


D = TypeVar("D", bound=Document)


@dataclass(frozen=True, slots=True)
class Versioned(Generic[D]):
    """A document as read, with the ETag the next CAS needs and the store's clock."""

    value: D
    etag: str | None
    store_time: float
    size: int


@dataclass
class CasStats:
    """Counters a process exports as metrics (``stale``: first attempts made on a
    remembered version that someone else had replaced — not races, see
    :class:`LastWritten`)."""

    writes: int = 0
    conflicts: int = 0
    stale: int = 0


class LastWritten(Generic[D]):
    """The version of a document this process wrote last, to skip the read before the next
    CAS.

    Why: a writer that appends often (the manifest producer, once per flush) would read
    back what it just wrote on every write: a GET per append, a round trip on S3 and a
    decode here. The conditional PUT checks the ETag anyway, so a first attempt on the
    remembered version is safe: if anyone wrote in between, it fails with 412, and the
    loop reads the document and goes on as usual. A mutation that writes nothing or
    refuses on the remembered version is redone on a fresh read: only a successful write
    proves the version was current. The store's clock is estimated as the clock at that
    write plus the local time elapsed since.

    When others write often (several producers on one manifest), most such attempts would
    fail, each costing a PUT with the whole body — more than the read it saves. So after
    ``k`` stale attempts in a row the next ``2**k - 1`` CASes (at most 63) read first; one
    write that succeeds on the remembered version resets ``k``.
    """

    MAX_SKIPPED = 63

    def __init__(self, clock: Clock = SYSTEM) -> None:
        self.clock = clock
        self._version: Versioned[D] | None = None
        self._at = 0.0
        self._misses = 0
        self._skip = 0

    def take(self) -> Versioned[D] | None:
        """The remembered version with its clock brought forward, or None (nothing
        remembered, or backing off); forgotten until the next write succeeds."""
        version, self._version = self._version, None
        if version is None:
            return None
        if self._skip:
            self._skip -= 1
            return None
        return Versioned(version.value, version.etag,
                         version.store_time + self.clock.monotonic() - self._at, version.size)

    def keep(self, version: Versioned[D], *, remembered: bool) -> None:
        """Remember ``version`` as written; ``remembered``: that write started from
        :meth:`take`'s version (it was current: stop backing off)."""
        if remembered:
            self._misses = 0
        self._version, self._at = version, self.clock.monotonic()

    def stale(self) -> None:
        """The version :meth:`take` gave had been replaced by someone else."""
        self._misses += 1
        self._skip = min(2 ** self._misses - 1, self.MAX_SKIPPED)


async def load_document(store: AsyncObjectStore, key: str, decode: Callable[[bytes], D],
                        empty: Callable[[], D], *, clock: Clock = SYSTEM) -> Versioned[D]:
    """Read and decode ``key``; a missing object reads as ``empty()`` with etag None (and
    ``clock``'s time: a missing object has no store time to report)."""
    try:
        result = await store.get(key)
    except NotFound:
        return Versioned(empty(), None, clock.time(), 0)
    return Versioned(decode(result.data), result.etag, result.store_time, len(result.data))


async def cas_document(store: AsyncObjectStore, key: str, decode: Callable[[bytes], D],
                       empty: Callable[[], D], mutate: Callable[[Versioned[D]], D | None], *,
                       backoff: RetryPolicy, stats: CasStats | None = None,
                       what: str = "document", last: LastWritten[D] | None = None,
                       clock: Clock = SYSTEM) -> tuple[Versioned[D], D | None]:
    """Apply ``mutate`` atomically; return what was read and what was written (or None).

    ``mutate`` returns None when nothing needs writing; it may raise to abort. Lost races
    retry with jittered backoff until ``backoff`` gives up, which surfaces as a transient
    error (sustained contention looks like an overloaded store). With ``last``, the first
    attempt starts from the version this process wrote last instead of a read, and a
    successful write is remembered there. ``clock`` times the give-up budget and the
    backoff sleeps.
    """
    started = clock.monotonic()
    attempt = 0
    remembered = last.take() if last is not None else None
    # a put of ours may have landed though it was seen refused: the retry layer re-sent a
    # write whose answer was lost, and the re-send met the ETag that write had made (the
    # re-read then finds it). A store error that ends this loop afterwards says so.
    uncertain = False
    try:
        while True:
            loaded = remembered or await load_document(store, key, decode, empty,
                                                       clock=clock)
            try:
                new = mutate(loaded)
            except Exception:
                if remembered is None:
                    raise
                new = None
            if new is None:
                if remembered is None:
                    return loaded, None
                # "nothing to write" or a refusal is only true of the current version,
                # and only a write that succeeds proves the remembered one current: read,
                # redo
                remembered = None
                continue
            data = new.encode()
            try:
                put = await _put(store, key, data, loaded.etag)
            except PreconditionFailed as exc:
                uncertain = uncertain or exc.ambiguous
                if remembered is not None:  # someone wrote since we did: read, and go on
                    assert last is not None
                    last.stale()
                    remembered = None
                    if stats is not None:
                        stats.stale += 1
                    continue
                attempt += 1
                await _after_lost_race(attempt, backoff, started, clock, stats, what, key)
                continue
            if stats is not None:
                stats.writes += 1
            if last is not None:
                last.keep(Versioned(new, put.etag, put.store_time, len(data)),
                          remembered=remembered is not None)
            return loaded, new
    except StoreError as exc:
        exc.ambiguous = exc.ambiguous or uncertain
        raise


async def _after_lost_race(attempt: int, backoff: RetryPolicy, started: float, clock: Clock,
                           stats: CasStats | None, what: str, key: str) -> None:
    """Wait before the next try after lost race number ``attempt``; raises (as an overloaded
    store) once ``backoff`` gives up."""
    if stats is not None:
        stats.conflicts += 1
    delay = backoff.delay(attempt)
    if attempt >= backoff.max_attempts or \
            clock.monotonic() - started + delay > backoff.budget_s:
        raise TransientStoreError(
            f"{what} {key!r}: lost {attempt} compare-and-swap races in a row over "
            f"{clock.monotonic() - started:.1f}s; the store is overloaded",
            op="put", key=key, ambiguous=False, code="CasContention") from None
    await clock.sleep(delay)


async def _put(store: AsyncObjectStore, key: str, data: bytes, etag: str | None
               ) -> PutResult:
    """The conditional put of a CAS: over ``etag``, or creating (``If-None-Match: *``)."""
    if etag is None:
        return await store.put(key, data, if_none_match="*")
    return await store.put(key, data, if_match=etag)
