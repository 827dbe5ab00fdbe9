"""Everything a replay checks in the store before it starts: retention on, the sink known
and paused, the range kept in the index, every file of it still there.

Why all before the first commit: a refusal after the start marker would leave the sink's
table emptied (``--truncate``) for nothing; the checks read only, so a refused replay
changes nothing anywhere.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from collector.replay import find_target
from collector.replay_range import Bound, ReplayRefused, resolve
from collector.routing import Target
from icefloe.config import Config
from icefloe.errors import NotFound
from icefloe.manifest.cas import load
from icefloe.registry import RegistryStore
from icefloe.registry.model import Registry
from icefloe.registry.streams import config_registry
from icefloe.retention import IndexedEntry, read_index
from icefloe.store.base import AsyncObjectStore

_HEAD_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class Plan:
    """A replay that may start: its sink and its kept entries, in order."""

    target: Target
    entries: list[IndexedEntry]


async def current_registry(config: Config, store: AsyncObjectStore) -> Registry:
    """The stream registry in the store, or the config's streams when none was written."""
    registry = await RegistryStore(store, config.admin.registry_key).read()
    return registry if registry.version else config_registry(config.streams)


async def plan(config: Config, store: AsyncObjectStore, sink: str, start: Bound,
               end: Bound) -> Plan:
    """The replay's sink and entries, or :class:`ReplayRefused` naming why not."""
    keep_s = config.collector.keep_batches_s
    if keep_s <= 0:
        raise ReplayRefused("retention is off ([collector] keep_batches_s = 0): no batch "
                            "file is kept after its commit, so there is nothing to replay; "
                            "set keep_batches_s (it keeps files committed from then on)")
    registry = await current_registry(config, store)
    target = find_target(registry, sink)
    loaded = await load(store, config.manifest.key)
    check_paused(target, registry, loaded.manifest.consumer.holder,
                 loaded.manifest.consumer.lease_expires_at, loaded.store_time)
    index = await read_index(store)
    entries = resolve(index.live(loaded.store_time, keep_s), start, end)
    await check_files(store, entries)
    return Plan(target, entries)


def check_paused(target: Target, registry: Registry, holder: str, lease_expires_at: float,
                 now: float) -> None:
    """Refuse while a collector holds the lease and the sink takes events: both would
    commit to one table with one offset property."""
    if not holder or lease_expires_at <= now:
        return
    if not target.receives_at(registry.version):
        return  # disabled (paused) in the registry: the live collector leaves it alone
    name = f"{target.source.id}/{target.sink.name}"
    how = (f"icefloe sinks disable {target.source.id} {target.sink.name}"
           if registry.version else "stop the collector")
    raise ReplayRefused(f"sink {name} is live: collector {holder!r} holds the lease and "
                        f"commits to {target.table}; pause it first ({how}), replay, then "
                        "enable it again")


async def check_files(store: AsyncObjectStore, entries: list[IndexedEntry]) -> None:
    """Every file of the range is still in the store (a bucket lifecycle rule shorter
    than ``keep_batches_s`` deletes files the index still names): refuse the first gone."""
    gone: list[IndexedEntry] = []
    limit = asyncio.Semaphore(_HEAD_CONCURRENCY)

    async def look(item: IndexedEntry) -> None:
        async with limit:
            try:
                await store.head(item.entry.location)
            except NotFound:
                gone.append(item)

    await asyncio.gather(*(look(item) for item in entries))
    if gone:
        first = min(gone, key=lambda e: (e.shard, e.sequence))
        raise ReplayRefused(f"sequence {first.sequence} (shard {first.shard}) is in the "
                            f"retention index but its batch file {first.entry.location} is "
                            "gone (a bucket lifecycle rule shorter than keep_batches_s?): "
                            "replay a range after it")
