"""Registering a model's stream through the admin API: create it, or evolve it.

Why through the admin API and not straight into the registry object: the admin API runs
the same validation as ``icefloe.toml``, creates or evolves the table *before* the registry
changes (a task), and refuses what the table cannot follow (a type change, a new key) with
a message naming the column; this module only adds the rules the server does not apply
because they are about producers, not tables (:func:`evolve_columns`).

Flow: ``GET /v1/sources/{stream}``; absent → ``POST /v1/sources`` with one sink; present
without a sink for the table → ``POST .../sinks``; present → ``PATCH .../sinks/{sink}``
with the evolved columns (nothing sent when nothing changed). A 202 is followed to its
task's end. Every refusal is raised as :class:`~icefloe.errors.RegistryError` carrying the
server's status, code, message and details.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import httpx
import msgspec

from icefloe.client.tls import ClientTls
from icefloe.clock import SYSTEM, Clock
from icefloe.errors import ModelError, RegistryError
from icefloe.streams.model import Column, StreamConfig

_SINK_KEYS = ("unknown_fields", "event_id_field", "partition", "partition_by", "sort_by",
              "table_properties", "primary_key", "tombstone_field")
"""The stream keys a model defines that a sink holds besides its table and columns."""
POLL_S = 0.05
"""How often a task is asked for its state (it makes or evolves a table: ~0.1-1 s)."""


@dataclass(frozen=True, slots=True)
class Registered:
    """What :meth:`~icefloe.pymodels.ModelStream.register` did. ``action``: ``created``
    (the source or its sink and table are new), ``evolved`` (columns changed), or
    ``unchanged``. ``version`` is the registry version that holds the stream (ingestors
    and the collector serve it within ``[admin] registry_poll_s``); ``added`` the columns
    the change added, ``kept`` the optional columns the class no longer has, still
    declared (their table column stays, new rows hold null)."""

    action: Literal["created", "evolved", "unchanged"]
    version: int
    added: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()


def evolve_columns(model: str, registered: Sequence[Column], wanted: Sequence[Column]
                   ) -> tuple[tuple[Column, ...], tuple[str, ...], tuple[str, ...]]:
    """The columns to register when the stream already declares ``registered``:
    ``(columns, added, kept)``.

    Refused (:class:`ModelError` naming the field), because producers of the registered
    class would break or the table would hold rows the class cannot describe:

    * a required field removed (events of the old class carry it, consumers rely on it;
      make it optional (``T | None``) and register first, then remove it);
    * a new field that is required (rows already in the table have no value for it:
      declare it ``T | None = None``);
    * an optional field made required (rows already hold nulls, producers of the old
      class may still send None).

    A removed optional field stays declared (``kept``): producers still running the old
    class keep sending it, and its column keeps its rows. Type changes are the server's
    to judge (the table decides what it can promote) and pass through.
    """
    old = {c.name: c for c in registered}
    new = {c.name: c for c in wanted}
    for column in registered:
        if column.name not in new and column.required:
            raise ModelError(f"{model}.{column.name}: the field was removed, but the "
                             "registered stream requires it; make it optional "
                             f"({column.name}: T | None = None) and register that first, "
                             "then remove it")
    added = []
    for column in wanted:
        before = old.get(column.name)
        if before is None:
            if column.required:
                raise ModelError(f"{model}.{column.name}: a new field must be optional "
                                 f"({column.name}: T | None = None): rows already in the "
                                 "table have no value for it")
            added.append(column.name)
        elif column.required and not before.required:
            raise ModelError(f"{model}.{column.name}: an optional field cannot become "
                             "required: rows already in the table hold nulls, and producers "
                             "of the registered class may still send None")
    kept = tuple(c for c in registered if c.name not in new)
    return (*wanted, *kept), tuple(added), tuple(c.name for c in kept)


def register(stream: StreamConfig, model: str, description: str, admin_url: str,
             token: str, *, timeout: float = 60.0, tls: ClientTls | None = None,
             clock: Clock = SYSTEM) -> Registered:
    """Create or evolve ``stream`` through the admin API at ``admin_url`` (see the module
    doc); ``model`` names the class in refusals. Raises :class:`RegistryError` (a refusal
    by the server, or a task that failed) or :class:`ModelError` (an evolution refused
    here)."""
    verify: ssl.SSLContext | bool = True if tls is None else tls.ssl_context()
    try:
        return _register(stream, model, description, admin_url, token, timeout, verify,
                         clock)
    except httpx.TransportError as exc:
        raise RegistryError(503, "unreachable", f"the admin API at {admin_url} did not "
                            f"answer ({type(exc).__name__}: {exc}); is `icefloe admin` "
                            "running? Nothing was changed unless a task had started: "
                            "registering again is safe") from None


def _register(stream: StreamConfig, model: str, description: str, admin_url: str,
              token: str, timeout: float, verify: ssl.SSLContext | bool, clock: Clock
              ) -> Registered:
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=admin_url.rstrip("/"), headers=headers, timeout=timeout,
                      verify=verify) as http:
        admin = _Admin(http, clock, clock.monotonic() + timeout)
        source_path = f"/v1/sources/{quote(stream.name, safe='')}"
        reply = http.get(source_path)
        if reply.status_code == 404:
            body = {"id": stream.name, "description": description,
                    "tokens": list(stream.tokens), "sinks": [_sink_body(stream)]}
            done = admin.finish(http.post("/v1/sources", json=body))
            return Registered("created", int(done["version"]),
                              tuple(c.name for c in stream.columns))
        current = admin.ok(reply)
        source = current["source"]
        sink = next((s for s in source["sinks"] if s["table"] == stream.table), None)
        if sink is None:
            done = admin.finish(http.post(f"{source_path}/sinks", json=_sink_body(stream)))
            return Registered("created", int(done["version"]),
                              tuple(c.name for c in stream.columns))
        registered = msgspec.convert(sink["columns"], tuple[Column, ...])
        columns, added, kept = evolve_columns(model, registered, stream.columns)
        patch = {"columns": _builtin(columns),
                 **{k: _builtin(getattr(stream, k)) for k in _SINK_KEYS}}
        if all(sink.get(k) == v for k, v in patch.items()):
            return Registered("unchanged", int(current["version"]), kept=kept)
        done = admin.finish(http.patch(f"{source_path}/sinks/{quote(sink['name'], safe='')}",
                                       json=patch))
        return Registered("evolved", int(done["version"]), added, kept)


def _sink_body(stream: StreamConfig) -> dict[str, Any]:
    return {"table": stream.table, "columns": _builtin(stream.columns),
            **{k: _builtin(getattr(stream, k)) for k in _SINK_KEYS}}


def _builtin(value: Any) -> Any:
    """``value`` as its JSON reads back (tuples as lists), to compare with the server's."""
    return msgspec.json.decode(msgspec.json.encode(value))


