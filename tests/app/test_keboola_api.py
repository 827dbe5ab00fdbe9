"""Keboola Data Streams, typed as its users type it (issue #37): the Stream API's paths and
JSON (``/v1/branches/default/sources``, ``sinkId``, ``table.mapping.columns``, ``primaryKey``,
``path`` in dot syntax with ``rawString`` and ``defaultValue``, a Jsonnet ``template``), the
``X-StorageApi-Token`` header, tasks, and the ``storage.level.target.import.trigger.*``
settings with Keboola's ranges and defaults. Real admin API and ingestor over HTTP, the real
collector, on the moto S3 server and a SQLite catalog; every request body below is Keboola's
documented example (docs/coming-from/keboola.md names, row by row, the tests that check it)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from collector_support import collect_all, collector_config, read_table
from ingest_support import http_serving, running

from icefloe.tokens import hash_token
from pipeline.load.run import LocalEngine
from tests.admin_support import admin_server

TOKEN = "ifl_keboola-test-token"
BASE = "/v1/branches/default/sources"
TEMPLATE = "'#' + Body('issue.id') + ': ' + Body('issue.body', 'n/a')"
SINK = {  # Keboola's tutorial columns (its second "id" column renamed: names are unique)
    "sinkId": "events", "type": "table", "name": "Events",
    "table": {"type": "keboola", "tableId": "in.c-github.issues", "mapping": {"columns": [
        {"primaryKey": True, "type": "id", "name": "id"},
        {"type": "datetime", "name": "datetime"},
        {"type": "ip", "name": "ip"},
        {"type": "body", "name": "body"},
        {"type": "headers", "name": "headers"},
        {"type": "path", "name": "issue_id", "path": "issue.id",
         "defaultValue": "undefined", "rawString": True},
        {"type": "path", "name": "labels", "path": "issue.labels[0]"},
        {"type": "template", "name": "template",
         "template": {"language": "jsonnet", "content": TEMPLATE}}]}}}


@pytest.fixture
def stack(tmp_path: Path, s3_bucket: Any) -> Iterator[tuple[httpx.Client, Any]]:
    """The admin API (icefloe's and Keboola's paths) on the moto S3 store, as a client that
    authenticates the Keboola way."""

    base = collector_config(tmp_path, (), store={"url": s3_bucket.url,
                                                 "endpoint_url": s3_bucket.endpoint_url})
    config = msgspec.structs.replace(base, admin=msgspec.structs.replace(
        base.admin, port=0, tokens=(hash_token(TOKEN, log2_n=10),), registry_poll_s=0.2))
    with admin_server(config) as url, httpx.Client(
            base_url=url, timeout=30, headers={"X-StorageApi-Token": TOKEN}) as client:
        yield client, config


def finished(client: httpx.Client, reply: httpx.Response) -> dict[str, Any]:
    """Poll a Keboola task's ``url`` until ``isFinished`` (as the tutorial says)."""
    assert reply.status_code == 202, reply.text
    task = reply.json()
    deadline = time.monotonic() + 60
    while not task["isFinished"]:
        assert time.monotonic() < deadline, task
        time.sleep(0.1)
        task = client.get(task["url"]).json()
    assert task["status"] == "success", task
    return task


