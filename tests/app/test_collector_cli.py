"""``icefloe collector`` and ``icefloe up`` as an operator runs them.

Fast tests cover the command's contract without Spark: ``--help``, config errors (exit 2),
an unreachable catalog (exit 1, one line), the ready line, SIGTERM (exit 0) and being fenced
(exit 3), the last ones in-process with the Spark-free :class:`pipeline.load.run.LocalEngine`.
The slow tests start real processes with Spark — a collector killed with ``kill -9`` and
replaced with ``--takeover`` must neither lose nor duplicate a row, and ``icefloe up`` must
take events from HTTP to the Iceberg table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pyarrow.compute as pc
import pytest
from collector_support import click, publish_sync, read_table
from process_support import (
    SPARK_TIMEOUT_S,
    Child,
    free_port,
    run_cli,
    sqlite_uri,
    table_rows,
    toml_value,
    wait_for,
    write_config,
)

from icefloe.config import CatalogSection, Config, load_config
from icefloe.config.manifest import ManifestConfig
from icefloe.errors import ConfigError
from icefloe.manifest import ManifestConsumer
from icefloe.store import open_async_store
from icefloe_app.cli import main
from icefloe_app.cli.collector_cmd import build_config, serve_collector
from icefloe_app.cli.config_args import config_from_args

# --- fast: the command's contract --------------------------------------------------------

def test_should_explain_lease_standby_and_takeover_in_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["collector", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for phrase in ("--takeover", "--metrics-port", "lease", "standby", "fences",
                   '{"event": "ready"', "exit codes", "3  fenced",
                   "ICEFLOE_COLLECTOR_METRICS_PORT"):
        assert phrase in out, phrase
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "collector" in capsys.readouterr().out


@pytest.mark.parametrize(("collector", "key"), [
    ('commit_interval_s = 0', "collector.commit_interval_s"),
    ('metrics_port = "high"', "collector.metrics_port"),
    ('metrics_port = 70000', "collector.metrics_port"),
    ('commit_intervall_s = 1', "commit_intervall_s"),
])
def test_should_exit_2_naming_the_key_of_a_bad_config(tmp_path, capsys, collector, key):
    path = tmp_path / "icefloe.toml"
    path.write_text(f"[collector]\n{collector}\n")
    assert main(["collector", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"icefloe: error: {path}: ")
    assert key in err
    assert err.count("\n") == 1


def test_should_exit_2_for_a_missing_config_file(tmp_path, capsys):
    assert main(["collector", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_should_take_the_metrics_port_from_flag_then_env_then_file(tmp_path, monkeypatch):
    path = write_config(tmp_path, metrics_port=7001)
    args = argparse.Namespace(config=str(path), metrics_port=None)
    assert build_config(args).collector.metrics_port == 7001
    monkeypatch.setenv("ICEFLOE_COLLECTOR_METRICS_PORT", "7002")
    assert build_config(args).collector.metrics_port == 7002
    args.metrics_port = 7003
    assert build_config(args).collector.metrics_port == 7003


def test_should_name_an_unreachable_catalog_in_one_line(tmp_path):
    path = write_config(tmp_path)
    port = free_port()  # closed again: connections are refused
    text = path.read_text().replace(
        f"uri = {toml_value(sqlite_uri(tmp_path))}",
        f'type = "sql"\nuri = "postgresql://icefloe:s3cret@127.0.0.1:{port}/icefloe"')
    path.write_text(text)
    result = run_cli(["collector", "--config", str(path), "--log-level", "error"], tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("icefloe: error: cannot open sql catalog 'icefloe' at "
                               f"postgresql://icefloe:***@127.0.0.1:{port}/icefloe")
    assert "PostgreSQL is running" in lines[0]
    assert "s3cret" not in result.stderr


def test_should_say_when_the_metrics_port_is_in_use(tmp_path, capsys):
    from pipeline.load.run import LocalEngine

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        path = write_config(tmp_path, metrics_port=busy.getsockname()[1])
        config = load_config(path)
        with pytest.raises(ConfigError, match=r"metrics port \d+ on 127.0.0.1 is in") as raised:
            serve_collector(config, engine=LocalEngine())
    assert "--metrics-port" in str(raised.value)


async def _bump_epoch(url: str) -> int:
    store = open_async_store(url)
    try:
        return await ManifestConsumer(store, ManifestConfig(lease_s=2.0),
                                      holder="intruder").initialize()
    finally:
        await store.close()


def _in_background(action: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def go() -> None:
        try:
            action()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread, errors


def test_should_commit_then_exit_3_with_advice_when_fenced(tmp_path, capsys):
    """In-process, no Spark: ready line, rows committed, then another collector takes over."""
    from pipeline.load.run import LocalEngine

    config = load_config(write_config(tmp_path))
    publish_sync(config, [[click(i) for i in range(20)]])
    ready = threading.Event()

    def intrude() -> None:
        assert ready.wait(60)
        wait_for(lambda: table_rows(config, "web.clicks") == 20, 60, "the committed rows")
        asyncio.run(_bump_epoch(config.store.url))

    def announce(info: Any) -> None:
        from icefloe_app.cli.collector_cmd import announce_ready

        announce_ready(info)
        ready.set()

    thread, errors = _in_background(intrude)
    code = serve_collector(config, engine=LocalEngine(), on_ready=announce)
    thread.join(30)
    assert not errors, errors
    assert code == 3
    out, err = capsys.readouterr()
    line = json.loads(out.splitlines()[0])
    assert line["event"] == "ready"
    assert line["epoch"] == 1
    assert line["metrics_port"] > 0
    assert err.startswith("icefloe: error: fenced: another collector took over")
    assert "this collector (epoch 1)" in err
    assert "--takeover" in err


def test_should_stop_cleanly_on_sigterm(tmp_path, capsys):
    """In-process, no Spark: SIGTERM sets the stop event; the run loop ends with exit 0."""
    from pipeline.load.run import LocalEngine

    config = load_config(write_config(tmp_path))
    ready = threading.Event()
    seen: dict[str, Any] = {}

    def terminate() -> None:
        assert ready.wait(60)
        url = f"http://127.0.0.1:{seen['port']}/metrics"
        seen["metrics"] = httpx.get(url, timeout=10).text
        os.kill(os.getpid(), signal.SIGTERM)

    def on_ready(info: Any) -> None:
        seen["port"] = info.metrics_port
        ready.set()

    thread, errors = _in_background(terminate)
    assert serve_collector(config, engine=LocalEngine(), on_ready=on_ready) == 0
    thread.join(30)
    assert not errors, errors
    assert "icefloe_collector_active 1.0" in seen["metrics"]
    assert "icefloe_collector_epoch 1.0" in seen["metrics"]


def test_should_put_catalog_and_warehouse_under_the_data_dir_unless_named(tmp_path,
                                                                         monkeypatch):
    path = write_config(tmp_path, locations=False)
    args = argparse.Namespace(config=str(path), data_dir=str(tmp_path / "data"))
    _, config = config_from_args(args, {"collector": {"metrics_port": 9999}}, env={})
    assert config.store.url == (tmp_path / "data" / "store").as_uri()
    assert config.catalog.uri == f"sqlite:///{tmp_path / 'data' / 'catalog.db'}"
    assert config.catalog.warehouse == (tmp_path / "data" / "warehouse").as_uri()
    assert config.collector.metrics_port == 9999
    _, named = config_from_args(args, env={"ICEFLOE_CATALOG_URI": "sqlite:////elsewhere/c.db"})
    assert named.catalog.uri == "sqlite:////elsewhere/c.db"
    assert named.catalog.warehouse == (tmp_path / "data" / "warehouse").as_uri()
    write_config(tmp_path, locations=True)
    _, from_file = config_from_args(args, env={})
    assert from_file.catalog.uri == f"sqlite:///{tmp_path / 'catalog.db'}"
    assert from_file.store.url == (tmp_path / "store").as_uri()


# --- slow: real processes with Spark (one at a time) --------------------------------------

def _distinct(config: Config, table: str) -> tuple[int, int]:
    rows = read_table(config, table)
    return rows.num_rows, len(pc.unique(rows.column("_event_id")))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_should_survive_kill_9_and_a_takeover_without_loss_or_duplicates(tmp_path):
    path = write_config(tmp_path)
    config = load_config(path)
    log = tmp_path / "collector.log"
    first = Child(["collector", "--config", str(path)], tmp_path, log)
    try:
        ready = first.ready()
        assert ready["metrics_port"] > 0
        metrics = httpx.get(f"http://127.0.0.1:{ready['metrics_port']}/metrics", timeout=10)
        assert "icefloe_collector_active 1.0" in metrics.text
        publish_sync(config, [[click(i) for i in range(k, k + 50)] for k in (0, 50)])
        wait_for(lambda: table_rows(config, "web.clicks") == 100, SPARK_TIMEOUT_S,
                 "the first 100 rows")
        first.proc.kill()  # kill -9: no clean stop, the lease stays "live" for lease_s
        assert first.proc.wait(30) == -signal.SIGKILL
    finally:
        first.close()

    publish_sync(config, [[click(i) for i in range(k, k + 50)] for k in (100, 150, 200)])
    second = Child(["collector", "--config", str(path), "--takeover"], tmp_path, log)
    try:
        taken = second.ready()
        assert taken["epoch"] > ready["epoch"]
        wait_for(lambda: table_rows(config, "web.clicks") == 250, SPARK_TIMEOUT_S,
                 "all 250 rows after the takeover")
        assert second.stop(signal.SIGTERM) == 0
    finally:
        second.close()
    assert _distinct(config, "web.clicks") == (250, 250)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_should_take_events_from_http_into_iceberg_with_up(tmp_path):
    from icefloe.client import HttpClient
    from pipeline.iceberg.catalog import open_catalog

    path = write_config(tmp_path, locations=False)
    data = tmp_path / "data"
    child = Child(["up", "--config", str(path), "--data-dir", str(data), "--http-port", "0",
                   "--grpc-port", "0", "--metrics-port", "0", "--kafka-port", "0",
                   "--otlp-http-port", "0", "--otlp-grpc-port", "0"], tmp_path,
                  tmp_path / "up.log")
    try:
        line = child.wait_line(lambda text: text.strip().startswith("HTTP"), 60)
        base = line.split()[1].split("/v1/")[0]
        with HttpClient(base) as client:
            sent = sum(client.send("clicks", [{"user_id": f"u{i}", "url": f"/p/{i}", "n": i}
                                              for i in range(k, k + 25)])
                       for k in range(0, 100, 25))
        assert sent == 100
        child.wait_line(lambda text: "collector active" in text)
        metrics_line = child.wait_line(lambda text: "(collector)" in text, 10)
        catalog = CatalogSection(uri=f"sqlite:///{data / 'catalog.db'}",
                                 warehouse=(data / "warehouse").as_uri())

        def committed() -> int:
            try:
                return open_catalog(catalog).load_table("web.clicks").scan().to_arrow().num_rows
            except Exception:
                return -1

        wait_for(lambda: committed() == 100, SPARK_TIMEOUT_S, "the 100 events in Iceberg")
        metrics = httpx.get(metrics_line.split()[1], timeout=10).text
        assert 'icefloe_collector_rows_committed_total{table="web.clicks"} 100.0' in metrics
        assert child.stop(signal.SIGTERM) == 0
    finally:
        child.close()
    assert "Traceback" not in (tmp_path / "up.log").read_text(errors="replace")


@pytest.fixture(autouse=True)
def _no_icefloe_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's ICEFLOE_* variables must not leak into these configs."""
    for name in list(os.environ):
        if name.startswith("ICEFLOE_"):
            monkeypatch.delenv(name)
