"""The simulated cluster: clients, ingestors, collectors and an admin on one virtual clock.

Every part is icefloe's own code: ingestors are the real :class:`~ingestor.buffer.Batcher`
with a real :class:`~icefloe.manifest.producer.ManifestProducer`; collectors are the real
:class:`~collector.service.Collector` driven by the real :class:`~collector.runner.Runner`
(lease renewal, retries, registry following, GC, staging, maintenance) over real pyiceberg
tables in a SQLite catalog; the admin changes the real registry with the admin API's own
operations. Only three things are stand-ins: the object store (:mod:`testing.sim.store`),
time (:mod:`testing.sim.loop`) and Spark (:class:`SimEngine` decodes the run's batch files
in process, as the embedded path's Spark job would).

What clients do: send small requests to a random ingestor, with event ids that repeat
across sources (business ids collide in real life), retry failed requests with the same ids
and payloads, and sometimes resend a request that succeeded (its answer was lost). Every
event carries a unique ``uid`` in its payload, so the checker can tell copies apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import pickle
import random
import tempfile
import weakref
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.exceptions import NoSuchTableError

from collector.metrics import CollectorMetrics
from collector.routing import Routes
from collector.runner import Runner, StandbyWarmth
from collector.service import Collector
from icefloe.config import Column, Config, load_config
from icefloe.config.manifest import ManifestConfig
from icefloe.errors import FencedError, IcefloeError, RegistryError, TableFencedError
from icefloe.formats.envelope import frame_events, frame_typed
from icefloe.manifest.model import Manifest
from icefloe.manifest.producer import ManifestProducer
from icefloe.manifest.sharded_producer import ShardedProducer
from icefloe.manifest.shards import ensure_shards, pick_shard, shard_key
from icefloe.registry import ops
from icefloe.registry.model import Conditions, Registry, Source
from icefloe.registry.store import RegistryStore
from icefloe.registry.streams import union_stream
from icefloe.registry.watch import RegistryWatch
from icefloe.store.base import GetResult, ListResult, ObjectInfo, ObjectStore, PutResult
from icefloe.store.retry import RetryingAsyncStore, RetryPolicy
from icefloe.streams.evolution import EXTRA_FIELD
from ingestor.buffer import Batcher, FlushSettings
from ingestor.metrics import IngestMetrics
from ingestor.publish import StorePublisher
from ingestor.validate import CompiledStream, InvalidEvents
from pipeline.columns import DEAD_LETTER_TABLE, ENVELOPE, SHARD_COLUMN
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import committed_state, not_committed, with_shard_column
from pipeline.iceberg.data_files import DataFileRef, FileSet, TableFiles, TableTarget
from pipeline.iceberg.upsert import without_keys
from pipeline.load.cluster import ClusterRunOutput, Written
from pipeline.load.fetch import decode_refs
from pipeline.load.frame import KEY_COLUMNS, ROW
from pipeline.load.named import named_columns, table_columns
from pipeline.load.plans import WritePlan
from pipeline.load.run import RunOutput
from pipeline.load.sink import StagedRows, StageTarget, rewrite_target
from pipeline.load.spec import RunSpec
from pipeline.load.wheres import where_column, where_flag
from testing.catalog_pointer import lost, metadata_pointer
from testing.sim import dynamic, retention, typed
from testing.sim.changes import ChangeLedger, Connector, cdc_seed
from testing.sim.checks import Checker
from testing.sim.kafka import KafkaLedger, KafkaProducer, KafkaSide
from testing.sim.loop import (
    HostClock,
    SimTime,
    VirtualTimeLoop,
    close_nested,
    drive,
    offload,
)
from testing.sim.scenario import Scenario
from testing.sim.store import FaultPlan, SimCrash, SimStore, SimStoreView

T = TypeVar("T")
HOST: contextvars.ContextVar[str] = contextvars.ContextVar("sim_host", default="world")
START = 1_790_000_000.0
COLUMNS = (Column("uid", "string", required=True), Column("n", "long"))
KEYED_COLUMNS = (*COLUMNS, Column("key", "string", required=True), Column("gone", "boolean"))
"""``upsert-restart``'s sinks: the latest row per ``key``; ``gone`` deletes the key."""
TYPED_SOURCE = typed.SOURCE
KEYED_KEYS = 10
"""Keys per client (``upsert-restart``): few, so copy-on-write commits copy rows."""
KEYED_EVENTS = 70
"""New versions per client at most (``upsert-restart``): below ``dedup_max_ids``."""
log = logging.getLogger("icefloe.sim")


# ---------------------------------------------------------------------- Spark stand-in


class SyncView(ObjectStore):
    """The synchronous store a Spark worker would open, over a host's simulated view."""

    def __init__(self, view: SimStoreView) -> None:
        self.view = view
        self.url = view.url

    def get(self, key: str) -> GetResult:
        return drive(self.view.get(key))

    def put(self, key: str, data: bytes, *, if_match: str | None = None,
            if_none_match: Any = None) -> PutResult:
        return drive(self.view.put(key, data, if_match=if_match, if_none_match=if_none_match))

    def delete(self, key: str) -> None:
        drive(self.view.delete(key))

    def list(self, prefix: str = "") -> ListResult:
        return drive(self.view.list(prefix))

    def head(self, key: str) -> ObjectInfo:
        return drive(self.view.head(key))


class SimEngine:
    """Decodes a run in process, with the embedded path's output shape (rows per stream
    plus dead letters): what the collector's commit code receives from Spark."""

    name = "sim"
    partitions = 1

    def __init__(self, view: SimStoreView) -> None:
        self.store = SyncView(view)

    def run(self, spec: RunSpec) -> RunOutput:
        schemas = {s.name: s.plan() for s in spec.streams}
        parts: dict[str, list[pa.Table]] = {}
        dead: list[pa.Table] = []
        for _, decoded in decode_refs(self.store, spec.refs(), schemas):
            for stream, table in decoded.tables.items():
                if table.num_rows:
                    parts.setdefault(stream, []).append(table)
            if len(decoded.dead):
                dead.append(decoded.dead.to_arrow())
        out = RunOutput({s.name: pa.concat_tables(parts[s.name]) for s in spec.streams
                         if s.name in parts})
        if dead:
            out.dead = pa.concat_tables(dead)
        return out


_WRITES = itertools.count()
"""Names the sim's staged files (deterministic per process, unlike a ULID)."""


