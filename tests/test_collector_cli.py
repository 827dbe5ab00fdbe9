"""``icefloe collector`` and ``icefloe up`` as an operator runs them.

Fast tests cover the command's contract without Spark: ``--help``, config errors (exit 2),
an unreachable catalog (exit 1, one line), the ready line, SIGTERM (exit 0) and being fenced
(exit 3), the last ones in-process with the Spark-free :class:`pipeline.run.LocalEngine`.
The slow tests start real processes with Spark — a collector killed with ``kill -9`` and
replaced with ``--takeover`` must neither lose nor duplicate a row, and ``icefloe up`` must
take events from HTTP to the Iceberg table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pyarrow.compute as pc
import pytest
from collector_support import CLICKS, click, publish_sync, read_table

from icefloe.cli import main
from icefloe.cli.collector_cmd import build_config, serve_collector
from icefloe.cli.up_cmd import up_config
from icefloe.config import CatalogSection, Config, StreamConfig, load_config
from icefloe.errors import ConfigError
from icefloe.manifest import ManifestConsumer
from icefloe.manifest.config import ManifestConfig
from icefloe.store import open_async_store

SPARK_TIMEOUT_S = 120.0
"""JVM + Python-worker start-up is ~15 s on an idle 2-core machine; allow for a loaded one."""


# --- helpers -------------------------------------------------------------------------------

def _toml(value: Any) -> str:
    """JSON scalars are valid TOML scalars; that is all these configs need."""
    return json.dumps(value)


def sqlite_uri(root: Path) -> str:
    return "sqlite:///" + str(root / "catalog.db")


def write_config(root: Path, streams: Sequence[StreamConfig] = (CLICKS,), *,
                 locations: bool = True, **collector: Any) -> Path:
    """A real config *file* (child processes read it) on a local store + SQLite catalog."""
    settings = {"metrics_port": 0, "host": "127.0.0.1", "gc_interval_s": 3600,
                "maintenance_interval_s": 3600, "commit_interval_s": 0.5,
                "spark_driver_memory": "1g", **collector}
    lines = ["[ingestor]", 'host = "127.0.0.1"', "[manifest]", "lease_s = 2.0", "[collector]"]
    lines += [f"{key} = {_toml(value)}" for key, value in settings.items()]
    if locations:
        lines += ["[store]", f"url = {_toml((root / 'store').as_uri())}",
                  "[catalog]", f"uri = {_toml(sqlite_uri(root))}",
                  f"warehouse = {_toml((root / 'warehouse').as_uri())}"]
    for stream in streams:
        columns = ", ".join(
            f"{{ name = {_toml(c.name)}, type = {_toml(c.type)}, required = {_toml(c.required)} }}"
            for c in stream.columns)
        lines += ["[[streams]]", f"name = {_toml(stream.name)}", f"table = {_toml(stream.table)}",
                  f"columns = [{columns}]"]
    path = root / "icefloe.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Child:
    """A child process whose stdout lines are read by a thread, so waits can time out."""

    def __init__(self, args: list[str], cwd: Path, log: Path) -> None:
        self.log = log
        self._err = log.open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "icefloe", *args], cwd=cwd,
                                     env=child_env(), stdout=subprocess.PIPE,
                                     stderr=self._err, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_line(self, match: Callable[[str], bool], timeout: float = SPARK_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self.lines.get(timeout=max(left, 0.01))
            except queue.Empty:
                raise AssertionError(f"no matching line in {timeout:.0f} s; stdout so far: "
                                     f"{self.seen}; stderr tail: {self.tail()}") from None
            if line is None:
                raise AssertionError(f"exited with {self.proc.wait(10)} before the line; "
                                     f"stdout: {self.seen}; stderr tail: {self.tail()}")
            self.seen.append(line)
            if match(line):
                return line

    def ready(self) -> dict[str, Any]:
        line = self.wait_line(lambda text: text.startswith("{") and '"ready"' in text)
        return json.loads(line)

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self._err.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._err.close()


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.25)


def table_rows(config: Config, name: str) -> int:
    try:
        return read_table(config, name).num_rows
    except Exception:  # not created yet
        return -1


def run_cli(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "icefloe", *args], cwd=cwd, env=child_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


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
        f"uri = {_toml(sqlite_uri(tmp_path))}",
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
    from pipeline.run import LocalEngine

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
    from pipeline.run import LocalEngine

    config = load_config(write_config(tmp_path))
    publish_sync(config, [[click(i) for i in range(20)]])
    ready = threading.Event()

    def intrude() -> None:
        assert ready.wait(60)
        wait_for(lambda: table_rows(config, "web.clicks") == 20, 60, "the committed rows")
        asyncio.run(_bump_epoch(config.store.url))

    def announce(info: Any) -> None:
        from icefloe.cli.collector_cmd import announce_ready

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
    from pipeline.run import LocalEngine

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
    args = argparse.Namespace(config=str(path), data_dir=str(tmp_path / "data"),
                              http_port=None, grpc_port=None, metrics_port=9999)
    _, config = up_config(args, env={})
    assert config.store.url == (tmp_path / "data" / "store").as_uri()
    assert config.catalog.uri == f"sqlite:///{tmp_path / 'data' / 'catalog.db'}"
    assert config.catalog.warehouse == (tmp_path / "data" / "warehouse").as_uri()
    assert config.collector.metrics_port == 9999
    _, named = up_config(args, env={"ICEFLOE_CATALOG_URI": "sqlite:////elsewhere/c.db"})
    assert named.catalog.uri == "sqlite:////elsewhere/c.db"
    assert named.catalog.warehouse == (tmp_path / "data" / "warehouse").as_uri()
    write_config(tmp_path, locations=True)
    _, from_file = up_config(args, env={})
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
    from pipeline.catalog import open_catalog

    path = write_config(tmp_path, locations=False)
    data = tmp_path / "data"
    child = Child(["up", "--config", str(path), "--data-dir", str(data), "--http-port", "0",
                   "--grpc-port", "0", "--metrics-port", "0"], tmp_path, tmp_path / "up.log")
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
