"""The admin API, served by uvicorn on a free port and called by real HTTP clients: auth,
CRUD round trips, tasks that create and evolve real Iceberg tables (SQLite catalog),
precise refusals, undelivered-data checks against the manifest, token rotation, the store
being down, the CLI, and a schemathesis run against the served ``/openapi.json``."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from icefloe.clock import SYSTEM, Clock, ManualClock
from icefloe.config import Column, Config, StreamConfig
from icefloe.errors import ConfigError, TransientStoreError
from icefloe.registry import RegistryStore
from icefloe.registry.model import Conditions
from icefloe.store import open_async_store
from icefloe.store.base import AsyncObjectStore
from icefloe.tokens import hash_token, parse_hash
from tests.admin_support import admin_server
from tests.collector_support import CLICKS, collector_config, publish_sync

ADMIN_TOKEN = "ifl_admin-test-token"
COLUMNS = [{"name": "user_id", "type": "string", "required": True},
           {"name": "n", "type": "long"}]


@dataclass
class Admin:
    url: str
    config: Config
    client: httpx.Client
    store_down: threading.Event

    def task(self, response: httpx.Response) -> dict[str, Any]:
        """Follow a 202 to the task's end."""
        assert response.status_code == 202, response.text
        assert response.headers["location"].startswith("/v1/tasks/")
        task = response.json()["task"]
        deadline = time.monotonic() + 60
        while task["state"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, task
            time.sleep(0.02)
            task = self.client.get(f"/v1/tasks/{task['id']}").json()["task"]
        return task


class FlakyStore(AsyncObjectStore):
    """The real local store, failing every call while ``down`` is set (a store outage at
    the object-store boundary)."""

    def __init__(self, inner: AsyncObjectStore, down: threading.Event) -> None:
        self.inner, self.down, self.url = inner, down, inner.url
        self.lose_answers = 0
        """Puts still to land whose answer is then lost (an ambiguous error)."""

    def _check(self, op: str, key: str) -> None:
        if self.down.is_set():
            raise TransientStoreError("connection refused", op=op, key=key, ambiguous=False,
                                      code="ConnectionRefused")

    async def get(self, key: str) -> Any:
        self._check("get", key)
        return await self.inner.get(key)

    async def put(self, key: str, data: bytes, **kw: Any) -> Any:
        self._check("put", key)
        done = await self.inner.put(key, data, **kw)
        if self.lose_answers:
            self.lose_answers -= 1
            raise TransientStoreError("connection reset after the write", op="put", key=key,
                                      ambiguous=True, code="ConnectionReset")
        return done

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str = "") -> Any:
        return await self.inner.list(prefix)

    async def head(self, key: str) -> Any:
        return await self.inner.head(key)

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[Admin]:
    down = threading.Event()
    yield from serving(tmp_path, lambda url: FlakyStore(open_async_store(url), down), down)


def serving(tmp_path: Path, make_store: Any, down: threading.Event,
            clock: Clock = SYSTEM) -> Iterator[Admin]:
    """The admin API on a free port in a background thread, over ``make_store(url)``."""

    base = collector_config(tmp_path, (CLICKS,))
    config = msgspec.structs.replace(base, admin=msgspec.structs.replace(
        base.admin, port=0, tokens=(hash_token(ADMIN_TOKEN, log2_n=10),)))
    with admin_server(config, open_store=lambda: make_store(config.store.url),
                      clock=clock) as url, httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
            timeout=30) as client:
        yield Admin(url, config, client, down)


def tables(config: Config) -> set[str]:
    from pipeline.iceberg.catalog import open_catalog

    catalog = open_catalog(config.catalog)
    return {".".join(t) for ns in catalog.list_namespaces() for t in catalog.list_tables(ns)}


def columns_of(config: Config, table: str) -> list[str]:
    from pipeline.iceberg.catalog import open_catalog

    return [f.name for f in open_catalog(config.catalog).load_table(table).schema().fields]