class LocalClusterOutput(ClusterRunOutput):
    """The cluster output shape without executors: the rows stay in this object (as they
    would stay on the executors), the collector sees only keys, and :meth:`write` writes
    the planned rows as Parquet files with the executors' own writer
    (:class:`pipeline.iceberg.data_files.TableFiles`), for ``add_files``."""

    def __init__(self, spec: RunSpec, embedded: RunOutput, store: ObjectStore) -> None:
        super().__init__(spec=spec, dead=embedded.dead)
        self.store = store
        self.full: dict[str, pa.Table] = {}
        self.wheres = {(w.stream, w.table): where_column(j) for j, w in enumerate(spec.wheres)}
        offset = 0
        for name, rows in embedded.tables.items():
            ids = pa.array(range(offset, offset + rows.num_rows), pa.int64())
            offset += rows.num_rows
            rows = rows.append_column(ROW, ids)
            flags = []  # each sink's where, as the executors mark it
            for j, where in enumerate(spec.wheres):
                if where.stream == name:
                    rows = rows.append_column(where_column(j), where_flag(where, rows))
                    flags.append(where_column(j))
            for j, table in enumerate(spec.tables):  # each template's table names
                if table.stream == name:
                    for column, value in zip(table_columns(j), named_columns(table, rows),
                                             strict=True):
                        rows = rows.append_column(column, value)
                        flags.append(column)
                    self.tables[(name, table.template)] = table_columns(j)
            self.full[name] = rows
            mine = next((s.keys for s in spec.streams if s.name == name), ())
            flags += [k for k in mine if k in rows.column_names]  # an upsert sink's keys
            keys = rows.select([*KEY_COLUMNS, *flags]).sort_by(
                [("_sequence", "ascending"), (ROW, "ascending")])
            self.keys[name] = keys

    def write_all(self, plans: Sequence[WritePlan]) -> Written:
        """What the executors do for ``plans``, in process: each target's projection of
        its source's rows, as table files or as one staged file (the executors' writers,
        :class:`TableFiles` and :class:`StagedRows`)."""
        out = Written()
        assert self.spec is not None
        streams = {s.name: s for s in self.spec.streams}
        for plan in (p for p in plans if p.expected > 0 or p.rewrites):
            rows = not_committed(self.full[plan.stream], "_sequence", plan.after)
            keep = pc.invert(pc.is_in(rows.column(ROW), value_set=plan.drop))
            if plan.sequences is not None:
                keep = pc.and_(keep, pc.is_in(rows.column("_sequence"), value_set=pa.array(
                    plan.sequences, pa.int64())))
            if plan.where is not None:
                keep = pc.and_(keep, rows.column(plan.where))
            if plan.named is not None:
                keep = pc.and_(keep, pc.fill_null(pc.equal(rows.column(plan.named),
                                                           plan.target), False))
            rows = rows.filter(keep)
            sink = plan.columns or tuple(streams[plan.stream].columns)
            have = set(rows.column_names)
            if plan.stage is not None:  # staged rows keep run positions, as the executors'
                staged = StagedRows(StageTarget(plan.stage, plan.stream, tuple(
                    (n if n in have else "", n, kind) for n, kind in sink)),
                    f"sim{next(_WRITES)}")
                staged.add(rows)
                done = staged.put(self.store)
                out.staged[plan.target] = (done,) if done is not None else ()
                got = sum(f.rows for f in out.staged[plan.target])
            else:
                assert plan.table is not None
                rows = with_shard_column(plan.table, rows, "_sequence")  # as the executors
                names = [(n if n in have else "", n) for n, _ in sink]
                names += [(n, n) for n, _ in ENVELOPE]
                names += [(n, n) for n in (SHARD_COLUMN[0],) if n in rows.column_names]
                target = TableTarget.of(plan.target, plan.table, names)
                files = TableFiles(target, f"sim{id(self):x}", "0")
                files.add(rows)
                written = tuple(files.close())
                out.files[plan.target] = FileSet(written + _rewritten(plan, f"{id(self):x}"))
                got = sum(f.rows for f in written)
            if got != plan.expected:
                raise RuntimeError(f"sim cluster write of {plan.target}: {got} rows, "
                                   f"expected {plan.expected}")
        return out

    def rows_of(self, stream: str, ids: pa.Array) -> pa.Table:
        """The decoded rows ``ids`` of ``stream`` (what the executors send back)."""
        assert self.spec is not None
        rows = self.full[stream]
        names = [n for s in self.spec.streams if s.name == stream for n, _ in s.columns]
        return rows.filter(pc.is_in(rows.column(ROW), value_set=ids)).select(
            [*names, *(n for n, _ in ENVELOPE)])

    def release(self) -> None:
        self.full.clear()


def _rewritten(plan: WritePlan, attempt: str) -> tuple[DataFileRef, ...]:
    """An upsert plan's rewrites, as the executors make them
    (:func:`pipeline.load.sink._rewrite_files`): each file the plan names read as the
    table's scan reads it, without the keys the run replaces or deletes."""
    if not plan.rewrites:
        return ()
    from pyiceberg.expressions import AlwaysTrue  # why: only upsert plans need a scan
    from pyiceberg.io.pyarrow import ArrowScan

    assert plan.table is not None
    columns = [(f.name, f.name) for f in plan.table.schema().fields]
    files = TableFiles(TableTarget.of(rewrite_target(plan.target), plan.table, columns),
                       f"sim{attempt}", "rewrite")
    scan = ArrowScan(plan.table.metadata, plan.table.io, plan.table.schema(), AlwaysTrue())
    for task, held in plan.rewrites:
        keys = pa.ipc.open_stream(held).read_all()
        kept = without_keys(scan.to_table([pickle.loads(task)]), keys, plan.upsert_key)
        if kept.num_rows:
            files.add(kept)
    return tuple(files.close())


class SimClusterEngine(SimEngine):
    """The cluster output path's engine: keys to the driver, files written on request;
    ``run_embedded`` for runs the cluster path hands to the embedded one."""

    name = "sim-cluster"

    def run(self, spec: RunSpec) -> ClusterRunOutput:  # type: ignore[override]
        if not spec.batches:
            return ClusterRunOutput()
        return LocalClusterOutput(spec, super().run(spec), self.store)

    def run_embedded(self, spec: RunSpec) -> RunOutput:
        return super().run(spec)


# ------------------------------------------------------------------------------ actors


@dataclass
class Copy:
    """One request carrying a logical event, as the client sent it."""

    uid: str
    source: str
    version: int
    acked: bool


@dataclass
class Version:
    """One version of a key (``upsert-restart``), as its client sent it: a new row, or a
    tombstone (``gone``). ``acked_at``: when the client was told it is durable (None: not
    told: it may or may not have landed)."""

    uid: str
    key: str
    gone: bool
    event_id: str
    payload: bytes
    acked_at: float | None = None


@dataclass
class Request:
    """A request a client was told is durable, kept for late retries
    (``external-expiry``)."""

    acked_at: float
    source: str
    ids: list[str]
    payloads: list[bytes]
    uids: list[str]


