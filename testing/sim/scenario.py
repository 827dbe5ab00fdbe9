"""What one seed decides before the simulation starts: configuration, hosts and fault rates.

Why a separate, printable scenario: a failing seed must be explainable at a glance (``make
sim SEED=N`` prints it), and every knob the world reads comes from here, drawn from one
``random.Random(seed)`` in a fixed order, so one seed always builds the same world.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from testing.sim.store import FaultPlan


@dataclass
class Scenario:
    seed: int
    sources: int
    ingestors: int
    clients: int
    duration_s: float
    quiet_gap_s: float
    """A pause in traffic in the middle of the run (GC, expiry and staging ages pass)."""
    lease_s: float
    append_deadline_s: float
    flush_timeout_s: float
    dedup_window_s: float
    snapshot_max_age_s: float
    gc_interval_s: float
    maintenance_interval_s: float
    conditions_age_s: float | None
    """Import conditions (``max_age_s``) on one sink: exercises staging; None: no staging."""
    admin_changes: int
    collector_crashes: int
    forced_takeovers: int
    collector_stalls: int
    ingestor_crashes: int
    retry_after_success: float
    """Chance that a client resends a request that succeeded (its answer was lost)."""
    output: str
    """``embedded`` or ``cluster``: the collector's output path (Spark's stand-in gives
    either shape)."""
    snapshot_keep_last: int
    """Few: expiry then removes snapshots (and files) within a run, and maintenance, which
    reads every kept snapshot's manifests, stays cheap."""
    faults: FaultPlan
    collector_faults: FaultPlan
    collector_skew_s: list[float] = field(default_factory=list)
    evolve: bool = False
    """The seeded sinks evolve their tables from the data (#27), and every event carries
    an undeclared field (embedded output only: the cluster path refuses evolve)."""
    shards: int = 1
    """Manifest shards (#25). 2 only with embedded output: the cluster output path takes
    shards since, but widening the draw would change the fixed and mutant seeds."""
    family: str = "mixed"
    """Which story the chaos plan tells (drawn apart, see :data:`FAMILIES`): ``mixed``
    (every kind of chaos at random moments), or one aimed at a case random timing almost
    never lines up: ``late-staging`` (#22 case 5), ``outage`` (the dedup window across a
    collector outage), ``failover`` (#28: a warm standby takes over from the killed active
    collector)."""
    standby: bool = False
    """A warm standby collector waits on the lease from the start (also in half of the
    other seeds, drawn by the world)."""
    outage_s: float = 0.0
    """``outage``: how long no collector runs."""
    upsert: bool = False
    """``upsert-restart``: the seeded sinks keep the latest row per ``key`` (a
    ``primary_key``, and ``gone`` as the tombstone field); clients send versions of keys."""
    dedup_max_ids: int = 5_000_000
    """``collector.dedup_max_ids`` (the default, except in ``upsert-restart``)."""
    stale_resend: float = 0.0
    """``upsert-restart``: chance that a client, instead of a new version, resends an older
    acknowledged version of one of its keys (10 s or more after it was acknowledged, well
    inside the dedup window)."""
    expire_at: float | None = None
    """``external-expiry``: when (fraction of the traffic) another tool expires every
    snapshot of every table but the newest one with an offset (and those after it)."""
    break_at: float | None = None
    """``parked-table``: when (fraction of the traffic) one table's metadata pointer is
    broken (its commits fail: the collector parks it); ``restore_at``: when it is fixed."""
    restore_at: float | None = None
    typed: bool = False
    """``protobuf-rename``: source ``s0`` is a Protobuf stream (#39); clients send it
    messages of :mod:`testing.sim.typed`."""
    deploy_at: float | None = None
    """``protobuf-rename``: when (fraction of the traffic) the operator deploys the
    message's version 2 (two fields renamed, numbers kept, one added)."""
    kafka_producers: int = 0
    """``kafka-retry`` (#40): idempotent Kafka producers sending record batches through
    each ingestor's real Kafka produce path (:mod:`testing.sim.kafka`)."""
    kafka_lost: float = 0.0
    """``kafka-retry``: chance that a Produce answer is lost (the batch may be durable or
    not; the producer retries the identical batch on its next connection)."""
    cdc: bool = False
    """``cdc-reorder`` (#42): every sink is a change stream; connectors send a key's
    changes out of position order and re-deliver old ones (:mod:`testing.sim.changes`)."""
    cdc_keep: bool = False
    """``cdc-reorder``: the change streams keep deletes as rows (``deletes = "keep"``)."""
    kafka_bump: float = 0.0
    """``kafka-retry``: chance, after each unanswered attempt, that the producer gives the
    batch up and bumps its epoch (sequences from 0 under epoch + 1, as librdkafka does
    after a timeout): the batch's records may then be in the table once, never twice."""
    keep_batches_s: float = 0.0
    """``retention`` (#42): ``[collector] keep_batches_s``, longer than the GC grace so
    that retention, not the grace, decides when a committed file may go
    (:mod:`testing.sim.retention`)."""
    dynamic: bool = False
    """``dynamic-tables`` (#42): every seeded sink's table is a template over the event's
    ``tenant`` (:mod:`testing.sim.dynamic`), its tables made on first use."""
    kills_at_create: int = 0
    """``dynamic-tables``: how many times the active collector dies right after making
    (or first preparing) a template's table, before its run commits to it, and a
    collector takes over at once."""
    overlap: bool = False
    """#43: the collector overlaps its runs (``[collector] overlap``: the next run read
    ahead while this one commits, acks in the background). A knob of any family, drawn
    by a generator of its own whose salt keeps it off on every seed pinned before it."""

    @classmethod
    def draw(cls, seed: int) -> Scenario:
        rng = random.Random(seed)
        faulty = rng.random() < 0.75

        def plan(scale: float) -> FaultPlan:
            if not faulty:
                return FaultPlan.none()
            return FaultPlan(error_before=0.02 * scale, error_after=0.02 * scale,
                             lost_race=0.01 * scale, stall=0.005 * scale,
                             crash=0.0, latency_s=(0.002, 0.04))

        dedup = rng.choice([300.0, 600.0, 900.0])
        lease = rng.choice([2.0, 4.0, 6.0])
        scenario = cls(
            seed=seed,
            sources=rng.randint(2, 3),
            ingestors=rng.randint(1, 3),
            clients=rng.randint(2, 5),
            duration_s=rng.uniform(40, 120),
            quiet_gap_s=rng.choice([0.0, 0.0, 600.0, 1800.0, 4000.0]),
            lease_s=lease,
            append_deadline_s=rng.choice([30.0, 60.0, 120.0]),
            flush_timeout_s=rng.choice([10.0, 20.0]),
            dedup_window_s=dedup,
            snapshot_max_age_s=dedup * rng.choice([1.0, 2.0, 4.0]),
            gc_interval_s=rng.choice([5.0, 20.0, 60.0]),
            maintenance_interval_s=rng.choice([60.0, 300.0, 900.0]),
            conditions_age_s=rng.choice([None, None, 5.0, 20.0]),
            admin_changes=rng.randint(0, 6),
            collector_crashes=rng.randint(0, 2),
            forced_takeovers=rng.randint(0, 1),
            collector_stalls=rng.randint(0, 1),
            ingestor_crashes=rng.randint(0, 2),
            retry_after_success=rng.choice([0.0, 0.05, 0.2]),
            output=rng.choice(["embedded", "cluster"]),
            snapshot_keep_last=rng.choice([2, 5, 20]),
            faults=plan(1.0),
            collector_faults=plan(0.5),
            collector_skew_s=[rng.choice([0.0, 0.0, 120.0, -120.0, 7200.0])
                              for _ in range(8)],
        )
        # drawn last, so every earlier knob of a seed stays what it was before shards
        two = rng.random() < 0.6
        if two and scenario.output == "embedded":
            scenario.shards = 2
        scenario.evolve = rng.random() < 0.5 and scenario.output == "embedded"  # drawn last
        scenario.aim(random.Random(seed * 7 + 104723))
        scenario.aim_36(random.Random(seed * 7 + 38026))
        scenario.aim_39(random.Random(seed * 7 + TYPED_SALT))
        scenario.aim_40(random.Random(seed * 7 + KAFKA_SALT))
        scenario.aim_42(random.Random(seed * 7 + RETENTION_SALT))
        scenario.aim_42_cdc(random.Random(seed * 7 + CDC_SALT))
        scenario.aim_42_dynamic(random.Random(seed * 7 + DYNAMIC_SALT))
        scenario.overlap = random.Random(seed * 7 + OVERLAP_SALT).random() < OVERLAP_SHARE
        return scenario

    def aim_42_dynamic(self, rng: random.Random) -> None:
        """#42's table-template family, from a generator of its own among the ``mixed``
        seeds ``cdc-reorder`` left (its salt is chosen so that no seed pinned before it
        is drawn)."""
        if self.family != "mixed" or rng.random() >= LATER_FAMILIES["dynamic-tables"]:
            return
        # each event names its table by its tenant; the active collector dies right
        # after making a table, before its run commits, and another takes over at once
        # (the table exists, no sequence recorded); clients resend committed requests,
        # so a replacement that forgot what the table holds commits them twice
        self.family, self.dynamic = "dynamic-tables", True
        self.evolve, self.quiet_gap_s, self.admin_changes = False, 0.0, 0
        self.conditions_age_s = None
        self.kills_at_create = rng.randint(1, 2)
        self.retry_after_success = max(self.retry_after_success, 0.3)
        self.duration_s = min(max(self.duration_s, 50.0), 90.0)

    def aim_42(self, rng: random.Random) -> None:
        """#42's family, from a generator of its own among the ``mixed`` seeds #40 left,
        so no seed pinned before it changes (its salt is chosen so that none is drawn)."""
        if self.family != "mixed" or rng.random() >= LATER_FAMILIES["retention"]:
            return
        # committed files kept past the GC grace; GC runs often, through a long quiet
        # gap (files expire while others are kept) and a tail after the drain that
        # outlasts retention: GC must keep every indexed file inside retention and
        # delete every one (and its index entry) after it
        self.family = "retention"
        grace = self.append_deadline_s + 300.0
        self.keep_batches_s = grace + rng.choice([60.0, 300.0, 900.0])
        self.gc_interval_s = rng.choice([5.0, 20.0])
        self.quiet_gap_s = rng.choice([0.0, 1800.0])
        self.duration_s = min(self.duration_s, 90.0)

    def aim_42_cdc(self, rng: random.Random) -> None:
        """#42's change-stream family, from a generator of its own among the ``mixed``
        seeds ``retention`` left (its salt is chosen so that no seed pinned before it is
        drawn)."""
        if self.family != "mixed" or rng.random() >= LATER_FAMILIES["cdc-reorder"]:
            return
        # change streams: connectors send a key's changes newest first and re-deliver
        # acknowledged ones; collectors die, stall and are taken over as in `mixed`; one
        # manifest shard (a key's deletes must keep its order: docs/cdc.md)
        self.family, self.cdc = "cdc-reorder", True
        self.shards, self.evolve, self.quiet_gap_s = 1, False, 0.0
        self.clients, self.admin_changes, self.conditions_age_s = 2, 0, None
        self.collector_crashes = max(self.collector_crashes, rng.randint(1, 2))
        self.duration_s = min(max(self.duration_s, 60.0), 90.0)
        self.dedup_window_s = 30.0  # re-deliveries past it meet the stale check
        # drawn last: half the seeds keep deletes as rows (deletes = "keep"), where a
        # key's changes may also be reordered across a delete and re-delivered at any age
        self.cdc_keep = rng.random() < 0.5

    def aim_40(self, rng: random.Random) -> None:
        """#40's family, from a generator of its own among the ``mixed`` seeds #39 left,
        so no seed pinned before it changes (its salt is chosen so that none is drawn)."""
        if self.family != "mixed" or rng.random() >= LATER_FAMILIES["kafka-retry"]:
            return
        # idempotent Kafka producers beside the HTTP clients: answers lost at random,
        # retries of the identical batch on another ingestor or after an ingestor
        # restart, epochs bumped after a give-up; collectors die and are taken over as
        # in `mixed`
        self.family = "kafka-retry"
        self.kafka_producers = rng.randint(2, 3)
        self.kafka_lost = rng.choice([0.1, 0.2, 0.3])
        self.kafka_bump = rng.choice([0.1, 0.25])
        self.ingestors = max(self.ingestors, 2)
        self.ingestor_crashes = max(self.ingestor_crashes, rng.randint(1, 2))
        self.collector_crashes = max(self.collector_crashes, 1)
        self.clients = min(self.clients, 2)
        self.evolve, self.quiet_gap_s = False, 0.0
        self.duration_s = min(max(self.duration_s, 50.0), 90.0)

    def aim_39(self, rng: random.Random) -> None:
        """#39's family, from a generator of its own among the ``mixed`` seeds #36 left,
        so no seed pinned before it changes (its salt is chosen so that none is drawn)."""
        if self.family != "mixed" or rng.random() >= LATER_FAMILIES["protobuf-rename"]:
            return
        # source s0 carries Protobuf messages; mid-run the operator deploys a descriptor
        # that renames a top-level and a nested field (numbers kept) and adds one, while
        # producers not yet upgraded keep sending the old messages; collectors are killed,
        # taken over and stalled around the change as in `mixed`
        self.family, self.typed = "protobuf-rename", True
        self.deploy_at = rng.uniform(0.2, 0.7)
        self.evolve = False  # a typed stream's columns are its message's
        self.quiet_gap_s = 0.0
        self.collector_crashes = max(self.collector_crashes, rng.randint(1, 2))
        self.duration_s = max(self.duration_s, 60.0)

    def aim_36(self, rng: random.Random) -> None:
        """#36's families, drawn from a generator of their own among ``mixed`` seeds only,
        so every seed pinned before them (and every aimed family) keeps its story."""
        if self.family != "mixed":
            return
        draw = rng.random()
        if draw < 0.2:
            # keyed sinks; every table's window must survive restarts whatever its
            # copy-on-write commits copied, and a stale retried version (a tombstone
            # too) must never win over a newer one
            self.family, self.upsert = "upsert-restart", True
            self.output, self.shards, self.evolve = "embedded", 1, False
            self.clients, self.admin_changes, self.quiet_gap_s = 2, 0, 0.0
            self.conditions_age_s = None
            self.collector_crashes = rng.randint(2, 3)
            self.forced_takeovers, self.collector_stalls = 0, 0
            self.duration_s = min(max(self.duration_s, 60.0), 90.0)
            self.dedup_max_ids = 100  # holds every event of a table; not its copies
            self.stale_resend = 0.3
        elif draw < 0.4:
            # another tool expires snapshots, the collector restarts, and clients retry
            # requests committed tens of seconds before
            self.family = "external-expiry"
            self.expire_at = rng.uniform(0.4, 0.7)
            self.quiet_gap_s, self.conditions_age_s = 0.0, None
            self.forced_takeovers, self.collector_stalls, self.collector_crashes = 0, 0, 0
            self.duration_s = max(self.duration_s, 60.0)
        elif random.Random(self.seed * 7 + 36018).random() < 0.25:
            # (a generator of its own again: no seed pinned before this family changes)
            # one table's commits fail for a while (its metadata pointer names a missing
            # file): the collector parks it, stages its rows, restarts and takeovers
            # happen while it is parked, and once it is fixed its rows land exactly once
            # while every other table kept committing
            self.family = "parked-table"
            self.break_at = rng.uniform(0.15, 0.35)
            self.restore_at = rng.uniform(0.6, 0.85)
            self.quiet_gap_s, self.conditions_age_s = 0.0, None
            self.collector_crashes = rng.randint(1, 2)
            self.collector_stalls = 0
            self.duration_s = max(self.duration_s, 60.0)

    def aim(self, rng: random.Random) -> None:
        """Pick the seed's family (from its own generator, so a ``mixed`` seed keeps every
        knob it had before families existed) and set the knobs its story needs."""
        self.family = rng.choices(list(FAMILIES), weights=list(FAMILIES.values()))[0]
        if self.family == "late-staging":
            # a staged sink gets its first rows while the old collector's run is in
            # flight at a takeover; with no dedup window to hide them, rows the old
            # collector staged after the takeover and the new one staged again would be
            # committed twice (#22 case 5)
            self.output, self.shards = "embedded", 1
            self.conditions_age_s = rng.choice([5.0, 20.0])
            self.dedup_window_s = 0.0
            self.snapshot_max_age_s = 600.0
            self.forced_takeovers, self.collector_crashes, self.collector_stalls = 1, 0, 0
            self.retry_after_success = 0.0
            self.quiet_gap_s = 0.0
        elif self.family == "outage":
            # no collector for longer than the dedup window, while clients resend
            # requests whose originals were committed just before it
            self.dedup_window_s = 300.0
            self.snapshot_max_age_s = max(self.snapshot_max_age_s, 600.0)
            self.outage_s = rng.uniform(330.0, 600.0)
            self.retry_after_success = 0.5
            self.forced_takeovers, self.collector_crashes, self.collector_stalls = 0, 0, 0
            self.duration_s = max(self.duration_s, 60.0)
        elif self.family == "failover":
            # an active collector and a warm standby; every kill hits the active one and
            # the standby takes over when the lease lapses (#28)
            self.standby = True
            self.collector_crashes = rng.randint(1, 3)
            self.forced_takeovers, self.collector_stalls = 0, 0
            self.retry_after_success = max(self.retry_after_success, 0.2)

    def describe(self) -> str:
        keys = ("sources", "ingestors", "clients", "duration_s", "quiet_gap_s", "lease_s",
                "append_deadline_s", "dedup_window_s", "snapshot_max_age_s",
                "conditions_age_s", "admin_changes", "collector_crashes",
                "forced_takeovers", "collector_stalls", "ingestor_crashes",
                "retry_after_success", "output", "snapshot_keep_last", "shards", "evolve",
                "family", "standby", "outage_s", "upsert", "dedup_max_ids",
                "stale_resend", "expire_at", "break_at", "restore_at", "typed",
                "deploy_at", "kafka_producers", "kafka_lost", "kafka_bump",
                "keep_batches_s", "cdc", "cdc_keep", "dynamic", "kills_at_create", "overlap")
        parts = [f"{k}={getattr(self, k):g}" if isinstance(getattr(self, k), float)
                 else f"{k}={getattr(self, k)}" for k in keys]
        faults = "faults" if self.faults.error_before else "no faults"
        return f"seed {self.seed}: " + " ".join(parts) + f" ({faults})"


