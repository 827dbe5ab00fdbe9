"""A Spark standalone cluster on loopback: a master and N workers started with the
``spark-class`` pyspark ships (the collector's cluster test and ``bench/collector_bench.py``).

Why ``PYTHONPATH`` and ``PYSPARK_PYTHON``: the executors must run this checkout's code with
this interpreter, as a deployment runs the same image (or the same Python) on every
executor.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 120.0
"""Master and workers register in ~10 s on an idle 2-core machine; allow for a loaded one."""
UI_BOUND = re.compile(rb"Successfully started service 'MasterUI' on port (\d+)")
"""The master's log line that names the port its web UI bound."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spark_env() -> dict[str, str]:
    """The environment of the master, the workers (hence the executors) and the driver."""
    import pyspark

    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env.update(SPARK_HOME=os.path.dirname(pyspark.__file__), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    return env


DRIVER_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
               "spark.executor.memory": "512m", "spark.executor.cores": "1"}
"""What a driver on this machine sets so the executors reach it, one core each."""


class Standalone:
    """A standalone master and ``workers`` one-core, 1 GiB workers on loopback."""

    def __init__(self, root: Path, workers: int = 1) -> None:
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.root = root
        self.workers = workers
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        spark_class = Path(spark_env()["SPARK_HOME"]) / "bin" / "spark-class"
        with (self.root / f"{name}.log").open("wb") as log:
            self.procs.append(subprocess.Popen(
                [str(spark_class), *args], env=spark_env(), cwd=self.root,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _bound_ui_port(self) -> int | None:
        """The port the master's web UI bound, from its log (None until it says)."""
        try:
            found = UI_BOUND.search((self.root / "master.log").read_bytes())
        except FileNotFoundError:
            return None
        return int(found.group(1)) if found else None

    def state(self) -> dict[str, Any]:
        """The master's JSON status (empty while it is not answering)."""
        return self.state_at(self.ui_port)

    @staticmethod
    def state_at(ui_port: int) -> dict[str, Any]:
        """The JSON status a master's web UI on ``ui_port`` answers (empty: none)."""
        try:
            state = httpx.get(f"http://127.0.0.1:{ui_port}/json/", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return {}
        return state if isinstance(state, dict) else {}

    def start(self) -> None:
        """Start the master, then the workers once it answers; return once every worker is
        registered. ``url`` is then the port the master bound.

        Why in that order, and why its answer sets ``url``: the port picked for the master is
        free when picked, not when the master binds; a clean-clone CI run saw it taken
        meanwhile (the master moved to the next port, as Spark does, and the worker kept
        calling the first one for 120 s). A worker started before the master binds can
        itself be handed that port for its own RPC server. The web UI's port is picked the
        same way and can move the same way, so it is read from the master's log before it
        is asked anything (else the status would be asked of whatever holds the old port)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        deadline = time.monotonic() + START_TIMEOUT_S
        while (bound := self._bound_ui_port()) is None \
                or not isinstance(url := self.state_at(bound).get("url"), str):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark master did not answer on its UI port "
                                   f"{self.ui_port} in {START_TIMEOUT_S:.0f} s: {self.tail()}")
            time.sleep(0.25)
        self.ui_port, self.url = bound, url
        for i in range(self.workers):
            self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url,
                        "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                        "--webui-port", str(free_port()),
                        "--work-dir", str(self.root / f"work-{i}"))
        while self.state().get("aliveworkers") != self.workers:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.workers} workers did not register with {self.url} "
                                   f"in {START_TIMEOUT_S:.0f} s: {self.tail()}")
            time.sleep(0.25)

    def tail(self) -> str:
        names = ["master", *(f"worker-{i}" for i in range(self.workers))]
        return " | ".join((self.root / f"{n}.log").read_text(errors="replace")[-400:]
                          for n in names if (self.root / f"{n}.log").exists())

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
