"""The warm standby collector of ``icefloe up``: a second ``icefloe collector`` process.

Why a second process: a collector that replaces a dead or stalled one must not pay Spark's
start (15 s on a quiet machine, minutes on a busy one) before the next commit. The standby
starts its SparkSession, keeps it warm and waits on the lease (:mod:`collector.runner`);
when the active collector stops renewing (a frozen or suspended process, a lost JVM), it
bumps the epoch and commits within about ``lease_s`` plus one run, and the stale one is
fenced. Exactly-once rests on the epoch and the sequences in Iceberg as for any pair of
collectors, so nothing here is part of the protocol: this module only starts, watches,
restarts and stops the child.

The child runs in its own session (a terminal's Ctrl-C reaches only ``icefloe up``, which
stops it first, so it does not take the lease the active collector releases on the way
out) and gets SIGTERM if ``icefloe up`` dies. Its warnings and errors pass through to
``up``'s stderr, labelled; its ``standby: warm`` and ``ready`` lines become one line each.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Sequence

from icefloe_app.cli.ingestor_group import die_with_parent

PASSED_LEVELS = (" WARNING ", " ERROR ", " CRITICAL ")
"""Log levels of the child shown on ``up``'s stderr (it logs at info, for its warm line)."""


class StandbyCollector:
    """Start, watch, restart and stop the standby ``icefloe collector`` process."""

    def __init__(self, argv: Sequence[str], *, stop_timeout_s: float = 60.0,
                 max_delay_s: float = 30.0) -> None:
        self.argv = list(argv)
        self.stop_timeout_s = stop_timeout_s
        self.max_delay_s = max_delay_s
        self.process: asyncio.subprocess.Process | None = None
        self.warm = asyncio.Event()
        """Set once the current child logged ``standby: warm`` (Spark, store, catalog)."""
        self.active = asyncio.Event()
        """Set once the current child took the lease (its ``ready`` line)."""
        self.epoch: int | None = None
        self.starts = 0
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._readers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start the child now and keep one running until :meth:`stop`."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name="standby-collector")

    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def _spawn(self) -> asyncio.subprocess.Process:
        self.warm.clear()
        self.active.clear()
        self.epoch = None
        process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None)
        self.starts += 1
        self._readers = [asyncio.create_task(self._read_stdout(process)),
                         asyncio.create_task(self._read_stderr(process))]
        return process

    async def _read_stdout(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict) and line.get("event") == "ready":
                    self.epoch = int(line.get("epoch") or 0)
                    self.active.set()
                    port = line.get("metrics_port")
                    print(f"\n  standby collector (pid {process.pid}) took over the queue at "
                          f"epoch {self.epoch}" + (f"; metrics port {port}" if port else ""),
                          flush=True)

    async def _read_stderr(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None
        async for raw in process.stderr:
            text = raw.decode(errors="replace").rstrip()
            if "standby: warm" in text and not self.warm.is_set():
                self.warm.set()
                print(f"  standby  collector pid {process.pid} warm; it takes over if this "
                      "one stops renewing its lease (--no-standby: none)", flush=True)
            elif text.startswith("icefloe: error: ") or any(
                    level in text for level in PASSED_LEVELS):
                print(f"[standby collector] {text}", file=sys.stderr, flush=True)

    async def _supervise(self) -> None:
        """Keep a child running: restart one that exits on its own, with backoff (1 s
        doubling to ``max_delay_s``; back to 1 s once a child got warm or active)."""
        delay = 1.0
        while not self._stopping:
            self.process = process = await self._spawn()
            code = await process.wait()
            await asyncio.gather(*self._readers, return_exceptions=True)
            if self._stopping:
                return
            if self.warm.is_set() or self.active.is_set():
                delay = 1.0
            print(f"icefloe up: the standby collector stopped (exit code {code}); "
                  f"restarting it in {delay:g} s", file=sys.stderr, flush=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_delay_s)

    async def stop(self) -> int | None:
        """SIGTERM the child (a waiting standby exits at once; an active one finishes its
        run), SIGKILL after the timeout; its exit code (None: none was running)."""
        self._stopping = True
        process = self.process
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if process is None:
            return None
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(process.wait(), self.stop_timeout_s)
        except TimeoutError:
            self.kill()
            code = await process.wait()
        await asyncio.gather(*self._readers, return_exceptions=True)
        return code

    def kill(self) -> None:
        """Immediate stop (a second Ctrl-C): safe, like any ``kill -9`` of a collector."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
