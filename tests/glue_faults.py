"""A moto server (Glue + S3) with faults on Glue's ``UpdateTable``, the commit of a Glue
Iceberg table.

Why a wrapper around moto's WSGI app: the fault sits at the catalog's HTTP boundary, where
real ones happen. A rule either forwards the request (moto applies it) and then answers 500
or cuts the connection — the client never learns its commit landed — or answers 500
without forwarding. botocore retries both, exactly as it would against AWS.

Moto ignores ``UpdateTable``'s ``VersionId``; AWS Glue refuses a stale one with
``ConcurrentModificationException`` (the optimistic lock pyiceberg relies on). The wrapper
enforces it, so a retried, already-applied ``UpdateTable`` is refused as on AWS.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from testing.chaos.moto_server import SerializedApp

_DROP = "icefloe.test.drop"


@dataclass
class UpdateFault:
    """The next ``times`` UpdateTable calls: ``applied`` or not, then a 500 or a cut."""

    applied: bool
    times: int = 1
    drop: bool = False
    fired: int = 0


class GlueFaultApp:
    """WSGI middleware in front of moto: Glue's version check and lost UpdateTable answers."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self.rules: list[UpdateFault] = []
        self.updates_applied = 0
        self.conflicts = 0
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        if environ.get("HTTP_X_AMZ_TARGET") != "AWSGlue.UpdateTable":
            return self._app(environ, start_response)
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        environ["wsgi.input"] = io.BytesIO(body)
        request = json.loads(body)
        with self._lock:
            if _stale(request):
                self.conflicts += 1
                return _error(start_response, 400, "ConcurrentModificationException",
                              "the table changed since the version given")
            fault = self._take()
            if fault is not None and not fault.applied:
                return self._lose(fault, environ, start_response)
            held: list[Any] = []
            answer = list(self._app(environ, lambda *args: held.append(args)))
            self.updates_applied += 1
        if fault is not None:
            return self._lose(fault, environ, start_response)
        start_response(*held[0])
        return answer

    def _take(self) -> UpdateFault | None:
        for rule in self.rules:
            if rule.fired < rule.times:
                rule.fired += 1
                return rule
        return None

    def _lose(self, fault: UpdateFault, environ: dict[str, Any],
              start_response: Callable[..., Any]) -> Iterable[bytes]:
        if fault.drop:
            environ[_DROP] = True  # SerializedApp cuts the connection after this returns
        return _error(start_response, 500, "InternalServiceException", "injected by the test")


def _stale(request: dict[str, Any]) -> bool:
    """Whether ``VersionId`` is given and is not the table's current version (AWS: refused)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.glue.models import glue_backends

    version = request.get("VersionId")
    if version is None:
        return False
    backend = glue_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    table = backend.get_table(request["DatabaseName"], request["TableInput"]["Name"])
    return str(table.as_dict()["VersionId"]) != str(version)


def _error(start_response: Callable[..., Any], status: int, code: str, message: str
           ) -> list[bytes]:
    body = json.dumps({"__type": code, "message": message}).encode()
    start_response(f"{status} {code}", [("Content-Type", "application/x-amz-json-1.1"),
                                        ("Content-Length", str(len(body))),
                                        ("x-amzn-ErrorType", code)])
    return [body]


class GlueServer:
    """moto (Glue and S3) on a free 127.0.0.1 port behind :class:`GlueFaultApp`."""

    def __init__(self) -> None:
        from moto.server import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.faults = GlueFaultApp(DomainDispatcherApplication(create_backend_app))
        app = SerializedApp(self.faults, drop_after=lambda environ: environ.get(_DROP, False))
        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="moto-glue")
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
