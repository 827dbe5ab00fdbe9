"""The ``cdc-reorder`` family (#42): change streams whose producers send out of order.

Every seeded sink is a change stream (``cdc = { format = "op", position = ["$.pos"] }``,
key ``key``): a seeded registry carries it as ``icefloe.toml`` would (the admin API takes
no ``cdc``). Each client is a connector for its own keys: it makes changes at increasing
source positions — creates, updates and, a fifth of the time, a delete — and sends a
group of two or three non-delete changes **in reverse order**, one change per request
through any ingestor, so a key's newer change is often accepted, and committed, before
an older one. A delete is only made once every earlier change of its key was
acknowledged (a key's changes must not be committed across a delete out of order:
docs/cdc.md; in half the seeds the sinks keep deletes as rows, ``deletes = "keep"``, and
then deletes are reordered and re-delivered like any change). Now and then a client
re-delivers an acknowledged change (a connector
restart re-reading its log), with the id the real door derives from its position and key,
at any age: inside the dedup window (30 s in this family) it is dropped by id, past it the
stale check makes it a no-op. Payloads go through the real
:class:`ingestor.validate.CompiledStream`.

The checker requires each key to end in the state of its acknowledged change with the
highest *position* (its row, or nothing after a delete), or of a change with a higher
position that was never acknowledged (it may have landed): never an older one, whatever
order they arrived in.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

import msgspec

from icefloe.config import Column
from icefloe.registry.model import Registry
from icefloe.streams.cdc import DELETED_COLUMN, cdc_columns
from icefloe.streams.model import CdcConfig
from ingestor.validate import CompiledStream

COLUMNS = (Column("uid", "string"), Column("n", "long"), Column("key", "string", required=True),
           Column("pos", "long"))
CDC = CdcConfig(format="op", op_field="op", position=("$.pos",))
KEYS = 8
"""Keys per client: few, so groups often hold two changes of one key."""
CHANGES = 60
"""Changes per client at most (below the dedup window's id bound)."""


@dataclass
class Change:
    """One change as its connector made it; ``acked_at``: when it was told durable."""

    uid: str
    key: str
    op: str
    pos: int
    event_id: str
    payload: bytes
    acked_at: float | None = None


@dataclass
class ChangeLedger:
    """Every key's changes, in position order (a client's positions only grow)."""

    keys: dict[str, list[Change]] = field(default_factory=dict)
    redelivered: int = 0
    reversed_groups: int = 0


def cdc_seed(registry: Registry, keep: bool = False) -> Registry:
    """Every seeded sink as a change stream (columns, key, tombstone and ``cdc`` as the
    config loader gives a ``[[streams]]`` entry with ``cdc``); ``keep``: deletes stay as
    rows (``deletes = "keep"``)."""
    cdc = msgspec.structs.replace(CDC, deletes="keep") if keep else CDC
    sources = []
    for source in registry.sources:
        sinks = []
        for sink in source.sinks:
            plain = msgspec.structs.replace(sink, columns=COLUMNS, primary_key=("key",),
                                            cdc=cdc)
            sinks.append(msgspec.structs.replace(
                plain, columns=COLUMNS + cdc_columns(plain.stream(source.id)),
                tombstone_field=DELETED_COLUMN))
        sources.append(msgspec.structs.replace(source, sinks=tuple(sinks)))
    return msgspec.structs.replace(registry, sources=tuple(sources))


class Connector:
    """One client's changes (see the module doc)."""

    def __init__(self, client: Any) -> None:
        """``client``: the :class:`testing.sim.world.Client` whose sends this uses (not
        imported: the world imports this module)."""
        self.client = client
        self.world = client.world
        self.rng: random.Random = client.rng
        self.keys = [f"{client.name}-k{j}" for j in range(KEYS)]
        self.pos = 0
        self.made = 0
        self.doors: dict[str, CompiledStream] = {}

    async def run(self, until: float) -> None:
        world = self.world
        index = int("".join(c for c in self.client.name if c.isdigit()) or 0)
        while world.sim.now < until:
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            sources = world.open_sources()
            if not sources:
                continue
            source = sources[index % len(sources)]
            old = self._redelivery()
            if old is not None and self.rng.random() < 0.2:
                world.ledger.changes.redelivered += 1
                world.checker.note(f"{self.client.name} re-delivers {old.uid} ({old.op} "
                                   f"{old.key} at {old.pos})")
                await self.client.send(source, [old.event_id], [old.payload], [old.uid])
                continue
            if self.made >= CHANGES:
                continue
            group = self._group(source)
            if len(group) > 1:
                world.ledger.changes.reversed_groups += 1
                group.reverse()  # newest first: positions, not arrival, must decide
            for i, change in enumerate(group):
                if i:  # the older change often lands in a later commit than the newer
                    await asyncio.sleep(self.rng.uniform(0.2, 3.0))
                if await self.client.send(source, [change.event_id], [change.payload],
                                          [change.uid]):
                    change.acked_at = world.sim.now

    def _group(self, source: str) -> list[Change]:
        """A delete alone (when its key has no change waiting), else 2-3 changes."""
        key = self.rng.choice(self.keys)
        history = self.world.ledger.changes.keys.get(key, [])
        live = bool(history) and history[-1].op != "d"
        keep = self.world.scenario.cdc_keep  # a kept delete may be reordered like the rest
        if live and self.rng.random() < 0.2 and (keep or all(c.acked_at for c in history)):
            return [self._make(source, key, "d")]
        group = []
        for _ in range(self.rng.randint(2, 3)):
            key = self.rng.choice(self.keys)
            history = self.world.ledger.changes.keys.get(key, [])
            live = bool(history) and history[-1].op != "d"
            op = "u" if live else "c"
            if keep and live and self.rng.random() < 0.3:
                op = "d"  # kept deletes are reordered with the rest
            group.append(self._make(source, key, op))
        return group

    def _make(self, source: str, key: str, op: str) -> Change:
        self.pos += self.rng.randint(1, 3)
        self.made += 1
        n = self.world.next_id(source)
        uid = f"{source}/{n}"
        event: dict[str, Any] = {"op": op, "key": key, "pos": self.pos}
        if op != "d":
            event |= {"uid": uid, "n": n}
        canonical = self._door(source).from_events([msgspec.json.encode(event)])
        assert canonical.body_ids is not None
        change = Change(uid, key, op, self.pos, canonical.body_ids[0] or "",
                        canonical.payloads[0])
        self.world.ledger.changes.keys.setdefault(key, []).append(change)
        return change

    def _door(self, source: str) -> CompiledStream:
        """The real validator of ``source``'s change stream (seeded once, never changed)."""
        door = self.doors.get(source)
        if door is None:
            registry = self.world.registry_history[0]
            record = registry.source(source)
            assert record is not None
            door = self.doors[source] = CompiledStream(record.sinks[0].stream(source))
        return door

    def _redelivery(self) -> Change | None:
        """An acknowledged change 10 s old or more: a delete only inside half the dedup
        window (past it, an older create re-delivered after a delete would re-create its
        key: docs/cdc.md), any other change at any age unless a delete of its key
        followed it."""
        now, window = self.world.sim.now, self.world.scenario.dedup_window_s
        found = []
        for key in self.keys:
            history = self.world.ledger.changes.keys.get(key, [])
            for i, change in enumerate(history):
                if change.acked_at is None or change.acked_at > now - 10:
                    continue
                if self.world.scenario.cdc_keep:
                    fresh = True  # a kept delete holds its position: anything may come back
                elif change.op == "d":
                    fresh = change.acked_at > now - window / 2
                else:
                    fresh = all(c.op != "d" for c in history[i + 1:])
                if fresh:
                    found.append(change)
        return self.rng.choice(found) if found else None


def check_changes(checker: Any, name: str, rows: dict[str, list[str]]) -> None:
    """Each key of table ``name`` in the state of its acknowledged change with the highest
    position, or of a higher unacknowledged one (module doc)."""
    ledger = checker.world.ledger.changes
    wrong: list[str] = []
    for key, changes in ledger.keys.items():
        if not changes or changes[0].uid.split("/", 1)[0] != name.split(".", 1)[1]:
            continue
        ordered = sorted(changes, key=lambda c: c.pos)
        acked = [c for c in ordered if c.acked_at is not None]
        top = acked[-1].pos if acked else -1
        allowed = {None if c.op == "d" else c.uid for c in ordered
                   if c.pos == top or (c.acked_at is None and c.pos > top)}
        if not acked:
            allowed.add(None)
        have = rows.get(key, [])
        if len(have) > 1 or (have[0] if have else None) not in allowed:
            wrong.append(f"{key}={have or 'absent'} (expected {sorted(map(str, allowed))})")
    if wrong:
        checker.violation(f"{name}: {len(wrong)} keys hold an older change than their "
                          f"latest by position, e.g. {wrong[:3]}")
