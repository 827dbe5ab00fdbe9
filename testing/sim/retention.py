"""The ``retention`` family (#42): committed batch files kept past the GC grace by the
retention index, with GC running through traffic, takeovers, crashes and a quiet gap.

What it checks (besides every check the other families make):

* **safety, at every delete**: no batch file is deleted while an index entry names it
  within retention (``now - committed_at <= keep_batches_s``, store clock). The checker
  reads the index straight from the simulated bucket, so a GC that ignores the index, or
  reads a stale one, is caught at the delete itself;
* **the index before the ack**: after the drain, every acknowledged sequence of every
  shard that is surely still within retention (seen queued less than ``keep_batches_s``
  ago, or newer than the oldest indexed one) is in the index (an entry the collector
  acked without indexing could be dequeued and its file deleted unseen);
* **liveness, after retention**: a tail after the drain outlasts retention and the grace;
  by its end no batch file is left but those still queued in the manifest (acknowledged,
  not dequeued: they pin their files as before), and no index entry.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from icefloe.retention import INDEX_PREFIX, IndexedEntry, Segment, expired


def indexed(world: Any) -> dict[tuple[int, int], IndexedEntry]:
    """Every entry of the index objects in the bucket now, by (shard, sequence)."""
    out: dict[tuple[int, int], IndexedEntry] = {}
    for key, obj in world.store.objects.items():
        if key.startswith(INDEX_PREFIX) and key.endswith(".json"):
            for item in msgspec.json.decode(obj.data, type=Segment).entries:
                out.setdefault((item.shard, item.sequence), item)
    return out


def check_delete(checker: Any, key: str) -> None:
    """Safety: ``key`` (a batch file about to be deleted) is promised by no live entry."""
    world = checker.world
    keep = world.config.collector.keep_batches_s
    for item in indexed(world).values():
        if item.entry.location == key and not expired(item, world.sim.now, keep):
            checker.violation(f"batch file {key} (sequence {item.sequence}, shard "
                              f"{item.shard}) deleted {world.sim.now - item.committed_at:.0f} "
                              f"s after its commit, inside retention ({keep:g} s)",
                              key=f"retention-delete:{key}")


def observe(checker: Any) -> None:
    """Note when each queued entry was first seen (every few simulated seconds): it was
    committed later, so an entry seen less than ``keep_batches_s`` ago is surely still
    within retention once acknowledged."""
    seen: dict[tuple[int, int], float] = checker.__dict__.setdefault("retention_seen", {})
    for shard, manifest in checker.world.manifests().items():
        for entry in manifest.entries:
            seen.setdefault((shard, entry.sequence), checker.world.sim.now)


def check_indexed(checker: Any) -> None:
    """The index before the ack: every acked sequence still within retention is indexed
    (those seen queued less than ``keep_batches_s`` ago, and every one from the oldest
    indexed sequence on: entries expire in commit order)."""
    world = checker.world
    keep = world.config.collector.keep_batches_s
    items = indexed(world)
    firsts: dict[int, int] = {}
    for shard, sequence in items:
        firsts[shard] = min(firsts.get(shard, sequence), sequence)
    seen: dict[tuple[int, int], float] = checker.__dict__.get("retention_seen", {})
    for shard, manifest in world.manifests().items():
        acked = manifest.consumer.acked_through
        first = firsts.get(shard, acked + 1)
        missing = [s for s in range(acked + 1) if (shard, s) not in items and (
            s >= first or world.sim.now - seen.get((shard, s), -1e18) < keep)]
        if missing:
            checker.violation(f"shard {shard}: acknowledged sequences {missing[:5]} are not "
                              "in the retention index (acked before they were indexed?)")


async def tail(world: Any) -> None:
    """After the drain: run on (collectors up, GC due) until retention and the grace are
    over for everything committed, then require the files and the index gone."""
    cfg = world.config
    checker = world.checker
    check_indexed(checker)
    items = indexed(world)
    checker.note(f"retention tail: {len(items)} batch files indexed, keep "
                 f"{cfg.collector.keep_batches_s:g} s")
    last = max((item.committed_at for item in items.values()), default=world.sim.now)
    end = max(last + cfg.collector.keep_batches_s,
              world.sim.now + cfg.manifest.gc_grace_s) + 3 * cfg.collector.gc_interval_s + 10
    while world.sim.now < end:
        await asyncio.sleep(min(30.0, end - world.sim.now))
    left = indexed(world)
    queued = {e.location for m in world.manifests().values() for e in m.entries}
    # acknowledged entries not dequeued yet (the collector dequeues every few runs, and
    # the tail has none) still pin their files, as before retention
    files = [key for key in world.store.objects
             if key.startswith("batches/") and key not in queued]
    if left:
        checker.violation(f"{len(left)} retention index entries left after retention "
                          f"(e.g. sequence {min(left)[1]} of shard {min(left)[0]})")
    if files:
        checker.violation(f"{len(files)} batch files left after retention and the grace "
                          f"(e.g. {files[0]})")
