"""Store faults over real HTTP, injected by the S3 server itself (chaos runs on S3).

Why both layers: the in-process layer (:mod:`icefloe.store.failpoints`) reaches every
icefloe store call under its retry layer; this one sits in front of the object store on
the wire, so botocore/aiohttp see real 503/500 answers, connections cut before a request is
served, and connections cut *after* a write was applied (the ambiguous case) — and so do
Spark's Python workers, which read batch files with their own clients.

Rules live in the same faults file, marked ``"layer": "http"``::

    {"seed": 3, "rules": [{"layer": "http", "kind": "reset", "probability": 0.1,
                           "methods": ["PUT"]}]}

Kinds: ``slowdown`` (503 SlowDown), ``fail`` (500 InternalError), ``reset`` (the connection
is cut before the request is served), ``lose_response`` (served, then the connection is cut),
``delay`` (``delay_s`` seconds before serving). Each injected fault is logged like the
in-process ones (``<pid> http-<kind> <method>``). :func:`start_moto` starts the S3 server of
a chaos run with these rules in front of it (the generic server, :mod:`.moto_server`, knows
nothing of them: the dependency runs one way).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from icefloe.store.failpoints import WatchedSpec
from testing.chaos.moto_server import FAKE_CREDENTIALS, MotoServer, drop_connection


class HttpFaults:
    """Reads the rules from the faults file (when it changes) and applies them."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.spec = WatchedSpec(path)
        self.log_path = Path(f"{path}.log")
        self.rules: list[dict[str, Any]] = []
        self.rng = random.Random(0)
        self._lock = threading.Lock()

    def _reload(self) -> None:
        spec = self.spec.changed()
        if spec is None:
            return
        self.rules = [r for r in spec.get("rules", []) if r.get("layer") == "http"]
        self.rng.seed(f"http:{spec.get('seed', 0)}")

    def _pick(self, method: str, when: str) -> dict[str, Any] | None:
        with self._lock:
            self._reload()
            for rule in self.rules:
                is_after = rule["kind"] == "lose_response"
                if is_after != (when == "after"):
                    continue
                if method not in rule.get("methods", ("GET", "PUT", "DELETE", "HEAD", "POST")):
                    continue
                if self.rng.random() < float(rule.get("probability", 1.0)):
                    self._record(rule["kind"], method)
                    return rule
        return None

    def _record(self, kind: str, method: str) -> None:
        with contextlib.suppress(OSError), self.log_path.open("a") as log:
            log.write(f"{os.getpid()} http-{kind} {method}\n")

    def before(self, environ: dict[str, Any], start_response: Callable[..., Any]
               ) -> list[bytes] | None:
        """Answer (or cut) the request before it is served, if a rule fires."""
        rule = self._pick(environ.get("REQUEST_METHOD", ""), "before")
        if rule is None:
            return None
        kind = rule["kind"]
        if kind == "delay":
            low, high = rule.get("delay_s", (0.05, 0.2))
            time.sleep(self.rng.uniform(float(low), float(high)))
            return None
        if kind == "reset":
            drop_connection(environ)
        code, status = ("SlowDown", "503 Slow Down") if kind == "slowdown" \
            else ("InternalError", "500 Internal Server Error")
        body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                "<Message>injected by the chaos harness</Message></Error>").encode()
        start_response(status, [("Content-Type", "application/xml"),
                                ("Content-Length", str(len(body)))])
        return [body]

    def drop_after(self, environ: dict[str, Any]) -> bool:
        """Whether to cut the connection after a served request (its answer is lost)."""
        return self._pick(environ.get("REQUEST_METHOD", ""), "after") is not None


def start_moto(faults_file: str | None = None) -> MotoServer:
    """A server for a chaos run; fake credentials go into this process's environment so
    the cluster's processes (which inherit it) reach moto with one identity. With
    ``faults_file``, the rules marked ``"layer": "http"`` in it are applied by the server
    itself, over real HTTP, to every client — Spark's Python workers included."""
    for name, value in FAKE_CREDENTIALS.items():
        os.environ.setdefault(name, value)
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    if faults_file is None:
        return MotoServer()
    faults = HttpFaults(faults_file)
    return MotoServer(intercept=faults.before, drop_after=faults.drop_after)
