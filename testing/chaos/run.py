"""One chaos run: start the cluster, load it, break it on a seeded schedule, drain, verify.

The schedule is drawn from the seed before anything starts, so a seed names a run: the
same kills, takeovers and store-fault bursts at the same offsets (process timing itself is
not deterministic, but every fault is). See docs/chaos.md for what is checked.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from icefloe.config import load_config
from icefloe.manifest import load
from testing.chaos.cluster import Cluster, Proc, StoreTarget
from testing.chaos.kafka_load import run_kafka_client
from testing.chaos.load import ClientSpec, read_ledgers, run_client
from testing.chaos.takeovers import Change, summarise
from testing.chaos.verify import freshness, read_table, verify

BURSTS: dict[str, list[dict[str, Any]]] = {
    # 503 SlowDown and 500s on every operation: retries, backoff, failed runs
    "errors": [{"kind": "slowdown", "probability": 0.3, "times": None},
               {"kind": "fail", "probability": 0.15, "times": None}],
    # writes applied but their responses lost: ambiguous manifest CAS and batch PUTs
    "lost_responses": [{"kind": "lose_response", "probability": 0.25, "ops": ["put"],
                        "times": None}],
    # a slow store: flushes back up, buffers fill, clients must get 429/503, not hangs
    "slow": [{"kind": "delay", "probability": 1.0, "ops": ["put"], "times": None,
              "delay_s": [0.5, 1.5]}],
    # a stalled store: buffers fill up; clients must get 429/503 quickly, never hang
    "stall": [{"kind": "delay", "probability": 1.0, "ops": ["put"], "times": None,
               "delay_s": [3.0, 6.0]}],
    # on the wire (S3 runs only; the S3 server applies these to every client, Spark's
    # workers included): 503s and 500s, cut connections, writes whose answer never comes
    "network": [{"layer": "http", "kind": "slowdown", "probability": 0.15},
                {"layer": "http", "kind": "fail", "probability": 0.1},
                {"layer": "http", "kind": "reset", "probability": 0.1},
                {"layer": "http", "kind": "lose_response", "probability": 0.15,
                 "methods": ["PUT"]}],
}
LOCAL_ONLY_SKIP = {"network"}
"""Bursts that need the S3 server; a local-store run draws from the others."""


OVERTIME_S = 180.0
STANDBY_AFTER_S = 30.0
"""A new standby starts once the active collector has run, or this long after it became
active (its runs may fail for a while, in a store-fault burst)."""


@dataclass(frozen=True)
class Action:
    at: float
    kind: str  # kill_ingestor | kill_collector | second_collector | burst
    arg: str = ""
    length: float = 0.0


@dataclass
class Options:
    duration_s: float = 60.0
    seed: int = 1
    store: str = "local"  # local | s3
    ingestors: int = 2
    clients: int = 4
    rate: float = 0.0  # requests/s per client; 0 = as fast as acks come
    keep: bool = False
    workdir: str | None = None
    faults: bool = True  # False: the same run without any fault (the benchmark baseline)
    kafka: bool = False
    """Every third client is an idempotent Kafka producer (librdkafka) on the ingestors'
    Kafka listeners; the others alternate HTTP and gRPC."""
    standby: bool = True
    """A warm standby collector waits beside the active one (the default, as in ``icefloe
    up``): collector faults alternate between a kill -9 of the active one, which the
    standby replaces when the lease lapses, and a ``--takeover`` collector that fences it;
    whenever no standby waits, a new one starts. Off (``--no-standby``): a killed
    collector's replacement boots cold."""


@dataclass
class Timeline:
    actions: list[Action]
    done: list[dict[str, Any]] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)


