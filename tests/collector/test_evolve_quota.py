"""Evolution quotas and the overflow column (issue #36 item 2): with
``unknown_fields = "evolve"`` on a shared stream, one client (write token) can no longer
fill the table and have every other client's events dead-lettered whole. Each client adds
at most its quota of columns per clock hour and in total (a ledger committed in the table's
properties with the columns, so a restarted collector keeps counting); an event whose new
fields find no room lands with its declared and evolved columns, those fields kept in the
``_overflow`` json column; ``redrive_overflow`` moves them into columns once the limit
moves. Real ingestor over HTTP with real tokens, real SQLite catalog, Spark embedded
path."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest
from collector_support import collector_config, drain, read_table, start
from ingest_support import http_serving, running

from icefloe.clock import ManualClock
from icefloe.config import Column, StreamConfig
from icefloe.errors import RegistryError
from icefloe.registry.model import Sink
from icefloe.registry.ops import check_sink
from icefloe.streams import EvolveQuota
from icefloe.streams.evolution import EvolveLimits
from icefloe.streams.evolve_quota import PROPERTY
from icefloe.tokens import hash_token
from pipeline.iceberg.catalog import open_catalog

TOKEN_A = "token-of-client-a"
TOKEN_B = "token-of-client-b"
HASHES = (hash_token(TOKEN_A, log2_n=10), hash_token(TOKEN_B, log2_n=10))
CLIENT_A, CLIENT_B = "pages/pages.tokens[0]", "pages/pages.tokens[1]"


def pages(**quota: int) -> StreamConfig:
    return StreamConfig(name="pages", table="web.pages", unknown_fields="evolve",
                        tokens=HASHES, evolve_quota=EvolveQuota(**quota) if quota else None,
                        columns=(Column("user_id", "string", required=True),
                                 Column("page", "string")))


async def send(config: Any, sent: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Each (token, events) as one authenticated request."""
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        for token, events in sent:
            ok = await client.post("/v1/streams/pages/events", json=events,
                                   headers={"Authorization": f"Bearer {token}"})
            assert ok.status_code == 202, ok.text


async def collect(config: Any, engine: Any, clock: ManualClock) -> None:
    collector = await start(config, engine)
    collector.clock = clock  # the quotas' hours are read on the injected clock
    try:
        await drain(collector)
    finally:
        await collector.store.close()


def table(config: Any) -> Any:
    return open_catalog(config.catalog).load_table("web.pages")


def rows(config: Any) -> dict[str, dict[str, Any]]:
    return {r["user_id"]: r for r in read_table(config, "web.pages").to_pylist()}


def dead(config: Any) -> list[dict[str, Any]]:
    try:
        return read_table(config, "icefloe.dead_letters").to_pylist()
    except Exception:  # no dead letter was ever committed: no table
        return []


def overflow(row: dict[str, Any]) -> Any:
    return None if row["_overflow"] is None else msgspec.json.decode(row["_overflow"])


@pytest.fixture
def engine(spark: Any) -> Any:
    from pipeline.load.run import SparkEngine

    return SparkEngine(spark, 2)


async def test_a_client_over_its_quota_cannot_stop_anothers_field_nor_lose_its_own_event(
        tmp_path, engine):
    config = collector_config(tmp_path, streams=(pages(token_columns_per_hour=2,
                                                       token_columns_total=3),))
    clock = ManualClock(1_800_000_000.0)
    await send(config, [
        (TOKEN_A, [{"user_id": "a1", "page": "/a", "x1": 1, "x2": 2, "x3": 3, "x4": 4}]),
        (TOKEN_B, [{"user_id": "b1", "page": "/b", "x3": 7}]),
    ])
    await collect(config, engine, clock)
    names = set(table(config).schema().column_names)
    assert {"x1", "x2", "_overflow"} <= names
    assert "x4" not in names
    # x3 was A's third column (over its hour); B carried it too and had room: B adds it
    assert "x3" in names
    got = rows(config)
    assert (got["a1"]["page"], got["a1"]["x1"], got["a1"]["x2"]) == ("/a", 1, 2)
    assert (got["a1"]["x3"], overflow(got["a1"])) == (3, {"x4": 4})  # x3 is B's column
    assert (got["b1"]["page"], got["b1"]["x3"]) == ("/b", 7)
    assert overflow(got["b1"]) is None
    assert dead(config) == []
    ledger = msgspec.json.decode(table(config).properties[PROPERTY])
    assert ledger["clients"] == {CLIENT_A: [2, 2], CLIENT_B: [1, 1]}

    # A restarted collector in the same hour reads the ledger from the table: A is still
    # out of room for this hour, B is not; the hour after, A has room for its last column
    # (its total is 3).
    await send(config, [(TOKEN_A, [{"user_id": "a2", "z1": 1}]),
                        (TOKEN_B, [{"user_id": "b2", "w1": 1}])])
    await collect(config, engine, clock)
    names = set(table(config).schema().column_names)
    assert "w1" in names
    assert "z1" not in names
    assert overflow(rows(config)["a2"]) == {"z1": 1}
    clock.advance(3600)
    await send(config, [(TOKEN_A, [{"user_id": "a3", "z2": 1, "z3": 2}])])
    await collect(config, engine, clock)
    names = set(table(config).schema().column_names)
    assert "z2" in names
    assert "z3" not in names  # token_columns_total = 3
    assert overflow(rows(config)["a3"]) == {"z3": 2}
    assert dead(config) == []


