"""Known-broken variants of icefloe, to prove the simulator finds what it claims to find.

Each mutant undoes one fix of issue #22 (or breaks one guarantee on purpose) by patching a
single function for the duration of a run. ``python -m testing.sim --mutant NAME --seeds
N`` must then report violations; ``tests/system/test_sim.py`` pins a seed per mutant. A mutant the
simulator cannot catch is a gap in the simulator, and ``docs/simulator.md`` says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


def _patch(target: Any, name: str, value: Any) -> contextlib.AbstractContextManager[None]:
    @contextlib.contextmanager
    def patched() -> Iterator[None]:
        original = getattr(target, name)
        setattr(target, name, value)
        try:
            yield
        finally:
            setattr(target, name, original)
    return patched()


@contextlib.contextmanager
def _both(first: contextlib.AbstractContextManager[None],
          second: contextlib.AbstractContextManager[None]) -> Iterator[None]:
    """Two patches for one run (a mutant that breaks both output paths)."""
    with first, second:
        yield


def _dedup_per_table() -> contextlib.AbstractContextManager[None]:
    """Case 3 undone: an id seen from any source counts as seen (one window per table)."""
    from collector.dedup import DedupWindow

    def seen(self: DedupWindow, source: str, event_id: str) -> bool:
        return any(event_id in ids for ids in self.seen.values())
    return _patch(DedupWindow, "_seen", seen)


def _dedup_from_now() -> contextlib.AbstractContextManager[None]:
    """The window measured from now, not from the oldest waiting event (seed 2's find)."""
    from collector.dedup import DedupWindow
    return _patch(DedupWindow, "edge_s", lambda self, now: now)


def _no_dedup() -> contextlib.AbstractContextManager[None]:
    """No deduplication at all: client retries must show up as duplicates."""
    from collector.dedup import DedupWindow
    return _patch(DedupWindow, "_keep", lambda self, ids, sources: None)


def _park_drops_rows() -> contextlib.AbstractContextManager[None]:
    """#36 bulkheads undone the careless way: a parked table's rows are acknowledged with
    the run but never staged (the other tables go on, the parked table loses them)."""
    from collector.embedded_path import EmbeddedPath

    original = EmbeddedPath.commit_routed

    def commit_routed(self: EmbeddedPath, target: Any, rows: Any, result: Any,
                      locations: Any, dead: Any) -> None:
        if self.state.bulkheads.is_parked(target.table):
            return
        original(self, target, rows, result, locations, dead)
    return _patch(EmbeddedPath, "commit_routed", commit_routed)


def _no_fence() -> contextlib.AbstractContextManager[None]:
    """Case 6 undone: a takeover does not fence the tables."""
    from collector.service import Collector
    return _patch(Collector, "fence_tables", lambda self: None)


def _no_staging_claim() -> contextlib.AbstractContextManager[object]:
    """Case 5 undone: staging states are neither stamped at takeover nor created (stamped)
    when a collector prepares a staged table, and a state a collector creates is relied on
    without confirming the manifest epoch first."""
    from collector.staging import StagingArea

    async def claim_existing(self: StagingArea, epoch: int) -> int:
        return 0

    original_init = StagingArea.__init__
    original_claim = StagingArea.claim

    def init(self: StagingArea, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **{**kwargs, "confirm": None})

    async def claim(self: StagingArea, table: str, epoch: int, *, create: bool = False
                    ) -> Any:
        return await original_claim(self, table, epoch, create=False)

    stack = contextlib.ExitStack()
    stack.enter_context(_patch(StagingArea, "claim_existing", claim_existing))
    stack.enter_context(_patch(StagingArea, "__init__", init))
    stack.enter_context(_patch(StagingArea, "claim", claim))
    return stack


def _standby_no_reread() -> contextlib.AbstractContextManager[object]:
    """#28's hot standby done wrong: while it waits, the standby reads every table (its
    committed sequences and the snapshots its dedup window is rebuilt from) every
    ``WARM_EVERY_S``, and after its epoch bump it keeps what it read instead of reading
    again, missing what the old active collector committed since."""
    import asyncio

    import collector.service as service
    from collector.dedup import DedupWindow
    from collector.runner import WARM_EVERY_S
    from collector.service import Collector

    early: dict[str, Any] = {}
    """The tables the collector now preparing read on standby (empty: none)."""
    original_acquire = Collector.acquire
    original_prepare = Collector._prepare_table
    original_state = service.committed_state
    original_rebuild = DedupWindow.rebuild

    def read_all(catalog: Any) -> dict[str, Any]:
        return {".".join(ident): catalog.load_table(ident)
                for namespace in catalog.list_namespaces()
                for ident in catalog.list_tables(namespace)}

    async def keep_reading(collector: Collector) -> None:
        while True:
            collector._early = read_all(collector.catalog)  # type: ignore[attr-defined]
            await collector.clock.sleep(WARM_EVERY_S)

    async def acquire(self: Collector, *, takeover: bool = False, stop: Any = None,
                      on_standby: Any = None, wait: bool = True) -> int:
        task: list[asyncio.Task[None]] = []

        def standby() -> None:
            if on_standby is not None:
                on_standby()
            task.append(asyncio.get_running_loop().create_task(keep_reading(self)))
        try:
            return await original_acquire(self, takeover=takeover, stop=stop,
                                          on_standby=standby, wait=wait)
        finally:
            for t in task:
                t.cancel()

    def prepare(self: Collector, name: str, stream: Any) -> None:
        early.update(getattr(self, "_early", {}))
        try:
            original_prepare(self, name, stream)
        finally:
            early.clear()

    def state(table: Any) -> Any:
        return original_state(early.get(".".join(table.name()), table))

    def rebuild(self: DedupWindow, table: Any, now_s: float | None = None,
                journal: Any = None) -> None:
        original_rebuild(self, early.get(self.name, table), now_s, journal)

    stack = contextlib.ExitStack()
    stack.enter_context(_patch(Collector, "acquire", acquire))
    stack.enter_context(_patch(Collector, "_prepare_table", prepare))
    stack.enter_context(_patch(service, "committed_state", state))
    stack.enter_context(_patch(DedupWindow, "rebuild", rebuild))
    return stack


def _cluster_unrouted() -> contextlib.AbstractContextManager[None]:
    """Case 2 undone: cluster runs are neither cut where routing changes nor handed to the
    embedded path when the cluster path cannot write them (the refusal loops forever)."""
    from collector.service import Collector
    return _patch(Collector, "_route_run", lambda self, entries: (entries, self.engine.run))


def _window_from_log() -> contextlib.AbstractContextManager[None]:
    """#36 undone: a restarted collector rebuilds its dedup windows from the tables'
    snapshot logs only (the journal beside each table is written but never read): a
    tombstone leaves no id there, copied rows count against ``dedup_max_ids``, and
    snapshots expired by another tool take their commits' ids with them."""
    from collector.dedup import DedupWindow

    original = DedupWindow.rebuild

    def rebuild(self: DedupWindow, table: Any, now_s: float | None = None,
                journal: Any = None) -> None:
        original(self, table, now_s)
    return _patch(DedupWindow, "rebuild", rebuild)


def _journal_no_tombstones() -> contextlib.AbstractContextManager[None]:
    """#36's tombstone case undone: the journal keeps the ids of the rows a commit writes,
    not those of its tombstones (a tombstone writes no row)."""
    import pyarrow.compute as pc

    import collector.commit as commit

    original = commit.id_rows

    def id_rows(rows: Any, source_column: str, default: str) -> Any:
        if "gone" in rows.column_names:
            rows = rows.filter(pc.invert(pc.fill_null(rows.column("gone"), False)))
        return original(rows, source_column, default)
    return _patch(commit, "id_rows", id_rows)


def _rename_apart() -> contextlib.AbstractContextManager[None]:
    """#39's rename by field number done in two steps: the columns are renamed in one
    commit and the field numbers they now hold are recorded only after the table evolved
    (``remember_numbers``). A collector that dies in between leaves a table whose columns
    have the new names and whose recorded numbers still name the old ones."""
    import pipeline.iceberg.field_numbers as numbers
    import pipeline.iceberg.tables as tables
    from pipeline.iceberg.errors import load_table_or_none

    def rename(catalog: Any, stream: Any, target: Any) -> None:
        kind = numbers._kind(stream)
        table = load_table_or_none(catalog, stream.table) if kind is not None else None
        if kind is None or table is None:
            return
        schema = table.schema()
        renames = kind.renames_from(numbers._stored(table))
        if renames:
            with table.update_schema() as update:
                for old, new in renames:
                    update.rename_column(numbers.iceberg_path(schema, old),
                                         new.rsplit(".", 1)[-1])
    return _patch(tables, "rename_by_numbers", rename)


def _numbers_after_create() -> contextlib.AbstractContextManager[None]:
    """#39's first find undone: a Protobuf table is created without its field numbers,
    which are recorded by a later commit (``remember_numbers``) only; a collector that dies
    in between leaves a table no recorded number names, and the next rename in the
    ``.proto`` is not seen as one."""
    import pipeline.iceberg.tables as tables
    return _patch(tables, "numbers_property", lambda stream: {})


def _staged_by_name() -> contextlib.AbstractContextManager[None]:
    """#39's second find undone: staged rows are imported under the names they were
    staged with, whatever a Protobuf rename changed since."""
    from collector.staged_path import StagedPath
    return _patch(StagedPath, "_renamer", lambda self, table: None)


def _kafka_ids_per_attempt() -> contextlib.AbstractContextManager[None]:
    """#40's idempotence undone: the Kafka listener does not derive event ids from the
    producer id, epoch and sequence, so every attempt of a batch gets fresh generated ids
    (what a non-idempotent producer gets): a retried batch that had landed lands again."""
    from ingestor.kafka.produce import ProduceHandler

    original = ProduceHandler._canonical

    def canonical(self: ProduceHandler, stream: Any, partition: int, records: Any,
                  caller: Any, origin: list[int] | None = None
                  ) -> tuple[Any, tuple[bytes, list[bytes]] | None]:
        return original(self, stream, partition, records, caller, origin)[0], None
    return _patch(ProduceHandler, "_canonical", canonical)


def _kafka_ids_without_epoch() -> contextlib.AbstractContextManager[None]:
    """#40's ids without the producer epoch: after an epoch bump the producer's sequences
    start again at 0, so its new records get the ids of the records it sent under the
    previous epoch, and the collector drops them as duplicates."""
    from ingestor.kafka.produce import ProduceHandler

    original = ProduceHandler._canonical

    def canonical(self: ProduceHandler, stream: Any, partition: int, records: Any,
                  caller: Any, origin: list[int] | None = None
                  ) -> tuple[Any, tuple[bytes, list[bytes]] | None]:
        got, ids = original(self, stream, partition, records, caller, origin)
        if ids is None:
            return got, None
        stem, suffixes = ids  # stem: b"kafka:<token>:<partition>:<producer id>:<epoch>:"
        parts = stem.split(b":")
        return got, (b":".join(parts[:4] + parts[5:]), suffixes)
    return _patch(ProduceHandler, "_canonical", canonical)


def _gc_ignores_retention() -> contextlib.AbstractContextManager[None]:
    """#42's retention undone in GC: the index is read (and compacted) but promises
    nothing, so a committed file goes once it is past the grace, inside retention."""
    from icefloe.retention import Index
    return _patch(Index, "live", lambda self, now, keep_s: {})


def _ack_unindexed() -> contextlib.AbstractContextManager[None]:
    """#42's index before the ack undone: runs are acknowledged without a retention
    segment, so dequeued entries are in neither the manifest nor the index."""
    from collector.service import Collector

    async def no_index(self: Collector, items: Any) -> None:
        return None
    return _patch(Collector, "index_run", no_index)


def _cdc_accepted_order() -> contextlib.AbstractContextManager[None]:
    """#42 undone: a change stream's table applied as a plain upsert (the accepted order
    decides, no stored position is compared): a key's older change sent after its newer
    one wins. On both output paths (the cluster path plans with no position column)."""
    import collector.cluster_path as cluster_path  # why: patched for this run only
    import pipeline.iceberg.table_commit as table_commit  # why: patched for this run only
    from pipeline.iceberg.upsert import CopyOnWrite

    def hook(stream: Any) -> CopyOnWrite | None:
        if not stream.primary_key:
            return None
        return CopyOnWrite(stream.primary_key, stream.tombstone_field)
    return _both(_patch(table_commit, "upsert_hook", hook),
                 _patch(cluster_path, "POSITION_COLUMN", None))


def _cdc_no_stale_check() -> contextlib.AbstractContextManager[None]:
    """#42's late changes undone: a key's changes are ordered by position within a
    commit, but a change older than the row's stored position still applies."""
    import pipeline.iceberg.upsert as upsert  # why: patched for this run only
    import pipeline.load.plans as plans  # why: the cluster path's, patched too

    def applicable(table: Any, rows: Any, latest: Any, *args: Any,
                   **kwargs: Any) -> tuple[Any, dict[str, int]]:
        return latest, {}
    return _both(_patch(upsert, "applicable_changes", applicable),
                 _patch(plans, "applicable_changes", applicable))


def _dynamic_fresh_window() -> contextlib.AbstractContextManager[None]:
    """#42 undone: a template's table is prepared as if this collector had just made it:
    its dedup window starts empty instead of being rebuilt from the table and its
    journal, so a replacement collector forgets what a table it did not make holds."""
    from collector.dedup import DedupWindow
    from collector.service import Collector

    original = Collector.prepare_dynamic

    def prepare(self: Collector, name: str, stream: Any) -> None:
        rebuild = DedupWindow.rebuild
        DedupWindow.rebuild = lambda window, table, *args, **kw: None  # type: ignore[method-assign]
        try:
            original(self, name, stream)
        finally:
            DedupWindow.rebuild = rebuild  # type: ignore[method-assign]
    return _patch(Collector, "prepare_dynamic", prepare)


def _ack_read_ahead() -> contextlib.AbstractContextManager[None]:
    """#43's overlap done wrong: the entries of the run read ahead are acknowledged as
    soon as they are read, before the commit that holds their sequence (a crash, a fence
    or a failed run in between loses them)."""
    from collector.overlap import Ahead, Overlap
    from collector.service import through_of

    original = Overlap._read_ahead

    async def read_ahead(self: Overlap) -> Ahead:
        ahead = await original(self)
        if ahead.read:
            self.acks.submit(through_of(ahead.read))
        return ahead
    return _patch(Overlap, "_read_ahead", read_ahead)


def _retention_local_clock() -> contextlib.AbstractContextManager[None]:
    """#42's retention index stamped on the collector host's own clock instead of the
    store's, which GC judges retention on: a collector whose clock is behind stamps its
    commits early, and their entries expire (and their files go) before retention is over."""
    from collector.service import Collector
    from icefloe.retention import record_run

    async def index_run(self: Collector, items: list[Any]) -> None:
        if self.config.collector.keep_batches_s <= 0:
            return
        await record_run(self.store, [(item.shard, item.entry) for item in items],
                         self.consumer.clock.time())
        self.hook("after_index")
    return _patch(Collector, "index_run", index_run)


MUTANTS: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] = {
    "dedup-per-table": _dedup_per_table,
    "dedup-from-now": _dedup_from_now,
    "no-dedup": _no_dedup,
    "no-fence": _no_fence,
    "no-staging-claim": _no_staging_claim,
    "cluster-unrouted": _cluster_unrouted,
    "standby-no-reread": _standby_no_reread,
    "window-from-log": _window_from_log,
    "journal-no-tombstones": _journal_no_tombstones,
    "park-drops-rows": _park_drops_rows,
    "rename-apart": _rename_apart,
    "numbers-after-create": _numbers_after_create,
    "staged-by-name": _staged_by_name,
    "kafka-ids-per-attempt": _kafka_ids_per_attempt,
    "kafka-ids-without-epoch": _kafka_ids_without_epoch,
    "gc-ignores-retention": _gc_ignores_retention,
    "ack-unindexed": _ack_unindexed,
    "cdc-accepted-order": _cdc_accepted_order,
    "cdc-no-stale-check": _cdc_no_stale_check,
    "dynamic-fresh-window": _dynamic_fresh_window,
    "ack-read-ahead": _ack_read_ahead,
    "retention-local-clock": _retention_local_clock,
}


def applied(name: str | None) -> contextlib.AbstractContextManager[object]:
    if name is None:
        return contextlib.nullcontext()
    if name not in MUTANTS:
        raise SystemExit(f"unknown mutant {name!r} (known: {', '.join(sorted(MUTANTS))})")
    return MUTANTS[name]()
