"""The invariants, checked while the simulation runs and once it has drained.

After every commit (through the collector's hook) and every few simulated seconds:

* no row appears twice in any table (rows are told apart by their ``uid``);
* no batch file a manifest entry references is deleted (checked at the delete itself),
  and every data file a table's current snapshot references exists;
* each table's committed sequence (``icefloe.sequence``) only grows;
* only the newest epoch commits: along each table's snapshot log epochs never go down,
  and no commit lands from an epoch older than a collector that had already finished
  starting.

After faults stop and the queue drains (the world bounds that time: no wedge): every
acknowledged event is in every sink that was live for it at the registry version it was
accepted under, exactly once, and nothing is anywhere it was not routed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol
from urllib.parse import urlparse

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.types import StructType

from icefloe.config import Config
from icefloe.manifest.model import Manifest
from icefloe.registry.model import Registry
from icefloe.staging import PREFIX as STAGING_PREFIX
from icefloe.staging import StagingState
from pipeline.columns import DEAD_LETTER_TABLE
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import (
    COMMITTED_AT_PROP,
    EPOCH_PROP,
    SEQUENCE_PROP,
    SEQUENCES_PROP,
    decode_sequences,
)
from testing.sim import dynamic, retention
from testing.sim.changes import check_changes
from testing.sim.loop import SimTime
from testing.sim.scenario import Scenario
from testing.sim.store import SimCrash, SimStore

CHECK_EVERY_S = 5.0


class Watched(Protocol):
    """What the checker reads of the simulated world (:class:`testing.sim.world.World`).

    Why a protocol: the world builds its checker, so the checker naming the world's class
    would close an import circle. The ledger and the hosts are the world's own records,
    read here by attribute.
    """

    @property
    def sim(self) -> SimTime: ...
    @property
    def store(self) -> SimStore: ...
    @property
    def rng(self) -> random.Random: ...
    @property
    def scenario(self) -> Scenario: ...
    @property
    def config(self) -> Config: ...
    @property
    def ledger(self) -> Any: ...
    @property
    def ingestors(self) -> Sequence[Any]: ...
    @property
    def collectors(self) -> Sequence[Any]: ...
    @property
    def registry_history(self) -> Sequence[Registry]: ...
    @property
    def deployed(self) -> int | None: ...

    def kill(self, host: str) -> None: ...

    def manifest(self) -> Manifest | None: ...

    def manifests(self) -> dict[int, Manifest]: ...


class Checker:
    def __init__(self, world: Watched) -> None:
        self.world = world
        self.violations: list[str] = []
        self.notes: list[str] = []
        self.ready_epoch = 0
        self._reported: set[str] = set()
        self.ready_at: dict[int, float] = {}
        """When the collector of each epoch had finished starting (fenced every table)."""
        self.max_epoch = 0
        self.commits = 0
        self._catalog: Catalog | None = None
        self._sequences: dict[str, dict[int, int]] = {}
        """Committed sequence per table and manifest shard, as last seen."""
        self._seen_snapshots: dict[str, set[int]] = {}
        self._journal_rng = random.Random(world.scenario.seed * 7919 + 36)
        world.store.on_delete = self.batch_deleted

    # -- recording --------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.notes.append(f"t+{self.world.sim.now - self.world_start():.1f}s {text}")

    def world_start(self) -> float:
        return self.world.sim.start

    def violation(self, text: str, key: str | None = None) -> None:
        """Record a violation once per ``key`` (default: its text): a duplicate stays a
        duplicate at every later look, and the first sighting is the one that matters."""
        key = key or text
        if key in self._reported:
            return
        self._reported.add(key)
        self.violations.append(f"t+{self.world.sim.now - self.world_start():.1f}s {text}")

    def epoch_acquired(self, host: str, epoch: int) -> None:
        self.max_epoch = max(self.max_epoch, epoch)
        self.note(f"{host} took epoch {epoch}")

    def collector_ready(self, host: str, epoch: int) -> None:
        self.ready_epoch = max(self.ready_epoch, epoch)
        self.ready_at.setdefault(epoch, self.world.sim.now)
        self.note(f"{host} ready at epoch {epoch}")

    # -- the collector's hook: crash points and per-commit checks -----------------------

    def hook(self, host: str) -> Any:
        rng = self.world.rng
        crash_p = 0.01 if self.world.scenario.collector_crashes else 0.0

        def at(stage: str) -> None:
            # the journal's crash point (#36) draws from a generator of its own: the
            # stories of seeds pinned before it stay as they were
            draw = self._journal_rng if stage.startswith("after_journal:") else rng
            if self.world.store.faults_on and crash_p and draw.random() < crash_p:
                self.crash(host, stage)
            if stage.startswith("after_prepare:") and self.world.scenario.dynamic:
                dynamic.at_prepare(self.world, host, stage)
            if stage.startswith(("after_commit:", "after_staged_commit:")):
                self.commits += 1
                self.check_table(stage.split(":", 1)[1])

        return at

    def crash(self, host: str, stage: str) -> None:
        """``host`` dies at ``stage`` (inside a blocking step: the step stops there)."""
        self.note(f"{host} crashes at {stage}")
        self.world.kill(host)
        for c in self.world.collectors:
            if c.name == host:
                c.outcome = "crashed"
        raise SimCrash(f"{host} crashed at {stage}")

    def batch_deleted(self, key: str) -> None:
        if not key.startswith("batches/"):
            return
        if any(e.location == key for manifest in self.world.manifests().values()
               for e in manifest.entries):
            self.violation(f"batch file {key} deleted while a manifest entry references it")
        if self.world.config.collector.keep_batches_s:
            retention.check_delete(self, key)

    # -- table checks -------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = open_catalog(self.world.config.catalog)
        return self._catalog

    def tables(self) -> list[str]:
        names: set[str] = set()
        for registry in self.world.registry_history:
            for source in registry.sources:
                names.update(s.table for s in source.sinks)
        templates = {n for n in names if "{" in n}  # dynamic-tables: the tables they made
        names = (names - templates) | set(dynamic.concrete_tables(self.catalog, templates))
        return [*sorted(names), DEAD_LETTER_TABLE]

    def check_table(self, name: str) -> None:
        try:
            table = self.catalog.load_table(name)
        except NoSuchTableError:
            return
        snapshots = {s.snapshot_id: s for s in table.metadata.snapshots}
        seen = self._seen_snapshots.setdefault(name, set())
        chain = []
        current = table.current_snapshot()
        while current is not None:
            chain.append(current)
            parent = current.parent_snapshot_id
            current = snapshots.get(parent) if parent is not None else None
        chain.reverse()
        last_epoch = 0
        sequences: dict[int, int] = {}
        for snap in chain:
            props = snap.summary.additional_properties if snap.summary else {}
            if EPOCH_PROP not in props:
                continue
            epoch = int(props[EPOCH_PROP])
            if epoch < last_epoch:
                self.violation(f"{name}: snapshot {snap.snapshot_id} has epoch {epoch} after "
                               f"a commit of epoch {last_epoch}: an older collector committed "
                               "after a newer one")
            last_epoch = max(last_epoch, epoch)
            for shard, seq in offsets_of(props).items():
                sequences[shard] = max(sequences.get(shard, -1), seq)
            if snap.snapshot_id not in seen:
                seen.add(snap.snapshot_id)
                self._check_late(name, epoch, props.get(COMMITTED_AT_PROP))
        known = self._sequences.setdefault(name, {})
        for shard, previous in list(known.items()):
            if chain and sequences.get(shard, -1) < previous:
                self.violation(f"{name}: committed sequence of shard {shard} went back "
                               f"from {previous} to {sequences.get(shard, -1)}")
        for shard, seq in sequences.items():
            known[shard] = max(known.get(shard, -1), seq)

    def _check_late(self, name: str, epoch: int, committed_at: str | None) -> None:
        """A commit stamped (store clock: the simulated time) after a newer collector had
        finished starting came from a fenced collector."""
        if committed_at is None:
            return
        at = int(committed_at) / 1000
        for newer, ready in self.ready_at.items():
            if newer > epoch and at > ready + 0.001:
                self.violation(f"{name}: a commit of epoch {epoch} landed at t+"
                               f"{at - self.world_start():.1f}s, after the collector of epoch "
                               f"{newer} had started (t+{ready - self.world_start():.1f}s): "
                               "a fenced collector committed")
                return

    def scan_rows(self, name: str) -> Counter[str]:
        try:
            table = self.catalog.load_table(name)
        except NoSuchTableError:
            return Counter()
        if table.current_snapshot() is None:
            return Counter()
        for task in table.scan().plan_files():
            path = urlparse(task.file.file_path).path
            if not os.path.exists(path):
                self.violation(f"{name}: data file {path} of the current snapshot is gone")
                return Counter()
        if name == DEAD_LETTER_TABLE:
            rows = table.scan().to_arrow()
            if rows.num_rows:
                self.violation(f"{rows.num_rows} dead letters (every simulated event is "
                               f"valid): {rows.column('reason').to_pylist()[:3]}")
            return Counter()
        uids = table.scan(selected_fields=("uid",)).to_arrow().column("uid")
        # (a change stream's kept delete is a row without an event's uid: cdc-reorder)
        return Counter(u for u in uids.to_pylist() if u is not None or not self.world.scenario.cdc)

    def check_all(self) -> dict[str, Counter[str]]:
        found: dict[str, Counter[str]] = {}
        for name in self.tables():
            self.check_table(name)
            counts = self.scan_rows(name)
            twice = [uid for uid, n in counts.items() if n > self.copies_allowed(uid)]
            if twice:
                self.violation(f"{name}: {len(twice)} events committed more than once"
                               f"{self._beyond}, e.g. {sorted(twice)[:3]}",
                               key=f"twice:{name}")
            found[name] = counts
        return found

    def copies_allowed(self, uid: str) -> int:
        """How many times a table may hold an event: once; with no dedup window
        (``dedup_window_s = 0``: at-least-once for client retries) as many times as
        requests carried it, and no more: a copy beyond that came from icefloe itself."""
        if self.world.config.collector.dedup_window_s > 0:
            return 1
        return max(1, self.world.ledger.sent[uid])

    @property
    def _beyond(self) -> str:
        return "" if self.world.config.collector.dedup_window_s > 0 else \
            " (more often than requests carried them; no dedup window)"

    async def periodic(self) -> None:
        """Every few simulated seconds, if anything was committed meanwhile (maintenance
        and GC between commits are caught by the next look)."""
        looked_at = -1
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            if self.world.config.collector.keep_batches_s:
                retention.observe(self)
            if self.commits != looked_at:
                looked_at = self.commits
                self.check_all()

    # -- drain and the final verdict ----------------------------------------------------------

    async def drained(self) -> bool:
        world = self.world
        if any(i.batcher.held_bytes for i in world.ingestors if i.alive):
            return False
        if any(manifest.consumer.acked_through < manifest.next_sequence - 1
               for manifest in world.manifests().values()):
            return False
        for key, obj in world.store.objects.items():
            if key.startswith(STAGING_PREFIX + "/") and key.endswith("/state.json") \
                    and StagingState.decode(obj.data).files:
                return False
        return True

    def final(self) -> None:
        found = self.check_all()
        registry = self.world.registry_history[-1]
        required: dict[str, set[str]] = {}
        allowed: dict[str, set[str]] = {}
        for copy in self.world.ledger.copies:
            source = next((s for s in registry.sources if s.id == copy.source), None)
            if source is None or copy.version < 0:
                tables: set[str] = set()
            else:
                tables = {dynamic.table_for(sink.table, copy.uid)
                          for sink in source.routes(copy.version)}
            allowed.setdefault(copy.uid, set()).update(tables)
            if copy.acked:
                required.setdefault(copy.uid, set()).update(tables)
        keyed = {sink.table for source in registry.sources for sink in source.sinks
                 if sink.primary_key}
        lost: list[str] = []
        for uid, tables in required.items():
            for table in tables - keyed:  # a keyed table holds each key's latest version
                if found.get(table, Counter())[uid] == 0:
                    lost.append(f"{uid} in {table}")
        if lost:
            self.violation(f"{len(lost)} acknowledged events missing from a sink they were "
                           f"routed to, e.g. {sorted(lost)[:4]}")
        stray = [f"{uid} in {table}" for table, counts in found.items()
                 for uid in counts if table not in allowed.get(uid, set())]
        if stray:
            self.violation(f"{len(stray)} events in a table they were not routed to, e.g. "
                           f"{sorted(stray)[:4]}")
        for table in sorted(keyed):
            self.check_keys(table)
            if self.world.scenario.cdc:
                check_changes(self, table, self._key_rows(table))
        if self.world.scenario.typed:
            self.check_typed()
        if self.world.scenario.kafka_producers:
            self.check_kafka(found)

    def check_typed(self) -> None:
        """``protobuf-rename`` (#39): once the operator deployed message version 2, the
        Protobuf source's table has v2's columns (the renamed ones under their new names,
        the old names gone, the added one there), its field-number property is v2's, and
        every row reads back, under the new names, the values its message carried (v1
        messages read by field number; ``channel`` null on them)."""
        from pipeline.iceberg.field_numbers import FIELDS_PROP, number_paths
        from testing.sim import typed

        registry = self.world.registry_history[-1]
        source = registry.source(typed.SOURCE)
        if self.world.deployed is None or source is None:
            self.violation("protobuf-rename: message version 2 was never deployed")
            return
        name = f"sim.{typed.SOURCE}"
        try:
            table = self.catalog.load_table(name)
        except NoSuchTableError:
            self.violation(f"{name}: the Protobuf source's table does not exist")
            return
        schema = table.schema()
        names = {f.name for f in schema.fields}
        kind = schema.find_field("detail").field_type if "detail" in names else None
        detail = {f.name for f in kind.fields} if isinstance(kind, StructType) else set()
        got = sorted(names) + [f"detail.{n}" for n in sorted(detail)]
        for old, new in typed.RENAMED.items():
            if old in got or new not in got:
                self.violation(f"{name}: column {old} should be {new} after the v2 deploy "
                               f"(same field number); columns {got}")
        if typed.ADDED not in names:
            self.violation(f"{name}: v2's added field {typed.ADDED} has no column: {got}")
        want = number_paths(_typed_stream(source, name))
        have = json.loads(table.properties.get(FIELDS_PROP, "{}"))
        if have != want:
            self.violation(f"{name}: {FIELDS_PROP} is {have}, v2's field numbers are {want}")
        if table.current_snapshot() is None:
            return
        rows = table.scan().to_arrow().to_pylist()
        v2 = sum(1 for r in rows if r.get(typed.ADDED))
        self.note(f"{name}: {len(rows)} rows, {v2} from v2 messages, columns {got}")
        wrong = []
        for row in rows:
            sent = self.world.ledger.typed.get(row.get("uid"))
            expected = sent.row() if sent is not None else None
            actual = {k: row.get(k) for k in ("n", "total", "detail", "tags", typed.ADDED)}
            if sent is not None and sent.channel is None and actual[typed.ADDED] == "":
                # a v1 message decoded as v2 reads the absent proto3 string as its
                # default; committed before the column existed, it reads null
                actual[typed.ADDED] = None
            if actual != expected:
                wrong.append(f"{row.get('uid')}: {actual} (sent {expected})")
        if wrong:
            self.violation(f"{name}: {len(wrong)} rows do not read back what their messages "
                           f"carried, under v2's names, e.g. {wrong[:2]}")

    def check_kafka(self, found: dict[str, Counter[str]]) -> None:
        """``kafka-retry`` (#40), by Kafka record, naming producer id, epoch and sequence:
        every acknowledged record is in each table it was routed to exactly once, and no
        record is anywhere more than once (a retried batch dropped as a duplicate by its
        ids, whichever ingestor took it, before or after a restart); a record whose batch
        its producer gave up (epoch bumped) may be there once or not at all."""
        ledger = self.world.ledger.kafka
        registry = self.world.registry_history[-1]
        routed: dict[str, set[str]] = {}
        for copy in self.world.ledger.copies:
            record = ledger.records.get(copy.uid)
            source = registry.source(copy.source)
            if record is not None and copy.acked and source is not None:
                routed.setdefault(copy.uid, set()).update(
                    s.table for s in source.routes(copy.version))
        missing, twice, given_up_landed = [], [], 0
        for uid, record in sorted(ledger.records.items()):
            for table in sorted(routed.get(uid, set())):
                if found.get(table, Counter())[uid] != 1:
                    missing.append(f"{record.label()} in {table}: "
                                   f"{found.get(table, Counter())[uid]} times")
            for table, counts in found.items():
                if counts[uid] > 1:
                    twice.append(f"{record.label()} {counts[uid]} times in {table}")
            if record.given_up and any(counts[uid] for counts in found.values()):
                given_up_landed += 1
        if missing:
            self.violation(f"kafka: {len(missing)} acknowledged records not exactly once in "
                           f"their tables, e.g. {missing[:3]}")
        if twice:
            self.violation(f"kafka: {len(twice)} records committed more than once, e.g. "
                           f"{twice[:3]}")
        stats = dict(sorted(ledger.stats.items()))
        acked = sum(1 for r in ledger.records.values() if r.acked)
        given_up = sum(1 for r in ledger.records.values() if r.given_up)
        self.note(f"kafka: {len(ledger.records)} records, {acked} acknowledged, {given_up} "
                  f"given up ({given_up_landed} of them landed, once); {stats}")

    def check_keys(self, name: str) -> None:
        """A keyed table (``upsert-restart``) holds, per key, the state of the key's last
        acknowledged version (its row, or nothing after a tombstone), or of a version sent
        after it or never acknowledged (it may have landed later): never an older
        acknowledged one, which only a stale retry that won could bring back (#36)."""
        rows = self._key_rows(name)
        wrong: list[str] = []
        for key, versions in self.world.ledger.versions.items():
            if not versions or versions[0].uid.split("/", 1)[0] != name.split(".", 1)[1]:
                continue
            acked = [i for i, v in enumerate(versions) if v.acked_at is not None]
            last = acked[-1] if acked else -1
            allowed = {None if v.gone else v.uid for i, v in enumerate(versions)
                       if i == last or v.acked_at is None}
            if last < 0:
                allowed.add(None)
            have = rows.get(key, [])
            if len(have) > 1 or (have[0] if have else None) not in allowed:
                wrong.append(f"{key}={have or 'absent'} (expected {sorted(map(str, allowed))})")
        if wrong:
            self.violation(f"{name}: {len(wrong)} keys hold a stale version (an older "
                           f"acknowledged one won, or the key was deleted again), e.g. "
                           f"{wrong[:3]}")

    def _key_rows(self, name: str) -> dict[str, list[str]]:
        try:
            table = self.catalog.load_table(name)
        except NoSuchTableError:
            return {}
        if table.current_snapshot() is None:
            return {}
        rows = table.scan(selected_fields=("key", "uid")).to_arrow()
        out: dict[str, list[str]] = {}
        for key, uid in zip(rows.column("key").to_pylist(), rows.column("uid").to_pylist(),
                            strict=True):
            out.setdefault(key, []).append(uid)
        return out

    def summary(self) -> dict[str, Any]:
        ledger = self.world.ledger
        return {"requests": ledger.requests, "acked": ledger.acked,
                "events_acked": sum(1 for c in ledger.copies if c.acked),
                "commits": self.commits, "max_epoch": self.max_epoch,
                "store_faults": self.world.store.log.faults,
                "simulated_s": round(self.world.sim.now - self.world_start(), 1)}


def _typed_stream(source: Any, table: str) -> Any:
    """The Protobuf source's stream as its collector evolves its table (its type)."""
    from icefloe.config import StreamConfig

    return StreamConfig(name=source.id, table=table, columns=(), format="protobuf",
                        schema=source.schema)


def offsets_of(props: dict[str, str]) -> dict[int, int]:
    """A snapshot's committed sequence per manifest shard (shard 0 only without
    ``icefloe.sequences``; nothing without an offset)."""
    shards = decode_sequences(props.get(SEQUENCES_PROP))
    if shards is not None:
        return shards
    return {0: int(props[SEQUENCE_PROP])} if SEQUENCE_PROP in props else {}