def schedule(opts: Options) -> list[Action]:
    """The seeded fault schedule for a run of ``duration_s`` seconds of load."""
    if not opts.faults:
        return []
    rng = random.Random(opts.seed)
    d = opts.duration_s
    actions = [Action(rng.uniform(0.1 * d, 0.95 * d), "kill_ingestor",
                      str(rng.randrange(opts.ingestors)))
               for _ in range(max(2, int(d // 20)))]
    # collector events spaced so each new collector can boot Spark (~15-25 s) in between
    slots = max(2, int(d // 30))
    for i in range(slots):
        # without a standby a takeover first (the first collector is active once load
        # starts), then a kill; with a warm standby a kill first (the standby is warm once
        # load starts), then a takeover, so fencing is exercised either way
        kind = ("second_collector" if i % 2 else "kill_collector") if opts.standby else \
            ("kill_collector" if i % 2 else "second_collector")
        actions.append(Action(0.15 * d + i * (0.6 * d / slots) + rng.uniform(0, 3), kind))
    kinds = sorted(k for k in BURSTS if opts.store == "s3" or k not in LOCAL_ONLY_SKIP)
    rng.shuffle(kinds)  # every kind at least once, then at random
    for i in range(max(len(kinds), int(d // 12))):
        kind = kinds[i] if i < len(kinds) else rng.choice(kinds)
        actions.append(Action(rng.uniform(0.05 * d, 0.9 * d), "burst", kind,
                              rng.uniform(2.0, 5.0)))
    return sorted(actions, key=lambda a: a.at)


class Run:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.root = Path(opts.workdir or tempfile.mkdtemp(prefix="icefloe-chaos-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.moto: Any = None
        self.cluster: Cluster | None = None
        self.timeline = Timeline(schedule(opts))
        self.kills: Counter[str] = Counter()
        self.progress: list[str] = []
        self.bursts: dict[float, list[dict[str, Any]]] = {}  # start time -> rules in force
        self.takeover_s: list[float] = []  # kill of the active -> the standby's "ready"
        self.takeover_store_faults: list[bool] = []  # a store burst during that takeover
        self.changes: list[tuple[Change, Proc]] = []  # collector changes, timed at the end

    def say(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {text}"
        self.progress.append(line)
        print(line, flush=True)

    # -- set-up --------------------------------------------------------------------------------

    def _store(self) -> StoreTarget:
        if self.opts.store == "local":
            return StoreTarget((self.root / "store").as_uri())
        from testing.chaos.http_faults import start_moto

        self.moto = start_moto(str(self.root / "faults.json"))
        return StoreTarget(self.moto.bucket_url("chaos"), self.moto.endpoint)

    def execute(self) -> dict[str, Any]:
        started = time.time()
        cluster = self.cluster = Cluster(self.root, self._store(), self.opts.ingestors,
                                         kafka=self.opts.kafka)
        try:
            self.say(f"chaos run seed={self.opts.seed} store={self.opts.store} "
                     f"duration={self.opts.duration_s:g}s in {self.root}")
            for i in range(self.opts.ingestors):
                cluster.start_ingestor(i)
            first = cluster.start_collector()
            # faults start once a collector commits: killing one that never got to run
            # would test Spark's start-up, not the exactly-once protocol
            if first.wait_ready(240) is None:
                raise RuntimeError(f"the first collector did not become active; see "
                                   f"{first.log_path}")
            if self.opts.standby:
                self._start_standby(first)
            self.say("collector active; load starts")
            clients = self._start_clients()
            load_started = time.time()
            self._first_commit(first)
            self._faults(time.time())
            load_s = time.time() - load_started
            (self.root / "stop").touch()
            for proc in clients:
                proc.join(60)
            self.say("load stopped; draining")
            self._drain()
            return self._report(started, load_s)
        except BaseException:
            self.opts.keep = True  # a failed run keeps its files for the post-mortem
            self.say(f"run failed; its files stay in {self.root}")
            raise
        finally:
            cluster.close()
            if self.moto is not None:
                self.moto.stop()
            if not self.opts.keep:
                shutil.rmtree(self.root, ignore_errors=True)

    def _start_clients(self) -> list[BaseProcess]:
        assert self.cluster is not None
        context = multiprocessing.get_context("spawn")
        procs: list[BaseProcess] = []
        endpoints = {"http": self.cluster.http_urls(), "grpc": self.cluster.grpc_targets(),
                     "kafka": self.cluster.kafka_bootstraps()}
        for i in range(self.opts.clients):
            transport = self._transport(i)
            spec = ClientSpec(i, transport, tuple(endpoints[transport]), str(self._ledger(i)),
                              str(self.root / "stop"), self.opts.seed * 1000 + i,
                              self.opts.rate)
            target = run_kafka_client if transport == "kafka" else run_client
            proc = context.Process(target=target, args=(spec,), daemon=True)
            proc.start()
            procs.append(proc)
        return procs

    def _first_commit(self, first: Proc, timeout: float = 240) -> None:
        """Wait until the first collector has committed a run (or ``timeout``): faults
        start then, so a kill hits a collector that ran, never one whose first Spark job
        is still under way (that would time Spark's start-up, not a takeover)."""
        deadline = time.time() + timeout
        while not first.logged("run sequences") and time.time() < deadline:
            if not first.alive():
                raise RuntimeError(f"the first collector exited; see {first.log_path}")
            time.sleep(0.2)
        self.say(f"{first.role} committed its first run; faults start")

    def _transport(self, index: int) -> str:
        transports = ("http", "grpc", "kafka") if self.opts.kafka else ("http", "grpc")
        return transports[index % len(transports)]

    def _ledger(self, index: int) -> Path:
        return self.root / f"client-{index}.jsonl"

    # -- faults --------------------------------------------------------------------------------

    def _faults(self, t0: float) -> None:
        """Carry out the schedule. The load goes on past ``duration_s`` until every action
        has happened (collector actions wait for a collector to finish booting, which takes
        longer on a loaded machine) and a ``--takeover`` collector took over, at most
        ``OVERTIME_S`` more."""
        assert self.cluster is not None
        pending: list[tuple[float, str, Any]] = [(t0 + a.at, "act", a)
                                                 for a in self.timeline.actions]
        end = t0 + self.opts.duration_s
        while pending or time.time() < end or self._settling():
            now = time.time()
            if now > end + OVERTIME_S:
                self.say(f"{len(pending)} scheduled actions not done after the overtime")
                break
            if self.opts.standby:
                self._keep_standby()
            pending.sort(key=lambda p: p[0])
            if not pending or pending[0][0] > now:
                time.sleep(0.2)
                continue
            _, what, arg = pending.pop(0)
            self.cluster.reap()
            if what == "act":
                pending.extend(self._act(arg))
            elif what == "replace_standby":
                pending.extend(self._replace_standby(arg))
            elif what == "restart_ingestor":
                self.cluster.start_ingestor(int(arg))
                self.say(f"ingestor {arg} restarted")
            elif what == "end_burst":
                self.bursts.pop(arg, None)
                self._write_faults()
                self.timeline.windows.append((arg, time.time()))
                self.say("store faults off" if not self.bursts else "one burst ended")

    def _settling(self) -> bool:
        """A ``--takeover`` collector is still starting: the load goes on until it has
        fenced the active one (a takeover begun at the end would else happen in the
        drain, unloaded and untimed)."""
        return any(change.kind == "takeover" and proc.alive() and proc.ready is None
                   and proc.wait_ready(0.01) is None for change, proc in self.changes)

    def _act(self, action: Action) -> list[tuple[float, str, Any]]:
        """Do ``action`` now (or put it off a few seconds); what follows from it."""
        follow = self._do(action)
        if not (follow and follow[0][1] == "act"):  # put off: not done yet
            self.timeline.done.append({"at": round(action.at, 1), "kind": action.kind,
                                       "arg": action.arg})
        return follow

    def _do(self, action: Action) -> list[tuple[float, str, Any]]:
        assert self.cluster is not None
        cluster = self.cluster
        now = time.time()
        if action.kind == "kill_ingestor":
            proc = cluster.ingestors[int(action.arg)]
            if proc is None or not proc.alive():
                return []
            proc.kill()
            self.kills["ingestor"] += 1
            self.say(f"kill -9 ingestor {action.arg}")
            self.timeline.windows.append((now, now + 3))
            return [(now + random.Random(action.at).uniform(0.5, 2.0), "restart_ingestor",
                     action.arg)]
        if action.kind == "kill_collector" and self.opts.standby:
            return self._kill_active(action)
        if action.kind == "second_collector" and self.opts.standby:
            return self._fence_active(action)
        if action.kind in ("kill_collector", "second_collector"):
            active = self._settled()
            if active is None:  # a collector is booting or waiting: try again shortly
                later = Action(action.at + 5, action.kind, action.arg, action.length)
                return [(now + 5, "act", later)]
        if action.kind == "kill_collector":
            assert active is not None
            active.kill()
            self.kills["collector"] += 1
            self.say(f"kill -9 {active.role}")
            takeover = random.Random(action.at).random() < 0.5
            self._change("kill", now, cluster.start_collector(takeover=takeover))
            self.say("collector started" + (" with --takeover" if takeover
                                            else " (standby until the lease lapses)"))
            self.timeline.windows.append((now, now + 25))
            return []
        if action.kind == "second_collector":
            self._change("takeover", now, cluster.start_collector(takeover=True))
            self.say("second collector started with --takeover (fences the active one)")
            self.timeline.windows.append((now, now + 25))
            return []
        self.bursts[now] = BURSTS[action.arg]
        self._write_faults()
        self.say(f"store faults on: {action.arg} for {action.length:.1f}s")
        return [(now + action.length, "end_burst", now)]

    # -- the warm standby ----------------------------------------------------------------------

    def _start_standby(self, active: Proc, *, wait: bool = True, timeout: float = 240) -> None:
        """Start a standby beside ``active``; ``wait`` until it says it is warm (Spark,
        store and catalog checked). Kills wait for a warm standby either way, so each
        measures a warm takeover, not a boot; only the first start blocks the schedule."""
        assert self.cluster is not None
        standby = self.cluster.start_collector()
        if not wait:
            self.say(f"{standby.role} starts as the standby of {active.role}")
            return
        deadline = time.time() + timeout
        while not standby.logged("standby: warm"):
            if not standby.alive() or time.time() > deadline:
                raise RuntimeError(f"the standby collector did not get warm; see "
                                   f"{standby.log_path}")
            time.sleep(0.2)
        self.say(f"{standby.role} waits warm beside {active.role}")

    def _roles(self) -> tuple[list[Proc], list[Proc]]:
        """The live collectors that said ``ready`` (active, or fenced and about to exit),
        and the others (standbys, or still starting)."""
        assert self.cluster is not None
        live = self.cluster.live_collectors()
        active = [p for p in live if p.ready is not None or p.wait_ready(0.01)]
        return active, [p for p in live if p not in active]

    def _keep_standby(self) -> None:
        """A standby beside the active collector at all times, as a supervisor keeps one:
        after a kill (once the standby took over), or after a store stall let the
        standby take the lease on its own; and a collector at all: one that exits on its
        own (a start-up failed by a store burst) is replaced."""
        active, others = self._roles()
        if len(active) == 1 and not others:
            # once it has run: a JVM starting beside its first run would slow that run
            # down, and that run is what the takeover's freshness waits for
            ready_s = time.monotonic() - (active[0].ready_at or 0.0)
            if active[0].logged("run sequences") or ready_s > STANDBY_AFTER_S:
                self._start_standby(active[0], wait=False)
        elif not active and not others:  # e.g. a start-up that failed in a store burst
            assert self.cluster is not None
            proc = self.cluster.start_collector()
            self.say(f"no collector alive: {proc.role} started")

    def _steady(self) -> tuple[Proc, Proc] | None:
        """The active collector and its warm standby, if nothing else runs (no collector
        still starting) and the active one has finished a run since it took over:
        collector faults hit that state, so each takeover is a warm one and each collector
        change is its own. Why the run: a ``--takeover`` collector's cold start overruns
        the schedule on a loaded machine, and the next kill then came within a second of
        its takeover, before its first commit — two changes measured as one."""
        active, others = self._roles()
        warm = [p for p in others if p.logged("standby: warm")]
        if len(active) != 1 or not warm or len(warm) != len(others) \
                or not active[0].logged("run sequences"):
            return None
        return active[0], warm[0]

    def _change(self, kind: str, at: float, proc: Proc) -> None:
        """Note a collector change, timed from the logs and Iceberg at the end."""
        self.changes.append((Change(kind, at, proc.log_path, store_faults=bool(self.bursts)),
                             proc))

    def _kill_active(self, action: Action) -> list[tuple[float, str, Any]]:
        """kill -9 the active collector while a warm standby waits (else try again)."""
        now = time.time()
        steady = self._steady()
        if steady is None:
            later = Action(action.at + 5, action.kind, action.arg, action.length)
            return [(now + 5, "act", later)]
        active, waiting = steady
        active.kill()
        self.kills["collector"] += 1
        self.say(f"kill -9 {active.role} (active); {waiting.role} takes over when "
                 "the lease lapses")
        self.timeline.windows.append((now, now + 25))
        self._change("kill", now, waiting)
        return [(now + 0.5, "replace_standby", (waiting, now, bool(self.bursts)))]

    def _fence_active(self, action: Action) -> list[tuple[float, str, Any]]:
        """Start a ``--takeover`` collector beside the active one and its warm standby: it
        starts Spark, then fences the active one (exit 3); the standby keeps waiting."""
        assert self.cluster is not None
        now = time.time()
        if self._steady() is None:
            later = Action(action.at + 5, action.kind, action.arg, action.length)
            return [(now + 5, "act", later)]
        self._change("takeover", now, self.cluster.start_collector(takeover=True))
        self.say("second collector started with --takeover (fences the active one; the "
                 "standby keeps waiting)")
        self.timeline.windows.append((now, now + 25))
        return []

    def _replace_standby(self, arg: tuple[Proc, float, bool]
                         ) -> list[tuple[float, str, Any]]:
        """Time the standby's takeover (kill -> its ``ready`` line); :meth:`_keep_standby`
        starts the next standby. ``arg``: the standby, when the active one was killed,
        whether store faults were in force."""
        promoted, killed_at, store_faults = arg
        if not promoted.alive():
            return []  # it died too; the drain starts a collector if none is left
        if promoted.ready is None and promoted.wait_ready(0.01) is None:
            return [(time.time() + 0.5, "replace_standby", arg)]
        self.takeover_s.append(round(time.time() - killed_at, 2))
        self.takeover_store_faults.append(store_faults or bool(self.bursts))
        self.say(f"{promoted.role} active {self.takeover_s[-1]:.1f} s after the kill"
                 + (" (store faults in force)" if self.takeover_store_faults[-1] else ""))
        return []

    def _write_faults(self) -> None:
        """The union of the bursts in force (overlapping bursts add up)."""
        assert self.cluster is not None
        rules = [rule for burst in self.bursts.values() for rule in burst]
        staged = self.cluster.faults_file.with_suffix(".tmp")
        staged.write_text(json.dumps({"seed": self.opts.seed, "rules": rules}))
        staged.replace(self.cluster.faults_file)  # readers never see half a file

    def _settled(self) -> Proc | None:
        """The one live collector if it is active and no other is starting, else None:
        collector faults hit an active collector, not one still booting Spark."""
        assert self.cluster is not None
        live = self.cluster.live_collectors()
        if len(live) != 1:
            return None
        return live[0] if live[0].ready is not None or live[0].wait_ready(0.01) else None

    # -- the end -------------------------------------------------------------------------------

    def _drain(self) -> None:
        cluster = self.cluster
        assert cluster is not None
        cluster.faults_file.write_text("{}")
        for proc in cluster.ingestors:
            if proc is not None and proc.alive():
                code = proc.terminate(60)
                cluster.exits.append((proc.role, code))
                proc.reaped = True
        config = load_config(cluster.config, env={})
        deadline = time.time() + 300
        while time.time() < deadline:
            cluster.reap()
            if not cluster.live_collectors():
                cluster.start_collector(takeover=True)
                self.say("no collector alive: started one to drain")
            if _consumed(config):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("the collector did not drain the queue within 300 s")
        # standbys first: the active one releases its lease as it stops, which a standby
        # still waiting would take at once, only to be stopped in turn
        for proc in sorted(cluster.live_collectors(), key=lambda p: p.ready is not None):
            code = proc.terminate(90)
            cluster.exits.append((proc.role, code))
            proc.reaped = True
        cluster.reap()

    def _acked_by_transport(self) -> dict[str, int]:
        acked: Counter[str] = Counter()
        for i in range(self.opts.clients):
            acked[self._transport(i)] += len(read_ledgers([self._ledger(i)])[0])
        return dict(acked)

    def _report(self, started: float, load_s: float) -> dict[str, Any]:
        assert self.cluster is not None
        config = load_config(self.cluster.config, env={})
        acked, unacked, statuses, hangs, errors = read_ledgers(
            [self._ledger(i) for i in range(self.opts.clients)])
        tables = {name: read_table(config, f"chaos.{name.removeprefix('chaos_')}")
                  for name in self.cluster.streams}
        verdict = verify(config, tables, acked, unacked)
        verdict.checks["no request hung"] = hangs == 0
        verdict.checks["no valid request refused"] = not errors
        faults = Counter[str]()
        log = Path(f"{self.cluster.faults_file}.log")
        if log.exists():
            faults.update(line.split()[1] for line in log.read_text().splitlines() if line)
        exits = Counter(f"{role.split('-')[0]} exit {code}" for role, code in self.cluster.exits)
        return {
            "ok": verdict.ok, "seed": self.opts.seed, "store": self.opts.store,
            "duration_s": round(time.time() - started, 1), "load_s": round(load_s, 1),
            "ingestors": self.opts.ingestors, "clients": self.opts.clients,
            "kafka": self.opts.kafka, "acked_by_transport": self._acked_by_transport(),
            "events": {"acked": verdict.acked, "unacked": verdict.unacked,
                       "committed_rows": verdict.committed,
                       "unacked_but_stored": verdict.unacked_stored,
                       "lost": len(verdict.lost), "duplicates": len(verdict.duplicates),
                       "phantoms": len(verdict.phantoms)},
            "lost_ids": verdict.lost[:50], "duplicate_ids": dict(list(
                verdict.duplicates.items())[:50]), "phantom_ids": verdict.phantoms[:50],
            "throughput_events_per_s": round(verdict.acked / load_s, 1) if load_s else 0.0,
            "freshness_s": freshness(tables, self.timeline.windows),
            "faults_injected": dict(faults), "kills": dict(self.kills),
            "takeovers": sum(1 for a in self.timeline.done
                             if a["kind"] in ("second_collector", "kill_collector")),
            "standby": self.opts.standby, "standby_takeover_s": self.takeover_s,
            "standby_takeover_store_faults": self.takeover_store_faults,
            "collector_changes": self._timed_changes(config),
            "process_exits": dict(exits), "failed_starts": self.cluster.failed_starts,
            "client_statuses": dict(statuses),
            "hangs": hangs, "refused_valid_requests": errors[:10],
            "dead_letters": verdict.dead_letters, "manifest_entries_left":
                verdict.manifest_entries, "leaked_batch_files": verdict.leaked_batch_files,
            "checks": verdict.checks, "schedule": self.timeline.done,
        }


    def _timed_changes(self, config: Any) -> list[dict[str, Any]]:
        """Each collector change the harness caused, from the kill (or the takeover's
        epoch bump) to the first commit (:mod:`testing.chaos.takeovers`)."""
        assert self.cluster is not None
        for change, proc in self.changes:
            ready = proc.ready or proc.wait_ready(0.01)
            change.epoch = int(ready["epoch"]) if ready else None
        names = [f"chaos.{name.removeprefix('chaos_')}" for name in self.cluster.streams]
        return summarise([change for change, _ in self.changes], config, names)


def _consumed(config: Any) -> bool:
    """Every entry appended so far is acknowledged by the collector."""
    from icefloe.store import open_async_store, options_for

    async def check() -> bool:
        store = open_async_store(config.store.url, options_for(config.store.endpoint_url,
                                                              config.store.region),
                                 control_url=config.store.control_url)
        try:
            manifest = (await load(store, config.manifest.key)).manifest
        finally:
            await store.close()
        return manifest.consumer.acked_through >= manifest.next_sequence - 1

    return asyncio.run(check())
