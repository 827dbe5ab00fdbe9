"""N ingestor processes sharing one HTTP and one gRPC port, supervised by ``icefloe up``.

Why processes: one ingestor is CPU-bound on one core (HTTP parsing, JSON validation,
framing); N processes use N cores. Why shared ports (``SO_REUSEPORT``): clients keep one
address and the kernel spreads connections, which is what a load balancer would do in a
real deployment. The ports are checked and *reserved* here first (a bound, non-listening
socket), so "port in use" is one clear error and a port 0 becomes one concrete port all
children share.

Children run in their own session, so a terminal's Ctrl-C reaches only ``icefloe up``,
which stops them in order (SIGTERM: drain, then exit). On Linux they also get SIGTERM if
``icefloe up`` itself dies, so no ingestor outlives its supervisor. A child that crashes
after start-up is restarted with backoff; one that fails during start-up fails ``up``
with its own last error line.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import json
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from icefloe.errors import ConfigError, IcefloeError

_PR_SET_PDEATHSIG = 1


def reserve_port(host: str, port: int, what: str, flag: str, env: str) -> socket.socket:
    """A bound (not listening) ``SO_REUSEPORT`` socket holding ``port`` for the children.

    First an exclusive bind proves nobody else is on the port: a reuse-port bind alone
    would silently share it with another ``icefloe up`` of the same user.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"{what} port {port} on {host} is already in use: stop the "
                                  f"other process or choose another port ({flag}, {env})"
                                  ) from None
            raise ConfigError(f"cannot bind {what} to {host}:{port}: {exc.strerror}") from None
        port = probe.getsockname()[1]
    holder = socket.socket(family)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        holder.bind((host, port))
    except OSError as exc:  # taken in the instant between the probe and here
        holder.close()
        raise ConfigError(f"{what} port {port} on {host}: {exc.strerror}") from None
    return holder


def die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM when the parent dies (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class _Child:
    index: int
    process: asyncio.subprocess.Process
    stats: dict[str, float] = field(default_factory=dict)
    last_error: str = ""
    ready: asyncio.Future[dict[str, int]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    readers: list[asyncio.Task[None]] = field(default_factory=list)


class IngestorGroup:
    """Start, watch, restart and stop ``count`` ingestor processes."""

    def __init__(self, count: int, argv: Sequence[str], *, start_timeout_s: float = 60.0,
                 stop_timeout_s: float = 30.0, shard_base: int | None = None) -> None:
        self.count = count
        self.argv = list(argv)
        self.shard_base = shard_base
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.children: list[_Child] = []
        self.restarts = 0
        self._stopping = False
        self._watchers: list[asyncio.Task[None]] = []
        self._base_accepted = 0.0  # events accepted by children that have since exited
        self._base_rejected = 0.0

    async def start(self) -> None:
        """Start every child and wait until each one listens (or fail with its reason)."""
        self.children = [await self._spawn(i) for i in range(self.count)]
        try:
            await asyncio.wait_for(asyncio.gather(*(c.ready for c in self.children)),
                                   self.start_timeout_s)
        except TimeoutError:
            await self.stop()
            raise IcefloeError(f"the ingestors did not start within {self.start_timeout_s:g} s"
                               ) from None
        except IcefloeError:
            await self.stop()
            raise
        self._watchers = [asyncio.create_task(self._supervise(i)) for i in range(self.count)]

    def _env(self, index: int) -> dict[str, str] | None:
        """Child ``index``'s environment: with ``shard_base``, its own
        ``ingestor.shard_index`` (base + index), so the children of one ``icefloe up``
        spread over the manifest shards exactly instead of by hashed names."""
        if self.shard_base is None:
            return None
        return {**os.environ, "ICEFLOE_INGESTOR_SHARD_INDEX": str(self.shard_base + index)}

    async def _spawn(self, index: int) -> _Child:
        process = await asyncio.create_subprocess_exec(
            *self.argv, env=self._env(index), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None)
        child = _Child(index, process)
        child.readers = [asyncio.create_task(self._read_stdout(child)),
                         asyncio.create_task(self._read_stderr(child))]
        return child

    async def _read_stdout(self, child: _Child) -> None:
        assert child.process.stdout is not None
        async for raw in child.process.stdout:
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if line.get("event") == "ready" and not child.ready.done():
                    child.ready.set_result(line)
                elif line.get("event") == "stats":
                    child.stats = line
        if not child.ready.done():
            code = await child.process.wait()
            reason = child.last_error or f"exited with code {code}"
            child.ready.set_exception(IcefloeError(f"ingestor {child.index + 1}: {reason}"))

    async def _read_stderr(self, child: _Child) -> None:
        """Keep the child's last error line and pass its log lines through, labelled."""
        assert child.process.stderr is not None
        async for raw in child.process.stderr:
            text = raw.decode(errors="replace").rstrip()
            if not text:
                continue
            if text.startswith("icefloe: error: "):
                child.last_error = text[len("icefloe: error: "):]
            else:
                print(f"[ingestor {child.index + 1}] {text}", file=sys.stderr, flush=True)

    async def _supervise(self, index: int) -> None:
        """Restart a child that exits on its own, with backoff (1 s doubling to 30 s)."""
        delay = 1.0
        while True:
            child = self.children[index]
            code = await child.process.wait()
            if self._stopping:
                return
            self._base_accepted += child.stats.get("accepted", 0.0)
            self._base_rejected += child.stats.get("rejected", 0.0)
            why = child.last_error or f"exit code {code}"
            print(f"icefloe up: ingestor {index + 1} stopped ({why}); restarting in "
                  f"{delay:g} s", file=sys.stderr, flush=True)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            self.restarts += 1
            self.children[index] = replacement = await self._spawn(index)
            with contextlib.suppress(IcefloeError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(replacement.ready), self.start_timeout_s)
                print(f"icefloe up: ingestor {index + 1} is serving again (pid "
                      f"{replacement.process.pid})", file=sys.stderr, flush=True)
                delay = 1.0
                continue
            delay = min(delay * 2, 30.0)

    def totals(self) -> dict[str, float]:
        """Events accepted and rejected by all children (also those restarted since)."""
        return {"accepted": self._base_accepted + sum(c.stats.get("accepted", 0.0)
                                                      for c in self.children),
                "rejected": self._base_rejected + sum(c.stats.get("rejected", 0.0)
                                                      for c in self.children)}

    async def stop(self) -> list[int]:
        """SIGTERM every child (each drains its buffer), SIGKILL after the timeout; the
        exit codes."""
        self._stopping = True
        for watcher in self._watchers:
            watcher.cancel()
        for child in self.children:
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        codes: list[int] = []
        for child in self.children:
            try:
                code = await asyncio.wait_for(child.process.wait(), self.stop_timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                code = await child.process.wait()
            if code == -signal.SIGTERM and not _was_ready(child):
                code = 0  # stopped while still starting (a restart): it accepted nothing
            codes.append(code)
        for child in self.children:  # the last log lines of a draining child
            await asyncio.gather(*child.readers, return_exceptions=True)
        return codes

    def kill(self) -> None:
        """Immediate stop (a second Ctrl-C): safe, acked events are already durable."""
        for child in self.children:
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()


def _was_ready(child: _Child) -> bool:
    """Whether the child announced itself ready (so it may have accepted events)."""
    ready = child.ready
    return ready.done() and not ready.cancelled() and ready.exception() is None