@dataclass
class Ledger:
    """Everything clients sent and what they were told."""

    copies: list[Copy] = field(default_factory=list)
    sent: Counter[str] = field(default_factory=Counter)
    """How many requests carried each event (counted before the request goes out): with
    no dedup window, a table may hold an event at most this many times."""
    requests: int = 0
    acked: int = 0
    refused: int = 0
    versions: dict[str, list[Version]] = field(default_factory=dict)
    """``upsert-restart``: each key's versions, in the order its one client sent them."""
    requests_acked: list[Request] = field(default_factory=list)
    typed: dict[str, typed.Sent] = field(default_factory=dict)
    """``protobuf-rename``: each Protobuf event's values, by ``uid``."""
    kafka: KafkaLedger = field(default_factory=KafkaLedger)
    """``kafka-retry``: each Kafka record (producer id, epoch, sequence, what its producer
    was told) by ``uid``, and what the producers went through."""
    changes: ChangeLedger = field(default_factory=ChangeLedger)
    """``cdc-reorder``: each key's changes (:mod:`testing.sim.changes`)."""


class Ingestor:
    """One ingestor process: registry follower, batcher, manifest producer."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.view = world.store.view(name, world.scenario.faults)
        store = RetryingAsyncStore(self.view, RetryPolicy(max_attempts=4, base_delay_s=0.05,
                                                          max_delay_s=1.0, budget_s=10.0))
        cfg = world.config
        clock = world.clock_of(name)
        self.store = store
        self.producer: ManifestProducer | ShardedProducer
        if cfg.manifest.shards > 1:  # the count is grown at start (run), as in production
            self.producer = ShardedProducer(store, cfg.manifest.build(),
                                            instance=spread_name(name, cfg.manifest.shards),
                                            clock=clock)
        else:
            self.producer = ManifestProducer(
                store, cfg.manifest.build(),
                producer_id=f"{name}-{world.rng.randrange(1 << 30)}", clock=clock)
        settings = FlushSettings(age_s=0.1, min_interval_s=0.0, early_requests=0,
                                 timeout_s=cfg.ingestor.flush_timeout_s, max_inflight=2)
        metrics = IngestMetrics()
        self.batcher = Batcher(StorePublisher(store, self.producer), settings, metrics,
                               clock=clock)
        self.kafka = KafkaSide(name, cfg, self.batcher, metrics, store, clock) \
            if world.scenario.kafka_producers else None
        """``kafka-retry``: the real Kafka front over this ingestor's batcher."""
        self.registry: Registry | None = None
        self._typed: dict[tuple[int, str], CompiledStream] = {}
        self.watch = RegistryWatch(store, cfg.admin.registry_key, self._on_registry,
                                   poll_s=cfg.admin.registry_poll_s, clock=clock)
        self.alive = True

    def _on_registry(self, registry: Registry) -> None:
        self.registry = registry
        if self.kafka is not None:
            self.kafka.service.apply_registry(registry)

    async def run(self) -> None:
        if self.world.config.manifest.shards > 1:
            await ensure_shards(self.store, self.world.config.manifest.build(),
                                clock=self.world.clock_of(self.name))
        self.batcher.start()
        if self.kafka is not None:
            self.world.spawn(self.name, self.kafka.start())
        while True:
            with contextlib.suppress(IcefloeError):
                await self.watch.check()
            await asyncio.sleep(self.world.config.admin.registry_poll_s)

    def _frame_typed(self, registry: Registry, source: Source, now_ms: int, ids: list[str],
                     payloads: list[bytes]) -> bytes:
        """A Protobuf source's messages as the ingest service frames them: checked by the
        source's type at this ingestor's registry version (the real validator), then
        envelope version 2 records holding the producer's bytes."""
        key = (registry.version, source.id)
        compiled = self._typed.get(key)
        if compiled is None:
            compiled = CompiledStream(union_stream(source, source.live_sinks()),
                                      registry.version)
            self._typed = {key: compiled}
        try:
            canonical = compiled.from_binary(payloads)
        except InvalidEvents as exc:  # every simulated message is valid
            self.world.checker.violation(f"{self.name} refused valid Protobuf messages of "
                                         f"{source.id}: {exc}")
            raise
        return frame_typed(source.id, now_ms, [i.encode() for i in ids], canonical.payloads,
                           canonical.format, canonical.schema_ids or [0] * len(ids))

    async def submit(self, source: str, ids: list[str], payloads: list[bytes]) -> int:
        """Accept a request as the HTTP front would; returns the registry version it was
        accepted under once durable; raises when refused or failed."""
        registry = self.registry
        if not self.alive or registry is None:
            raise ConnectionError("ingestor down")
        if registry.source(source) is None:
            raise LookupError(f"unknown source {source}")
        now_ms = int(self.world.clock_of(self.name).time() * 1000)
        record = registry.source(source)
        if record is not None and record.format != "json":
            framed = self._frame_typed(registry, record, now_ms, ids, payloads)
        else:
            framed = frame_events(source, now_ms, ids, payloads)
        future = self.batcher.enqueue(framed, len(ids), source, registry.version)
        await asyncio.wait_for(future, self.world.config.ingestor.flush_timeout_s + 5)
        return registry.version