def test_should_demand_an_admin_token(admin: Admin) -> None:
    plain = httpx.get(f"{admin.url}/v1/sources")
    assert plain.status_code == 401
    assert plain.json()["error"] == "unauthenticated"
    wrong = httpx.get(f"{admin.url}/v1/sources", headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 403
    assert httpx.get(f"{admin.url}/healthz").status_code == 200
    assert httpx.get(f"{admin.url}/health").json() == {"status": "ok"}
    metrics = httpx.get(f"{admin.url}/metrics").text
    assert 'icefloe_admin_requests_total{operation="list_sources",status="401"} 1.0' in metrics
    assert 'operation="list_sources",status="403"' in metrics
    assert httpx.get(f"{admin.url}/openapi.json").json()["openapi"].startswith("3.1")


def test_should_keep_a_name_given_beside_an_id_as_the_description(admin: Admin) -> None:
    named = admin.client.post("/v1/sources", json={"id": "web", "name": "Web Clicks"})
    assert named.status_code == 201, named.text
    assert named.json()["source"]["description"] == "Web Clicks"  # never dropped silently
    own = admin.client.post("/v1/sources", json={"id": "shop", "name": "Shop",
                                                  "description": "orders"})
    assert own.json()["source"]["description"] == "orders"
    # the version written shows in the metric at once (not only after the next read)
    version = own.json()["version"]
    metrics = httpx.get(f"{admin.url}/metrics").text
    assert f"icefloe_admin_registry_version {float(version)}" in metrics


def test_should_seed_from_the_config_and_round_trip_sources(admin: Admin) -> None:
    listed = admin.client.get("/v1/sources").json()
    assert listed["version"] == 1
    [clicks] = listed["sources"]
    assert (clicks["id"], clicks["sinks"][0]["table"]) == ("clicks", "web.clicks")

    made = admin.client.post("/v1/sources", json={"id": "orders", "description": "shop"})
    assert made.status_code == 201, made.text
    assert made.headers["location"] == "/v1/sources/orders"
    assert made.json()["version"] == 2
    again = admin.client.post("/v1/sources", json={"id": "orders"})
    assert (again.status_code, again.json()["error"]) == (409, "exists")

    patched = admin.client.patch("/v1/sources/orders", json={"description": "the shop"})
    assert patched.json()["source"]["description"] == "the shop"
    assert admin.client.get("/v1/sources/orders").json()["source"]["description"] == "the shop"
    assert admin.client.get("/v1/sources/nope").status_code == 404
    gone = admin.client.delete("/v1/sources/orders")
    assert gone.status_code == 200, gone.text
    assert admin.client.get("/v1/sources/orders").status_code == 404

    assert admin.client.get("/v1/registry").json()["version"] == 4


def test_should_create_a_sink_and_its_table_through_a_task(admin: Admin) -> None:
    response = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "slow", "table": "mart.slow_clicks", "columns": COLUMNS,
        "conditions": {"max_age_s": 600, "max_bytes": 1000, "max_events": 50}})
    task = admin.task(response)
    assert task["state"] == "succeeded", task
    assert task["result"]["sink"]["conditions"] == {"max_age_s": 600, "max_bytes": 1000,
                                                    "max_events": 50}
    assert "mart.slow_clicks" in tables(admin.config)
    sinks = admin.client.get("/v1/sources/clicks/sinks").json()["sinks"]
    assert [s["name"] for s in sinks] == ["clicks", "slow"]

    # add a column: the table evolves first, then the registry changes
    evolve = admin.client.patch("/v1/sources/clicks/sinks/slow", json={
        "columns": [*COLUMNS, {"name": "score", "type": "long"}]})
    assert admin.task(evolve)["state"] == "succeeded"
    assert "score" in columns_of(admin.config, "mart.slow_clicks")
    # an incompatible type change fails in the task and leaves the registry as it was
    version = admin.client.get("/v1/registry").json()["version"]
    bad = admin.client.patch("/v1/sources/clicks/sinks/slow", json={
        "columns": [*COLUMNS, {"name": "score", "type": "string"}]})
    failed = admin.task(bad)
    assert failed["state"] == "failed"
    assert "score" in failed["error"]["message"]
    assert admin.client.get("/v1/registry").json()["version"] == version
    # a type the source's other sink declares differently is refused at once
    clash = admin.client.patch("/v1/sources/clicks/sinks/slow", json={
        "columns": [{"name": "user_id", "type": "long", "required": True}]})
    assert (clash.status_code, clash.json()["error"]) == (409, "column_conflict")

    cond = admin.client.patch("/v1/sources/clicks/sinks/slow",
                              json={"conditions": {"max_age_s": 5}})
    assert cond.status_code == 200, cond.text
    assert cond.json()["sink"]["conditions"]["max_age_s"] == 5


