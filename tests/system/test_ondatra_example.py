"""OndatraSQL's Full Example, as its users type it, against icefloe (issue #26, item 2).

``examples/ondatra/`` holds the same files and directives: ``models/raw/events.sql``
(``-- @kind: events``) declares the stream and table ``raw.events``, ``staging/sessions``
is a view and ``mart/daily_traffic`` a merge by day. A real ``icefloe ingestor`` process
takes curl's POSTs (form content type, as ``curl -d`` sends), ``icefloe run`` commits the
queue and runs the models (refusing while another collector holds the lease), and
``icefloe sql`` reads the mart. Spark: the session of the test run, reused in-process.
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
from process_support import Child

from icefloe.config import Config
from icefloe.config.load import load_config
from icefloe.manifest import ManifestConsumer
from icefloe.store import open_async_store
from icefloe_app.cli import main
from icefloe_app.cli.config_args import data_dir_defaults

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ondatra"
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


def curl_post(url: str, body: str) -> str:
    """``curl -X POST URL -d BODY``: curl's own defaults, form content type included."""
    done = subprocess.run(["curl", "-sS", "-X", "POST", url, "-d", body, "-w", " %{http_code}"],
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def config_of(path: Path, data: Path) -> Config:
    return load_config(path, overrides=data_dir_defaults(path, data, {}))


def hold_lease(config: Config, holder: str) -> None:
    """Be another, live collector: take the queue's lease as ``holder``."""
    async def take() -> None:
        store = open_async_store(config.store.url)
        try:
            await ManifestConsumer(store, config.manifest.build(), holder=holder).initialize()
        finally:
            await store.close()
    asyncio.run(take())


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_ondatrasql_full_example(spark: Any, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    project, data = tmp_path / "project", tmp_path / "data"
    shutil.copytree(EXAMPLE, project)
    conf = project / "icefloe.toml"
    where = ["--config", str(conf), "--data-dir", str(data)]
    ingestor = Child(["ingestor", *where, "--http-port", "0", "--grpc-port", "0"], tmp_path,
                     tmp_path / "ingestor.log")
    try:
        url = f"http://127.0.0.1:{ingestor.ready()['http_port']}/collect/raw/events"
        assert [curl_post(url, body) for body in ONE] == ['{"accepted":1} 202'] * len(ONE)
        today = dt.datetime.now(dt.UTC).date().isoformat()
        assert curl_post(f"{url}/batch", BATCH) == '{"accepted":2} 202'
    finally:
        assert ingestor.stop() == 0

    hold_lease(config_of(conf, data), "collector-on-another-host")
    assert main(["run", *where]) == 3
    assert "collector-on-another-host holds the queue's lease" in capsys.readouterr().err

    assert main(["run", *where, "--takeover"]) == 0
    outcomes = capsys.readouterr().out
    assert "staging.sessions" in outcomes
    assert "mart.daily_traffic" in outcomes

    assert main(["sql", *where, "--format", "json",
                 "SELECT * FROM mart.daily_traffic ORDER BY day"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == sorted([
        {"day": "2026-03-01", "visitors": 2, "pageviews": 2, "events": 3},
        {"day": "2026-03-02", "visitors": 1, "pageviews": 2, "events": 2},
        {"day": today, "visitors": 1, "pageviews": 1, "events": 1},
    ], key=lambda row: row["day"])
