"""A replaced collector commits nowhere: every icefloe table is fenced on takeover.

Real local store, real SQLite Iceberg catalog, two real collectors (decode in-process, no
Spark). The old collector is prepared and has read its run; the new one takes over; then
the old one's commit to each kind of table (routed, dead letters, created after the
takeover, model targets) is refused and nothing of it lands. Also: a table whose offset
was expired outside icefloe is refused loudly instead of replayed from the start.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from collector.service import Collector, Fenced
from icefloe.config import Config
from icefloe.errors import FencedError, OffsetLostError, TableFencedError
from icefloe.registry import RegistryStore, ops
from pipeline.columns import DEAD_LETTER_TABLE
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.commit import EPOCH_PROP, commit_rows, committed_state
from pipeline.load.run import LocalEngine
from pipeline.load.spec import run_spec
from pipeline.models.write import WriteFence, write_result
from tests.collector_support import (
    CLICKS,
    Gate,
    assert_exact,
    buy,
    click,
    collector_config,
    drain,
    open_store_of,
    publish_sync,
    read_table,
    start,
)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, dedup_window_s=0, dequeue_every=1)


def bad_click(i: int) -> tuple[str, str, int, bytes]:
    stream, event_id, received, _ = click(i)
    return stream, event_id, received, b"{not json"


async def close(*collectors: Collector) -> None:
    for collector in collectors:
        await collector.store.close()


async def test_a_run_read_before_the_takeover_lands_in_no_table(config: Config) -> None:
    """The old collector read its run, the new one took over but has committed nothing:
    the old run's commits are refused (before: they landed, as the new one had not yet
    written its epoch into the tables)."""
    publish_sync(config, [[click(i) for i in range(10)] + [buy(i) for i in range(3)]])
    gate = Gate()
    old = await start(config, gate)
    running = asyncio.create_task(old.run_once())
    assert await asyncio.to_thread(gate.entered.wait, 10)
    new = await start(config, LocalEngine())  # takes over while the old job runs
    gate.go.set()
    with pytest.raises(Fenced):
        await running
    catalog = open_catalog(config.catalog)
    for name in ("web.clicks", "shop.buys", DEAD_LETTER_TABLE):
        table = catalog.load_table(name)
        assert table.scan().to_arrow().num_rows == 0, name
        assert committed_state(table).epoch == new.epoch
    await drain(new)
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(10)})
    assert_exact(config, "shop.buys", {f"b{i}" for i in range(3)})
    await close(old, new)


async def test_every_table_kind_refuses_the_old_epoch_before_the_new_one_commits(
        config: Config) -> None:
    publish_sync(config, [[click(i) for i in range(5)] + [bad_click(99)]])
    old = await start(config, LocalEngine())
    output = LocalEngine().run(run_spec(config, [e.entry for e in await old.consumer.read()]))
    assert output.dead.num_rows == 1
    new = await start(config, LocalEngine())
    catalog = open_catalog(config.catalog)
    with pytest.raises(TableFencedError):
        commit_rows(catalog, "web.clicks", output.tables["clicks"], sequence=0,
                    epoch=old.epoch)
    with pytest.raises(TableFencedError):
        commit_rows(catalog, DEAD_LETTER_TABLE, output.dead, sequence=0, epoch=old.epoch)
    assert read_table(config, "web.clicks").num_rows == 0
    assert read_table(config, DEAD_LETTER_TABLE).num_rows == 0
    await close(old, new)


async def add_sink(config: Config, table: str) -> Any:
    store = open_store_of(config)
    try:
        spec = ops.SourceSpec(id="late", sinks=(ops.SinkSpec(name="late", table=table,
                                                             columns=CLICKS.columns),))
        registries = RegistryStore(store, config.admin.registry_key)
        await registries.update(lambda r: ops.create_source(r, spec))
        return await registries.read()
    finally:
        await store.close()


async def test_a_table_created_by_the_old_collector_after_the_takeover_is_refused(
        config: Config) -> None:
    """The new collector listed the catalog before the table existed: the old one creates
    it, confirms the manifest epoch before its first commit, and stops."""
    old = await start(config, LocalEngine())
    new = await start(config, LocalEngine())
    registry = await add_sink(config, "web.late")
    with pytest.raises(FencedError):
        await asyncio.to_thread(old.apply_registry, registry)
    assert "web.late" not in old.windows  # never prepared: nothing can commit to it
    assert open_catalog(config.catalog).load_table("web.late").current_snapshot() is None
    await asyncio.to_thread(new.apply_registry, registry)  # the new one carries on
    assert "web.late" in new.windows
    await close(old, new)


async def test_a_table_marked_before_the_takeover_is_fenced_even_if_not_routed(
        config: Config) -> None:
    """An admin created the sink's table (marked, empty) and the old collector prepared
    it; the new collector does not route it yet but fences it, so the old commit fails."""
    old = await start(config, LocalEngine())
    registry = await add_sink(config, "web.late")
    await asyncio.to_thread(old.apply_registry, registry)
    new = await start(config, LocalEngine())  # routes by the config: no web.late
    table = open_catalog(config.catalog).load_table("web.late")
    props = table.current_snapshot().summary.additional_properties
    assert props[EPOCH_PROP] == str(new.epoch)  # no sequence: nothing was ever committed
    empty = table.schema().as_arrow().empty_table()
    with pytest.raises(TableFencedError):
        commit_rows(open_catalog(config.catalog), "web.late", empty, sequence=3,
                    epoch=old.epoch)
    await close(old, new)


def result_rows() -> pa.Table:
    return pa.table({"day": ["2026-11-23"], "views": pa.array([3], pa.int64())})


def write_as(collector: Collector, target: str, expected: int | None) -> None:
    write_result(collector.catalog, target, result_rows(), mode="append", unique_key=(),
                 properties={"icefloe.model.name": "m"}, expected_snapshot_id=expected,
                 fence=WriteFence(collector.epoch or 0, collector.confirm_epoch_sync))


async def test_model_commits_carry_the_epoch_and_are_fenced(config: Config) -> None:
    old = await start(config, LocalEngine())
    await asyncio.to_thread(write_as, old, "mart.daily", None)
    catalog = open_catalog(config.catalog)
    first = catalog.load_table("mart.daily").current_snapshot()
    assert first.summary.additional_properties[EPOCH_PROP] == str(old.epoch)
    new = await start(config, LocalEngine())  # finds the model target by its mark
    # The old run read the target's state before the takeover: its commit is refused.
    with pytest.raises(TableFencedError):
        await asyncio.to_thread(write_as, old, "mart.daily", first.snapshot_id)
    fenced = catalog.load_table("mart.daily")
    assert fenced.scan().to_arrow().num_rows == 1
    # Even a run that reads the state after the fence cannot commit as the old epoch.
    with pytest.raises(TableFencedError):
        await asyncio.to_thread(write_as, old, "mart.daily",
                                fenced.current_snapshot().snapshot_id)
    # A target the old collector creates after the takeover: created, then refused.
    with pytest.raises(FencedError):
        await asyncio.to_thread(write_as, old, "mart.later", None)
    assert catalog.load_table("mart.later").current_snapshot() is None
    await asyncio.to_thread(write_as, new, "mart.daily",
                            catalog.load_table("mart.daily").current_snapshot().snapshot_id)
    assert catalog.load_table("mart.daily").scan().to_arrow().num_rows == 2
    await close(old, new)


async def test_an_offset_expired_outside_icefloe_is_refused_loudly(config: Config) -> None:
    publish_sync(config, [[click(i) for i in range(5)]])
    first = await start(config, LocalEngine())
    await drain(first)
    await close(first)
    catalog = open_catalog(config.catalog)
    table = catalog.load_table("web.clicks")
    rows = table.scan().to_arrow().slice(0, 1)
    table.append(rows.cast(table.schema().as_arrow()))  # another tool's commit, no offset
    table = catalog.load_table("web.clicks")
    older = [s.snapshot_id for s in table.snapshots()
             if s.snapshot_id != table.current_snapshot().snapshot_id]
    table.maintenance.expire_snapshots().by_ids(older).commit()  # ...and its expiry
    with pytest.raises(OffsetLostError, match=r"web\.clicks.*icefloe\.sequence"):
        await start(config, LocalEngine())
    with pytest.raises(OffsetLostError):
        committed_state(catalog.load_table("web.clicks"))
    # A table whose whole log has no icefloe commit is simply not icefloe's yet.
    plain = catalog.create_table("web.plain", table.schema())
    plain.append(rows.cast(table.schema().as_arrow()))
    assert committed_state(catalog.load_table("web.plain")).sequence == -1


async def test_a_collector_runs_on_one_thread_with_inline_hops(config: Config) -> None:
    """The seams a simulator uses: ``offload=inline`` and ``block_on=drive`` with a store
    that never leaves the thread run prepare, fence, job, commits and ack in order on the
    calling thread; the manual clock times the run."""
    from collector.hops import drive, inline
    from icefloe.clock import ManualClock
    from icefloe.store.adapters import InlineAsyncStore
    from icefloe.store.local import LocalStore

    threads: set[int] = set()

    class Recording(LocalEngine):
        def run(self, spec: Any) -> Any:
            threads.add(threading.get_ident())
            return super().run(spec)

    publish_sync(config, [[click(i) for i in range(5)]])
    root = Path(config.store.url.removeprefix("file://"))
    clock = ManualClock()

    def build() -> Collector:
        return Collector(config, InlineAsyncStore(LocalStore(root)),
                         open_catalog(config.catalog), Recording(), clock=clock,
                         offload=inline, block_on=drive)

    first = build()
    await first.acquire(takeover=True)
    first.prepare_tables()  # on the loop's thread: every store call is driven inline
    result = await first.run_once()
    assert result.rows == {"web.clicks": 5}
    assert result.seconds == 0.0  # the manual clock did not move
    assert threads == {threading.get_ident()}
    second = build()
    await second.acquire(takeover=True)
    second.prepare_tables()
    with pytest.raises(TableFencedError):
        commit_rows(first.catalog, "web.clicks", read_table(config, "web.clicks"),
                    sequence=9, epoch=first.epoch or 0)
    assert_exact(config, "web.clicks", {f"c{i}" for i in range(5)})


async def test_an_old_commit_racing_the_fence_lands_before_it_or_not_at_all(
        config: Config) -> None:
    """The old collector commits between the fence's read and its commit: the fence is
    rejected (retries are 0), re-reads, and lands on top carrying the old commit's sequence
    forward; the old collector's next commit is refused."""
    from pipeline.iceberg.fence import fence_table

    publish_sync(config, [[click(i) for i in range(5)]])
    old = await start(config, LocalEngine())
    output = LocalEngine().run(run_spec(config, [e.entry for e in await old.consumer.read()]))
    catalog = open_catalog(config.catalog)
    races = [lambda: commit_rows(catalog, "web.clicks", output.tables["clicks"], sequence=0,
                                 epoch=old.epoch or 0)]

    class Racing:
        """The catalog, with the old commit slipped in right after the fence's first load."""

        def load_table(self, identifier: str) -> Any:
            table = catalog.load_table(identifier)
            if races:
                races.pop()()
            return table

    new_epoch = (old.epoch or 0) + 1
    assert fence_table(Racing(), "web.clicks", new_epoch, offsets=True) is not None  # type: ignore[arg-type]
    table = catalog.load_table("web.clicks")
    state = committed_state(table)
    assert (state.sequence, state.epoch) == (0, new_epoch)
    assert table.scan().to_arrow().num_rows == 5  # landed before the fence, once
    with pytest.raises(TableFencedError):
        commit_rows(catalog, "web.clicks", output.tables["clicks"], sequence=1,
                    epoch=old.epoch or 0)
    await close(old)
