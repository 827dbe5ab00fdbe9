"""Helpers for tests that run icefloe commands as real child processes.

Why a thread reads each child's stdout: waits for a line can then time out with the output
so far in the message, instead of hanging the suite on a child that never says "ready".
"""

from __future__ import annotations

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

import msgspec
from collector_support import CLICKS, read_table

from icefloe.config import Column, Config, StreamConfig

SPARK_TIMEOUT_S = 120.0
"""JVM + Python-worker start-up is ~15 s on an idle 2-core machine; allow for a loaded one."""


def toml_value(value: Any) -> str:
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
    lines += [f"{key} = {toml_value(value)}" for key, value in settings.items()]
    if locations:
        lines += ["[store]", f"url = {toml_value((root / 'store').as_uri())}",
                  "[catalog]", f"uri = {toml_value(sqlite_uri(root))}",
                  f"warehouse = {toml_value((root / 'warehouse').as_uri())}"]
    for stream in streams:
        columns = ", ".join(column_toml(c) for c in stream.columns)
        lines += ["[[streams]]", f"name = {toml_value(stream.name)}",
                  f"table = {toml_value(stream.table)}", f"columns = [{columns}]"]
    path = root / "icefloe.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def column_toml(column: Column) -> str:
    """A column as an inline TOML table: name, type, required, and what differs from the
    defaults (mappings, defaults, dialect)."""
    defaults = msgspec.to_builtins(Column(column.name, column.type))
    keys = {k: v for k, v in msgspec.to_builtins(column).items()
            if k in ("name", "type", "required") or v != defaults.get(k)}
    return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in keys.items()) + " }"


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before in this run: the kernel may give the same
    ephemeral port to two binds in a row once the first socket is closed, and a test that
    asks for three ports (HTTP, gRPC, admin) must get three."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Child:
    """A child process whose stdout lines are read by a thread, so waits can time out."""

    def __init__(self, args: list[str], cwd: Path, log: Path,
                 env: dict[str, str] | None = None, *,
                 command: Sequence[str] = (sys.executable, "-m", "icefloe")) -> None:
        """``env``: the child's whole environment (default :func:`child_env`);
        ``command``: what runs ``args`` (an installed ``icefloe`` script, say)."""
        self.log = log
        self._err = log.open("ab")
        self.proc = subprocess.Popen([*command, *args], cwd=cwd,
                                     env=child_env() if env is None else env,
                                     stdout=subprocess.PIPE,
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

    def stdout(self, timeout: float = 10) -> str:
        """All of stdout once the child has exited (the lines not yet waited for too)."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                break
            if line is None:
                self.lines.put(None)
                break
            self.seen.append(line)
        return "".join(self.seen)

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


