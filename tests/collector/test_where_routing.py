"""Routing by content: one source fans out to tables by each sink's ``where``, with SQL's
NULL rule (a NULL predicate does not take the event); events no sink takes are counted and,
when the source says ``unrouted = "dead_letter"``, dead-lettered with the reason; a change
of ``where`` applies from its registry version on and a replay after a crash routes
exactly as the first attempt. Real local store, real SQLite catalog, in-process decode."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import msgspec
import pyarrow.compute as pc
import pytest

from icefloe.config import Column, Config
from icefloe.registry import Registry, ops
from tests.collector.test_registry_routing import collector_for
from tests.collector_support import (
    BASE_MS,
    CLICKS,
    Crash,
    assert_exact,
    collector_config,
    crash_at,
    drain,
    open_store_of,
    publish,
    read_table,
    start,
)
from tests.collector_support import change_registry as change

BIG = ops.SinkSpec(name="big", table="web.big", columns=CLICKS.columns, where="n >= 5")
SMALL = ops.SinkSpec(name="small", table="web.small",
                     columns=(Column("user_id", "string"), Column("n", "long")),
                     where="n < 3 AND user_id <> 'nobody'")


def event(i: int | None, prefix: str, key: int) -> tuple[str, str, int, bytes]:
    """A clicks event with ``n = i`` (left out when None: the column is NULL)."""
    body: dict[str, object] = {"user_id": f"u{key}", "url": f"/p/{key}"}
    if i is not None:
        body["n"] = i
    return ("clicks", f"{prefix}{key}", BASE_MS + key, msgspec.json.encode(body))


def ids(prefix: str, keys: Iterable[int]) -> set[str]:
    return {f"{prefix}{k}" for k in keys}


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return collector_config(tmp_path, (CLICKS,))


def unrouted_count(collector: object, source: str) -> float:
    metric = collector.metrics.unrouted.labels(source)  # type: ignore[attr-defined]
    return metric._value.get()


async def test_should_fan_out_by_content_and_dead_letter_what_no_sink_takes(
        config: Config) -> None:
    await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(BIG, SMALL), unrouted="dead_letter")))
    store = open_store_of(config)
    # keys 0..7 carry n = key; keys 8, 9 carry no n (NULL: neither predicate is true)
    await publish(store, [[event(k, "e", k) for k in range(8)] +
                          [event(None, "e", k) for k in (8, 9)]], registry_version=1)
    await store.close()
    collector = await collector_for(config)
    await drain(collector)
    assert_exact(config, "web.big", ids("e", [5, 6, 7]))
    assert_exact(config, "web.small", ids("e", [0, 1, 2]))
    assert unrouted_count(collector, "clicks") == 4
    dead = read_table(config, "icefloe.dead_letters")
    assert sorted(dead.column("event_id").to_pylist()) == sorted(ids("e", [3, 4, 8, 9]))
    assert set(dead.column("reason").to_pylist()) == {"unrouted"}
    raw = {msgspec.json.decode(r)["user_id"] for r in dead.column("raw").to_pylist()}
    assert raw == {"u3", "u4", "u8", "u9"}
    await collector.store.close()


async def test_should_count_but_drop_unrouted_events_by_default(config: Config) -> None:
    await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(BIG,))))
    store = open_store_of(config)
    await publish(store, [[event(k, "d", k) for k in range(7)]], registry_version=1)
    await store.close()
    collector = await collector_for(config)
    await drain(collector)
    assert_exact(config, "web.big", ids("d", [5, 6]))
    assert unrouted_count(collector, "clicks") == 5
    from pipeline.iceberg.catalog import open_catalog

    catalog = open_catalog(config.catalog)
    assert not catalog.table_exists("icefloe.dead_letters") or \
        read_table(config, "icefloe.dead_letters").num_rows == 0
    await collector.store.close()


async def test_should_apply_a_where_change_from_its_version_on_and_replay_exactly(
        config: Config) -> None:
    await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(BIG, msgspec.structs.replace(
            SMALL, where=None, name="all", table="web.all")))))
    store = open_store_of(config)
    await publish(store, [[event(k, "a", k) for k in range(8)]], registry_version=1)
    await change(config, lambda r: ops.update_sink(r, "clicks", "big",
                                                   ops.SinkPatch(where="n >= 2")))
    await publish(store, [[event(k, "b", k) for k in range(8)]], registry_version=2)
    await store.close()

    crashing = await start(config, _engine(), hook=crash_at("after_commit:web.big"))
    with pytest.raises(Crash):
        await drain(crashing)
    await crashing.store.close()
    restarted = await collector_for(config)  # the replay: same entries, same versions
    await drain(restarted)
    expected = ids("a", [5, 6, 7]) | ids("b", [2, 3, 4, 5, 6, 7])
    assert_exact(config, "web.big", expected)
    assert_exact(config, "web.all", ids("a", list(range(8))) | ids("b", list(range(8))))
    await restarted.store.close()


HUGE = 2 ** 62  # times 4 leaves bigint
TIMES = ops.SinkSpec(name="times", table="web.times", columns=CLICKS.columns,
                     where="n * 4 > 20")
SHARE = ops.SinkSpec(name="share", table="web.share", columns=CLICKS.columns,
                     where="100 / n > 30")
GUARDED = ops.SinkSpec(name="guarded", table="web.guarded", columns=CLICKS.columns,
                       where="n <> 0 AND 100 / n > 40")


def where_error_count(collector: object, source: str) -> float:
    metric = collector.metrics.where_errors.labels(source)  # type: ignore[attr-defined]
    return metric._value.get()


def overflowing(prefix: str) -> list[tuple[str, str, int, bytes]]:
    """n = 0..7 (0 divides by zero in SHARE), one n = 2**62 (overflows in TIMES) and one
    without n (NULL: no error, no sink)."""
    return [*(event(k, prefix, k) for k in range(8)), event(HUGE, prefix, 8),
            event(None, prefix, 9)]


async def test_should_dead_letter_an_event_whose_where_overflows_or_divides_by_zero(
        config: Config) -> None:
    """#36: Spark SQL's ANSI arithmetic. ``n * 4`` wrapped around (2**62 * 4 = 0) and
    ``100 / 0`` gave +infinity, so those events were routed by the wrong value; each is
    an error for that event: dead-lettered with reason ``where_error`` and a message
    naming the sink, its where and the error, counted, never unrouted. The other events
    route normally, and a guarded division (``n <> 0 AND ...``) raises nothing."""
    await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(TIMES, SHARE, GUARDED), unrouted="dead_letter")))
    store = open_store_of(config)
    await publish(store, [overflowing("o")], registry_version=1)
    await store.close()
    collector = await collector_for(config)
    await drain(collector)
    assert_exact(config, "web.times", ids("o", [6, 7]))  # 24, 28 > 20
    assert_exact(config, "web.share", ids("o", [1, 2, 3]))  # 100, 50, 33.3 > 30
    assert_exact(config, "web.guarded", ids("o", [1, 2]))  # n = 0 skipped, no error
    dead = read_table(config, "icefloe.dead_letters")
    reasons = {e: (r, m) for e, r, m in zip(dead.column("event_id").to_pylist(),
                                             dead.column("reason").to_pylist(),
                                             dead.column("message").to_pylist(), strict=True)}
    assert sorted(reasons) == sorted(ids("o", [0, 4, 5, 8, 9]))
    assert {e for e, (r, _) in reasons.items() if r == "unrouted"} == ids("o", [4, 5, 9])
    reason, message = reasons["o0"]
    assert reason == "where_error"
    assert "sink 'share'" in message
    assert "division by zero in '100 / n'" in message
    reason, message = reasons["o8"]
    assert reason == "where_error"
    assert "sink 'times'" in message
    assert "integer overflow in 'n * 4'" in message
    assert where_error_count(collector, "clicks") == 2
    assert unrouted_count(collector, "clicks") == 3
    dead_metric = collector.metrics.dead_letters.labels("where_error")._value.get()
    assert dead_metric == 2
    raw = msgspec.json.decode(dead.filter(pc.equal(
        dead.column("event_id"), "o8")).column("raw")[0].as_py())
    assert raw["n"] == HUGE  # the decoded event, for a redrive once the where is fixed
    await collector.store.close()


def _engine() -> object:
    from pipeline.load.run import LocalEngine

    return LocalEngine()


async def test_should_route_by_a_where_from_the_config_alone(tmp_path: Path) -> None:
    stream = msgspec.structs.replace(CLICKS, where="n >= 5", unrouted="dead_letter")
    config = collector_config(tmp_path, (stream,))
    store = open_store_of(config)
    await publish(store, [[event(k, "c", k) for k in range(7)]])
    await store.close()
    collector = await start(config, _engine())
    await drain(collector)
    assert_exact(config, "web.clicks", ids("c", [5, 6]))
    dead = read_table(config, "icefloe.dead_letters")
    assert sorted(dead.column("event_id").to_pylist()) == sorted(ids("c", range(5)))
    await collector.store.close()


async def test_should_route_events_ingested_over_http_and_grpc(tmp_path: Path) -> None:
    import grpc
    import httpx
    from ingest_support import grpc_serving, http_serving, running

    from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

    stream = msgspec.structs.replace(CLICKS, where="n >= 5 OR url LIKE '/keep/%'",
                                     unrouted="dead_letter")
    config = collector_config(tmp_path, (stream,))
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        sent = await client.post("/v1/streams/clicks/events", json=[
            {"user_id": "h1", "n": 7}, {"user_id": "h2", "n": 1},
            {"user_id": "h3", "url": "/keep/x"}, {"user_id": "h4"}])
        assert sent.status_code == 202, sent.text
    async with grpc_serving(config) as (_, served), \
            grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        request = ingest_pb2.PublishRequest(stream="clicks", events=[
            ingest_pb2.Event(json=msgspec.json.encode(body))
            for body in ({"user_id": "g1", "n": 9}, {"user_id": "g2", "n": 0})])
        assert (await ingest_pb2_grpc.IngestStub(channel).Publish(request)).accepted == 2
    collector = await start(config, _engine())
    await drain(collector)
    kept = read_table(config, "web.clicks").column("user_id").to_pylist()
    assert sorted(kept) == ["g1", "h1", "h3"]
    dead = read_table(config, "icefloe.dead_letters")
    users = sorted(msgspec.json.decode(r)["user_id"] for r in dead.column("raw").to_pylist())
    assert users == ["g2", "h2", "h4"]
    assert unrouted_count(collector, "clicks") == 3
    await collector.store.close()


def test_should_judge_each_entry_by_its_own_versions_where() -> None:
    """A sink created at version 2 with a ``where`` changed at version 3: entry 10 (v1)
    is not its own, entry 11 (v2) meets the first predicate, entry 12 (v3) the second."""
    import pyarrow as pa

    from collector.routing import Routes
    from icefloe.registry import Registry

    registry = ops.create_source(Registry(), ops.SourceSpec(id="clicks", sinks=(
        msgspec.structs.replace(SMALL, where=None, name="all", table="web.all"),)))
    registry = ops.create_sink(registry, "clicks", BIG)
    registry = ops.update_sink(registry, "clicks", "big", ops.SinkPatch(where="n < 2"))
    rows = pa.table({"user_id": ["a", "b", "c", "d", "e", "f"],
                     "n": pa.array([9, 1, 9, 1, 1, None], pa.int64()),
                     "_event_id": list("abcdef"),
                     "_received_at": pa.array([0] * 6, pa.timestamp("us", tz="UTC")),
                     "_sequence": pa.array([10, 10, 11, 11, 12, 12], pa.int64())})
    routed, unrouted = Routes(registry).route("clicks", rows, {10: 1, 11: 2, 12: 3})
    taken = {t.sink.name: part.column("_event_id").to_pylist() for t, part in routed}
    # v1: not big's; v2 (n >= 5): c, not d; v3 (n < 2): e, not f (NULL)
    assert taken == {"all": list("abcdef"), "big": ["c", "e"]}
    assert unrouted is None  # "all" takes everything


def _dropped_n(registry: Registry) -> Registry:
    """One sink PATCH removes ``n`` and the ``where`` that read it."""
    return ops.update_sink(registry, "clicks", "big", ops.SinkPatch(
        columns=tuple(c for c in CLICKS.columns if c.name != "n"), where=None))


async def test_should_dead_letter_what_an_old_where_judges_once_its_column_is_gone(
        config: Config) -> None:
    """A sink PATCH drops ``n`` and the ``where`` that read it. The entries queued before
    are judged by their own version's ``where`` (``n >= 5``), which no longer fits the
    sink's columns: each of their events is a ``where_error`` dead letter naming the
    column (it used to fail the run, and every retry, with ``unknown column 'n'``). The
    other sink still takes them; the entries accepted after the PATCH route normally."""
    every = ops.SinkSpec(name="all", table="web.all",
                         columns=(Column("user_id", "string"), Column("url", "string")))
    await change(config, lambda r: ops.create_source(r, ops.SourceSpec(
        id="clicks", sinks=(BIG, every), unrouted="dead_letter")))
    store = open_store_of(config)
    await publish(store, [[event(k, "a", k) for k in range(8)]], registry_version=1)
    after = await change(config, _dropped_n)
    assert after.version == 2
    await publish(store, [[event(k, "b", k) for k in range(4)]], registry_version=2)
    await store.close()

    collector = await collector_for(config)
    assert await drain(collector) >= 1  # the run completes: nothing raised
    assert_exact(config, "web.big", ids("b", range(4)))  # v2: no where, every event
    assert_exact(config, "web.all", ids("a", range(8)) | ids("b", range(4)))
    dead = read_table(config, "icefloe.dead_letters")
    assert sorted(dead.column("event_id").to_pylist()) == sorted(ids("a", range(8)))
    assert set(dead.column("reason").to_pylist()) == {"where_error"}
    [message] = set(dead.column("message").to_pylist())
    assert message == ("where 'n >= 5' of sink 'big' (table 'web.big'): reads column 'n', "
                       "which the sink no longer declares (the where of the registry "
                       "version this event was accepted under; the column was removed "
                       "from the sink since)")
    assert where_error_count(collector, "clicks") == 8
    assert unrouted_count(collector, "clicks") == 0
    assert collector.routes.version == 2
    await collector.store.close()


def test_should_judge_an_old_where_whose_column_is_gone_alike_on_both_paths() -> None:
    """The embedded path (:meth:`Routes.route_all`) and the cluster path's executors
    (:func:`pipeline.load.wheres.where_verdict` over :meth:`Routes.where_specs`, and the
    columns :func:`pipeline.where.referenced` hands them) give the same verdict and the
    same message, and neither raises."""
    import pyarrow as pa

    from collector.routing import Routes
    from collector.where import WHERE_ERROR
    from pipeline.load.wheres import where_verdict
    from pipeline.where import referenced

    registry = ops.create_source(Registry(), ops.SourceSpec(id="clicks", sinks=(BIG,)))
    registry = _dropped_n(registry)
    rows = pa.table({"user_id": ["a", "b", "c"], "url": ["/", "/", "/"],
                     "_event_id": list("abc"),
                     "_received_at": pa.array([0] * 3, pa.timestamp("us", tz="UTC")),
                     "_sequence": pa.array([10, 10, 11], pa.int64())})
    versions = {10: 1, 11: 2}
    routes = Routes(registry)
    routed, unrouted, failed = routes.route_all("clicks", rows, versions)
    assert [part.column("_event_id").to_pylist() for _, part in routed] == [["c"]]
    assert unrouted is None
    assert failed is not None
    assert failed.column("_event_id").to_pylist() == ["a", "b"]
    embedded = failed.column(WHERE_ERROR).to_pylist()
    assert "reads column 'n', which the sink no longer declares" in embedded[0]

    [spec] = routes.where_specs({"clicks": versions})
    assert referenced("n >= 5", spec.columns) == ()
    taken, errors = where_verdict(spec, rows)
    assert taken.to_pylist() == [False, False, True]
    assert errors.to_pylist() == [*embedded, None]