class Client:
    """Sends requests, retries failures with the same ids, sometimes resends a success."""

    def __init__(self, world: World, name: str, rng: random.Random) -> None:
        self.world = world
        self.name = name
        self.rng = rng

    async def run(self, until: float) -> None:
        world = self.world
        if world.scenario.upsert:
            await self.run_keyed(until)
            return
        if world.scenario.cdc:
            await Connector(self).run(until)
            return
        while world.sim.now < until:
            await asyncio.sleep(self.rng.uniform(0.05, 0.6))
            sources = world.open_sources()
            if not sources:
                continue
            source = self.rng.choice(sources)
            count = self.rng.randint(1, 4)
            ids, payloads, uids = [], [], []
            for _ in range(count):
                n = world.next_id(source)
                uid = f"{source}/{n}"
                ids.append(f"e{n}")  # the same ids in every source: they must not collide
                uids.append(uid)
                if world.typed_source(source):
                    payload, sent = typed.reading(self._message_version(), uid, n)
                    world.ledger.typed[uid] = sent
                    payloads.append(payload)
                    continue
                body: dict[str, object] = {"uid": uid, "n": n}
                if world.scenario.dynamic:  # the value that names the event's table
                    body["tenant"] = dynamic.tenant(n)
                if world.scenario.evolve:  # what an evolving stream's ingestor keeps
                    body[EXTRA_FIELD] = msgspec.json.encode({f"x{n % 5}": n}).decode()
                payloads.append(msgspec.json.encode(body))
            acked = await self.send(source, ids, payloads, uids)
            if acked and self.rng.random() < world.scenario.retry_after_success:
                await asyncio.sleep(self.rng.uniform(0.1, 5.0))
                await self.send(source, ids, payloads, uids)

    def _message_version(self) -> int:
        """``protobuf-rename``: which message version this request is built with. Before
        the deploy, v1; after it, once every ingestor serves v2 (a producer upgrades after
        the descriptor is deployed), v2 for six requests in ten; the rest are producers not
        upgraded yet, whose v1 messages v2 must read by field number."""
        world = self.world
        if world.deployed is None or not all(
                i.registry is not None and i.registry.version >= world.deployed
                for i in world.ingestors if i.alive):
            return 1
        return 2 if self.rng.random() < 0.6 else 1

    async def run_keyed(self, until: float) -> None:
        """``upsert-restart``: versions of this client's own keys in one source (its
        keys' order is its send order), a quarter of them tombstones; sometimes, instead,
        an older acknowledged version is sent again (a retry of a request whose answer was
        lost, arriving after newer versions): it must never win. At most
        :data:`KEYED_EVENTS` events, so a table's window holds every event."""
        world = self.world
        index = int("".join(c for c in self.name if c.isdigit()) or 0)
        sent = 0
        keys = [f"{self.name}-k{j}" for j in range(KEYED_KEYS)]
        while world.sim.now < until:
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            sources = world.open_sources()
            if not sources:
                continue
            source = sources[index % len(sources)]
            stale = self._stale_version(keys)
            if stale is not None and self.rng.random() < world.scenario.stale_resend:
                world.checker.note(f"{self.name} resends {stale.uid} of {stale.key} "
                                   f"(acknowledged {world.sim.now - (stale.acked_at or 0):.0f}"
                                   " s ago, newer versions since)")
                await self.send(source, [stale.event_id], [stale.payload], [stale.uid])
                continue
            if sent >= KEYED_EVENTS:
                continue
            sent += 1
            key = self.rng.choice(keys)
            n = world.next_id(source)
            uid, gone = f"{source}/{n}", self.rng.random() < 0.25
            payload = msgspec.json.encode({"uid": uid, "n": n, "key": key, "gone": gone})
            version = Version(uid, key, gone, f"e{n}", payload)
            world.ledger.versions.setdefault(key, []).append(version)
            if await self.send(source, [version.event_id], [payload], [uid]):
                version.acked_at = world.sim.now

    def _stale_version(self, keys: list[str]) -> Version | None:
        """An acknowledged version of one of ``keys`` with a newer version sent since,
        acknowledged 10 s or more ago and within half the dedup window."""
        now, window = self.world.sim.now, self.world.scenario.dedup_window_s
        old = [v for key in keys for v in self.world.ledger.versions.get(key, [])[:-1]
               if v.acked_at is not None and now - window / 2 < v.acked_at < now - 10]
        return self.rng.choice(old) if old else None

    async def send(self, source: str, ids: list[str], payloads: list[bytes],
                   uids: list[str]) -> bool:
        world = self.world
        for _attempt in range(6):
            ingestor = self.rng.choice(world.ingestors)
            world.ledger.requests += 1
            world.ledger.sent.update(uids)
            version = ingestor.registry.version if ingestor.registry else -1
            try:
                accepted = await ingestor.submit(source, ids, payloads)
            except LookupError:
                world.ledger.refused += 1
                return False  # the source is gone: a 404, nothing accepted
            except (Exception, asyncio.CancelledError) as exc:
                if isinstance(exc, asyncio.CancelledError) and not ingestor.alive:
                    pass  # the ingestor died under the request: unknown outcome
                elif isinstance(exc, asyncio.CancelledError):
                    raise
                world.ledger.copies.extend(Copy(u, source, version, False) for u in uids)
                await asyncio.sleep(self.rng.uniform(0.2, 2.0))
                continue
            world.ledger.acked += 1
            world.ledger.requests_acked.append(Request(world.sim.now, source, ids, payloads,
                                                       uids))
            world.ledger.copies.extend(Copy(u, source, accepted, True) for u in uids)
            return True
        return False


class CollectorHost:
    """One collector process: start-up as ``run_collector`` does it, then the Runner."""

    def __init__(self, world: World, name: str, *, takeover: bool,
                 faults: FaultPlan) -> None:
        self.world = world
        self.name = name
        self.takeover = takeover
        self.view = world.store.view(name, faults)
        self.stop = asyncio.Event()
        self.collector: Collector | None = None
        self.outcome: str = "running"

    async def run(self) -> None:
        world, config = self.world, self.world.config
        store = RetryingAsyncStore(self.view, RetryPolicy(max_attempts=3, base_delay_s=0.05,
                                                          max_delay_s=0.5, budget_s=5.0))
        catalog = open_catalog(config.catalog)
        metrics = CollectorMetrics()
        engine = SimClusterEngine(self.view) if config.collector.output == "cluster" \
            else SimEngine(self.view)
        rng = random.Random(world.scenario.seed * 131 + len(world.collectors))

        async def timed_offload(func: Callable[..., Any], /, *args: Any, **kwargs: Any
                                ) -> Any:
            # a blocking step takes time (a Spark job seconds, a commit a tenth): others
            # run meanwhile, then the step itself runs atomically, as a thread's result
            # arrives all at once
            job = isinstance(getattr(func, "__self__", None), SimEngine)
            if job:
                world.job_starts(self.name, args[0])
            await asyncio.sleep(rng.uniform(0.3, 3.0) if job else rng.uniform(0.02, 0.3))
            return await offload(func, *args, **kwargs)

        collector = Collector(config, store, catalog, engine,
                              metrics=metrics, hook=world.checker.hook(self.name),
                              holder=self.name, clock=world.clock_of(self.name),
                              offload=timed_offload, block_on=drive)
        self.collector = collector
        # a warm standby, as ``run_collector`` runs one: the real warming (catalog checked
        # every WARM_EVERY_S; Spark is a stand-in here) while it waits on the lease, and
        # every table, committed sequence, dedup window and staging state read only after
        # its epoch bump (prepare_tables below)
        warmth = StandbyWarmth(config, engine, catalog, offload=offload,
                               clock=world.clock_of(self.name))

        def on_standby() -> None:
            world.checker.note(f"{self.name} waits on the lease (warm standby)")
            warmth.start()
        try:
            await collector.acquire(takeover=self.takeover, stop=self.stop,
                                    on_standby=on_standby)
        except asyncio.CancelledError:
            self.outcome = "stopped on standby"
            return
        finally:
            await warmth.stop()
        world.checker.epoch_acquired(self.name, collector.epoch or 0)
        watch = RegistryWatch(store, config.admin.registry_key, lambda registry: None,
                              poll_s=config.admin.registry_poll_s,
                              config_streams=config.streams)
        runner = Runner(collector, self.stop, None, watch)
        runner.start_renewal()
        try:
            registry = await watch.check()
            if registry is not None:
                collector.routes = Routes(registry)
            await asyncio.to_thread(collector.prepare_tables)
            await collector.verify_offsets()
        except BaseException:
            await runner.stop_renewal()
            raise
        world.checker.collector_ready(self.name, collector.epoch or 0)
        code = await runner.run()
        self.outcome = f"exited {code}" + (f" ({runner.fenced})" if runner.fenced else "")


