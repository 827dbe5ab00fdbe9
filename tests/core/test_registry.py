"""The stream registry: validation of every change, routing history by version, seeding,
drift reports, and compare-and-swap updates from two processes that lose nothing."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from icefloe.config import Column, StreamConfig
from icefloe.errors import ManifestCorruptError, RegistryError
from icefloe.registry import Conditions, Registry, RegistryStore, drift, ops
from icefloe.store import open_async_store

COLS = (Column("user_id", "string", required=True), Column("n", "long"))


def sink(name: str = "raw", table: str = "web.raw", **kw) -> ops.SinkSpec:
    return ops.SinkSpec(name=name, table=table, columns=kw.pop("columns", COLS), **kw)


def with_source(sinks: tuple[ops.SinkSpec, ...] = (), source: str = "clicks") -> Registry:
    return ops.create_source(Registry(), ops.SourceSpec(id=source, sinks=sinks))


def refused(status: int, code: str, fn, *args) -> RegistryError:
    with pytest.raises(RegistryError) as info:
        fn(*args)
    assert (info.value.status, info.value.code) == (status, code), str(info.value)
    return info.value


def test_should_create_a_source_with_sinks_at_the_next_version() -> None:
    reg = with_source((sink(), sink("agg", "mart.agg")))
    assert reg.version == 1
    source = reg.source("clicks")
    assert source is not None
    assert [s.name for s in source.routes(1)] == ["raw", "agg"]
    assert Registry.decode(reg.encode()) == reg
    refused(409, "exists", ops.create_source, reg, ops.SourceSpec(id="clicks"))


@pytest.mark.parametrize(("spec", "field"), [
    (sink(columns=(Column("x", "float128"),)), "sink.columns[0].type"),
    (sink(columns=(Column("_sequence", "long"),)), "sink.columns[0].name"),
    (sink(columns=(Column("x", "string", path="$..bad"),)), "sink.columns[0] (x)"),
    (sink(columns=(Column("x", "string", sql="lower(("),)), "sink.columns[0] (x)"),
    (sink(table="nodot"), "sink.table"),
    (sink(table="icefloe.dead_letters"), "sink.table"),
    (sink(name="bad name"), "sink.name"),
    (sink(conditions=Conditions(max_age_s=0.5)), "sink.conditions.max_age_s"),
    (sink(conditions=Conditions(max_age_s=86_401)), "sink.conditions.max_age_s"),
    (sink(conditions=Conditions(max_bytes=99)), "sink.conditions.max_bytes"),
    (sink(conditions=Conditions(max_bytes=500_000_001)), "sink.conditions.max_bytes"),
    (sink(conditions=Conditions(max_events=0)), "sink.conditions.max_events"),
    (sink(conditions=Conditions(max_events=10_000_001)), "sink.conditions.max_events"),
    (sink(unknown_fields="keep"), "sink.unknown_fields"),
    (sink(event_id_field="nope"), "sink.event_id_field"),
])
def test_should_refuse_a_bad_sink_naming_the_field(spec: ops.SinkSpec, field: str) -> None:
    error = refused(400, "invalid", ops.create_sink, with_source(), "clicks", spec)
    assert error.details[0]["field"] == field, error.details
    assert error.details[0]["reason"]


def test_should_accept_the_condition_bounds() -> None:
    low = Conditions(max_age_s=1, max_bytes=100, max_events=1)
    high = Conditions(max_age_s=86_400, max_bytes=500_000_000, max_events=10_000_000)
    reg = ops.create_sink(with_source(), "clicks", sink("low", "a.low", conditions=low))
    reg = ops.create_sink(reg, "clicks", sink("high", "a.high", conditions=high))
    assert reg.version == 3


def test_should_refuse_a_21st_sink_and_a_table_owned_elsewhere() -> None:
    reg = with_source(tuple(sink(f"s{i}", f"web.t{i}") for i in range(20)))
    error = refused(409, "too_many_sinks", ops.create_sink, reg, "clicks", sink("s20", "web.t20"))
    assert "at most 20" in str(error)
    reg = ops.create_source(reg, ops.SourceSpec(id="other"))
    error = refused(409, "table_owned", ops.create_sink, reg, "other", sink("x", "web.t3"))
    assert "sink 's3' of source 'clicks'" in str(error)
    refused(409, "exists", ops.create_sink, reg, "clicks", sink("s1", "web.new"))
    # a deleted sink frees its table and its slot
    reg = ops.delete_sink(reg, "clicks", "s3")
    reg = ops.create_sink(reg, "other", sink("x", "web.t3"))
    assert reg.owner_of("web.t3") == ("other", "x")


def test_should_route_each_version_to_the_sinks_live_and_enabled_then() -> None:
    reg = with_source((sink(),))                                    # v1
    reg = ops.create_sink(reg, "clicks", sink("late", "web.late"))  # v2
    reg = ops.set_sink_enabled(reg, "clicks", "raw", False)        # v3
    reg = ops.set_sink_enabled(reg, "clicks", "raw", True)         # v4
    reg = ops.delete_sink(reg, "clicks", "late")                   # v5
    source = next(s for s in reg.sources if s.id == "clicks")
    routes = {v: [s.name for s in source.routes(v)] for v in range(1, 7)}
    assert routes == {1: ["raw"], 2: ["raw", "late"], 3: ["late"], 4: ["raw", "late"],
                      5: ["raw"], 6: ["raw"]}
    # no change, no new version
    assert ops.set_sink_enabled(reg, "clicks", "raw", True) is reg


def test_should_keep_a_deleted_source_for_the_events_accepted_before() -> None:
    reg = with_source((sink(),))
    reg = ops.delete_source(reg, "clicks")
    assert reg.source("clicks") is None
    tomb = reg.sources[0]
    assert [s.name for s in tomb.routes(1)] == ["raw"]
    assert tomb.routes(2) == []
    assert tomb.tokens == ()
    refused(404, "not_found", ops.delete_source, reg, "clicks")
    reg = ops.create_source(reg, ops.SourceSpec(id="clicks"))  # the id can be reused
    assert reg.source("clicks") is not None


def test_should_refuse_changing_a_sinks_table_and_plain_tokens() -> None:
    reg = with_source((sink(),))
    refused(400, "invalid", ops.update_sink, reg, "clicks", "raw",
            ops.SinkPatch(table="web.other"))
    refused(404, "not_found", ops.update_sink, reg, "clicks", "nope", ops.SinkPatch())
    error = refused(400, "invalid", ops.update_source, reg, "clicks",
                    ops.SourcePatch(tokens=("plain-secret",)))
    assert "plain-secret" not in str(error)
    assert "icefloe token hash" in str(error)


def test_should_report_how_the_config_differs_after_seeding() -> None:
    streams = [StreamConfig("clicks", "web.raw", COLS), StreamConfig("views", "web.v", COLS)]
    reg = Registry()
    for spec in ops.seed_specs(streams):
        reg = ops.create_source(reg, spec)
    assert drift(reg, streams) == []
    reg = ops.delete_source(reg, "views")
    reg = ops.create_source(reg, ops.SourceSpec(id="extra"))
    changed = [StreamConfig("clicks", "web.raw", COLS[:1]), streams[1]]
    notes = drift(reg, changed)
    assert any("clicks" in n and "columns differ" in n for n in notes)
    assert any("'views' is in the config but not in the registry" in n for n in notes)
    assert any("'extra' exists in the registry only" in n for n in notes)


async def test_should_seed_once_and_refuse_a_corrupt_registry(tmp_path: Path) -> None:
    store = open_async_store((tmp_path / "store").as_uri())
    registry = RegistryStore(store)
    streams = [StreamConfig("clicks", "web.raw", COLS)]
    seeded = await registry.seed(streams, "icefloe.toml")
    assert (seeded.version, seeded.seeded_from) == (1, "icefloe.toml")
    assert seeded.sources[0].sinks[0].created_version == 0  # receives version-0 entries
    again = await registry.seed([*streams, StreamConfig("more", "web.more", COLS)], None)
    assert again == seeded  # the registry wins after the first seed
    await store.put(registry.key, b"{not json")
    with pytest.raises(ManifestCorruptError, match="registry cannot be read"):
        await registry.read()
    await store.close()


WRITER = textwrap.dedent("""
    import asyncio, sys
    from icefloe.registry import RegistryStore
    from icefloe.registry.ops import SourceSpec, create_source
    from icefloe.store import open_async_store

    async def main(url, prefix, count):
        store = open_async_store(url)
        registry = RegistryStore(store)
        for i in range(count):
            spec = SourceSpec(id=f"{prefix}{i}")
            await registry.update(lambda reg: create_source(reg, spec))
        print(registry.stats.conflicts)
        await store.close()

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
""")


def test_should_lose_no_change_when_two_processes_update_at_once(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    count = 25
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, prefix, str(count)],
                              stdout=subprocess.PIPE, text=True) for prefix in ("a", "b")]
    conflicts = [int(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)

    async def read() -> Registry:
        store = open_async_store(url)
        try:
            return await RegistryStore(store).read()
        finally:
            await store.close()
    reg = asyncio.run(read())
    assert reg.version == 2 * count
    assert sorted(s.id for s in reg.sources) == sorted(
        f"{p}{i}" for p in "ab" for i in range(count))
    assert sorted({s.created_version for s in reg.sources}) == list(range(1, 2 * count + 1))
    print("CAS conflicts:", conflicts)


def test_should_refuse_sinks_that_disagree_on_a_shared_column() -> None:
    reg = with_source((sink(),))
    clash = sink("other", "web.other", columns=(Column("n", "string"),))
    error = refused(409, "column_conflict", ops.create_sink, reg, "clicks", clash)
    assert "'raw' and 'other'" in str(error)
    refused(409, "column_conflict", ops.create_source, Registry(), ops.SourceSpec(
        id="x", sinks=(sink(), clash)))
    # the same column, stricter elsewhere: fine, and required in the union
    from icefloe.registry.streams import union_stream

    reg = ops.create_sink(reg, "clicks", sink("strict", "web.strict", columns=(
        Column("n", "long", required=True),)))
    source = reg.source("clicks")
    assert source is not None
    union = union_stream(source, source.live_sinks())
    assert [(c.name, c.required) for c in union.columns] == [("user_id", True), ("n", True)]


async def test_should_retry_a_registry_version_whose_apply_failed(tmp_path: Path) -> None:
    from icefloe.registry.watch import RegistryWatch

    store = open_async_store((tmp_path / "store").as_uri())
    applied: list[int] = []
    failures = [RuntimeError("catalog down")]

    def apply(registry: Registry) -> None:
        if failures:
            raise failures.pop()
        applied.append(registry.version)

    watch = RegistryWatch(store, "registry/registry.json", apply)
    await RegistryStore(store).update(lambda r: ops.create_source(r, ops.SourceSpec(id="a")))
    with pytest.raises(RuntimeError, match="catalog down"):
        await watch.check()
    assert watch.version == 0  # not applied: the next look tries again
    assert (await watch.check()) is not None
    assert applied == [1]
    assert await watch.check() is None  # nothing new
    await store.close()


def test_should_recognize_its_own_sink_after_a_lost_answer() -> None:
    spec = sink()
    reg = with_source((spec,))
    source = reg.source("clicks")
    assert source is not None
    assert ops.matches(source.live_sinks()[0], spec)
    assert not ops.matches(source.live_sinks()[0], sink(table="web.other"))


def test_should_keep_a_columns_type_for_the_life_of_a_source_id() -> None:
    reg = with_source((sink("a", "web.a", columns=(Column("x", "string"),)),))
    reg = ops.delete_sink(reg, "clicks", "a")
    clash = sink("b", "web.b", columns=(Column("x", "long"),))
    error = refused(409, "column_conflict", ops.create_sink, reg, "clicks", clash)
    assert "deleted sink" in str(error)
    reg = ops.delete_source(reg, "clicks")
    refused(409, "column_conflict", ops.create_source, reg, ops.SourceSpec(
        id="clicks", sinks=(clash,)))
    same = sink("b", "web.b", columns=(Column("x", "string"), Column("y", "long")))
    reg = ops.create_source(reg, ops.SourceSpec(id="clicks", sinks=(same,)))
    assert reg.source("clicks") is not None


def test_should_prune_only_tombstones_nothing_needs() -> None:
    reg = with_source((sink("a", "web.a"), sink("b", "web.b")))      # v1
    reg = ops.delete_sink(reg, "clicks", "a")                         # v2
    reg = ops.create_source(reg, ops.SourceSpec(id="gone", sinks=(sink("g", "web.g"),)))
    reg = ops.delete_source(reg, "gone")                              # v4
    deleted_at = time.time()

    def pruned(now: float, pending: dict[str, int] | None = None,
               staged: frozenset[str] = frozenset()) -> Registry:
        return ops.prune(reg, now=now, grace_s=3600, oldest_pending=pending or {},
                         staged_tables=staged)

    assert pruned(deleted_at + 10) is reg                   # within the grace period
    later = deleted_at + 3601
    assert pruned(later, {"clicks": 1}, frozenset({"web.g"})) is reg  # queued and staged
    kept = pruned(later, {"clicks": 2})   # the pending entry came after the deletion
    assert kept.version == reg.version + 1
    clicks = kept.source("clicks")
    assert clicks is not None
    assert [s.name for s in clicks.sinks] == ["b"]
    assert [s.id for s in kept.sources] == ["clicks"]       # the deleted source went too
    # what is left routes exactly as before for the versions still in use
    assert [s.name for s in clicks.routes(5)] == ["b"]


async def test_should_prune_from_what_the_store_says(tmp_path: Path) -> None:
    from icefloe_app.api.server import prune_tombstones
    from tests.collector_support import click, publish

    store = open_async_store((tmp_path / "store").as_uri())
    registry = RegistryStore(store)
    await registry.update(lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(sink("a", "web.a"),))))
    await publish(store, [[click(1)]], registry_version=1)   # queued, accepted at v1
    await registry.update(lambda r: ops.delete_source(r, "clicks"))
    kept = await prune_tombstones(store, registry, "manifest/queue", grace_s=0)
    assert kept.version == 2                                # the queued entry needs it
    assert [s.id for s in kept.sources] == ["clicks"]
    from icefloe.config.manifest import ManifestConfig
    from icefloe.manifest import ManifestConsumer

    consumer = ManifestConsumer(store, ManifestConfig(), holder="t")
    await consumer.initialize()
    await consumer.ack((await consumer.read(max_entries=10))[-1].sequence)
    gone = await prune_tombstones(store, registry, "manifest/queue", grace_s=0)
    assert gone.version == 3
    assert gone.sources == ()
    await store.close()


async def test_should_keep_a_tombstone_while_another_shard_holds_its_events(
        tmp_path: Path) -> None:
    """The pending entry is on manifest shard 1 only: the deleted source is kept."""
    import time

    from icefloe.manifest import BatchRef, ManifestConfig, ShardedProducer, grow_shards
    from icefloe_app.api.server import prune_tombstones

    store = open_async_store((tmp_path / "store").as_uri())
    registry = RegistryStore(store)
    await registry.update(lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(sink("a", "web.a"),))))
    config = ManifestConfig(shards=2)
    await grow_shards(store, config.key, 2, backoff=config.conflict_backoff)
    producer = ShardedProducer(store, config, shard=1)
    await producer.append(BatchRef("batches/x.ifb", 1, 10, 1, ("clicks",), time.time(),
                                   registry_version=1))
    await producer.close()
    await registry.update(lambda r: ops.delete_source(r, "clicks"))
    kept = await prune_tombstones(store, registry, config.key, grace_s=0)
    assert [s.id for s in kept.sources] == ["clicks"]  # shard 1's entry needs it
    await store.close()


def test_should_keep_a_table_templates_tombstone_while_one_of_its_tables_is_staged() -> None:
    """Staging is per concrete table (``tenants.events_acme``), the sink's table is the
    template: a deleted template sink with a staged table is kept past the grace period,
    and goes once nothing of it is staged."""
    template = ops.SinkSpec(name="t", table="tenants.events_{n}", columns=(
        Column("n", "long"),))
    reg = with_source((sink("b", "web.b"), template))
    reg = ops.delete_sink(reg, "clicks", "t")
    later = time.time() + 3601

    def kept(staged: set[str]) -> list[str]:
        after = ops.prune(reg, now=later, grace_s=3600, oldest_pending={},
                          staged_tables=frozenset(staged))
        clicks = after.source("clicks")
        assert clicks is not None
        return [s.name for s in clicks.sinks]

    assert kept({"tenants.events_7"}) == ["b", "t"]
    assert kept({"tenants.other_7", "web.events_7"}) == ["b"]
    assert kept(set()) == ["b"]
