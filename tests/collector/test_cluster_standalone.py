"""The collector on a real Spark standalone cluster: a master and one worker started with
the ``spark-class`` pyspark ships, the collector a child process with ``output = "cluster"``.

Why a child process: a process has one SparkContext, and the suite's session fixture is a
``local`` one. Why ``PYTHONPATH``: the executors must run this checkout's code with this
interpreter, as a deployment runs the same image (or the same Python) on every executor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.compute as pc
import pytest
from collector_support import click, publish_sync, read_table
from process_support import SPARK_TIMEOUT_S, Child, free_port, table_rows, wait_for, write_config

from icefloe.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def spark_env() -> dict[str, str]:
    """The environment of the master, the worker (hence the executors) and the collector."""
    import pyspark

    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env.update(SPARK_HOME=os.path.dirname(pyspark.__file__), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    return env


class Standalone:
    """A standalone master and one worker (one core, 1 GiB) on loopback."""

    def __init__(self, root: Path) -> None:
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        spark_class = Path(spark_env()["SPARK_HOME"]) / "bin" / "spark-class"
        with (self.root / f"{name}.log").open("wb") as log:
            self.procs.append(subprocess.Popen(
                [str(spark_class), *args], env=spark_env(), cwd=self.root,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def state(self) -> dict:
        try:
            return httpx.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return {}

    def start(self) -> None:
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        self._start("worker", "org.apache.spark.deploy.worker.Worker", self.url,
                    "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                    "--webui-port", str(free_port()), "--work-dir", str(self.root / "work"))
        # ready when the master's JSON lists the worker as alive
        wait_for(lambda: self.state().get("aliveworkers") == 1, SPARK_TIMEOUT_S,
                 f"a worker registered with {self.url}: {self.tail()}")

    def tail(self) -> str:
        return " | ".join((self.root / f"{n}.log").read_text(errors="replace")[-400:]
                          for n in ("master", "worker") if (self.root / f"{n}.log").exists())

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    cluster = Standalone(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.timeout(300)  # ~45 s (60-70 s on 2 busy cores): master, worker, driver, executor
def test_should_commit_exactly_once_through_a_standalone_cluster(tmp_path, standalone):
    path = write_config(tmp_path, spark_master=standalone.url, output="cluster",
                        spark_partitions=2)
    with path.open("a") as file:  # the executors on this machine reach the driver here
        file.write('[collector.spark_conf]\n"spark.driver.host" = "127.0.0.1"\n'
                   '"spark.driver.bindAddress" = "127.0.0.1"\n'
                   '"spark.executor.memory" = "512m"\n"spark.executor.cores" = 1\n')
    config = load_config(path)
    publish_sync(config, [[click(i) for i in range(k, k + 40)] for k in (0, 40, 80)])
    child = Child(["collector", "--config", str(path)], tmp_path, tmp_path / "collector.log",
                  env=spark_env())
    try:
        child.ready()
        wait_for(lambda: table_rows(config, "web.clicks") == 120, SPARK_TIMEOUT_S,
                 "120 rows committed through the cluster")
        apps = standalone.state().get("activeapps", [])
        assert [app["name"] for app in apps] == ["icefloe-collector"]
        assert apps[0]["cores"] == 1  # the worker's executor ran the job
        assert child.stop(signal.SIGTERM) == 0
    finally:
        child.close()
    rows = read_table(config, "web.clicks")
    assert sorted(pc.unique(rows.column("_event_id")).to_pylist()) == sorted(
        f"c{i}" for i in range(120))
    assert rows.num_rows == 120
    log = (tmp_path / "collector.log").read_text(errors="replace").splitlines()
    not_json = [line for line in log if line.strip() and not _is_json(line)]
    assert not_json == [], not_json  # Spark's own lines are JSON lines too
    assert any('"run sequences' in line for line in log)


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