# -------------------------------------------------------------------------------- world


class World:
    """Builds everything from a :class:`Scenario` and runs it to a verdict."""

    def __init__(self, scenario: Scenario, root: Path) -> None:
        self.scenario = scenario
        self.root = root
        self.rng = random.Random(scenario.seed * 7919 + 1)
        self.staging_rng = random.Random(scenario.seed * 7919 + 2)
        self.sim = SimTime(START)
        self.store = SimStore(self.sim, random.Random(scenario.seed * 104729 + 3))
        self.config = self._config()
        self.ledger = Ledger()
        self.checker = Checker(self)
        self.ingestors: list[Ingestor] = []
        self.collectors: list[CollectorHost] = []
        self.owners: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = \
            weakref.WeakKeyDictionary()
        """Every task, by the host that created it (a crash stops all of a host's tasks)."""
        self._ids: dict[str, int] = {}
        self._skews: dict[str, float] = {}
        self.registry_history: list[Registry] = []
        self.opens_at: dict[str, float] = {}
        """Sources clients leave alone until this simulated time (``late-staging``)."""
        self.takeover_armed = False
        self.kills_at_create = scenario.kills_at_create
        """``dynamic-tables``: collector deaths right after preparing a table still due."""
        """``late-staging``: take over when the active collector's next job starts."""
        self.broken: tuple[str, str] | None = None
        """``parked-table``: the broken table and its good metadata pointer."""
        self.deployed: int | None = None
        """``protobuf-rename``: the registry version that deployed message version 2."""

    # -- configuration --------------------------------------------------------------------

    def _config(self) -> Config:
        s = self.scenario
        path = self.root / "icefloe.toml"
        path.write_text("")
        overrides: dict[str, dict[str, Any]] = {
            "store": {"url": (self.root / "unused-store").as_uri()},
            "catalog": {"uri": f"sqlite:///{self.root / 'catalog.db'}",
                        "warehouse": (self.root / "warehouse").as_uri()},
            "manifest": {"lease_s": s.lease_s, "append_deadline_s": s.append_deadline_s,
                         "shards": s.shards,
                         "gc_grace_s": s.append_deadline_s + 300.0},
            "ingestor": {"flush_timeout_s": s.flush_timeout_s},
            "admin": {"registry_poll_s": 1.0},
            "collector": {"metrics_port": 0, "host": "127.0.0.1", "commit_interval_s": 1.0,
                          "poll_interval_s": 0.5, "dedup_window_s": s.dedup_window_s,
                          "snapshot_max_age_s": s.snapshot_max_age_s,
                          "gc_interval_s": s.gc_interval_s,
                          "maintenance_interval_s": s.maintenance_interval_s,
                          "orphan_age_s": 600.0, "retry_max_delay_s": 5.0,
                          "max_run_entries": 50, "output": s.output,
                          "dedup_max_ids": s.dedup_max_ids,
                          "snapshot_keep_last": s.snapshot_keep_last,
                          "keep_batches_s": s.keep_batches_s, "overlap": s.overlap,
                          # one table after another: threads would make a seed's story
                          # depend on the OS scheduler, not on the seed
                          "commit_workers": 1},
        }
        return load_config(path, overrides=overrides)

    # -- helpers the actors use -------------------------------------------------------------

    def clock_of(self, host: str) -> HostClock:
        return HostClock(self.sim, self._skews.get(host, 0.0))

    def next_id(self, source: str) -> int:
        self._ids[source] = self._ids.get(source, 0) + 1
        return self._ids[source]

    def live_sources(self) -> list[str]:
        registry = self.registry_history[-1] if self.registry_history else None
        return [s.id for s in registry.live_sources()] if registry else []

    def open_sources(self) -> list[str]:
        """The live sources clients send to now."""
        return [s for s in self.live_sources() if self.opens_at.get(s, 0.0) <= self.sim.now]

    def typed_source(self, source: str) -> bool:
        """Whether clients send ``source`` Protobuf messages (``protobuf-rename``'s s0)."""
        return self.scenario.typed and source == TYPED_SOURCE

    def job_starts(self, host: str, spec: RunSpec) -> None:
        """A collector's Spark job starts: in ``late-staging``, if it carries the staged
        source's first events, take over while it runs, so the old collector stages that
        table for the first time after the takeover."""
        if not self.takeover_armed or self.sim.now < self.opens_at.get("s0", 0.0):
            return
        active = self.active()
        if active is None or active.name != host:
            return
        locations = {batch[1] for batch in spec.batches}
        if not any("s0" in e.streams for m in self.manifests().values() for e in m.entries
                   if e.location in locations):
            return
        self.takeover_armed = False
        self.checker.note(f"forced takeover while {host}'s job runs")
        self._start_collector(takeover=True)

    def spawn(self, host: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        token = HOST.set(host)
        try:
            task = asyncio.get_running_loop().create_task(coro, name=host)
        finally:
            HOST.reset(token)
        return task

    def kill(self, host: str) -> None:
        """A host dies: its store view refuses everything and all its tasks stop."""
        owners: list[Ingestor | CollectorHost] = [*self.ingestors, *self.collectors]
        for view_owner in owners:
            if view_owner.name == host:
                view_owner.view.crashed = True
                if isinstance(view_owner, Ingestor):
                    view_owner.alive = False
        for task, owner in list(self.owners.items()):
            if owner == host and not task.done():
                task.cancel()

    # -- the admin ----------------------------------------------------------------------------

    async def admin_change(self, registry_store: RegistryStore) -> None:
        rng, ac = self.rng, self.clock_of("admin")
        current = self.registry_history[-1]
        # the Protobuf source keeps its one sink (its columns are its message's)
        sources = [s for s in current.live_sources() if not self.typed_source(s.id)]
        if not sources:
            return
        choice = rng.choice(["disable", "enable", "recreate", "move", "move", "move",
                             "add_sink", "add_source", "delete_sink"])
        source = rng.choice(sources)
        change: Callable[[Registry], Registry] | None = None
        sinks = source.live_sinks()
        if choice in ("disable", "enable") and sinks:
            sink = rng.choice(sinks)
            change = lambda r: ops.set_sink_enabled(r, source.id, sink.name,  # noqa: E731
                                                    choice == "enable", clock=ac)
        elif choice == "recreate" and sinks:
            sink = rng.choice(sinks)

            def change(r: Registry) -> Registry:
                r = ops.delete_sink(r, source.id, sink.name, clock=ac)
                return ops.create_sink(r, source.id, ops.SinkSpec(
                    name=sink.name, table=sink.table, columns=COLUMNS), clock=ac)
        elif choice == "move" and sinks and len(sources) > 1:
            sink = rng.choice(sinks)
            other = rng.choice([s for s in sources if s.id != source.id])

            def change(r: Registry) -> Registry:
                r = ops.delete_sink(r, source.id, sink.name, clock=ac)
                return ops.create_sink(r, other.id, ops.SinkSpec(
                    name=f"{sink.name}m", table=sink.table, columns=COLUMNS), clock=ac)
        elif choice == "add_sink":
            table = f"sim.t{len(self._ids) + rng.randrange(100, 999)}"
            # half of the new sinks stage their rows (import conditions): a table staged
            # for the first time during a takeover (drawn apart, so the rest of the
            # scenario keeps its random stream)
            staged = Conditions(max_age_s=self.staging_rng.choice([5.0, 20.0])) \
                if self.staging_rng.random() < 0.5 else Conditions()
            change = lambda r: ops.create_sink(r, source.id, ops.SinkSpec(  # noqa: E731
                name=f"k{rng.randrange(1000)}", table=table, columns=COLUMNS,
                conditions=staged), clock=ac)
        elif choice == "add_source":
            new = f"s{len(current.sources)}"
            change = lambda r: ops.create_source(r, ops.SourceSpec(  # noqa: E731
                id=new, sinks=(ops.SinkSpec(name="main", table=f"sim.{new}",
                                            columns=COLUMNS),)), clock=ac)
        elif choice == "delete_sink" and len(sinks) > 1:
            sink = rng.choice(sinks)
            change = lambda r: ops.delete_sink(r, source.id, sink.name, clock=ac)  # noqa: E731
        if change is None:
            return
        try:
            registry = await registry_store.update(change)
        except (RegistryError, IcefloeError) as exc:
            log.debug("admin change %s refused: %s", choice, exc)
            return
        self.note_registry(registry, f"admin {choice} {source.id}")

    def note_registry(self, registry: Registry, why: str) -> None:
        if not self.registry_history or registry.version > self.registry_history[-1].version:
            self.registry_history.append(registry)
            self.checker.note(f"registry v{registry.version}: {why}")

    def _seed_spec(self) -> list[ops.SourceSpec]:
        age = self.scenario.conditions_age_s
        specs = []
        for i in range(self.scenario.sources):
            conditions = Conditions(max_age_s=age) if age is not None and i == 0 \
                else Conditions()
            keyed: dict[str, Any] = {"primary_key": ("key",), "tombstone_field": "gone"} \
                if self.scenario.upsert else {}
            columns = typed.columns(1) if self.typed_source(f"s{i}") else \
                KEYED_COLUMNS if self.scenario.upsert else \
                (*COLUMNS, dynamic.COLUMN) if self.scenario.dynamic else COLUMNS
            table = dynamic.template(i) if self.scenario.dynamic else f"sim.s{i}"
            specs.append(ops.SourceSpec(id=f"s{i}", sinks=(ops.SinkSpec(
                name="main", table=table, columns=columns,
                conditions=conditions,
                unknown_fields="evolve" if self.scenario.evolve else "ignore", **keyed),)))
        return specs

    def _typed_seed(self, registry: Registry) -> Registry:
        """``protobuf-rename``: source s0 carries message version 1 (as a seeded registry
        keeps a config stream's format and type: the admin API takes no typed sources)."""
        if not self.scenario.typed:
            return registry
        return with_source_type(registry, TYPED_SOURCE, typed.schema(1))

    async def _deploy(self, registry_store: RegistryStore) -> None:
        """``protobuf-rename``: the operator deploys message version 2. After seeding the
        registry is the truth (a changed descriptor in icefloe.toml is only drift), so the
        new type reaches every ingestor and collector through the source's type and its
        sink's columns, in one registry version, as a re-seeded typed source carries them;
        running collectors evolve the table when they read it, new ones when they start."""
        clock = self.clock_of("admin")

        def change(r: Registry) -> Registry:
            r = ops.update_sink(r, TYPED_SOURCE, "main",
                                ops.SinkPatch(columns=typed.columns(2)), clock=clock)
            return with_source_type(r, TYPED_SOURCE, typed.schema(2))

        registry = await registry_store.update(change)
        self.deployed = registry.version
        self.note_registry(registry, "deploy Protobuf message v2 (amount -> total, "
                                     "detail.note -> detail.label, + channel)")

    # -- the run ----------------------------------------------------------------------------

    async def main(self) -> None:
        s = self.scenario
        admin_view = self.store.view("admin", FaultPlan.none())
        registry_store = RegistryStore(admin_view, self.config.admin.registry_key,
                                       clock=self.clock_of("admin"))

        def seed(r: Registry) -> Registry:
            for spec in self._seed_spec():
                r = ops.create_source(r, spec, clock=self.clock_of("admin"))
            return cdc_seed(self._typed_seed(r), s.cdc_keep) if s.cdc else self._typed_seed(r)

        self.note_registry(await registry_store.update(seed), "seed")
        for i in range(s.ingestors):
            self._start_ingestor(f"ingestor-{i}")
        self._start_collector(takeover=False)
        standby = self.rng.random() < 0.5
        if standby or s.standby:
            self._start_collector(takeover=False)  # a warm standby from the start
        traffic_end = self.sim.now + s.duration_s
        clients = [self.spawn(f"client-{i}", Client(self, f"client-{i}", random.Random(
            s.seed * 31 + i)).run(traffic_end)) for i in range(s.clients)]
        clients += [self.spawn(f"kafka-{i}", KafkaProducer(
            self, f"kafka-{i}", random.Random(s.seed * 41 + i), Copy).run(traffic_end))
            for i in range(s.kafka_producers)]
        chaos = self.spawn("chaos", self._chaos(registry_store, traffic_end))
        checks = self.spawn("checker", self.checker.periodic())
        await asyncio.gather(*clients, return_exceptions=True)
        if s.quiet_gap_s:  # a long pause, then a second burst: GC, expiry, dedup ages
            await asyncio.sleep(s.quiet_gap_s)
            end2 = self.sim.now + 20
            more = [self.spawn(f"client-b{i}", Client(self, f"client-b{i}", random.Random(
                s.seed * 37 + i)).run(end2)) for i in range(s.clients)]
            await asyncio.gather(*more, return_exceptions=True)
        await chaos
        await self._drain()
        if s.keep_batches_s:
            await retention.tail(self)
        checks.cancel()
        for c in self.collectors:
            c.stop.set()
        await asyncio.sleep(self.scenario.lease_s)
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()

    def _start_ingestor(self, name: str) -> None:
        ingestor = Ingestor(self, name)
        self.ingestors = [i for i in self.ingestors if i.name != name] + [ingestor]
        self.spawn(name, ingestor.run())

    def _start_collector(self, *, takeover: bool) -> CollectorHost:
        index = len(self.collectors)
        name = f"collector-{index}"
        skew = self.scenario.collector_skew_s[index % len(self.scenario.collector_skew_s)]
        self._skews[name] = skew
        host = CollectorHost(self, name, takeover=takeover,
                             faults=self.scenario.collector_faults)
        self.collectors.append(host)
        self.spawn(name, self._guard(host))
        return host

    async def _guard(self, host: CollectorHost) -> None:
        try:
            await host.run()
        except SimCrash:
            host.outcome = "crashed"
        except asyncio.CancelledError:
            host.outcome = host.outcome if host.outcome != "running" else "killed"
        except (FencedError, TableFencedError) as exc:  # replaced while starting: it stops
            host.outcome = f"fenced at start: {exc}"
        except Exception as exc:  # a collector that dies of an error is a finding
            host.outcome = f"died: {type(exc).__name__}: {exc}"
            self.checker.violation(f"{host.name} died of an unexpected error: "
                                   f"{type(exc).__name__}: {exc}")

    def active(self) -> CollectorHost | None:
        running = [c for c in self.collectors if c.outcome == "running"
                   and c.collector is not None and c.collector.epoch is not None]
        return max(running, key=lambda c: (c.collector and c.collector.epoch) or 0) \
            if running else None

    async def _chaos(self, registry_store: RegistryStore, until: float) -> None:
        s, rng = self.scenario, self.rng
        events: list[tuple[float, str]] = []
        span = max(1.0, until - self.sim.now)
        for kind, count in (("admin", s.admin_changes), ("crash", s.collector_crashes),
                            ("takeover", s.forced_takeovers), ("stall", s.collector_stalls),
                            ("ingestor", s.ingestor_crashes)):
            events += [(self.sim.now + rng.uniform(0.1, 0.9) * span, kind)
                       for _ in range(count)]
        if s.family == "late-staging":  # the takeover follows the staged source's opening
            events = [e for e in events if e[1] != "takeover"]
            self.opens_at["s0"] = self.sim.now + rng.uniform(0.2, 0.5) * span
            self.takeover_armed = True
        elif s.family == "outage":
            events.append((self.sim.now + rng.uniform(0.3, 0.7) * span, "outage"))
        elif s.family == "external-expiry" and s.expire_at is not None:
            events.append((self.sim.now + s.expire_at * span, "expire"))
        elif s.family == "protobuf-rename" and s.deploy_at is not None:
            events.append((self.sim.now + s.deploy_at * span, "deploy"))
        elif s.family == "parked-table" and s.break_at is not None:
            assert s.restore_at is not None
            events.append((self.sim.now + s.break_at * span, "break"))
            events.append((self.sim.now + s.restore_at * span, "restore"))
        for at, kind in sorted(events):
            await asyncio.sleep(max(0.0, at - self.sim.now))
            if kind == "admin":
                await self.admin_change(registry_store)
            elif kind == "crash":
                victim = self.active()
                if victim is not None:
                    self.checker.note(f"crash {victim.name}")
                    self.kill(victim.name)
                    victim.outcome = "crashed"
                    if s.family == "failover":  # the standby takes over; then a new standby
                        await self._until_active_other_than(victim)
                    else:
                        await asyncio.sleep(rng.uniform(0.5, 3.0))
                    self._start_collector(takeover=False)
            elif kind == "outage":
                await self._outage(s.outage_s)
            elif kind == "expire":
                await self._external_expiry()
            elif kind == "deploy":
                await self._deploy(registry_store)
            elif kind == "break":
                self._break_table()
            elif kind == "restore":
                self._restore_table()
            elif kind == "takeover":
                self.checker.note("forced takeover")
                self._start_collector(takeover=True)  # the old one runs on: stale
            elif kind == "stall":
                victim = self.active()
                if victim is not None:
                    self.checker.note(f"stall {victim.name}")
                    self._start_collector(takeover=False)  # standby, takes over the lease
                    victim.view.plan = FaultPlan(stall=1.0, stall_s=(s.lease_s * 2,
                                                                     s.lease_s * 4))
                    await asyncio.sleep(s.lease_s * 3)
                    victim.view.plan = s.collector_faults
            elif kind == "ingestor":
                victim_i = rng.choice(self.ingestors)
                self.checker.note(f"crash {victim_i.name}")
                self.kill(victim_i.name)
                await asyncio.sleep(rng.uniform(0.5, 3.0))
                self._start_ingestor(victim_i.name + "r")

    async def _until_active_other_than(self, victim: CollectorHost) -> None:
        """Wait (bounded) until another collector is active: the standby's takeover."""
        limit = self.sim.now + self.scenario.lease_s * 4 + 30.0
        while self.sim.now < limit and (self.active() in (None, victim)):
            await asyncio.sleep(0.5)

    async def _outage(self, seconds: float) -> None:
        """Every collector dies (standbys too); a new one starts after ``seconds``: longer
        than the dedup window, while clients resend requests committed just before."""
        running = [c for c in self.collectors if c.outcome == "running"]
        self.checker.note(f"outage: {len(running)} collectors die for {seconds:.0f} s")
        for host in running:
            self.kill(host.name)
            host.outcome = "crashed"
        await asyncio.sleep(seconds)
        self._start_collector(takeover=False)

    async def _external_expiry(self) -> None:
        """``external-expiry``: another tool expires every table's snapshots but the
        newest one holding an offset (and any after it), the active collector restarts,
        and clients retry requests acknowledged 10 s or more before (well inside the dedup
        window): the restarted collector must drop them, whatever the snapshot log lost."""
        expired = expire_all_but_current(self.checker.catalog, self.checker.tables())
        self.checker.note(f"another tool expires {expired} snapshots")
        victim = self.active()
        if victim is not None:
            self.checker.note(f"crash {victim.name} (restart after the expiry)")
            self.kill(victim.name)
            victim.outcome = "crashed"
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
            self._start_collector(takeover=False)
        now, window = self.sim.now, self.scenario.dedup_window_s
        old = [r for r in self.ledger.requests_acked
               if now - window / 2 < r.acked_at < now - 10]
        picked = self.rng.sample(old, min(len(old), 20))
        self.checker.note(f"clients retry {len(picked)} requests acknowledged before the "
                          "expiry")
        retrier = Client(self, "client-late", random.Random(self.scenario.seed * 53 + 36))
        for request in picked:
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))
            await retrier.send(request.source, request.ids, request.payloads, request.uids)

    def _break_table(self) -> None:
        """``parked-table``: point one seeded table at a metadata file that is not there
        (a bad restore, another tool's mistake): its loads and commits fail from now on."""
        names = [n for n in self.checker.tables() if n != DEAD_LETTER_TABLE]
        if not names:
            return
        name = self.rng.choice(names)
        good = metadata_pointer(self.root / "catalog.db", name)
        if good is None:
            return
        self.broken = (name, good)
        metadata_pointer(self.root / "catalog.db", name, lost(good))
        self.checker.note(f"table {name} broken (its metadata file is missing)")

    def _restore_table(self) -> None:
        """The operator restores the pointer: the parked table must unpark by itself."""
        if self.broken is None:
            return
        name, good = self.broken
        metadata_pointer(self.root / "catalog.db", name, good)
        self.broken = None
        parked = any(c.collector is not None and c.collector.bulkheads.is_parked(name)
                     for c in self.collectors if c.outcome == "running")
        self.checker.note(f"table {name} restored ({'parked' if parked else 'not parked'} "
                          "at that moment)")

    async def _drain(self) -> None:
        """Faults stop; the queue and staging must empty within a bounded simulated time."""
        self.store.faults_on = False
        for c in self.collectors:
            c.view.plan = FaultPlan.none()
        limit = self.sim.now + 900.0
        if self.active() is None:
            self._start_collector(takeover=False)
        while self.sim.now < limit:
            await asyncio.sleep(1.0)
            if self.active() is None and not any(
                    c.outcome == "running" for c in self.collectors):
                self._start_collector(takeover=False)
            if await self.checker.drained():
                self.checker.note("drained")
                return
        self.checker.violation("wedged: the queue or staging did not drain within 900 s of "
                               "simulated time after faults stopped")

    def manifest(self) -> Manifest | None:
        obj = self.store.objects.get(ManifestConfig.key)
        return Manifest.decode(obj.data) if obj is not None else None

    def manifests(self) -> dict[int, Manifest]:
        """Every manifest shard that exists, by number (shard 0 is :meth:`manifest`)."""
        out: dict[int, Manifest] = {}
        for shard in range(self.scenario.shards):
            obj = self.store.objects.get(shard_key(ManifestConfig.key, shard))
            if obj is not None:
                out[shard] = Manifest.decode(obj.data)
        return out


