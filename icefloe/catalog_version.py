"""The catalog version: one increasing number per collector run and model run.

Why a number of its own: DuckLake's ``a AT (VERSION => 3) JOIN b AT (VERSION => 3)`` reads
one moment of the whole lake, because its version is catalog-wide. Iceberg numbers commits
per table (sequence numbers), and icefloe adds empty fencing snapshots on takeover, so a
table's own numbers say nothing about another table's. Each collector run (and each
scheduled import of staged rows) and each model run (one ``icefloe models run``/``icefloe
run`` pass, or one refresh in the collector) claims the next number here before its first
commit and records it as :data:`VERSION_PROP` in every snapshot it commits, whatever the
number of tables or manifest shards it writes (:mod:`pipeline.read.versions` reads it).

Why this counter lives in the object store, as one small document changed by
compare-and-swap (:func:`icefloe.store.cas.cas_document`), and not elsewhere:

* not derived from manifest sequences: model runs consume no manifest entry, and with
  several shards no single sequence orders the runs;
* not an Iceberg table or catalog property: a commit per run would cost 0.1-0.2 s and four
  metadata objects, and a properties-only commit is last-writer-wins (no CAS);
* the store is the state every icefloe process already shares (manifest, registry), so the
  counter survives collector restarts and takeovers and keeps increasing: a claim reads the
  last number written and writes the next one under ``If-Match``; the loser of a race
  re-reads and takes the number after the winner's, so no two runs share a number.

It is written under the epoch fence: a collector's claim records its epoch, a new collector
records its own when it fences the tables (:func:`stamp_epoch`), and a claim by an older
epoch is refused with :class:`~icefloe.errors.FencedError` (that collector's commits would be
refused by every table anyway). Model runs outside a collector claim with no epoch. A claimed
number whose run then commits nothing (a replay, a failure) is simply never seen: versions
increase, with gaps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from icefloe.errors import (
    CatalogError,
    FencedError,
    NotFound,
    PreconditionFailed,
    TransientStoreError,
)

if TYPE_CHECKING:  # the store and the clock are imported where used: a cold `icefloe
    # query` reads VERSION_PROP from here and must import neither (tests/pipeline/
    # test_query_cold_start.py)
    from icefloe.clock import Clock
    from icefloe.store.base import AsyncObjectStore, ObjectStore
    from icefloe.store.cas import Versioned

VERSION_KEY = "catalog/version.json"
"""The counter's object (a control key: :mod:`icefloe.store.split`)."""
VERSION_PROP = "icefloe.version"
"""Snapshot summary property: the catalog version of the run whose state the snapshot
holds. Fencing and maintenance snapshots carry the previous one forward (they change no
rows), so they never take a number of their own."""

_ATTEMPTS = 50


class CatalogVersion(msgspec.Struct, frozen=True):
    """The document: the last version claimed, the newest collector epoch seen, and when
    (store clock, ms) it was last written."""

    version: int = 0
    epoch: int = 0
    claimed_ms: int = 0

    def encode(self) -> bytes:
        return msgspec.json.encode(self)


def _decode(data: bytes) -> CatalogVersion:
    try:
        return msgspec.json.decode(data, type=CatalogVersion)
    except msgspec.DecodeError as exc:
        raise CatalogError(f"the catalog version object {VERSION_KEY!r} cannot be read "
                           f"({exc}); restore it, or write a version above every "
                           "icefloe.version in the tables") from None


def next_version(current: CatalogVersion, epoch: int | None, now_ms: int) -> CatalogVersion:
    """The document after one claim by ``epoch`` (None: a model run outside a collector)."""
    if epoch is not None and current.epoch > epoch:
        raise FencedError(epoch, current.epoch)
    return CatalogVersion(current.version + 1, max(current.epoch, epoch or 0), now_ms)


async def claim_version(store: AsyncObjectStore, *, epoch: int | None,
                        clock: Clock | None = None) -> int:
    """Claim the next catalog version (asyncio store: the collector)."""
    from icefloe.clock import SYSTEM  # startup time: cold query
    from icefloe.store.cas import cas_document  # startup time: cold query
    from icefloe.store.retry import RetryPolicy  # startup time: cold query

    clock = clock or SYSTEM
    def mutate(loaded: Versioned[CatalogVersion]) -> CatalogVersion:
        return next_version(loaded.value, epoch, int(clock.time() * 1000))

    _, written = await cas_document(store, VERSION_KEY, _decode, CatalogVersion, mutate,
                                    backoff=RetryPolicy(max_attempts=_ATTEMPTS, budget_s=30.0),
                                    what="catalog version", clock=clock)
    assert written is not None
    return written.version


async def stamp_epoch(store: AsyncObjectStore, epoch: int, *,
                      clock: Clock | None = None) -> None:
    """Record ``epoch`` as the newest (on takeover), so an older collector's claims fail."""
    from icefloe.clock import SYSTEM  # startup time: cold query
    from icefloe.store.cas import cas_document  # startup time: cold query
    from icefloe.store.retry import RetryPolicy  # startup time: cold query

    clock = clock or SYSTEM
    def mutate(loaded: Versioned[CatalogVersion]) -> CatalogVersion | None:
        current = loaded.value
        if current.epoch > epoch:
            raise FencedError(epoch, current.epoch)
        if current.epoch == epoch:
            return None
        return CatalogVersion(current.version, epoch, int(clock.time() * 1000))

    await cas_document(store, VERSION_KEY, _decode, CatalogVersion, mutate,
                       backoff=RetryPolicy(max_attempts=_ATTEMPTS, budget_s=30.0),
                       what="catalog version", clock=clock)


def claim_version_sync(store: ObjectStore, *, epoch: int | None,
                       clock: Clock | None = None) -> int:
    """:func:`claim_version` on a synchronous store (model runs, which may run on a thread
    that has an event loop, or none)."""
    from icefloe.clock import SYSTEM  # startup time: cold query

    clock = clock or SYSTEM
    for attempt in range(1, _ATTEMPTS + 1):
        try:
            got = store.get(VERSION_KEY)
            current, etag = _decode(got.data), got.etag
        except NotFound:
            current, etag = CatalogVersion(), None
        new = next_version(current, epoch, int(clock.time() * 1000))
        try:
            if etag is None:
                store.put(VERSION_KEY, new.encode(), if_none_match="*")
            else:
                store.put(VERSION_KEY, new.encode(), if_match=etag)
        except PreconditionFailed:
            clock.sleep_sync(min(0.5, 0.01 * attempt))
            continue
        return new.version
    raise TransientStoreError(f"catalog version {VERSION_KEY!r}: lost {_ATTEMPTS} "
                              "compare-and-swap races in a row", op="put", key=VERSION_KEY,
                              ambiguous=False, code="CasContention")


def read_version(store: ObjectStore) -> int:
    """The newest catalog version claimed so far (0: none yet)."""
    try:
        return _decode(store.get(VERSION_KEY).data).version
    except NotFound:
        return 0