class _Admin:
    """Answers of the admin API: a body, or the refusal it carries as RegistryError."""

    def __init__(self, http: httpx.Client, clock: Clock, deadline: float) -> None:
        self.http, self.clock, self.deadline = http, clock, deadline

    @staticmethod
    def ok(reply: httpx.Response) -> dict[str, Any]:
        if reply.is_success:
            body: dict[str, Any] = reply.json()
            return body
        try:
            body = reply.json()
            code, message = str(body["error"]), str(body.get("message", ""))
            details = list(body.get("details") or [])
        except (ValueError, KeyError, TypeError):  # not the admin API's body (a proxy's)
            code, message, details = f"http_{reply.status_code}", reply.text[:500], []
        raise RegistryError(reply.status_code, code, message, details)

    def finish(self, reply: httpx.Response) -> dict[str, Any]:
        """The result of a create or change: its body (200/201), or its task's result once
        the task succeeded (202)."""
        body = self.ok(reply)
        if reply.status_code != 202:
            return body
        task = body["task"]
        while task["state"] not in ("succeeded", "failed"):
            if self.clock.monotonic() > self.deadline:
                raise RegistryError(504, "task_timeout", f"task {task['id']} ({task['kind']} "
                                    f"{task['target']}) is still {task['state']} "
                                    f"({task['progress']}); ask GET /v1/tasks/{task['id']}")
            self.clock.sleep_sync(POLL_S)
            task = self.ok(self.http.get(f"/v1/tasks/{task['id']}"))["task"]
        if task["state"] == "failed":
            error = task.get("error") or {}
            code = str(error.get("error", "failed"))
            raise RegistryError(503 if code == "internal" else 409, code,
                                str(error.get("message", "the task failed")),
                                list(error.get("details") or []))
        result: dict[str, Any] = task["result"]
        return result