@contextlib.contextmanager
def rename_crash_points(world: World) -> Iterator[None]:
    """``protobuf-rename``: two more crash points inside the blocking step that prepares a
    Protobuf table (``ensure_stream_table``): ``after_rename:<table>``, right after a
    rename by field number was committed (before the added column and before the numbers
    are remembered), and ``before_remember:<table>``, after the table evolved and before
    its field numbers are recorded. Drawn from a generator of their own (other families
    are untouched); the collector that prepares the table dies there and another one
    must finish the job from what the catalog holds."""
    import pipeline.iceberg.tables as tables

    rename, remember = tables.rename_by_numbers, tables.remember_numbers
    rng = random.Random(world.scenario.seed * 7919 + 39)

    def point(stage: str, chance: float) -> None:
        host = HOST.get()
        if host.startswith("collector-") and world.store.faults_on \
                and rng.random() < chance:
            world.checker.crash(host, stage)

    def renamed(catalog: Any, stream: Any, target: Any) -> None:
        before = _schema_of(catalog, stream.table)
        rename(catalog, stream, target)
        if before is not None and _schema_of(catalog, stream.table) != before:
            point(f"after_rename:{stream.table}", 0.5)

    def remembered(catalog: Any, stream: Any) -> None:
        if stream.format == "protobuf":
            point(f"before_remember:{stream.table}", 0.05)
        remember(catalog, stream)

    tables.rename_by_numbers, tables.remember_numbers = renamed, remembered
    try:
        yield
    finally:
        tables.rename_by_numbers, tables.remember_numbers = rename, remember


