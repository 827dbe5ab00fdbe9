"""OndatraSQL's event collection example, as its users type it, against icefloe (#26, #37).

``examples/ondatra/`` holds the example's own file and nothing else: ``models/raw/events.sql``
exactly as OndatraSQL documents it (the code block of "Collect Events" / "Event
Collection", https://ondatra.sh/guides/collect-events/ and
https://ondatra.sh/concepts/events, the same text as ``docs/guides/collect-events.md`` in
github.com/ondatra-labs/ondatrasql before commit 9916d24 removed the feature; the first line
is the block's file-name comment, which users copy along). Its steps are run as written,
in the project folder, with no icefloe config file: ``COLLECT_PORT=… ondatrasql daemon``
becomes ``COLLECT_PORT=… icefloe ingestor`` (the daemon's port variables, read by
``cmd/ondatrasql/daemon_cmd.go`` before v0.9.0), the two documented curl lines (the port
is a free one instead of 8080: the only change), ``ondatrasql run`` is ``icefloe run``
and the table is read with ``icefloe sql``.

A second test adds transformation models of our own (a view and a merge by day, written
here, not part of the example) to check the DAG, ``icefloe run`` asking a lease holder that
does not answer, and ``--takeover``.
Spark: the session of the test run, reused in-process.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ingest_support import TOKEN_HASH
from process_support import Child, child_env, free_port

from icefloe.config import Config
from icefloe.config.load import load_config
from icefloe.manifest import ManifestConsumer
from icefloe.store import open_async_store
from icefloe_app.cli import main
from icefloe_app.cli.config_args import data_dir_defaults

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ondatra"
UPSTREAM_EVENTS_SQL = """\
-- models/raw/events.sql
-- @kind: events

event_name VARCHAR NOT NULL,
page_url VARCHAR,
user_id VARCHAR,
received_at TIMESTAMPTZ
"""
"""OndatraSQL's schema file, character for character as its docs show it."""
UPSTREAM_CURL = [
    ("localhost:8080/collect/raw/events",
     '{"event_name":"pageview","page_url":"/home","user_id":"u42"}'),
    ("localhost:8080/collect/raw/events/batch",
     '[{"event_name":"pageview"},{"event_name":"click"}]'),
]
"""The documented ``curl -X POST URL -d BODY`` lines (single event, then the batch)."""

STAGING_SESSIONS = """\
-- @kind: view
-- One row per visitor and day: when the visit started and ended, what it did.
SELECT
  user_id,
  CAST(received_at AS DATE) AS day,
  min(received_at) AS session_start,
  max(received_at) AS session_end,
  count(*) AS events,
  sum(CASE WHEN event_name = 'pageview' THEN 1 ELSE 0 END) AS pageviews
FROM raw.events
WHERE user_id IS NOT NULL
GROUP BY user_id, CAST(received_at AS DATE)
"""
MART_DAILY_TRAFFIC = """\
-- @kind: merge
-- @unique_key: day
-- Visitors, page views and events per day; each run upserts the days new events touched.
SELECT
  day,
  count(*) AS visitors,
  sum(pageviews) AS pageviews,
  sum(events) AS events
FROM staging.sessions
GROUP BY day
"""
ONE = [  # POST /collect/raw/events, one object each
    '{"event_name":"pageview","page_url":"/","user_id":"u1",'
    '"received_at":"2026-03-01T10:00:00Z"}',
    '{"event_name":"click","page_url":"/","user_id":"u1","received_at":"2026-03-01T10:05:00Z"}',
    '{"event_name":"pageview","page_url":"/docs","user_id":"u2",'
    '"received_at":"2026-03-01T11:00:00+01:00"}',
    '{"event_name":"pageview","page_url":"/","user_id":"u1"}',  # received_at: now
]
BATCH = ('[{"event_name":"pageview","user_id":"u3","received_at":"2026-03-02T08:00:00Z"},'
         '{"event_name":"pageview","user_id":"u3","received_at":"2026-03-02T08:01:00Z"}]')


def curl(*args: str) -> str:
    done = subprocess.run(["curl", "-sS", *args], capture_output=True, text=True, timeout=30,
                          check=True)
    return done.stdout


def curl_post(url: str, body: str) -> str:
    """``curl -X POST URL -d BODY``: curl's own defaults, form content type included."""
    return curl("-X", "POST", url, "-d", body, "-w", " %{http_code}")


def hold_lease(config: Config, holder: str) -> None:
    """Be another, live collector: take the queue's lease as ``holder``."""
    async def take() -> None:
        store = open_async_store(config.store.url)
        try:
            await ManifestConsumer(store, config.manifest.build(), holder=holder).initialize()
        finally:
            await store.close()
    asyncio.run(take())


