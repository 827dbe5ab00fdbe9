"""A small Iceberg REST catalog for tests, with faults on its commit endpoint.

Why it exists: icefloe opens a REST catalog through pyiceberg's ``RestCatalog``, whose
unknown outcomes (a 5xx or a cut connection on ``POST .../tables/{table}``) differ from the
SQL and Glue catalogs'. This server speaks the handful of REST endpoints ``RestCatalog``
uses (config, namespaces, create/load/exists/commit table) over real HTTP on 127.0.0.1 and
keeps the truth in a pyiceberg ``SqlCatalog`` (SQLite) in a temp dir. ``faults`` decides,
per commit, whether to answer normally, to apply the commit and lose the answer, or to
answer an error without applying it.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyiceberg.catalog.rest import CreateTableRequest, TableResponse
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.table import CommitTableRequest

_ERRORS: dict[type[Exception], int] = {
    NoSuchTableError: 404, NoSuchNamespaceError: 404, CommitFailedException: 409,
    NamespaceAlreadyExistsError: 409, TableAlreadyExistsError: 409}


@dataclass
class CommitFault:
    """The next ``times`` commits: ``applied`` (apply, then answer ``status``) or not, and
    ``drop`` (close the connection instead of answering)."""

    applied: bool
    status: int = 500
    times: int = 1
    drop: bool = False
    fired: int = 0


class CommitFaults:
    """Faults of the commit endpoint; the first rule with shots left fires."""

    def __init__(self) -> None:
        self.rules: list[CommitFault] = []
        self.commits = 0  # commits applied, through a fault or not
        self._lock = threading.Lock()

    def add(self, fault: CommitFault) -> CommitFault:
        with self._lock:
            self.rules.append(fault)
        return fault

    def take(self) -> CommitFault | None:
        with self._lock:
            for rule in self.rules:
                if rule.fired < rule.times:
                    rule.fired += 1
                    return rule
        return None


class RestCatalogServer:
    """The running server: ``uri`` for ``RestCatalog``, ``stop()`` when done."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        (root / "warehouse").mkdir(exist_ok=True)
        self.backend = SqlCatalog("rest-backend", uri=f"sqlite:///{root / 'catalog.db'}",
                                  warehouse=(root / "warehouse").as_uri())
        self.faults = CommitFaults()
        self._lock = threading.Lock()  # one commit at a time, as a real catalog's CAS is
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.uri = f"http://127.0.0.1:{self._http.server_port}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True,
                                        name="rest-catalog")
        self._thread.start()

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    # --- the endpoints: each returns (status, JSON body or None) -------------------------

    def config(self, _: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"defaults": {}, "overrides": {}}

    def list_namespaces(self, _: dict[str, Any]) -> tuple[int, Any]:
        return 200, {"namespaces": [list(n) for n in self.backend.list_namespaces()]}

    def create_namespace(self, body: dict[str, Any]) -> tuple[int, Any]:
        namespace = tuple(body["namespace"])
        self.backend.create_namespace(namespace, body.get("properties") or {})
        return 200, {"namespace": list(namespace), "properties": body.get("properties") or {}}

    def load_namespace(self, namespace: str) -> tuple[int, Any]:
        props = self.backend.load_namespace_properties(namespace)
        return 200, {"namespace": [namespace], "properties": props}

    def create_table(self, namespace: str, body: dict[str, Any]) -> tuple[int, Any]:
        # pyiceberg leaves out the fields it has no value for; the model wants them named.
        request = CreateTableRequest.model_validate(
            {"location": None, "partition-spec": None, "write-order": None, **body})
        table = self.backend.create_table(
            (namespace, request.name), request.table_schema, location=request.location,
            partition_spec=request.partition_spec, properties=request.properties,
            **({"sort_order": request.write_order} if request.write_order else {}))
        return 200, _table_response(table.metadata_location, table.metadata)

    def load_table(self, namespace: str, name: str) -> tuple[int, Any]:
        table = self.backend.load_table((namespace, name))
        return 200, _table_response(table.metadata_location, table.metadata)

    def commit(self, namespace: str, name: str, body: dict[str, Any]
               ) -> tuple[int, Any] | CommitFault:
        """Apply a commit unless a fault says otherwise; a fault replaces the answer."""
        request = CommitTableRequest.model_validate(body)
        fault = self.faults.take()
        if fault is not None and not fault.applied:
            return fault
        with self._lock:
            table = self.backend.load_table((namespace, name))
            response = self.backend.commit_table(table, request.requirements,
                                                 request.updates)
            self.faults.commits += 1
        if fault is not None:
            return fault
        return 200, json.loads(response.model_dump_json())


def _table_response(location: str, metadata: Any) -> Any:
    return json.loads(TableResponse(metadata_location=location, metadata=metadata)
                      .model_dump_json())


_TABLE = re.compile(r"^/v1/namespaces/([^/]+)/tables/([^/]+)$")
_TABLES = re.compile(r"^/v1/namespaces/([^/]+)/tables$")
_NAMESPACE = re.compile(r"^/v1/namespaces/([^/]+)$")


class _Handler(BaseHTTPRequestHandler):
    """Routes a request to :class:`RestCatalogServer` and turns its errors into REST ones."""

    server_state: RestCatalogServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet in tests
        pass

    def do_GET(self) -> None:  # http.server names them so
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else {}
        try:
            outcome = self._route(method, urlsplit(self.path).path, body)
        except tuple(_ERRORS) as exc:
            outcome = _error(_ERRORS[type(exc)], exc)
        except Exception as exc:  # a bug in a test server must still answer
            outcome = _error(500, exc)
        if isinstance(outcome, CommitFault):
            if outcome.drop:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            outcome = _error(outcome.status, RuntimeError("injected by the test"))
        status, payload = outcome
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)

    def _route(self, method: str, path: str, body: dict[str, Any]
               ) -> tuple[int, Any] | CommitFault:
        state = self.server_state
        routes: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [
            ("GET", re.compile(r"^/v1/config$"), lambda: state.config(body)),
            ("GET", re.compile(r"^/v1/namespaces$"), lambda: state.list_namespaces(body)),
            ("POST", re.compile(r"^/v1/namespaces$"), lambda: state.create_namespace(body)),
            ("GET", _NAMESPACE, state.load_namespace),
            ("HEAD", _NAMESPACE, state.load_namespace),
            ("POST", _TABLES, lambda ns: state.create_table(ns, body)),
            ("GET", _TABLE, state.load_table),
            ("HEAD", _TABLE, state.load_table),
            ("POST", _TABLE, lambda ns, t: state.commit(ns, t, body)),
        ]
        for verb, pattern, handle in routes:
            match = pattern.match(path)
            if verb == method and match:
                return handle(*(unquote(g) for g in match.groups()))
        return 404, {"error": {"message": f"no route {method} {path}",
                               "type": "NotFound", "code": 404}}


def _error(status: int, exc: Exception) -> tuple[int, Any]:
    return status, {"error": {"message": str(exc) or type(exc).__name__,
                              "type": type(exc).__name__, "code": status}}