def _schema_of(catalog: Any, name: str) -> Any:
    try:
        return catalog.load_table(name).schema()
    except NoSuchTableError:
        return None


def with_source_type(registry: Registry, source_id: str, schema: Any) -> Registry:
    """``registry`` with ``source_id`` a Protobuf source of ``schema`` (same version)."""
    sources = tuple(msgspec.structs.replace(s, format="protobuf", schema=schema)
                    if s.id == source_id else s for s in registry.sources)
    return msgspec.structs.replace(registry, sources=sources)


def expire_all_but_current(catalog: Any, names: Sequence[str]) -> int:
    """What another engine's snapshot expiry does, keeping each table's current state:
    every snapshot but the newest one holding an offset (``icefloe.sequence``) and those
    after it (branch heads too) is expired. Returns how many."""
    expired = 0
    for name in names:
        try:
            table = catalog.load_table(name)
            state = committed_state(table)
        except (NoSuchTableError, IcefloeError):
            continue
        keep = {ref.snapshot_id for ref in table.metadata.refs.values()}
        snapshot = table.current_snapshot()
        while snapshot is not None:
            keep.add(snapshot.snapshot_id)
            if state.snapshot_id is None or snapshot.snapshot_id == state.snapshot_id:
                break
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        victims = [s.snapshot_id for s in table.metadata.snapshots
                   if s.snapshot_id not in keep]
        if victims:
            table.maintenance.expire_snapshots().by_ids(victims).commit()
            expired += len(victims)
    return expired