def test_a_sink_patch_changes_only_the_conditions_it_gives(admin: Admin) -> None:
    """``{"conditions": {"max_events": 5000}}`` used to decode into a whole Conditions,
    resetting ``max_age_s`` and ``max_bytes`` to their defaults; the conditions given are
    merged into the sink's, with the same checks and refusals."""
    path = "/v1/sources/clicks/sinks/clicks"

    def patch(conditions: Any) -> httpx.Response:
        return admin.client.patch(path, json={"conditions": conditions})

    full = patch({"max_age_s": 600, "max_bytes": 1000, "max_events": 50})
    assert full.status_code == 200, full.text
    one = patch({"max_events": 5000})
    assert one.status_code == 200, one.text
    assert one.json()["sink"]["conditions"] == {"max_age_s": 600, "max_bytes": 1000,
                                                "max_events": 5000}
    two = patch({"max_age_s": 30, "max_bytes": 2000})
    assert two.json()["sink"]["conditions"] == {"max_age_s": 30, "max_bytes": 2000,
                                                "max_events": 5000}
    version = two.json()["version"]
    assert patch({}).json()["version"] == version  # nothing given: no new version
    assert patch({"max_events": 5000}).json()["version"] == version
    for body, field in (({"max_events": 0}, "sink.conditions.max_events"),
                        ({"max_bytes": "x"}, "conditions.max_bytes"),
                        ({"max_evnts": 1}, "conditions")):
        refused = patch(body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["details"][0]["field"] == field, refused.text
    assert "max_evnts" in patch({"max_evnts": 1}).json()["message"]
    assert "0 is out of range (1 to 1e+07 events)" in patch({"max_events": 0}).json()[
        "message"]
    assert admin.client.get(path).json()["sink"]["conditions"] == {
        "max_age_s": 30, "max_bytes": 2000, "max_events": 5000}
    assert admin.client.get("/v1/registry").json()["version"] == version


def test_should_refuse_a_patch_that_changes_how_queued_events_are_computed(
        admin: Admin) -> None:
    """A ``from`` or ``header`` the collector computes from queued events cannot change
    (those events were accepted under the old mapping: they would silently get the new
    one's value); an expression changes by version, so a changed ``sql`` is accepted."""
    mapped = [*COLUMNS, {"name": "who", "type": "string", "from": "ip"},
              {"name": "u", "type": "string", "sql": "upper(user_id)"}]
    created = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "mapped", "table": "mart.mapped_clicks", "columns": mapped})
    assert admin.task(created)["state"] == "succeeded"
    version = admin.client.get("/v1/registry").json()["version"]
    for who in ({"from": "id"}, {"header": "X-Forwarded-For"}, {}, {"sql": "user_id"},
                {"from": "kafka_topic"}):
        changed = [*mapped[:2], {"name": "who", "type": "string", **who}, mapped[3]]
        refused = admin.client.patch("/v1/sources/clicks/sinks/mapped",
                                     json={"columns": changed})
        assert (refused.status_code, refused.json()["error"]) == (409, "mapping_fixed"), who
        assert "columns.who" in refused.json()["message"]
    assert admin.client.get("/v1/registry").json()["version"] == version
    lower = [*mapped[:3], {"name": "u", "type": "string", "sql": "lower(user_id)"}]
    patched = admin.client.patch("/v1/sources/clicks/sinks/mapped", json={"columns": lower})
    assert admin.task(patched)["state"] == "succeeded"
    sink = admin.client.get("/v1/sources/clicks/sinks/mapped").json()["sink"]
    assert sink["columns"][3]["sql"] == "lower(user_id)"


class GatedStore(FlakyStore):
    """Holds each PUT whose body contains a pattern until that pattern's gate opens (a
    slow registry write, at the object-store boundary): two admin tasks reach their
    registry change together, in the order the test opens the gates."""

    def __init__(self, inner: AsyncObjectStore, down: threading.Event,
                 gates: dict[bytes, threading.Event]) -> None:
        super().__init__(inner, down)
        self.gates = gates

    async def put(self, key: str, data: bytes, **kw: Any) -> Any:
        for pattern, gate in self.gates.items():
            while pattern in data and not gate.is_set():
                await asyncio.sleep(0.01)
        return await super().put(key, data, **kw)


@pytest.mark.parametrize("existing", [False, True], ids=["created", "existing"])
def test_a_create_sink_task_refused_at_its_registry_change_drops_the_table_it_made(
        tmp_path: Path, existing: bool) -> None:
    """Two sinks of one source race with different types for ``score``: both pass the
    check at POST, both tasks make their tables, the second's registry change is refused
    (``column_conflict``). Its table, which it created, must not stay in the catalog: every
    collector start would fence the orphan (#36). A table that existed before stays."""
    from pipeline.iceberg.catalog import open_catalog
    from pipeline.iceberg.tables import ensure_stream_table

    gates = {b"mart.a": threading.Event(), b"mart.b": threading.Event()}
    down = threading.Event()
    for admin in serving(tmp_path, lambda url: GatedStore(open_async_store(url), down, gates),
                         down):
        assert "mart.b" not in tables(admin.config)  # (creates the catalog's own tables
        # first: two first openers of one SQLite catalog race to create them)
        if existing:  # the table is there before the sink (made by hand, say)
            ensure_stream_table(open_catalog(admin.config.catalog), StreamConfig(
                name="b", table="mart.b", columns=(Column("score", "string"),)))
        score = [*COLUMNS[:1], {"name": "score", "type": "long"}]
        first = admin.client.post("/v1/sources/clicks/sinks", json={
            "name": "a", "table": "mart.a", "columns": score})
        second = admin.client.post("/v1/sources/clicks/sinks", json={
            "name": "b", "table": "mart.b",
            "columns": [*COLUMNS[:1], {"name": "score", "type": "string"}]})
        assert (first.status_code, second.status_code) == (202, 202), second.text
        deadline = time.monotonic() + 30
        while not {"mart.a", "mart.b"} <= tables(admin.config):  # both at their change
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gates[b"mart.a"].set()
        assert admin.task(first)["state"] == "succeeded"
        gates[b"mart.b"].set()
        failed = admin.task(second)
        assert (failed["state"], failed["error"]["error"]) == ("failed", "column_conflict")
        assert failed["error"].get("dropped_tables", []) == ([] if existing else ["mart.b"])
        assert ("mart.b" in tables(admin.config)) is existing
        assert "mart.a" in tables(admin.config)
        sinks = admin.client.get("/v1/sources/clicks/sinks").json()["sinks"]
        assert [s["name"] for s in sinks] == ["clicks", "a"]


def test_should_refuse_bad_sinks_with_the_field_and_reason(admin: Admin) -> None:
    def post(body: Any) -> httpx.Response:
        return admin.client.post("/v1/sources/clicks/sinks", json=body)

    bad_type = post({"name": "x", "table": "a.x", "columns": [{"name": "c", "type": "blob"}]})
    assert bad_type.status_code == 400
    assert bad_type.json()["details"][0]["field"] == "sink.columns[0].type"
    out_of_range = post({"name": "x", "table": "a.x", "columns": COLUMNS,
                         "conditions": {"max_age_s": 100_000}})
    assert out_of_range.json()["details"][0]["field"] == "sink.conditions.max_age_s"
    huge = post({"name": "x", "table": "a.x", "columns": COLUMNS,
                 "conditions": {"max_bytes": 10 ** 400}})
    assert huge.status_code == 400, huge.text
    assert huge.json()["details"][0]["field"] == "sink.conditions.max_bytes"
    long_text = admin.client.post("/v1/sources", json={"id": "x", "description": "d" * 1001})
    assert long_text.json()["details"][0]["field"] == "description"
    wrong_shape = post({"name": 3, "table": "a.x", "columns": COLUMNS})
    assert (wrong_shape.status_code, wrong_shape.json()["details"][0]["field"]) == (400, "name")
    owned = post({"name": "x", "table": "web.clicks", "columns": COLUMNS})
    assert (owned.status_code, owned.json()["error"]) == (409, "table_owned")
    malformed = admin.client.post("/v1/sources/clicks/sinks", content=b"{nope",
                                  headers={"content-type": "application/json"})
    assert (malformed.status_code, malformed.json()["error"]) == (400, "malformed")
    huge = admin.client.post("/v1/sources", content=b" " * (1024 * 1024 + 1))
    assert huge.status_code == 413
    many = admin.client.post("/v1/sources", json={"id": "wide", "sinks": [
        {"name": f"s{i}", "table": f"wide.t{i}", "columns": COLUMNS} for i in range(21)]})
    assert (many.status_code, many.json()["error"]) == (409, "too_many_sinks")
    assert "wide.t0" not in tables(admin.config)  # refused before any table was made


def test_should_disable_enable_and_delete_a_sink(admin: Admin) -> None:
    off = admin.client.post("/v1/sources/clicks/sinks/clicks:disable")
    assert off.status_code == 200, off.text
    assert off.json()["sink"]["enabled"] is False
    on = admin.client.post("/v1/sources/clicks/sinks/clicks:enable").json()
    assert on["sink"]["enabled"] is True
    assert [t["enabled"] for t in on["sink"]["toggles"]] == [False, True]
    assert admin.client.post("/v1/sources/clicks/sinks/nope:disable").status_code == 404
    assert admin.client.delete("/v1/sources/clicks/sinks/clicks").status_code == 200
    assert admin.client.get("/v1/sources/clicks/sinks").json()["sinks"] == []


def test_should_refuse_to_delete_a_source_with_undelivered_events(admin: Admin) -> None:
    publish_sync(admin.config, [[("clicks", "e1", int(time.time() * 1000),
                                  b'{"user_id":"u"}')]])
    refused = admin.client.delete("/v1/sources/clicks")
    assert (refused.status_code, refused.json()["error"]) == (409, "undelivered")
    assert "1 manifest entry" in refused.json()["message"]
    forced = admin.client.delete("/v1/sources/clicks", params={"force": "true"})
    assert forced.status_code == 200
    assert forced.json()["pending_entries"] == 1

    async def tomb() -> Any:
        store = open_async_store(admin.config.store.url)
        try:
            return (await RegistryStore(store).read()).sources[0]
        finally:
            await store.close()
    source = asyncio.run(tomb())
    # the pending events were accepted at version 1: still routed to the sink
    assert [s.name for s in source.routes(1)] == ["clicks"]
    assert source.routes(2) == []


def test_should_count_undelivered_events_of_every_manifest_shard(admin: Admin) -> None:
    """Only shard 1 holds the source's entry (an ingestor grew the store to two shards;
    the admin's own config says one): the deletion is still refused as undelivered."""
    from icefloe.manifest import BatchRef, ManifestConfig, ShardedProducer, grow_shards

    async def queue_on_shard_1() -> None:
        store = open_async_store(admin.config.store.url)
        try:
            config = ManifestConfig(key=admin.config.manifest.key, shards=2)
            await grow_shards(store, config.key, 2, backoff=config.conflict_backoff)
            producer = ShardedProducer(store, config, shard=1)
            await producer.append(BatchRef("batches/x.ifb", 1, 10, 1, ("clicks",),
                                           time.time(), registry_version=1))
            await producer.close()
        finally:
            await store.close()
    asyncio.run(queue_on_shard_1())
    refused = admin.client.delete("/v1/sources/clicks")
    assert (refused.status_code, refused.json()["error"]) == (409, "undelivered")
    assert "1 manifest entry" in refused.json()["message"]


def test_retry_parked_is_a_new_registry_version_that_changes_no_route(admin: Admin) -> None:
    """An operator who fixed a parked table outside icefloe asks every collector to retry
    now: the registry moves one version on (what collectors react to), nothing else."""
    before = admin.client.get("/v1/sources").json()
    reply = admin.client.post("/v1/parked:retry")
    assert reply.status_code == 200, reply.text
    assert reply.json()["version"] == before["version"] + 1
    after = admin.client.get("/v1/sources").json()
    assert after["version"] == before["version"] + 1
    assert after["sources"] == before["sources"]
    anonymous = httpx.post(admin.url + "/v1/parked:retry")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"] == "unauthenticated"


def test_should_rotate_write_tokens(admin: Admin) -> None:
    first = admin.client.post("/v1/sources/clicks/tokens")
    assert first.status_code == 201
    token = first.json()["token"]
    assert first.json()["tokens"] == 1
    second = admin.client.post("/v1/sources/clicks/tokens", params={"keep_previous": "1"})
    assert second.json()["tokens"] == 2
    third = admin.client.post("/v1/sources/clicks/tokens").json()
    assert third["tokens"] == 1

    async def hashes() -> tuple[str, ...]:
        store = open_async_store(admin.config.store.url)
        try:
            reg = await RegistryStore(store).read()
        finally:
            await store.close()
        source = reg.source("clicks")
        assert source is not None
        return source.tokens
    [only] = asyncio.run(hashes())
    assert parse_hash(only).verify(third["token"])
    assert not parse_hash(only).verify(token)  # the old token was cut off
    assert "scrypt" not in admin.client.get("/v1/sources/clicks").text


def test_should_answer_503_while_the_store_is_down(admin: Admin) -> None:
    admin.store_down.set()
    try:
        down = admin.client.post("/v1/sources", json={"id": "later"})
        assert down.status_code == 503
        assert down.headers["retry-after"] == "1"
        assert down.json()["error"] == "store_unavailable"
    finally:
        admin.store_down.clear()
    assert admin.client.post("/v1/sources", json={"id": "later"}).status_code == 201


def test_should_drive_the_api_from_the_command_line(admin: Admin, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from icefloe_app.cli import main

    def cli(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--url", admin.url])
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = cli("sources", "list")
    assert code == 2
    assert "ICEFLOE_ADMIN_TOKEN" in err
    monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", ADMIN_TOKEN)
    spec = tmp_path / "sink.toml"
    spec.write_text('name = "copy"\ntable = "web.copy"\n'
                    'columns = [{ name = "user_id", type = "string" }]\n')
    code, out, err = cli("sinks", "create", "clicks", "--file", str(spec))
    assert code == 0, err
    assert "created sink clicks/copy → web.copy" in out
    code, out, _ = cli("sinks", "update", "clicks", "copy", "--max-age-s", "120")
    assert code == 0
    code, out, _ = cli("sinks", "list", "clicks")
    assert "120 s" in out
    code, out, _ = cli("sinks", "disable", "clicks", "copy")
    assert "disabled sink clicks/copy" in out
    code, out, err = cli("sinks", "create", "clicks", "--file", str(spec))
    assert code == 1
    assert "409 exists" in err
    code, out, _ = cli("sources", "list", "--json")
    assert code == 0
    assert [s["id"] for s in msgspec.json.decode(out)["sources"]] == ["clicks"]
    code, out, _ = cli("sources", "rotate-token", "clicks")
    assert out.startswith("ifl_")
    before = admin.client.get("/v1/registry").json()["version"]
    code, out, _ = cli("sinks", "retry-parked")
    assert code == 0
    assert f"retry their parked tables at registry version {before + 1}" in out


def test_the_cli_sends_only_the_conditions_it_changes(
        admin: Admin, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``icefloe sinks update --max-age-s`` used to GET the conditions, merge them and PATCH
    all three: another operator's change landing in between was undone. It sends only the
    condition it changes (the API merges at write time), so both changes stay."""
    from icefloe_app.cli import main, sources_cmd

    monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", ADMIN_TOKEN)
    path = "/v1/sources/clicks/sinks/clicks"
    sent: list[tuple[str, str, Any]] = []
    real = sources_cmd.call

    def call(args: Any, method: str, where: str, body: Any = None, **kw: Any) -> Any:
        sent.append((method, where, body))
        if method == "PATCH":  # another operator's change lands meanwhile
            other = admin.client.patch(path, json={"conditions": {"max_events": 777}})
            assert other.status_code == 200, other.text
        return real(args, method, where, body, **kw)

    monkeypatch.setattr(sources_cmd, "call", call)
    code = main(["sinks", "update", "clicks", "clicks", "--max-age-s", "120",
                 "--url", admin.url])
    assert code == 0, capsys.readouterr().err
    assert sent == [("PATCH", path, {"conditions": {"max_age_s": 120.0}})]
    assert admin.client.get(path).json()["sink"]["conditions"] == {
        "max_age_s": 120, "max_bytes": 64 * 1024 * 1024, "max_events": 777}


def test_should_conform_to_its_openapi_document(admin: Admin) -> None:
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        response_schema_conformance,
        status_code_conformance,
    )

    schema = schemathesis.openapi.from_url(f"{admin.url}/openapi.json")
    failures: list[str] = []
    for operation in schema.get_all_operations():
        op = operation.ok()

        @settings(max_examples=15, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), database=None)
        @given(case=op.as_strategy())
        def check(case: Any) -> None:
            case.headers = {**(case.headers or {}), "authorization": f"Bearer {ADMIN_TOKEN}"}
            response = case.call(base_url=admin.url)
            case.validate_response(response, checks=(not_a_server_error,
                                                     status_code_conformance,
                                                     response_schema_conformance))
        try:
            check()
        except Exception as exc:
            failures.append(f"{op.method.upper()} {op.path}: {str(exc)[:400]}")
    assert not failures, "\n".join(failures)
    assert StreamConfig  # the seeded source survives whatever the fuzzer did


def test_should_refuse_to_start_without_an_admin_token(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    from icefloe_app.cli import main

    path = tmp_path / "icefloe.toml"
    path.write_text(f'[store]\nurl = "{(tmp_path / "store").as_uri()}"\n')
    assert main(["admin", "--config", str(path), "--port", "0"]) == 2
    assert "admin.tokens is empty; the admin API needs at least one token hash" in \
        capsys.readouterr().err
    path.write_text('[admin]\ntokens = ["plain"]\n')
    assert main(["admin", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "admin.tokens[0]: not a token hash" in err
    assert "plain" not in err.replace("admin.tokens[0]", "")


def test_should_say_in_streams_list_that_the_registry_defines_the_streams(
        admin: Admin, capsys: pytest.CaptureFixture[str]) -> None:
    from icefloe_app.cli import main

    config = Path(admin.config.source or "").with_name("cli.toml")
    config.write_text(f'[store]\nurl = "{admin.config.store.url}"\n')
    assert main(["streams", "list", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "the stream registry in the store (version 1) defines the streams now" in out


def test_should_succeed_when_a_create_landed_but_its_answer_was_lost(tmp_path: Path) -> None:
    """The registry PUT of a new sink is applied but its response lost: the retry finds
    the sink it made, so the task succeeds instead of reporting a conflict."""
    from icefloe.store.adapters import ThreadedAsyncStore
    from icefloe.store.faults import FaultRule, FaultyAsyncStore
    from icefloe.store.local import LocalStore
    from icefloe.store.retry import RetryingAsyncStore

    lost = FaultRule("lose_response", ops=frozenset({"put"}),
                     key_prefix="registry/registry.json", skip=1, times=1)  # not the seed

    def store(url: str) -> Any:
        root = Path(url.removeprefix("file://"))
        return RetryingAsyncStore(FaultyAsyncStore(ThreadedAsyncStore(LocalStore(root)),
                                                   [lost]))

    for admin in serving(tmp_path, store, threading.Event()):
        task = admin.task(admin.client.post("/v1/sources/clicks/sinks", json={
            "name": "copy", "table": "web.copy", "columns": COLUMNS}))
        assert lost.fired == 1
        assert task["state"] == "succeeded", task
        assert task["result"]["sink"]["table"] == "web.copy"
        assert admin.client.get("/v1/registry").json()["version"] == 2


def test_should_serve_the_admin_api_over_tls_and_refuse_plaintext_off_loopback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from icefloe_app.api.server import serve_admin
    from icefloe_app.cli import main
    from ingestor.tls import section_tls
    from tests.security_support import Authority

    authority = Authority.create(tmp_path, "admin")
    cert, key = authority.write("localhost", server=True, stem="admin")
    base = collector_config(tmp_path, (CLICKS,))
    config = msgspec.structs.replace(base, admin=msgspec.structs.replace(
        base.admin, port=0, tokens=(hash_token(ADMIN_TOKEN, log2_n=10),),
        tls_cert_file=str(cert), tls_key_file=str(key)))

    async def main_loop() -> None:
        stop = asyncio.Event()
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(serve_admin(config, stop=stop, on_ready=ready.set_result))
        info = await asyncio.wait_for(ready, 30)
        assert info.url.startswith("https://")
        trust = ssl.create_default_context(cafile=str(authority.ca_file))
        async with httpx.AsyncClient(verify=trust) as client:
            listed = await client.get(f"{info.url}/v1/sources",
                                      headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
            assert listed.status_code == 200
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get(f"http://127.0.0.1:{info.port}/healthz")
        monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", ADMIN_TOKEN)
        code = await asyncio.to_thread(main, ["sources", "list", "--url", info.url,
                                              "--cacert", str(authority.ca_file)])
        assert code == 0
        stop.set()
        assert await task == 0

    asyncio.run(main_loop())
    assert "clicks" in capsys.readouterr().out

    exposed = msgspec.structs.replace(config, admin=msgspec.structs.replace(
        config.admin, host="0.0.0.0", tls_cert_file=None, tls_key_file=None))
    with pytest.raises(ConfigError, match=r"admin\.plaintext: refusing to serve 0\.0\.0\.0"):
        section_tls(exposed, "admin", what="admin API", secrets="admin tokens")
    allowed = msgspec.structs.replace(exposed, admin=msgspec.structs.replace(
        exposed.admin, plaintext=True))
    assert section_tls(allowed, "admin", what="admin API", secrets="admin tokens") is None


def test_should_stamp_registry_changes_and_tasks_with_the_injected_clock(
        tmp_path: Path) -> None:
    """The admin API reads no clock of its own: what it writes (registry versions, delete
    tombstones, task times) carries the injected clock's time."""
    clock = ManualClock(start=1_900_000_000.0)

    async def read_registry(url: str) -> Any:
        store = open_async_store(url)
        try:
            return (await RegistryStore(store).load()).value
        finally:
            await store.close()

    for admin in serving(tmp_path, open_async_store, threading.Event(), clock):
        clock.advance(5)
        made = admin.client.post("/v1/sources", json={"id": "orders"})
        assert made.status_code == 201, made.text
        assert asyncio.run(read_registry(admin.config.store.url)).updated_at == 1_900_000_005
        clock.advance(5)
        assert admin.client.delete("/v1/sources/orders").status_code == 200
        registry = asyncio.run(read_registry(admin.config.store.url))
        assert registry.updated_at == 1_900_000_010
        [gone] = [s for s in registry.sources if s.id == "orders"]
        assert gone.deleted_at == 1_900_000_010


def test_should_throttle_an_address_that_keeps_sending_wrong_tokens(tmp_path: Path) -> None:
    """The failure budget refills with the injected clock, which stands still here: a
    loaded machine taking seconds over the burst must not refill it mid-test."""
    clock = ManualClock()
    for admin in serving(tmp_path, open_async_store, threading.Event(), clock):
        throttled_then_refilled(admin, clock)


def throttled_then_refilled(admin: Admin, clock: ManualClock) -> None:
    from icefloe_app.api.auth import FAILED_BURST, FAILED_PER_S

    assert admin.client.get("/v1/sources").status_code == 200  # the operator's token: proven
    codes = [httpx.get(f"{admin.url}/v1/sources",
                       headers={"authorization": f"Bearer wrong-{i}"}).status_code
             for i in range(FAILED_BURST + 3)]
    assert codes[:FAILED_BURST] == [403] * FAILED_BURST
    assert codes[FAILED_BURST:] == [429] * 3
    again = httpx.get(f"{admin.url}/v1/sources", headers={"authorization": "Bearer wrong-0"})
    assert again.status_code == 403  # a known wrong token costs nothing: still a plain 403
    assert admin.client.get("/v1/sources").status_code == 200  # and still works
    clock.advance(2 / FAILED_PER_S)  # two failures' worth of refill, no more
    codes = [httpx.get(f"{admin.url}/v1/sources",
                       headers={"authorization": f"Bearer later-{i}"}).status_code
             for i in range(3)]
    assert codes == [403, 403, 429]


def test_should_accept_fan_out_and_import_conditions_on_the_cluster_output_path(
        tmp_path: Path) -> None:
    """Both output paths deliver several sinks and import conditions (#28)."""
    from icefloe.registry import RegistryStore
    from icefloe.registry import ops as registry_ops
    from icefloe_app.api.app import AdminApi
    from icefloe_app.api.auth import AdminAuth
    from icefloe_app.api.tasks import Tasks

    async def go() -> None:
        store = open_async_store((tmp_path / "store").as_uri())
        api = AdminApi(RegistryStore(store), Tasks(lambda stream: None), AdminAuth(()),
                       pending=lambda source: asyncio.sleep(0, 0), cluster_output=True)
        one = registry_ops.SinkSpec(name="a", table="web.a", columns=CLICKS.columns)
        await api.check(lambda r: registry_ops.create_source(r, registry_ops.SourceSpec(
            id="s", sinks=(one,))), "s")  # one sink, default conditions: fine
        two = registry_ops.SourceSpec(id="s", sinks=(one, msgspec.structs.replace(
            one, name="b", table="web.b", conditions=Conditions(max_events=10))))
        after = await api.check(lambda r: registry_ops.create_source(r, two), "s")
        assert len(after.source("s").live_sinks()) == 2
        await store.close()
    asyncio.run(go())


def test_should_say_a_change_whose_answer_was_lost_may_be_written(tmp_path: Path) -> None:
    """The registry write lands and the store's answer is lost (an ambiguous error above
    the store's own retries): the 503 says the change may have been written, never
    "nothing was changed"; reading back shows it."""
    down = threading.Event()
    made: list[FlakyStore] = []

    def make(url: str) -> FlakyStore:
        made.append(FlakyStore(open_async_store(url), down))
        return made[-1]

    for admin in serving(tmp_path, make, down):
        admin.client.get("/v1/sources")  # seeded
        for store in made:
            store.lose_answers = 1
        lost = admin.client.post("/v1/sources", json={"id": "quiet", "description": "q"})
        assert lost.status_code == 503, lost.text  # never "nothing was changed": it was
        assert "may have been written" in lost.json()["message"]
        assert admin.client.get("/v1/sources/quiet").json()["source"]["description"] == "q"
        again = admin.client.post("/v1/sources", json={"id": "quiet", "description": "q"})
        assert (again.status_code, again.json()["error"]) == (409, "exists")


def test_should_recognize_its_own_create_after_a_retried_lost_answer(tmp_path: Path) -> None:
    """The store's own retry re-sends a conditional write whose first attempt landed: the
    compare-and-swap then finds the source there; a source without sinks recognizes its
    own write and answers 201 (it answered 409 ``exists`` to the request that made it)."""
    from icefloe.store.retry import RetryingAsyncStore, RetryPolicy

    down = threading.Event()
    made: list[FlakyStore] = []

    def make(url: str) -> RetryingAsyncStore:
        made.append(FlakyStore(open_async_store(url), down))
        return RetryingAsyncStore(made[-1], RetryPolicy(base_delay_s=0.01))  # type: ignore[arg-type]

    for admin in serving(tmp_path, make, down):
        admin.client.get("/v1/sources")  # seeded
        for store in made:
            store.lose_answers = 1
        created = admin.client.post("/v1/sources", json={"id": "quiet", "description": "q"})
        assert created.status_code == 201, created.text
        assert created.json()["source"]["description"] == "q"
