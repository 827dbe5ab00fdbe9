"""A real icefloe cluster on this machine for a chaos run: K ingestors, collectors, a store.

Why real processes: the claim under test — nothing acknowledged is lost, nothing is
duplicated — is about what survives ``kill -9``, restarts and fencing, which only separate
processes can show. Every process gets ``ICEFLOE_STORE_FAULTS`` pointing at one faults
file (see :mod:`icefloe.store.failpoints`), so the harness breaks the store for all of them
at once by rewriting that file.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icefloe.store.failpoints import FAULTS_ENV

STREAMS = ("chaos_http", "chaos_grpc")
"""One stream per transport; both keep the client's id as the event id."""
KAFKA_STREAM = "chaos_kafka"
"""The Kafka producers' stream (``--kafka``). No ``event_id_field``: its event ids are the
idempotent producer's (producer id, epoch, sequence), the retry safety under test."""


def streams(kafka: bool) -> tuple[str, ...]:
    return (*STREAMS, KAFKA_STREAM) if kafka else STREAMS


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class StoreTarget:
    """Where the cluster's objects go: a local directory or a bucket on a moto server."""

    url: str
    endpoint_url: str | None = None


def write_config(root: Path, store: StoreTarget, kafka: bool = False) -> Path:
    """The cluster's ``icefloe.toml``: small buffers (so slow stores fill them and clients
    see 429s), short leases (so kills are noticed quickly), frequent GC and maintenance."""
    endpoint = f'endpoint_url = "{store.endpoint_url}"\nregion = "us-east-1"\n' \
        if store.endpoint_url else ""
    columns = ('[{ name = "id", type = "string", required = true }, '
               '{ name = "client", type = "string", required = true }, '
               '{ name = "n", type = "long" }, { name = "sent_at", type = "timestamp" }]')
    tables = "".join(
        f'[[streams]]\nname = "{name}"\ntable = "chaos.{name.removeprefix("chaos_")}"\n'
        + ('kafka_partitions = 2\n' if name == KAFKA_STREAM else 'event_id_field = "id"\n')
        + f'columns = {columns}\n\n' for name in streams(kafka))
    text = f"""# written by the chaos harness
[store]
url = "{store.url}"
{endpoint}
[catalog]
uri = "sqlite:///{root / 'catalog.db'}"
warehouse = "{(root / 'warehouse').as_uri()}"

[manifest]
lease_s = 3.0
append_deadline_s = 10.0
gc_grace_s = 310.0
producer_ttl_s = 310.0

[ingestor]
host = "127.0.0.1"
flush_age_ms = 50.0
max_body_bytes = 131072
flush_bytes = 131072
buffer_max_bytes = 524288
flush_timeout_s = 5.0
shutdown_timeout_s = 15.0

[collector]
host = "127.0.0.1"
metrics_port = 0
commit_interval_s = 0.5
gc_interval_s = 5.0
maintenance_interval_s = 15.0
snapshot_keep_last = 100000
snapshot_max_age_s = 86400.0
orphan_age_s = 60.0
spark_driver_memory = "1g"
retry_max_delay_s = 2.0

{tables}"""
    path = root / "icefloe.toml"
    path.write_text(text)
    return path


@dataclass
class Proc:
    """One icefloe process: its stdout lines are read by a thread, stderr goes to a log."""

    role: str
    args: list[str]
    popen: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    started: float = field(default_factory=time.monotonic)
    ready: dict[str, Any] | None = None
    ready_at: float | None = None
    """When its ``ready`` line was read (monotonic)."""
    reaped: bool = False
    log_path: Path | None = None
    """This process's own stderr log (collectors: their warm-up and takeover lines)."""

    def pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_ready(self, timeout: float) -> dict[str, Any] | None:
        """The ``ready`` JSON line, or None if the process exited or the time ran out."""
        deadline = time.monotonic() + timeout
        while self.ready is None:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict) and parsed.get("event") == "ready":
                    self.ready = parsed
                    self.ready_at = time.monotonic()
        return self.ready

    def alive(self) -> bool:
        return self.popen.poll() is None

    def logged(self, text: str) -> bool:
        """``text`` is in this process's own log (False without one)."""
        if self.log_path is None or not self.log_path.exists():
            return False
        return text in self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """``kill -9``."""
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        self.popen.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM and wait (SIGKILL after ``timeout``); the exit code."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(30)