async def test_past_the_column_limit_declared_columns_land_and_redrive_moves_the_rest(
        tmp_path, engine):
    from collector.evolve import redrive_overflow

    # user_id, page and icefloe's _event_id, _received_at, _sequence, _shard: 6 columns
    config = collector_config(tmp_path, streams=(pages(),), evolve_max_columns=8)
    clock = ManualClock(1_800_000_000.0)
    await send(config, [(TOKEN_A, [{"user_id": "a1", "x1": 1, "x2": 2}])])
    await collect(config, engine, clock)  # A fills the table to its limit
    await send(config, [(TOKEN_B, [
        {"user_id": "b1", "page": "/b", "x1": 5, "y1": {"k": "v"}},
        {"user_id": "b2", "page": "/c", "y2": [1, 2]}])])
    await collect(config, engine, clock)
    got = rows(config)
    assert (got["b1"]["page"], got["b1"]["x1"]) == ("/b", 5)  # declared and evolved land
    assert overflow(got["b1"]) == {"y1": {"k": "v"}}
    assert (got["b2"]["page"], overflow(got["b2"])) == ("/c", {"y2": [1, 2]})
    assert dead(config) == []  # nothing of B's was dead-lettered

    stream = config.streams[0]
    catalog = open_catalog(config.catalog)
    same = redrive_overflow(catalog, "web.pages", stream, EvolveLimits(max_columns=8))
    assert (same.rows, same.moved, same.left, same.added) == (2, 0, 2, [])
    dry = redrive_overflow(catalog, "web.pages", stream, EvolveLimits(max_columns=20),
                           dry_run=True)
    assert (dry.moved, dry.added) == (2, ["y1", "y2"])
    assert "y1" not in table(config).schema().column_names
    before = len(table(config).snapshots())
    done = redrive_overflow(catalog, "web.pages", stream, EvolveLimits(max_columns=20))
    assert (done.rows, done.moved, done.left, sorted(done.added)) == (2, 2, 0, ["y1", "y2"])
    after = table(config).snapshots()  # one snapshot: no version shows the rows gone (#37)
    assert (len(after) - before, table(config).current_snapshot().summary.operation.value
            ) == (1, "overwrite")
    got = rows(config)
    assert len(got) == 3  # rewritten, not duplicated
    assert got["b1"]["y1"] == {"k": "v"}
    assert got["b2"]["y2"] == [1, 2]
    assert got["a1"]["x2"] == 2
    assert all(r["_overflow"] is None for r in got.values())
    again = redrive_overflow(catalog, "web.pages", stream, EvolveLimits(max_columns=20))
    assert again.rows == 0


async def test_the_ingestor_names_the_token_only_on_events_with_undeclared_fields(tmp_path):
    from ingestor.validate import CompiledStream, with_client

    compiled = CompiledStream(pages())
    payloads = compiled.from_json(b'[{"user_id": "u", "x": "\\"_icefloe_extra\\":\\""},'
                                  b'{"user_id": "v"}]').payloads
    first, second = (msgspec.json.decode(p) for p in with_client(payloads, "pages.tokens[1]"))
    assert first["_icefloe_client"] == "pages.tokens[1]"
    assert msgspec.json.decode(first["_icefloe_extra"]) == {"x": '"_icefloe_extra":"'}
    assert second == {"user_id": "v"}


def test_quota_keys_are_checked_where_sinks_are_set():
    good = Sink(name="pages", table="web.pages", columns=pages().columns,
                unknown_fields="evolve", evolve_quota=EvolveQuota(token_columns_total=0))
    check_sink("pages", good, "sink")
    assert good.stream("pages").evolve_quota == EvolveQuota(token_columns_total=0)
    bad = msgspec.structs.replace(good, evolve_quota=EvolveQuota(token_columns_per_hour=-1))
    with pytest.raises(RegistryError) as refused:
        check_sink("pages", bad, "sink")
    assert refused.value.status == 400
    assert "evolve_quota.token_columns_per_hour" in str(refused.value)
