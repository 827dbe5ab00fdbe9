"""Keboola Data Streams parity on the admin API, served by uvicorn and called over HTTP:
settings resources of sources and sinks (import conditions included) with precise 400s and
404s, ids made from names with a clear 409 on a collision, and a running collector that
imports waiting (staged) data as soon as changed conditions hold."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from icefloe.registry import RegistryStore
from icefloe.store import open_async_store
from tests.app.test_admin_api import COLUMNS, Admin, serving
from tests.collector_support import assert_exact, click, publish


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[Admin]:
    """The admin API served over the real local store."""
    yield from serving(tmp_path, open_async_store, threading.Event())


def settings_of(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return {s["key"]: s for s in response.json()["settings"]}


def test_should_read_and_patch_a_sinks_settings_with_the_conditions(admin: Admin) -> None:
    url = "/v1/sources/clicks/sinks/clicks/settings"
    before = settings_of(admin.client.get(url))
    assert before["conditions.max_age_s"]["value"] == 1.0
    assert before["conditions.max_events"] == {
        "key": "conditions.max_events", "type": "integer", "value": 1_000_000,
        "default": 1_000_000, "overwritten": False,
        "description": before["conditions.max_events"]["description"]}
    version = admin.client.get("/v1/registry").json()["version"]

    patched = admin.client.patch(url, json={"settings": [
        {"key": "conditions.max_events", "value": 500},
        {"key": "conditions.max_age_s", "value": 600}]})
    after = settings_of(patched)
    assert patched.json()["version"] == version + 1
    assert (after["conditions.max_events"]["value"], after["conditions.max_events"]
            ["overwritten"]) == (500, True)
    assert after["conditions.max_bytes"]["value"] == 64 * 1024 * 1024  # untouched
    sink = admin.client.get("/v1/sources/clicks/sinks/clicks").json()["sink"]
    assert sink["conditions"] == {"max_age_s": 600, "max_bytes": 64 * 1024 * 1024,
                                  "max_events": 500}
    reset = settings_of(admin.client.patch(url, json={"settings": [
        {"key": "conditions.max_events", "value": None}]}))
    assert reset["conditions.max_events"]["overwritten"] is False

    def refused(body: Any) -> tuple[int, str]:
        response = admin.client.patch(url, json=body)
        return response.status_code, response.json()["details"][0]["field"]

    assert refused({"settings": [{"key": "conditions.max_age_s", "value": 0}]}) == (
        400, "conditions.max_age_s")
    assert refused({"settings": [{"key": "conditions.max_events", "value": "many"}]}) == (
        400, "conditions.max_events")
    assert refused({"settings": [{"key": "conditions.max_events", "value": True}]}) == (
        400, "conditions.max_events")
    assert refused({"settings": [{"key": "table", "value": "x.y"}]}) == (
        400, "settings[0].key")
    assert refused({"settings": [{"key": "enabled", "value": False},
                                 {"key": "enabled", "value": True}]}) == (
        400, "settings[1].key")
    assert refused({"settings": []}) == (400, "settings")
    assert refused({"settings": [{"key": "enabled", "value": 1, "x": 2}]})[0] == 400
    assert admin.client.get("/v1/registry").json()["version"] == version + 2  # no refusal wrote
    assert admin.client.get("/v1/sources/clicks/sinks/nope/settings").status_code == 404
    assert admin.client.patch("/v1/sources/nope/sinks/clicks/settings", json={
        "settings": [{"key": "enabled", "value": False}]}).status_code == 404

    off = settings_of(admin.client.patch(url, json={"settings": [
        {"key": "enabled", "value": False}]}))
    assert off["enabled"]["value"] is False
    toggles = admin.client.get("/v1/sources/clicks/sinks/clicks").json()["sink"]["toggles"]
    assert toggles[-1]["enabled"] is False  # routed by version like :disable


def test_should_read_and_patch_a_sources_settings(admin: Admin) -> None:
    url = "/v1/sources/clicks/settings"
    assert settings_of(admin.client.get(url))["rate_limit.events_per_s"]["value"] is None
    after = settings_of(admin.client.patch(url, json={"settings": [
        {"key": "rate_limit.events_per_s", "value": 50}, {"key": "description",
                                                          "value": "web clicks"}]}))
    assert after["rate_limit.events_per_s"]["value"] == 50
    assert after["rate_limit.burst_s"]["value"] == 1.0
    source = admin.client.get("/v1/sources/clicks").json()["source"]
    assert (source["description"], source["rate_limit"]["events_per_s"]) == ("web clicks", 50)
    bad = admin.client.patch(url, json={"settings": [
        {"key": "rate_limit.burst_s", "value": -1}]})
    assert (bad.status_code, bad.json()["details"][0]["field"]) == (400,
                                                                    "rate_limit.burst_s")
    cleared = settings_of(admin.client.patch(url, json={"settings": [
        {"key": "rate_limit.events_per_s", "value": None}]}))
    assert cleared["rate_limit.events_per_s"]["value"] is None
    assert admin.client.get("/v1/sources/clicks").json()["source"]["rate_limit"] is None
    assert admin.client.get("/v1/sources/nope/settings").status_code == 404


def test_should_make_source_and_sink_ids_from_names(admin: Admin) -> None:
    made = admin.client.post("/v1/sources", json={"name": "Web Événements (EU)"})
    assert made.status_code == 201, made.text
    source = made.json()["source"]
    assert (source["id"], source["description"]) == ("web-evenements-eu",
                                                     "Web Événements (EU)")
    assert made.headers["location"] == "/v1/sources/web-evenements-eu"
    again = admin.client.post("/v1/sources", json={"name": "web evenements EU!"})
    assert (again.status_code, again.json()["error"]) == (409, "exists")
    assert "made from name 'web evenements EU!'" in again.json()["message"]
    assert again.json()["details"][0]["field"] == "name"
    nothing = admin.client.post("/v1/sources", json={"name": "!!!"})
    assert (nothing.status_code, nothing.json()["details"][0]["field"]) == (400, "name")
    neither = admin.client.post("/v1/sources", json={"description": "x"})
    assert (neither.status_code, neither.json()["details"][0]["field"]) == (400, "id")

    task = admin.task(admin.client.post("/v1/sources/web-evenements-eu/sinks", json={
        "table": "web.page_views", "columns": COLUMNS}))
    assert task["state"] == "succeeded", task
    assert task["result"]["sink"]["name"] == "web.page_views"
    assert admin.client.get(
        "/v1/sources/web-evenements-eu/sinks/web.page_views").status_code == 200


def test_should_import_waiting_data_at_once_when_changed_conditions_hold(
        admin: Admin) -> None:
    """A real collector (run_collector, in-process decode) stages a slow sink's rows; a
    settings PATCH lowering max_events below what waits makes it import them, without
    new events arriving and long before the hour-long age condition."""
    from collector.metrics import CollectorMetrics
    from collector.runner import run_collector
    from pipeline.load.run import LocalEngine

    url = "/v1/sources/clicks/sinks/clicks/settings"
    slow = admin.client.patch(url, json={"settings": [
        {"key": "conditions.max_age_s", "value": 3600},
        {"key": "conditions.max_events", "value": 1000}]})
    assert slow.status_code == 200, slow.text
    version = slow.json()["version"]
    base = admin.config
    config = msgspec.structs.replace(
        base, collector=msgspec.structs.replace(base.collector, poll_interval_s=0.05),
        admin=msgspec.structs.replace(base.admin, registry_poll_s=0.1))
    metrics = CollectorMetrics()
    done: dict[str, Any] = {}
    loop_ready = threading.Event()

    def sample(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    async def collect() -> None:
        done["stop"], done["loop"] = asyncio.Event(), asyncio.get_running_loop()
        loop_ready.set()
        done["code"] = await run_collector(config, stop=done["stop"], engine=LocalEngine(),
                                           serve_metrics=False, metrics=metrics)

    thread = threading.Thread(target=lambda: asyncio.run(collect()), daemon=True)
    thread.start()
    assert loop_ready.wait(30)

    async def send() -> None:
        store = open_async_store(config.store.url)
        reg = await RegistryStore(store, config.admin.registry_key).read()
        assert reg.version == version
        now_ms = int(time.time() * 1000)  # fresh rows: the hour-long age condition waits
        events = [(s, i, now_ms, p) for s, i, _, p in (click(n, "w") for n in range(7))]
        await publish(store, [events], registry_version=version)
        await store.close()
    asyncio.run(send())

    def wait_for(what: str, check: Any) -> None:
        deadline = time.monotonic() + 60
        while not check():
            assert thread.is_alive(), done
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    wait_for("rows staged", lambda: sample("icefloe_collector_staged_rows",
                                           table="web.clicks") == 7)
    assert not sample("icefloe_collector_staged_commits_total", table="web.clicks",
                      reason="events")
    lowered = admin.client.patch(url, json={"settings": [
        {"key": "conditions.max_events", "value": 5}]})
    assert lowered.status_code == 200, lowered.text
    wait_for("the staged rows imported", lambda: sample(
        "icefloe_collector_staged_commits_total", table="web.clicks", reason="events"))
    done["loop"].call_soon_threadsafe(done["stop"].set)
    thread.join(30)
    assert done.get("code") == 0
    assert_exact(config, "web.clicks", {f"w{i}" for i in range(7)})
