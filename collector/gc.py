"""Batch-file garbage collection: delete batch files no manifest entry needs any more.

Why it is safe (the argument the tests pin down):

1. **List first, then read the manifest.** A batch file can only become referenced by a
   producer's append. Every file in the listing that was appended before the manifest read
   is seen as referenced and kept, whatever its age. A file written after the listing is not
   in the listing, so it cannot be deleted by this run.
2. **Only old files, on the store's clock.** What remains are files appended *after* the
   manifest read, or never. A producer never appends a batch older than
   ``append_deadline_s`` (store clock), and ``gc_grace_s`` exceeds that deadline plus a
   safety margin (:mod:`icefloe.config.manifest`). So an unreferenced file older than the
   grace period at listing time can never be appended again: deleting it loses nothing.
   Ages are ``ListResult.store_time - ObjectInfo.last_modified``: both come from the store
   (S3's ``Date`` and ``Last-Modified`` headers; the file system clock and mtimes for
   ``file://``), so a skewed collector clock cannot make GC unsafe. The listing's clock is
   the earliest store time of the run (S3 reports the first page's ``Date``), so ages are
   underestimated, never overestimated, however long the run takes. (A producer dates a
   batch by its PUT's response, a little after ``Last-Modified``; that upload time, and
   S3's whole-second timestamps, are what the config's safety margin absorbs.)
3. **Any entry pins its file.** Acknowledged entries still in the manifest are kept too:
   only a dequeue (after the Iceberg commit) releases a file.
4. **Stateless and idempotent.** GC remembers nothing between runs and only deletes, so a
   crash at any point leaves a subset of safe deletions done; the next run recomputes
   everything from the store. Deleting an already missing key is not an error. Two GC runs
   at once (e.g. an old collector that was fenced) are as safe as one: GC never writes the
   manifest and needs no epoch.

5. **Retention.** With ``[collector] keep_batches_s`` a file the retention index
   (:mod:`icefloe.retention`) names within retention is kept like a referenced one. The
   index is read after the manifest: the collector indexes a run's entries before it acks
   them, so an entry dequeued before the manifest read is in the index by then. Expired
   entries leave the index (:func:`icefloe.retention.compact`) before their files are
   deleted, so the index never promises a file that is gone; a crash between the two
   leaves unreferenced old files, which the next run deletes.

A missing manifest deletes nothing: it more likely means a wrong ``manifest_key`` (which
would otherwise read as "nothing is referenced") than a queue that never saw an append.

**Shards.** With a sharded manifest (:mod:`icefloe.manifest.shards`) every shard pins its
files: after the LIST the run reads the shard count, then every shard (shard 0 is
``manifest_key``; a shard never written reads as empty). Reading the count after the LIST
keeps point 1: a shard added later can only receive appends after this run's reads,
which point 2 covers. Batch keys may sit in sub-folders of the prefix (``batches/xx/``,
spread for S3's per-prefix limits) or directly in it (older keys): the LIST covers both.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import NotFound
from icefloe.manifest.cas import load
from icefloe.manifest.publish import BATCH_PREFIX, BATCH_SUFFIX
from icefloe.manifest.shards import read_shard_count, shard_key
from icefloe.retention import Segment, compact, read_index
from icefloe.store.base import AsyncObjectStore, ObjectInfo

log = logging.getLogger("icefloe.gc")

Hook = Callable[[str], Awaitable[None] | None]
"""Crash/interleaving injection point for tests; may be sync or return an awaitable.