def project_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the example, as the working folder (no config file: OndatraSQL has none)."""
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project)
    monkeypatch.chdir(project)
    for name in ("ICEFLOE_CONFIG", "COLLECT_PORT", "COLLECT_ADMIN_PORT"):
        monkeypatch.delenv(name, raising=False)
    return project


def test_example_folder_is_ondatrasqls_own() -> None:
    """Nothing added, nothing changed: the folder is the documented file."""
    files = sorted(p.relative_to(EXAMPLE).as_posix() for p in EXAMPLE.rglob("*")
                   if p.is_file())
    assert files == ["models/raw/events.sql"]
    assert (EXAMPLE / "models" / "raw" / "events.sql").read_text() == UPSTREAM_EVENTS_SQL


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_ondatrasql_example_verbatim(spark: Any, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    project = project_of(tmp_path, monkeypatch)
    port = free_port()
    env = {**child_env(), "COLLECT_PORT": str(port),
           # plaintext is served on this machine only (0.0.0.0 needs TLS), and 50051 may
           # be taken on a shared machine
           "ICEFLOE_INGESTOR_HOST": "127.0.0.1", "ICEFLOE_INGESTOR_GRPC_PORT": "0"}
    ingestor = Child(["ingestor"], project, tmp_path / "ingestor.log", env=env)
    try:
        assert ingestor.ready()["http_port"] == port
        answers = [curl("-X", "POST", url.replace(":8080", f":{port}"), "-d", body)
                   for url, body in UPSTREAM_CURL]
        assert answers == ['{"accepted":1}', '{"accepted":2}']
        assert '"ok"' in curl(f"localhost:{port}/health")  # OndatraSQL's health check
    finally:
        assert ingestor.stop() == 0

    assert main(["run"]) == 0
    capsys.readouterr()
    assert main(["sql", "--format", "json",
                 "SELECT event_name, page_url, user_id, received_at IS NOT NULL AS stamped "
                 "FROM raw.events ORDER BY event_name, page_url NULLS FIRST"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [
        {"event_name": "click", "page_url": None, "user_id": None, "stamped": True},
        {"event_name": "pageview", "page_url": None, "user_id": None, "stamped": True},
        {"event_name": "pageview", "page_url": "/home", "user_id": "u42", "stamped": True},
    ]


def test_collect_admin_port_moves_the_admin_api(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``COLLECT_PORT`` alone: the admin API takes the next port, as OndatraSQL's does."""
    project = project_of(tmp_path, monkeypatch)
    port = free_port()
    admin = Child(["admin"], project, tmp_path / "admin.log",
                  env={**child_env(), "COLLECT_PORT": str(port - 1),
                       "ICEFLOE_ADMIN_TOKENS": TOKEN_HASH})
    try:
        assert admin.ready()["port"] == port
        assert '"ok"' in curl(f"http://127.0.0.1:{port}/healthz")
    finally:
        assert admin.stop() == 0


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_ondatrasql_example_with_marts(spark: Any, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    project = project_of(tmp_path, monkeypatch)
    (project / "models" / "staging").mkdir()
    (project / "models" / "staging" / "sessions.sql").write_text(STAGING_SESSIONS)
    (project / "models" / "mart").mkdir()
    (project / "models" / "mart" / "daily_traffic.sql").write_text(MART_DAILY_TRAFFIC)
    ingestor = Child(["ingestor", "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0"],
                     project,
                     tmp_path / "ingestor.log")
    try:
        url = f"http://127.0.0.1:{ingestor.ready()['http_port']}/collect/raw/events"
        assert [curl_post(url, body) for body in ONE] == ['{"accepted":1} 202'] * len(ONE)
        today = dt.datetime.now(dt.UTC).date().isoformat()
        assert curl_post(f"{url}/batch", BATCH) == '{"accepted":2} 202'
    finally:
        assert ingestor.stop() == 0

    data = project / "icefloe-data"  # what every command uses without --data-dir
    hold_lease(load_config(None, env={}, overrides=data_dir_defaults(None, data, {})),
               "collector-on-another-host")
    monkeypatch.delenv("ICEFLOE_ADMIN_TOKEN", raising=False)
    assert main(["run"]) == 2  # a lease holder is asked, with an admin token
    err = capsys.readouterr().err
    assert "collector collector-on-another-host holds the queue's lease" in err
    assert "set ICEFLOE_ADMIN_TOKEN" in err
    monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", "ifl_not_checked_by_anyone")
    monkeypatch.setenv("ICEFLOE_COLLECTOR_URL", f"http://127.0.0.1:{free_port()}")
    assert main(["run"]) == 3  # nobody answers where the holder should be
    err = capsys.readouterr().err
    assert "collector-on-another-host holds the queue's lease" in err
    assert "but does not answer at http://127.0.0.1:" in err

    assert main(["run", "--takeover"]) == 0
    outcomes = capsys.readouterr().out
    assert "staging.sessions" in outcomes
    assert "mart.daily_traffic" in outcomes

    assert main(["sql", "--format", "json",
                 "SELECT * FROM mart.daily_traffic ORDER BY day"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == sorted([
        {"day": "2026-03-01", "visitors": 2, "pageviews": 2, "events": 3},
        {"day": "2026-03-02", "visitors": 1, "pageviews": 2, "events": 2},
        {"day": today, "visitors": 1, "pageviews": 1, "events": 1},
    ], key=lambda row: row["day"])