def settings(reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 200, reply.text
    return {s["key"]: s["value"] for s in reply.json()["settings"]}


async def ingest(config: Any, events: list[dict[str, Any]]) -> None:
    async with running(config) as runtime, http_serving(runtime) as url, \
            httpx.AsyncClient(base_url=url) as client:
        reply = await client.post("/v1/streams/github-issues/events", json=events,
                                  headers={"X-GitHub-Event": "issues"})
        assert reply.status_code == 202, reply.text


def test_keboola_source_sink_template_and_conditions_end_to_end(
        stack: tuple[httpx.Client, Any]) -> None:
    client, config = stack
    created = finished(client, client.post(BASE, json={"type": "http",
                                                       "name": "Github Issues"}))
    assert created["outputs"]["sourceId"] == "github-issues"
    assert client.get(f"{BASE}/github-issues").json()["sourceId"] == "github-issues"
    task = finished(client, client.post(f"{BASE}/github-issues/sinks", json=SINK))
    assert task["type"] == "sink.create"
    assert task["outputs"]["sinkId"] == "events"

    sink = client.get(f"{BASE}/github-issues/sinks/events").json()
    assert sink["table"]["mapping"]["columns"] == SINK["table"]["mapping"]["columns"]
    url = f"{BASE}/github-issues/sinks/events/settings"
    assert settings(client.get(url)) == {  # Keboola's defaults for a new sink
        "storage.level.target.import.trigger.count": 50_000,
        "storage.level.target.import.trigger.interval": "1m0s",
        "storage.level.target.import.trigger.size": "50MB"}
    for key, value in (("interval", "29s"), ("interval", "25h"), ("size", "99B"),
                       ("size", "501MB"), ("count", 0), ("count", 10_000_001)):
        refused = client.patch(url, json={"settings": [
            {"key": f"storage.level.target.import.trigger.{key}", "value": value}]})
        assert refused.status_code == 400, (key, value, refused.text)
        assert refused.json()["details"][0]["field"] == \
            f"storage.level.target.import.trigger.{key}"
    assert settings(client.patch(url, json={"settings": [
        {"key": "storage.level.target.import.trigger.count", "value": 1}]}))[
        "storage.level.target.import.trigger.count"] == 1

    asyncio.run(ingest(config, [
        {"action": "opened", "issue": {"id": 7, "body": "Fix it", "labels": ["bug"]}},
        {"action": "opened", "issue": {"body": "no id"}}]))
    asyncio.run(collect_all(config, LocalEngine()))

    rows = read_table(config, "in_c_github.issues").to_pylist()
    assert len(rows) == 1, rows
    row = rows[0]
    assert row["issue_id"] == "7"  # rawString: the value's text
    assert row["labels"] == '"bug"'  # no rawString: JSON text, quotes kept
    assert row["template"] == '"#7: Fix it"'  # the template's JSON value, as Keboola stores
    assert msgspec.json.decode(row["body"])["issue"]["id"] == 7
    assert msgspec.json.decode(row["headers"])["x-github-event"] == "issues"
    assert row["ip"] == "127.0.0.1"
    assert row["id"]
    assert row["datetime"] is not None
    dead = read_table(config, "icefloe.dead_letters").to_pylist()
    assert [(d["reason"], d["stream"]) for d in dead] == [
        ("template_error", "github-issues")], dead
    assert 'path "issue.id" not found in the body' in dead[0]["message"]
    assert msgspec.json.decode(dead[0]["raw"])["issue"] == {"body": "no id"}


def test_keboola_refusals_name_the_field(stack: tuple[httpx.Client, Any]) -> None:
    client, _ = stack
    assert client.get("/v1/branches/123/sources").status_code == 404
    finished(client, client.post(BASE, json={"sourceId": "s", "type": "http", "name": "S"}))
    cases = [
        ({"type": "nope", "name": "a"}, "table.mapping.columns[0].type"),
        ({"type": "template", "name": "t", "template": {"language": "jsonnet",
                                                        "content": "Body("}},
         "table.mapping.columns[0]"),
        ({"type": "template", "name": "t", "template": {"language": "lua", "content": "1"}},
         "table.mapping.columns[0].template.language"),
        ({"type": "path", "name": "p", "path": "a..b"}, "table.mapping.columns[0].path")]
    for column, field in cases:
        body = {"type": "table", "name": "x", "table": {
            "type": "keboola", "tableId": "in.c-b.t", "mapping": {"columns": [column]}}}
        reply = client.post(f"{BASE}/s/sinks", json=body)
        assert reply.status_code == 400, (column, reply.text)
        assert reply.json()["details"][0]["field"].startswith(field), reply.json()
    assert client.get(f"{BASE}/s", headers={"X-StorageApi-Token": "wrong"}).status_code == 403


def sink_with(template: str) -> dict[str, Any]:
    """A small Keboola sink whose ``template`` column holds ``template``."""
    return {"sinkId": "t", "type": "table", "name": "T", "table": {
        "type": "keboola", "tableId": "in.c-github.templated", "mapping": {"columns": [
            {"primaryKey": True, "type": "id", "name": "id"},
            {"type": "path", "name": "n", "path": "n"},
            {"type": "template", "name": "v",
             "template": {"language": "jsonnet", "content": template}}]}}}


def commit_each_event(client: httpx.Client, sink: str) -> None:
    """Import conditions of one event (Keboola's defaults would hold rows for a minute)."""
    settings(client.patch(f"{sink}/settings", json={"settings": [
        {"key": "storage.level.target.import.trigger.count", "value": 1}]}))


def test_a_changed_template_applies_only_to_events_accepted_after_it(
        stack: tuple[httpx.Client, Any]) -> None:
    """Events wait in the queue while the template is changed (a Keboola sink PATCH), then
    while the sink is deleted and re-created with a third one: each event gets the template
    of the registry version it was accepted under, never the sink's content of the moment
    the collector runs (the way ``sql`` columns and ``where`` are versioned)."""
    client, config = stack
    finished(client, client.post(BASE, json={"type": "http", "name": "Github Issues"}))
    sinks = f"{BASE}/github-issues/sinks"
    finished(client, client.post(sinks, json=sink_with("'old-' + Body('n')")))
    commit_each_event(client, f"{sinks}/t")

    def current_is(template: str) -> None:  # each ingest starts an ingestor afresh
        assert client.get(f"{sinks}/t").json()["table"]["mapping"]["columns"][2][
            "template"]["content"] == template

    asyncio.run(ingest(config, [{"n": "a"}, {"n": "b"}]))
    finished(client, client.patch(f"{sinks}/t", json={
        "table": sink_with("'new-' + Body('n')")["table"]}))
    current_is("'new-' + Body('n')")
    asyncio.run(ingest(config, [{"n": "c"}]))
    finished(client, client.delete(f"{sinks}/t"))
    finished(client, client.post(sinks, json=sink_with("'third-' + Body('n')")))
    commit_each_event(client, f"{sinks}/t")
    current_is("'third-' + Body('n')")
    asyncio.run(ingest(config, [{"n": "d"}]))
    asyncio.run(collect_all(config, LocalEngine()))

    rows = read_table(config, "in_c_github.templated").to_pylist()
    assert sorted((r["n"], r["v"]) for r in rows) == [
        ('"a"', '"old-a"'), ('"b"', '"old-b"'), ('"c"', '"new-c"'), ('"d"', '"third-d"')]


def test_keboola_lists_patches_deletes_and_source_settings(
        stack: tuple[httpx.Client, Any]) -> None:
    """The paths the end-to-end test does not type: list sources and sinks, PATCH a
    source, a sink id made from its name, ``uuid`` and ``primaryKey`` as icefloe sees them,
    source settings applied to every sink, a sink PATCH that would move its table (fixed
    here: a 400 naming ``table.tableId``), the 20-sink limit, DELETE sink and source."""
    client, _ = stack
    finished(client, client.post(BASE, json={"type": "http", "name": "Web Events (EU)"}))
    source = f"{BASE}/web-events-eu"
    assert client.get(source).json()["http"]["url"] == "/v1/streams/web-events-eu/events"
    assert [s["sourceId"] for s in client.get(BASE).json()["sources"]] == ["web-events-eu"]
    patched = client.patch(source, json={"name": "Web events"})
    assert patched.status_code == 200, patched.text
    assert client.get(source).json()["name"] == "Web events"

    columns = [{"type": "uuid", "name": "event", "primaryKey": True},
               {"type": "path", "name": "page", "path": "page.url"}]
    sink = {"type": "table", "name": "Page Views", "table": {
        "type": "keboola", "tableId": "in.c-web.views", "mapping": {"columns": columns}}}
    task = finished(client, client.post(f"{source}/sinks", json=sink))
    assert task["outputs"]["sinkId"] == "page-views"  # made from the name
    second = {**sink, "name": "Clicks", "table": {**sink["table"],
                                                  "tableId": "in.c-web.clicks"}}
    finished(client, client.post(f"{source}/sinks", json=second))
    assert [s["sinkId"] for s in client.get(f"{source}/sinks").json()["sinks"]] == [
        "page-views", "clicks"]
    own = client.get("/v1/sources/web-events-eu/sinks/page-views").json()["sink"]
    assert own["primary_key"] == ["event"]
    assert own["table"] == "in_c_web.views"
    assert own["columns"][0]["from"] == "id"

    settings_url = f"{source}/settings"
    assert settings(client.get(settings_url))[
        "storage.level.target.import.trigger.interval"] == "1m0s"
    assert settings(client.patch(settings_url, json={"settings": [
        {"key": "storage.level.target.import.trigger.interval", "value": "30s"}]}))[
        "storage.level.target.import.trigger.interval"] == "30s"
    for name in ("page-views", "clicks"):  # a source PATCH reaches every sink
        assert settings(client.get(f"{source}/sinks/{name}/settings"))[
            "storage.level.target.import.trigger.interval"] == "30s"

    moved = client.patch(f"{source}/sinks/clicks", json={"table": {
        **second["table"], "tableId": "in.c-web.elsewhere"}})
    assert moved.status_code == 400, moved.text
    assert moved.json()["details"][0]["field"] == "table.tableId"

    for i in range(18):  # 20 sinks per source, as Keboola
        finished(client, client.post(f"{source}/sinks", json={
            **sink, "name": f"s{i}", "table": {**sink["table"], "tableId": f"in.c-web.t{i}"}}))
    refused = client.post(f"{source}/sinks", json={
        **sink, "name": "s21", "table": {**sink["table"], "tableId": "in.c-web.t21"}})
    assert refused.status_code == 409, refused.text  # checked before any task starts
    assert refused.json()["error"] == "too_many_sinks", refused.json()
    assert client.get(f"{source}/sinks/s21").status_code == 404

    deleted = client.delete(f"{source}/sinks/clicks")
    assert deleted.status_code == 202, deleted.text
    assert deleted.json()["type"] == "sink.delete"
    assert client.get(f"{source}/sinks/clicks").status_code == 404
    deleted = client.delete(source)
    assert deleted.status_code == 202, deleted.text
    assert deleted.json()["type"] == "source.delete"
    assert client.get(source).status_code == 404
    assert client.get(BASE).json()["sources"] == []

