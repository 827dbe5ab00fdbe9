"""Table templates (#42) through the admin API, over real HTTP: a sink whose table is a
template is created and patched with the checks (and the messages) icefloe.toml's load
gives — the template parsed with sqlglot, its limits in range, what templates do not
support, the namespace the template's own — and a collector routing by the registry
makes its tables on first use with the sink's own limits."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from icefloe.config import Column, StreamConfig
from icefloe.errors import ConfigError
from icefloe.registry import RegistryStore
from icefloe.streams.check import validate_stream
from tests.app.test_admin_api import Admin, admin, tables  # noqa: F401  (the served API)
from tests.collector_support import BASE_MS, open_store_of, publish, read_table, start

COLUMNS = [{"name": "tenant", "type": "string"}, {"name": "n", "type": "long"},
           {"name": "ok", "type": "boolean"}]
SINK = {"name": "per_tenant", "table": "tenants.t_{lower(tenant)}", "columns": COLUMNS,
        "dynamic_tables": {"max_tables": 2}}


def config_reason(table: str, limits: dict[str, int] | None = None) -> tuple[str, str]:
    """The key and problem icefloe.toml's load gives for a stream with ``table``."""
    from icefloe.streams.model import DynamicTables  # why: only this helper builds one

    stream = StreamConfig(name="events", table=table, columns=tuple(
        Column(c["name"], c["type"]) for c in COLUMNS),
        dynamic_tables=DynamicTables(**limits) if limits is not None else None)
    with pytest.raises(ConfigError) as caught:
        validate_stream(stream, "streams[0]")
    key, _, problem = str(caught.value).partition(": ")
    return key.removeprefix("streams[0]."), problem


@pytest.mark.parametrize(("table", "limits"), [
    ("tenants.e_{colour}", None),
    ("{tenant}.events", None),
    ("icefloe.t_{tenant}", None),
    ("tenants.e_{ok}", None),
    ("tenants.e_{reflect('java.lang.System', 'exit')}", None),
    ("tenants.e_{tenant", None),
    ("tenants.e_{tenant}", {"max_tables": 0}),
    ("tenants.e_{tenant}", {"max_name_length": 300}),
    ("tenants.events", {"max_tables": 5}),
])
def test_a_bad_template_is_refused_as_config_loading_refuses_it(
        admin: Admin, table: str, limits: dict[str, int] | None) -> None:  # noqa: F811
    key, problem = config_reason(table, limits)
    body: dict[str, Any] = {**SINK, "table": table}
    body.pop("dynamic_tables")
    if limits is not None:
        body["dynamic_tables"] = limits
    refused = admin.client.post("/v1/sources/clicks/sinks", json=body)
    assert refused.status_code == 400, refused.text
    [detail] = refused.json()["details"]
    assert (detail["field"], detail["reason"]) == (f"sink.{key}", problem)
    source = admin.client.post("/v1/sources", json={"id": "events", "sinks": [body]})
    assert source.status_code == 400, source.text
    assert source.json()["details"][0] == {"field": f"sinks[0].{key}", "reason": problem}


def test_what_templates_do_not_support_is_refused_by_name(admin: Admin) -> None:  # noqa: F811
    for extra, key in (({"primary_key": ["n"]}, "primary_key"),
                       ({"unknown_fields": "evolve"}, "unknown_fields")):
        refused = admin.client.post("/v1/sources/clicks/sinks", json={**SINK, **extra})
        assert refused.status_code == 400, refused.text
        assert refused.json()["details"][0]["field"] == f"sink.{key}"
        assert "a table template" in refused.json()["details"][0]["reason"]


def test_a_template_owns_its_namespace(admin: Admin) -> None:  # noqa: F811
    taken = admin.client.post("/v1/sources/clicks/sinks",
                              json={**SINK, "table": "web.t_{tenant}"})  # web.clicks is there
    assert taken.status_code == 409, taken.text
    assert taken.json()["error"] == "namespace_owned"
    assert "holds table 'web.clicks' of sink 'clicks' of source 'clicks'" in taken.text
    made = admin.client.post("/v1/sources", json={"id": "events", "sinks": [SINK]})
    assert admin.task(made)["state"] == "succeeded"
    assert not any(t.startswith("tenants.") for t in tables(admin.config))  # on first use
    intruder = admin.client.post("/v1/sources/clicks/sinks", json={
        "name": "audit", "table": "tenants.audit", "columns": COLUMNS[:1]})
    assert intruder.status_code == 409, intruder.text
    assert ("namespace 'tenants' belongs to the table template 'tenants.t_{lower(tenant)}' "
            "of sink 'per_tenant' of source 'events'") in intruder.json()["message"]


def test_a_templates_limits_are_patched_with_the_same_checks(admin: Admin) -> None:  # noqa: F811
    made = admin.client.post("/v1/sources", json={"id": "events", "sinks": [SINK]})
    assert admin.task(made)["state"] == "succeeded"
    path = "/v1/sources/events/sinks/per_tenant"
    bad = admin.client.patch(path, json={"dynamic_tables": {"max_name_length": 300}})
    assert bad.status_code == 400, bad.text
    assert bad.json()["details"][0] == {
        "field": "sink.dynamic_tables",
        "reason": config_reason(SINK["table"], {"max_name_length": 300})[1]}
    fixed = admin.client.patch(path, json={"table": "tenants.u_{tenant}"})
    assert fixed.status_code == 400, fixed.text
    assert fixed.json()["details"][0]["field"] == "sink.table"
    patched = admin.client.patch(path, json={"dynamic_tables": {"max_tables": 5}})
    assert patched.status_code == 200, patched.text  # no table to evolve: done at once
    assert patched.json()["sink"]["dynamic_tables"] == {"max_tables": 5,
                                                        "max_name_length": 128}


def test_a_registry_template_routes_into_tables_with_its_own_limits(admin: Admin) -> None:  # noqa: F811
    made = admin.client.post("/v1/sources", json={"id": "events", "sinks": [SINK]})
    assert admin.task(made)["state"] == "succeeded"
    config = admin.config

    async def go() -> None:
        from collector.routing import Routes  # why: the collector is only this test's
        from pipeline.load.run import LocalEngine

        store = open_store_of(config)
        registry = await RegistryStore(store, config.admin.registry_key).read()
        events = [("events", f"e{i}", BASE_MS + i,
                   msgspec.json.encode({"tenant": t, "n": i}))
                  for i, t in enumerate(["Acme", "Globex", "acme", "Initech"])]
        await publish(store, [events], registry_version=registry.version)
        await store.close()
        collector = await start(config, LocalEngine())
        collector.routes = Routes(registry)
        await asyncio.to_thread(collector.prepare_tables)
        while (await collector.run_once()).entries:
            pass
        await collector.store.close()

    asyncio.run(go())
    assert {t for t in tables(config) if t.startswith("tenants.")} == {"tenants.t_acme",
                                                                      "tenants.t_globex"}
    assert sorted(read_table(config, "tenants.t_acme").column("_event_id").to_pylist()) == [
        "e0", "e2"]
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    assert [(d["event_id"], d["reason"]) for d in dead] == [("e3",
                                                             "dynamic_table:max_tables")]