def spread_name(name: str, shards: int) -> str:
    """An instance name for ingestor ``name`` whose rendezvous pick is shard ``index %
    shards`` (the simulated cluster is small: left to chance, every ingestor of a seed
    could land on one shard). The real pick code runs; only the name is chosen."""
    index = int("".join(c for c in name if c.isdigit()) or 0)
    want = index % shards
    return next(f"{name}~{k}" for k in range(1000) if pick_shard(f"{name}~{k}", shards) == want)


@contextlib.contextmanager
def quiet_logs(verbose: bool) -> Iterator[None]:
    if verbose:
        logging.basicConfig(level=logging.INFO)
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def run_seed(seed: int, *, verbose: bool = False, keep: Path | None = None) -> Checker:
    """Run one seed to its verdict (``checker.violations`` empty means it passed)."""
    scenario = Scenario.draw(seed)
    random.seed(seed)  # the retry layer's jitter, drawn from the module generator
    with contextlib.ExitStack() as stack:
        root = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix=f"icefloe-sim-{seed}-")))
        stack.enter_context(quiet_logs(verbose))
        world = World(scenario, root)
        if scenario.typed:
            stack.enter_context(rename_crash_points(world))
        loop = VirtualTimeLoop(world.sim)

        def task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
                         ) -> asyncio.Task[Any]:
            task = asyncio.Task(coro, loop=loop, **kwargs)
            world.owners[task] = HOST.get()
            return task

        loop.set_task_factory(task_factory)
        try:
            loop.run_until_complete(world.main())
            if not world.checker.violations:
                world.checker.final()
        finally:
            with contextlib.suppress(BaseException):
                for task in asyncio.all_tasks(loop):
                    task.cancel()
                loop.run_until_complete(asyncio.sleep(0))
            close_nested(loop)
            loop.close()
        return world.checker