Stages, in order: ``"listed"`` (after the LIST, before the manifest read), ``"loaded"``
(after the manifest read, deletions planned), then per file ``"before_delete"`` and
``"after_delete"``.
"""

DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class GcResult:
    """What one run saw and did. Counts are of batch files under the prefix.

    listed:        batch files in the listing
    referenced:    of those, named by an entry of the manifest (kept)
    young:         unreferenced but not older than the grace period (kept)
    deleted:       delete requests that succeeded (a file already gone counts: stores
                   answer a delete of a missing key with success)
    bytes_deleted: their total size (from the listing)
    seconds:       wall time of the run
    deferred:      old and unreferenced but left for a later run by ``max_deletes``
    retained:      unreferenced, but named by the retention index within retention (kept)
    """

    listed: int
    referenced: int
    young: int
    deleted: int
    bytes_deleted: int
    seconds: float
    deferred: int = 0
    retained: int = 0


async def collect_garbage(store: AsyncObjectStore, manifest_key: str, *, grace_s: float,
                          prefix: str = BATCH_PREFIX, max_deletes: int | None = None,
                          hook: Hook | None = None, suffix: str = BATCH_SUFFIX,
                          concurrency: int = DEFAULT_CONCURRENCY,
                          clock: Clock = SYSTEM, keep_s: float = 0.0,
                          index_cache: dict[str, Segment] | None = None) -> GcResult:
    """Delete unreferenced batch files older than ``grace_s`` (store clock); see module doc.

    ``grace_s`` must be the validated ``ManifestConfig.gc_grace_s`` in production (tests use
    tiny values). Only keys under ``prefix`` ending in ``suffix`` are candidates, and never
    ``manifest_key``: a misconfigured prefix must not reach the manifest or table files.
    ``max_deletes`` bounds one run (oldest files first) so a large backlog is worked off in
    slices. Raises whatever the store raises (nothing is deleted if the LIST or the manifest
    read fails; a failed delete stops the run and leaves the rest for the next one).
    ``clock`` times the run (ages are judged on the store's clock, never on it).
    ``keep_s`` is ``[collector] keep_batches_s``: files the retention index names are kept
    that long after their commit (point 5 of the module doc); ``index_cache`` keeps the
    index segments read by earlier runs (they never change), so a run fetches new ones only.
    """
    _validate(prefix, grace_s, max_deletes, concurrency)
    tally = _Tally(manifest_key=manifest_key, prefix=prefix, clock=clock)
    try:
        listing = await store.list(prefix)
        batches = [info for info in listing.objects
                   if info.key.startswith(prefix) and info.key.endswith(suffix)
                   and not info.key.startswith(manifest_key)]  # nor its shards
        tally.listed = len(batches)
        await _call(hook, "listed")

        pinned = await _pinned(store, manifest_key, clock)
        if pinned is None:
            log.warning("gc skipped: manifest not found, deleting nothing",
                        extra=tally.fields())
            return tally.result()

        # read only with retention on: the index costs a LIST and a GET per segment
        index = await read_index(store, index_cache) if keep_s > 0 else None
        retained = set() if index is None else {
            e.entry.location for by_seq in index.live(listing.store_time, keep_s).values()
            for e in by_seq.values()}
        candidates = _classify(batches, pinned, retained, listing.store_time, grace_s,
                               tally)
        candidates.sort(key=lambda info: (info.last_modified, info.key))
        if max_deletes is not None and len(candidates) > max_deletes:
            tally.deferred = len(candidates) - max_deletes
            del candidates[max_deletes:]
        await _call(hook, "loaded")
        if index is not None:
            await compact(store, index, listing.store_time, keep_s)
        await _delete_all(store, candidates, hook, concurrency, tally)
    except BaseException:
        log.warning("gc run failed", exc_info=True, extra=tally.fields())
        raise
    log.info("gc run", extra=tally.fields())
    return tally.result()


async def _pinned(store: AsyncObjectStore, manifest_key: str, clock: Clock
                  ) -> set[str] | None:
    """Locations named by an entry of any shard; None if shard 0 (the manifest) is
    missing. Shard 0 is read first and the others after, all after the LIST."""
    first = await load(store, manifest_key, clock=clock)
    if first.etag is None:
        return None
    count = await read_shard_count(store, manifest_key, clock=clock)
    rest = await asyncio.gather(*(load(store, shard_key(manifest_key, n), clock=clock)
                                  for n in range(1, count)))
    return {entry.location for loaded in (first, *rest)
            for entry in loaded.manifest.entries}


def _classify(batches: list[ObjectInfo], pinned: set[str], retained: set[str],
              store_time: float, grace_s: float, tally: _Tally) -> list[ObjectInfo]:
    """The files this run may delete: neither referenced, nor retained, nor young."""
    candidates: list[ObjectInfo] = []
    for info in batches:
        if info.key in pinned:
            tally.referenced += 1
        elif info.key in retained:
            tally.retained += 1
        elif not _older_than(info, store_time, grace_s):
            tally.young += 1
        else:
            candidates.append(info)
    return candidates


@dataclass
class _Tally:
    """Running counts of one run, so a failed run can still log how far it got."""

    manifest_key: str
    prefix: str
    listed: int = 0
    referenced: int = 0
    young: int = 0
    deleted: int = 0
    bytes_deleted: int = 0
    deferred: int = 0
    retained: int = 0
    clock: Clock = SYSTEM
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock.monotonic()

    def result(self) -> GcResult:
        return GcResult(self.listed, self.referenced, self.young, self.deleted,
                        self.bytes_deleted, self.clock.monotonic() - self.started, self.deferred,
                        self.retained)

    def fields(self) -> dict[str, object]:
        """The structured fields of the per-run log line (keys stable for log queries)."""
        return {"manifest_key": self.manifest_key, "prefix": self.prefix,
                "listed": self.listed, "referenced": self.referenced, "young": self.young,
                "deleted": self.deleted, "bytes_deleted": self.bytes_deleted,
                "deferred": self.deferred, "retained": self.retained,
                "seconds": round(self.clock.monotonic() - self.started, 4)}


def _validate(prefix: str, grace_s: float, max_deletes: int | None, concurrency: int) -> None:
    """Refuse arguments that could widen what GC deletes beyond batch files."""
    if not prefix or not prefix.endswith("/"):
        # "" would cover the whole store (manifest, warehouse); "batches" would also match
        # "batches-archive/...".
        raise ValueError(f"gc prefix must be a non-empty folder ending in '/', got {prefix!r}")
    if math.isnan(grace_s) or grace_s < 0:
        raise ValueError(f"gc grace_s must be >= 0, got {grace_s}")
    if max_deletes is not None and max_deletes < 0:
        raise ValueError(f"gc max_deletes must be >= 0 or None, got {max_deletes}")
    if concurrency < 1:
        raise ValueError(f"gc concurrency must be >= 1, got {concurrency}")


def _older_than(info: ObjectInfo, store_time: float, grace_s: float) -> bool:
    """True when the object is older than ``grace_s`` at ``store_time``.

    A missing timestamp (0) reads as young: without an age there is no proof of safety.
    """
    if info.last_modified <= 0:
        return False
    return store_time - info.last_modified > grace_s


async def _call(hook: Hook | None, stage: str) -> None:
    if hook is not None:
        result = hook(stage)
        if inspect.isawaitable(result):
            await result


async def _delete_all(store: AsyncObjectStore, candidates: list[ObjectInfo],
                      hook: Hook | None, concurrency: int, tally: _Tally) -> None:
    """Delete ``candidates`` with a few workers; the first failure cancels the rest.

    Why workers and not one gather per file: bounded concurrency keeps a backlog of
    thousands of files from opening thousands of requests, and cancelling siblings on the
    first error makes a failure look like a crash (a prefix done, the rest left).
    """
    pending: Iterator[ObjectInfo] = iter(candidates)

    async def worker() -> None:
        for info in pending:  # one shared iterator: each file goes to exactly one worker
            await _call(hook, "before_delete")
            try:
                await store.delete(info.key)
            except NotFound:
                pass  # someone (an earlier or parallel run) deleted it already
            else:
                tally.deleted += 1
                tally.bytes_deleted += info.size
            await _call(hook, "after_delete")

    tasks = [asyncio.create_task(worker(), name="gc-delete")
             for _ in range(min(concurrency, len(candidates)))]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise

