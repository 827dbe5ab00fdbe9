"""The admin API checks a sink's ``where`` when the request arrives: 400 naming the field
and the problem, whichever output path the collector writes through; a good one is
stored, versioned, and settable through ``/settings``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest

from icefloe.errors import RegistryError
from icefloe.store import open_async_store
from tests.app.test_admin_api import COLUMNS, Admin, serving
from tests.collector_support import CLICKS


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Admin]:
    yield from serving(tmp_path, open_async_store, threading.Event())


def post(api: Admin, where: str) -> httpx.Response:
    return api.client.post("/v1/sources/clicks/sinks", json={
        "name": "x", "table": "web.x", "columns": COLUMNS, "where": where})


@pytest.mark.parametrize(("where", "problem"), [
    ("user_id = ", "does not parse"),
    ("colour = 'red'", "unknown column 'colour'"),
    ("java_method('java.lang.System', 'exit', 1) = 1", "function java_method is not allowed"),
    ("count(*) > 1", "aggregate"),
])
def test_should_answer_400_naming_the_where_and_the_problem(api: Admin, where: str,
                                                            problem: str) -> None:
    answer = post(api, where)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["details"][0]["field"] == "sink.where"
    assert problem in body["details"][0]["reason"]


def test_should_store_a_where_and_version_its_changes(api: Admin) -> None:
    assert api.task(post(api, "user_id = 'u1'"))["state"] == "succeeded"
    patched = api.client.patch("/v1/sources/clicks/sinks/x", json={"where": "user_id = 'u2'"})
    assert patched.status_code in (200, 202), patched.text
    bad = api.client.patch("/v1/sources/clicks/settings", json={"settings": [
        {"key": "unrouted", "value": "nowhere"}]})
    assert bad.status_code == 400
    assert bad.json()["details"][0]["field"] == "unrouted"
    mode = api.client.patch("/v1/sources/clicks/settings", json={"settings": [
        {"key": "unrouted", "value": "dead_letter"}]})
    assert mode.status_code in (200, 202), mode.text
    source = api.client.get("/v1/sources/clicks").json()
    source = source.get("source", source)
    sinks = api.client.get("/v1/sources/clicks/sinks").json()["sinks"]
    sink = next(s for s in sinks if s["name"] == "x")
    assert sink["where"] == "user_id = 'u2'"
    assert [(c["value"]) for c in sink["wheres"]] == ["user_id = 'u1'", "user_id = 'u2'"]
    assert source["unrouted"] == "dead_letter"


def test_should_accept_a_where_with_the_cluster_output_path(tmp_path: Path) -> None:
    """The cluster output path routes by content too (#28): a sink with a ``where`` is
    checked like any other and stored."""
    from icefloe.registry import RegistryStore, ops
    from icefloe_app.api.app import AdminApi
    from icefloe_app.api.auth import AdminAuth
    from icefloe_app.api.tasks import Tasks

    async def go() -> None:
        store = open_async_store((tmp_path / "store").as_uri())
        api = AdminApi(RegistryStore(store), Tasks(lambda stream: None), AdminAuth(()),
                       pending=lambda source: asyncio.sleep(0, 0), cluster_output=True)
        routed = ops.SinkSpec(name="a", table="web.a", columns=CLICKS.columns,
                              where="n > 1")
        after = await api.check(lambda r: ops.create_source(r, ops.SourceSpec(
            id="s", sinks=(routed,), unrouted="dead_letter")), "s")
        source = after.source("s")
        assert source is not None
        assert [s.where for s in source.live_sinks()] == ["n > 1"]
        with pytest.raises(RegistryError) as info:  # a bad one is still refused, with 400
            await api.check(lambda r: ops.create_source(r, ops.SourceSpec(
                id="t", sinks=(msgspec.structs.replace(routed, where="n >"),))), "t")
        assert info.value.status == 400
        await store.close()
    asyncio.run(go())


@pytest.mark.parametrize(("where", "problem"), [
    ("(" * 60 + "n > 1" + ")" * 60, "nests deeper than 32 levels"),
    ("abs(" * 60 + "n" + ")" * 60 + " > 1", "nests deeper than 32 levels"),
    ("NOT " * 2000 + "n > 1", "nests deeper than 32 levels"),
    ("n IN (" + ", ".join(str(i) for i in range(1001)) + ")",
     "an IN list holds 1001 values; a where allows at most 1000"),
    ("n IN (" + ", ".join(str(i) for i in range(50_000)) + ")",
     "a where is at most 16384"),
])
def test_should_refuse_a_where_beyond_its_documented_limits_with_400(
        api: Admin, where: str, problem: str) -> None:
    """#36: a predicate nested ~60 levels answered 500 (RecursionError), a 50,000-item IN
    list was parsed for about a second on the event loop: each is refused, by its limit."""
    answer = post(api, where)
    assert answer.status_code == 400, answer.text
    detail = answer.json()["details"][0]
    assert detail["field"] == "sink.where"
    assert problem in detail["reason"]


def test_should_accept_a_where_at_its_limits(api: Admin) -> None:
    deep = "(" * 29 + "n > 1" + ")" * 29  # AND, 29 parentheses, >, n: 32 levels
    listed = "n IN (" + ", ".join(str(i) for i in range(1000)) + ")"
    assert api.task(post(api, f"{deep} AND {listed}"))["state"] == "succeeded"


def test_should_check_a_where_off_the_event_loop(tmp_path: Path) -> None:
    """The admin API validates a change in a worker thread: a slow check never holds the
    loop that serves every other request (timing-free: the thread is observed)."""
    from icefloe.registry import Registry, RegistryStore
    from icefloe_app.api.app import AdminApi
    from icefloe_app.api.auth import AdminAuth
    from icefloe_app.api.tasks import Tasks

    async def go() -> None:
        store = open_async_store((tmp_path / "store").as_uri())
        api = AdminApi(RegistryStore(store), Tasks(lambda stream: None), AdminAuth(()),
                       pending=lambda source: asyncio.sleep(0, 0))
        loop_thread = threading.get_ident()
        seen: list[int] = []

        def change(registry: Registry) -> Registry:
            seen.append(threading.get_ident())
            return registry
        await api.check(change)
        assert len(seen) == 1
        assert seen[0] != loop_thread
        await store.close()
    asyncio.run(go())
