"""Run the OpenTelemetry JavaScript SDK's OTLP exporters (``tests/js/export.mjs``) from pytest.

Why Node and not only the Python SDK: the issue asks for the real clients services run, and
the JS exporters differ from Python's on the wire (OTLP/JSON with integer attributes as JSON
numbers, doubles for every counter, their own retry and partial-success handling). The
packages are pinned by ``tests/js/package-lock.json`` and installed by ``make test`` (the
``npm ci`` stamp in the Makefile); a missing install is an error that says so, never a skip.

One call is one Node process: it builds the SDK pipeline (resource ``service.name``, a batch
processor or a metric reader, the exporter of the protocol), emits ``count`` log records /
spans / metric points per instrument, force-flushes, and prints one JSON line, returned as
:class:`JsExport`. With an in-process ingestor use :func:`export_async`, which does not block
the event loop that serves the export.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
JS_DIR = ROOT / "tests" / "js"
SCRIPT = JS_DIR / "export.mjs"
PROTOCOLS = ("http/json", "http/protobuf", "grpc")
SIGNALS = ("logs", "traces", "metrics")
METRIC_KINDS_PER_COUNT = {"sum": 2, "gauge": 1, "histogram": 1, "exponential_histogram": 1}
"""Data points per kind for ``count`` = 1: a counter and an up-down counter (sums), a gauge,
an explicit-bucket histogram and an exponential histogram, one point per attribute set."""


@dataclass(frozen=True)
class JsExport:
    """What the Node script exported and what its exporter answered (its JSON line)."""

    signal: str
    protocol: str
    service: str
    items: int
    exports: int
    ok: bool
    results: list[dict[str, Any]]
    warnings: list[str]
    flush_error: str | None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[str]:
        """Every error an export call answered, for assertion messages."""
        return [r["error"] for r in self.results if r.get("error")]


def node() -> str:
    """The ``node`` executable, or a test error saying how to get the JS packages."""
    path = shutil.which("node")
    if path is None:
        pytest.fail("node is not on PATH: install Node.js 20 or later (the OTLP tests run the "
                    "OpenTelemetry JS exporters with it), then run `make test`", pytrace=False)
    if not (JS_DIR / "node_modules" / "@opentelemetry" / "sdk-logs").is_dir():
        pytest.fail(f"the OpenTelemetry JS packages are not installed in {JS_DIR}/node_modules: "
                    "run `make test` (or `npm ci --prefix tests/js`)", pytrace=False)
    return path


def command(endpoint: str, protocol: str, signal: str, *, token: str = "", count: int = 10,
            service: str = "icefloe-js-test", compression: str = "none",
            timeout_ms: int = 10_000, batch_size: int = 512) -> list[str]:
    """The Node command line; ``endpoint`` is the base URL (``http://host:port``)."""
    if protocol not in PROTOCOLS or signal not in SIGNALS:
        raise ValueError(f"protocol must be one of {PROTOCOLS} and signal one of {SIGNALS}, "
                         f"not {protocol!r}, {signal!r}")
    return [node(), str(SCRIPT), "--endpoint", endpoint, "--protocol", protocol,
            "--signal", signal, "--token", token, "--count", str(count), "--service", service,
            "--compression", compression, "--timeout-ms", str(timeout_ms),
            "--batch-size", str(batch_size)]


def parse(stdout: str, stderr: str, returncode: int) -> JsExport:
    """The script's JSON line as :class:`JsExport`; anything else fails the test with output."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if returncode != 0 or not lines:
        pytest.fail(f"export.mjs exited {returncode} without its JSON line:\nstdout: "
                    f"{stdout[-2000:]}\nstderr: {stderr[-2000:]}", pytrace=False)
    line = json.loads(lines[-1])
    known = {"signal", "protocol", "service", "items", "exports", "ok", "results", "warnings",
             "flush_error", "endpoint"}
    return JsExport(signal=line["signal"], protocol=line["protocol"], service=line["service"],
                    items=line["items"], exports=line["exports"], ok=line["ok"],
                    results=line["results"], warnings=line["warnings"],
                    flush_error=line["flush_error"],
                    details={k: v for k, v in line.items() if k not in known})


def export(endpoint: str, protocol: str, signal: str, *, timeout_s: float = 60.0,
           **options: Any) -> JsExport:
    """Run one export in a Node process and wait for it (blocking: not with an in-process
    ingestor on this thread's loop; use :func:`export_async` there)."""
    args = command(endpoint, protocol, signal, **options)
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s,
                              check=False, cwd=JS_DIR)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"export.mjs did not finish in {timeout_s} s: {' '.join(args)}\n"
                    f"stderr: {exc.stderr!r}", pytrace=False)
    return parse(done.stdout, done.stderr, done.returncode)


async def export_async(endpoint: str, protocol: str, signal: str, *, timeout_s: float = 60.0,
                       **options: Any) -> JsExport:
    """:func:`export` as a coroutine: the loop keeps serving the ingestor meanwhile."""
    args = command(endpoint, protocol, signal, **options)
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=JS_DIR)
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        pytest.fail(f"export.mjs did not finish in {timeout_s} s: {' '.join(args)}",
                    pytrace=False)
    return parse(stdout.decode(), stderr.decode(), process.returncode or 0)