FAMILIES = {"mixed": 0.55, "late-staging": 0.15, "outage": 0.15, "failover": 0.15}
"""How often each family of stories is drawn (:meth:`Scenario.aim`)."""
LATER_FAMILIES = {"upsert-restart": 0.2, "external-expiry": 0.2, "parked-table": 0.15,
                  "protobuf-rename": 0.3, "kafka-retry": 0.3, "retention": 0.3,
                  "cdc-reorder": 0.3, "dynamic-tables": 0.3}
"""Later families: the share of ``mixed`` seeds each takes (#36's :meth:`Scenario.aim_36`,
``parked-table`` a quarter of those left, by a generator of its own; #39's
``protobuf-rename`` (:meth:`Scenario.aim_39`) 30 % of the ``mixed`` seeds #36 left;
#40's ``kafka-retry`` (:meth:`Scenario.aim_40`) 30 % of the ``mixed`` seeds #39 left)."""
TYPED_SALT = 42091
"""``protobuf-rename``'s generator salt (see :meth:`Scenario.aim_39`)."""
RETENTION_SALT = 42040
"""``retention``'s generator salt (see :meth:`Scenario.aim_42_cdc`): no seed pinned in
``tests/system/test_sim.py`` before the family is drawn (of 1-100: 48, 61, 63, 83)."""
CDC_SALT = 50014
"""``cdc-reorder``'s generator salt (see :meth:`Scenario.aim_42_cdc`): no seed pinned in
``tests/system/test_sim.py`` before the family is drawn, and none ``retention`` took."""
KAFKA_SALT = 40013
"""``kafka-retry``'s generator salt (see :meth:`Scenario.aim_40`): no seed pinned in
``tests/system/test_sim.py`` before the family is drawn, and 20 and 38 of 1-40 are."""
DYNAMIC_SALT = 60240
"""``dynamic-tables``' generator salt (see :meth:`Scenario.aim_42_dynamic`): no seed
pinned in ``tests/system/test_sim.py`` before the family is drawn (1-100 has no ``mixed``
seed left that is not pinned; of 1-300 it draws 116, 199, 216, 236, 275 and 284)."""
OVERLAP_SALT = 53809
"""#43's ``overlap`` knob's generator salt: no seed pinned in ``tests/system/test_sim.py``
before it has the knob on (of 1-40: 6, 16, 20, 22, 36)."""
OVERLAP_SHARE = 0.3
"""Share of seeds (of any family) whose collectors overlap their runs."""