class Cluster:
    """Starts, kills and restarts the processes of one chaos run."""

    def __init__(self, root: Path, store: StoreTarget, ingestors: int,
                 kafka: bool = False) -> None:
        self.root = root
        self.store = store
        self.kafka = kafka
        self.streams = streams(kafka)
        self.config = write_config(root, store, kafka)
        self.faults_file = root / "faults.json"
        self.faults_file.write_text("{}")
        self.ports = [(free_port(), free_port(), free_port()) for _ in range(ingestors)]
        self.ingestors: list[Proc | None] = [None] * ingestors
        self.collectors: list[Proc] = []
        self.exits: list[tuple[str, int]] = []
        self.failed_starts = 0
        self._log = (root / "processes.log").open("ab")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
        env.update({FAULTS_ENV: str(self.faults_file), "PYTHONUNBUFFERED": "1",
                    "SPARK_LOCAL_IP": "127.0.0.1", "GRPC_ENABLE_FORK_SUPPORT": "false"})
        return env

    def _spawn(self, role: str, args: list[str], log_path: Path | None = None) -> Proc:
        if log_path is None:
            popen = subprocess.Popen([sys.executable, "-m", "icefloe", *args], cwd=self.root,
                                     env=self.env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._log, text=True)
        else:
            with log_path.open("ab") as own_log:
                popen = subprocess.Popen([sys.executable, "-m", "icefloe", *args],
                                         cwd=self.root, env=self.env(),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=own_log, text=True)
        proc = Proc(role, args, popen, log_path=log_path)
        threading.Thread(target=proc.pump, daemon=True, name=f"pump-{role}").start()
        return proc

    # -- ingestors ---------------------------------------------------------------------------

    def start_ingestor(self, index: int, timeout: float = 60, attempts: int = 10) -> Proc:
        """Start ingestor ``index`` on its ports, retrying like a supervisor would: one
        restarted during a store-fault burst may fail its start-up store probe and exit."""
        http, grpc, kafka = self.ports[index]
        listeners = ["--kafka-port", str(kafka)] if self.kafka else []
        for attempt in range(1, attempts + 1):
            proc = self._spawn(f"ingestor-{index}", [
                "ingestor", "--config", str(self.config), "--http-port", str(http),
                "--grpc-port", str(grpc), *listeners, "--log-format", "text",
                "--log-level", "warning"])
            if proc.wait_ready(timeout) is not None:
                self.ingestors[index] = proc
                return proc
            proc.kill()
            self.exits.append((proc.role, proc.popen.returncode or 0))
            proc.reaped = True
            self.failed_starts += 1
            time.sleep(min(5.0, 0.5 * attempt))
        raise RuntimeError(f"ingestor {index} did not start {attempts} times in a row; see "
                           f"{self._log.name}")

    def http_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{http}" for http, _, _ in self.ports]

    def grpc_targets(self) -> list[str]:
        return [f"127.0.0.1:{grpc}" for _, grpc, _ in self.ports]

    def kafka_bootstraps(self) -> list[str]:
        return [f"127.0.0.1:{kafka}" for _, _, kafka in self.ports]

    # -- collectors --------------------------------------------------------------------------

    def start_collector(self, *, takeover: bool = False) -> Proc:
        """A collector logging at info level to its own file: a standby's "standby: warm"
        line is looked for there, and every takeover is timed from its lines
        (:mod:`testing.chaos.takeovers`)."""
        role = f"collector-{len(self.collectors)}"
        args = ["collector", "--config", str(self.config), "--log-format", "text",
                "--log-level", "info"]
        if takeover:
            args.append("--takeover")
        proc = self._spawn(role, args, self.root / f"{role}.log")
        self.collectors.append(proc)
        return proc

    def live_collectors(self) -> list[Proc]:
        return [p for p in self.collectors if p.alive()]

    def reap(self) -> None:
        """Record exit codes of processes that ended (a fenced collector exits 3)."""
        for proc in [*self.collectors, *(p for p in self.ingestors if p is not None)]:
            code = proc.popen.poll()
            if code is not None and not proc.reaped:
                proc.reaped = True
                self.exits.append((proc.role, code))

    def close(self) -> None:
        for proc in [*self.collectors, *(p for p in self.ingestors if p is not None)]:
            if proc.alive():
                proc.kill()
        self._log.close()
