"""The admin API: sources, sinks, tokens and tasks over HTTP (Starlette on uvicorn).

Why these shapes: every change is validated at once against the current registry, so a
bad request gets its 400/404/409 with the offending fields straight away; changes that
need a table (a new sink, new columns) answer ``202`` with a task that creates or evolves
the table and then applies the change (:mod:`icefloe_app.api.tasks`); everything else is applied by
compare-and-swap before the answer. Errors share the ingest API's body:
``{"error": code, "message": ..., "details": [{"field", "reason"}]}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route

from icefloe.config import split_key_path
from icefloe.errors import ConfigError, ManifestCorruptError, RegistryError, StoreError
from icefloe.registry import ops, settings
from icefloe.registry.model import Registry, Sink, Source
from icefloe.registry.store import RegistryStore
from icefloe.schemas.store import SchemaStore, schema_key
from icefloe.streams.layout import check_raw_partition
from icefloe.tokens import new_token
from icefloe_app.api.auth import AdminAuth, Throttled
from icefloe_app.api.keboola import keboola_routes
from icefloe_app.api.openapi import openapi_document
from icefloe_app.api.schema_registry import (
    SchemaRegistryApi,
    is_registry_path,
    refuse,
    schema_registry_routes,
)
from icefloe_app.api.tasks import Tasks

log = logging.getLogger("icefloe.admin")

MAX_BODY = 1024 * 1024
PendingCounter = Callable[[str], Awaitable[int]]
"""Unacknowledged manifest entries holding events of a source (undelivered data)."""

Handler = Callable[[Request], Awaitable[Response]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> Response:
    return Response(msgspec.json.encode(body), status, headers=headers,
                    media_type="application/json")


def error(status: int, code: str, message: str,
          details: list[dict[str, str]] | None = None) -> Response:
    return json_response({"error": code, "message": message, "details": details or []},
                         status)


def allowed_methods(routes: list[Route], request: Request) -> str:
    """The ``Allow`` value of a 405: the methods of every route whose path matches (one
    path has several routes here, one per method, and Starlette names only the first's)."""
    methods: set[str] = set()
    for route in routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE and route.methods:
            methods |= route.methods
    return ", ".join(sorted(methods))


def sink_json(source: Source, sink: Sink) -> dict[str, Any]:
    out = msgspec.to_builtins(sink)
    out["source"] = source.id
    out["toggles"] = [msgspec.to_builtins(t) for t in sink.toggles]
    return out


def source_json(source: Source) -> dict[str, Any]:
    """A source without its token hashes (only how many it has) and with live sinks only."""
    return {"id": source.id, "description": source.description,
            "tokens": len(source.tokens), "unrouted": source.unrouted,
            "rate_limit": msgspec.to_builtins(source.rate_limit),
            "created_version": source.created_version,
            "updated_version": source.updated_version,
            "sinks": [sink_json(source, s) for s in source.live_sinks()]}


class AdminMetrics:
    """``/metrics`` of the admin process: calls by operation and status, tasks by outcome,
    and the registry version it last read."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("icefloe_admin_requests", "Admin API calls",
                                ["operation", "status"], registry=r)
        self.tasks = Counter("icefloe_admin_tasks", "Finished tasks by kind and state",
                             ["kind", "state"], registry=r)
        self.schema_requests = Counter("icefloe_schema_registry_requests",
                                       "Schema registry (Confluent API) calls",
                                       ["operation", "status"], registry=r)
        self.registry_version = Gauge("icefloe_admin_registry_version",
                                      "Registry version last read or written", registry=r)


class AdminApi:
    """The routes, bound to one registry store, task runner and auth."""

    def __init__(self, registry: RegistryStore, tasks: Tasks, auth: AdminAuth, *,
                 pending: PendingCounter, metrics: AdminMetrics | None = None,
                 cluster_output: bool = False, schemas: SchemaStore | None = None) -> None:
        self.cluster_output = cluster_output
        """The collector writes through the cluster output path. Nothing is refused for it
        any more (both output paths accept every registry, #28); kept so a caller can say
        which path serves the registry."""
        self.registry = registry
        self.clock = registry.clock
        """Stamps every change made through the API (the registry store's clock: injected,
        so a test or the simulator drives it)."""
        self.tasks = tasks
        self.auth = auth
        self.pending = pending
        self.metrics = metrics or AdminMetrics()
        tasks.on_finish = lambda task: self.metrics.tasks.labels(task.kind, task.state).inc()
        self.schemas = schemas or SchemaStore(registry.store, schema_key(registry.key),
                                              clock=registry.clock)
        """The schema registry (Confluent's paths), next to the stream registry."""
        tasks.unowned = self._unowned

    async def _unowned(self, table: str) -> bool:
        """No live sink of the current registry writes ``table``."""
        return (await self.current()).owner_of(table) is None

    # -- plumbing -------------------------------------------------------------------------

    def guarded(self, handler: Handler) -> Handler:
        """Bearer auth, then the handler, with refusals turned into JSON errors."""

        async def wrapped(request: Request) -> Response:
            response = await checked(request)
            self.metrics.requests.labels(handler.__name__, str(response.status_code)).inc()
            return response

        async def checked(request: Request) -> Response:
            header = request.headers.get("authorization", "")
            keboola = request.headers.get("x-storageapi-token", "")
            if not header and keboola:  # Keboola's clients send the token this way
                header = f"Bearer {keboola}"
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                return error(401, "unauthenticated", "send 'Authorization: Bearer <admin "
                             "token>' (a token whose hash is in [admin] tokens)")
            client = request.client.host if request.client else None
            try:
                if not await self.auth.check(token.strip(), client):
                    return error(403, "forbidden", "this token is not an admin token")
            except Throttled:
                return json_response({"error": "auth_throttled", "message": "too many wrong "
                                      "admin tokens from this address; wait and retry",
                                      "details": []}, 429, {"retry-after": "1"})
            try:
                return await handler(request)
            except RegistryError as exc:
                return error(exc.status, exc.code, str(exc), exc.details)
            except ManifestCorruptError as exc:
                return error(500, "registry_corrupt", str(exc))
            except StoreError as exc:
                log.warning("admin %s %s: store unavailable: %s", request.method,
                            request.url.path, exc)
                outcome = "the change may have been written (the store's answer was " \
                    "lost): read it back before retrying (a retried create of what was " \
                    "written answers 409 exists)" \
                    if getattr(exc, "ambiguous", False) else "nothing was changed, retry"
                return json_response({"error": "store_unavailable", "message": "the object "
                                      f"store is unreachable ({type(exc).__name__}); "
                                      f"{outcome}", "details": []}, 503,
                                     {"retry-after": "1"})
        return wrapped

    async def body(self, request: Request, kind: type[Any]) -> Any:
        data = b""
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                raise RegistryError(413, "too_large", f"the body exceeds {MAX_BODY} bytes")
        if not data.strip():
            raise ops.invalid("body", "a JSON object is required")
        try:
            data.decode("utf-8")  # msgspec checks only the strings it keeps
            decoded = msgspec.json.decode(data, type=kind)
            if kind is ops.SinkSpec or kind is ops.SourceSpec:
                _check_written_partitions(msgspec.json.decode(data), kind)
            return decoded
        except UnicodeDecodeError as exc:
            raise RegistryError(400, "invalid_utf8", f"the body is not valid UTF-8 (byte "
                                f"{exc.start}: {exc.reason})") from None
        except RecursionError:
            raise RegistryError(400, "json_too_deep", "the body nests deeper than the "
                                "decoder allows") from None
        except msgspec.ValidationError as exc:
            field, reason = split_key_path(str(exc))
            raise ops.invalid(field or "body", reason) from None
        except msgspec.DecodeError as exc:
            raise RegistryError(400, "malformed", f"the body is not JSON: {exc}") from None

    async def current(self) -> Registry:
        registry = await self.registry.read()
        self.metrics.registry_version.set(registry.version)
        return registry

    async def _update(self, change: Callable[[Registry], Registry]) -> Registry:
        """Write ``change`` (compare-and-swap) and show the version written in
        ``icefloe_admin_registry_version`` at once, as a read does."""
        registry = await self.registry.update(change)
        self.metrics.registry_version.set(registry.version)
        return registry

    async def check(self, change: Callable[[Registry], Registry],
                    source_id: str | None = None) -> Registry:
        """Validate ``change`` against the current registry without writing it (both
        output paths accept every registry this API accepts, #28: nothing depends on
        ``[collector] output`` here).

        Why in a worker thread: checking a sink parses its ``where`` and ``sql`` mappings,
        which takes milliseconds per sink and grows with the text; on the event loop it
        would stall every other request meanwhile. The checks are remembered
        (:func:`icefloe.streams.where.check_where`), so the write that follows, which runs
        ``change`` again on the loop, costs little."""
        registry = await self.current()
        return await asyncio.to_thread(change, registry)

    @staticmethod
    def _source(registry: Registry, source_id: str) -> Source:
        source = registry.source(source_id)
        if source is None:
            raise ops.not_found("source", source_id)
        return source

    @staticmethod
    def _sink(registry: Registry, source_id: str, name: str) -> tuple[Source, Sink]:
        source = AdminApi._source(registry, source_id)
        sink = source.sink(name)
        if sink is None:
            raise ops.not_found("sink", f"{source_id}/{name}")
        return source, sink

    # -- registry and sources -------------------------------------------------------------

    async def get_registry(self, request: Request) -> Response:
        reg = await self.current()
        return json_response({"version": reg.version, "updated_at": reg.updated_at,
                              "seeded_from": reg.seeded_from,
                              "sources": len(reg.live_sources())})

    async def list_sources(self, request: Request) -> Response:
        reg = await self.current()
        return json_response({"version": reg.version,
                              "sources": [source_json(s) for s in reg.live_sources()]})

    async def create_source(self, request: Request) -> Response:
        spec: ops.SourceSpec = ops.named_source(await self.body(request, ops.SourceSpec))
        checked = await self.check(lambda r: ops.create_source(r, spec, clock=self.clock), spec.id)
        made = checked.source(spec.id)
        assert made is not None
        if not spec.sinks:
            reg = await self._create_source(spec)
            return self._created(reg, spec.id)

        async def commit() -> dict[str, Any]:
            reg = await self._create_source(spec)
            return {"version": reg.version, "source": source_json(self._source(reg, spec.id))}
        task = self.tasks.start("create_source", spec.id,
                                [s.stream(spec.id) for s in made.live_sinks()], commit)
        return self._accepted(task)

    async def _create_source(self, spec: ops.SourceSpec) -> Registry:
        """Write the new source; a create whose write landed but whose answer was lost (the
        store's retry then finds the source there) recognizes its own source: the same
        sinks, and without sinks the same description."""
        try:
            return await self._update(lambda r: ops.create_source(r, spec, clock=self.clock))
        except RegistryError as exc:
            reg = await self.current()
            found = reg.source(spec.id)
            if exc.code != "exists" or found is None:
                raise
            sinks = found.live_sinks()
            same = len(sinks) == len(spec.sinks) and all(
                ops.matches(s, w) for s, w in zip(sinks, spec.sinks, strict=True))
            if not same or (not spec.sinks and found.description != spec.description):
                raise
            return reg

    def _created(self, reg: Registry, source_id: str) -> Response:
        return json_response({"version": reg.version,
                              "source": source_json(self._source(reg, source_id))}, 201,
                             {"location": f"/v1/sources/{source_id}"})

    @staticmethod
    def _accepted(task: Any) -> Response:
        return json_response({"task": task.to_json()}, 202,
                             {"location": f"/v1/tasks/{task.id}"})

    async def get_source(self, request: Request) -> Response:
        reg = await self.current()
        source = self._source(reg, request.path_params["id"])
        return json_response({"version": reg.version, "source": source_json(source)})

    async def patch_source(self, request: Request) -> Response:
        source_id = request.path_params["id"]
        patch: ops.SourcePatch = await self.body(request, ops.SourcePatch)
        await self.check(lambda r: ops.update_source(r, source_id, patch, clock=self.clock))
        reg = await self._update(
            lambda r: ops.update_source(r, source_id, patch, clock=self.clock))
        return json_response({"version": reg.version,
                              "source": source_json(self._source(reg, source_id))})

    async def delete_source(self, request: Request) -> Response:
        source_id = request.path_params.get("id") or request.path_params["sourceId"]
        force = request.query_params.get("force", "").lower() in ("1", "true", "yes")
        self._source(await self.current(), source_id)
        pending = await self.pending(source_id)
        if pending and not force:
            raise RegistryError(409, "undelivered", f"source {source_id!r} has events in "
                                f"{pending} manifest entr{'y' if pending == 1 else 'ies'} not "
                                "yet committed; retry later, or add ?force=true (they are "
                                "still delivered to its sinks)",
                                [{"field": "force", "reason": f"{pending} pending entries"}])
        reg = await self._update(
            lambda r: ops.delete_source(r, source_id, clock=self.clock))
        return json_response({"version": reg.version, "deleted": source_id,
                              "pending_entries": pending})

    async def rotate_tokens(self, request: Request) -> Response:
        source_id = request.path_params["id"]
        keep = request.query_params.get("keep_previous", "").lower() in ("1", "true", "yes")
        source = self._source(await self.current(), source_id)
        token = new_token()
        hashed = await self.auth.hash_in_pool(token)

        def rotate(reg: Registry) -> Registry:
            current = self._source(reg, source_id)
            kept = current.tokens if keep else ()
            return ops.set_tokens(reg, source_id, (*kept, hashed), clock=self.clock)
        reg = await self._update(rotate)
        count = len(self._source(reg, source_id).tokens)
        log.info("tokens of source %s rotated (%d valid, previous %s)", source.id, count,
                 "kept" if keep else "revoked")
        return json_response({"version": reg.version, "source": source_id, "token": token,
                              "tokens": count}, 201)

    # -- sinks ----------------------------------------------------------------------------

    async def list_sinks(self, request: Request) -> Response:
        reg = await self.current()
        source = self._source(reg, request.path_params["id"])
        return json_response({"version": reg.version,
                              "sinks": [sink_json(source, s) for s in source.live_sinks()]})

    json = staticmethod(json_response)

    async def create_sink(self, request: Request) -> Response:
        source_id = request.path_params["id"]
        spec: ops.SinkSpec = ops.named_sink(await self.body(request, ops.SinkSpec))
        return self._accepted(await self.start_sink(source_id, spec))

    async def start_sink(self, source_id: str, spec: ops.SinkSpec) -> Any:
        """Check a new sink now (400/404/409 at once), then a task that makes its table and
        adds it (also the Keboola paths' sink create)."""
        checked = await self.check(
            lambda r: ops.create_sink(r, source_id, spec, clock=self.clock), source_id)
        _, sink = self._sink(checked, source_id, spec.name)

        async def commit() -> dict[str, Any]:
            try:
                reg = await self._update(
                    lambda r: ops.create_sink(r, source_id, spec, clock=self.clock))
            except RegistryError as exc:  # our own write, if its answer was lost?
                reg = await self.current()
                found = reg.source(source_id)
                mine = found.sink(spec.name) if found is not None else None
                if exc.code != "exists" or mine is None or not ops.matches(mine, spec):
                    raise
            source, made = self._sink(reg, source_id, spec.name)
            return {"version": reg.version, "sink": sink_json(source, made)}
        return self.tasks.start("create_sink", f"{source_id}/{spec.name}",
                                [sink.stream(source_id)], commit)

    async def get_sink(self, request: Request) -> Response:
        reg = await self.current()
        source, sink = self._sink(reg, request.path_params["id"], request.path_params["sink"])
        return json_response({"version": reg.version, "sink": sink_json(source, sink)})

    async def patch_sink(self, request: Request) -> Response:
        source_id, name = request.path_params["id"], request.path_params["sink"]
        patch: ops.SinkPatch = await self.body(request, ops.SinkPatch)
        before = await self.current()
        _, old = self._sink(before, source_id, name)
        checked = await self.check(
            lambda r: ops.update_sink(r, source_id, name, patch, clock=self.clock),
                                   source_id)
        _, new = self._sink(checked, source_id, name)
        commit = self._sink_commit(source_id, name, patch)
        shape = ("columns", "partition_by", "sort_by", "table_properties")
        if any(getattr(new, k) != getattr(old, k) for k in shape):  # the table evolves first
            task = self.tasks.start("update_sink", f"{source_id}/{name}",
                                    [new.stream(source_id)], commit)
            return self._accepted(task)
        return json_response(await commit())

    async def start_sink_update(self, source_id: str, name: str, patch: ops.SinkPatch) -> Any:
        """A sink change as a task that evolves the table first (the Keboola paths' sink
        update; checked at once like ``PATCH .../sinks/{sink}``)."""
        checked = await self.check(
            lambda r: ops.update_sink(r, source_id, name, patch, clock=self.clock), source_id)
        _, new = self._sink(checked, source_id, name)
        return self.tasks.start("update_sink", f"{source_id}/{name}",
                                [new.stream(source_id)],
                                self._sink_commit(source_id, name, patch))

    def _sink_commit(self, source_id: str, name: str, patch: ops.SinkPatch
                     ) -> Callable[[], Awaitable[dict[str, Any]]]:
        """The registry write of a sink change (run at once, or by its task once the
        table has evolved)."""
        async def commit() -> dict[str, Any]:
            reg = await self._update(
                lambda r: ops.update_sink(r, source_id, name, patch, clock=self.clock))
            source, sink = self._sink(reg, source_id, name)
            return {"version": reg.version, "sink": sink_json(source, sink)}
        return commit

    async def toggle_sink(self, request: Request, enabled: bool) -> Response:
        source_id, name = request.path_params["id"], request.path_params["sink"]
        self._sink(await self.current(), source_id, name)
        reg = await self._update(
            lambda r: ops.set_sink_enabled(r, source_id, name, enabled, clock=self.clock))
        source, sink = self._sink(reg, source_id, name)
        return json_response({"version": reg.version, "sink": sink_json(source, sink)})

    async def disable_sink(self, request: Request) -> Response:
        return await self.toggle_sink(request, False)

    async def enable_sink(self, request: Request) -> Response:
        return await self.toggle_sink(request, True)

    async def delete_sink(self, request: Request) -> Response:
        source_id, name = request.path_params["id"], request.path_params["sink"]
        self._sink(await self.current(), source_id, name)
        reg = await self._update(
            lambda r: ops.delete_sink(r, source_id, name, clock=self.clock))
        return json_response({"version": reg.version, "deleted": f"{source_id}/{name}"})

    async def retry_parked(self, request: Request) -> Response:
        """Collectors retry every parked table's staged rows as soon as they read the new
        registry version (``registry_poll_s``), instead of at their next ``park_retry_s``."""
        reg = await self._update(lambda r: ops.nudge(r, clock=self.clock))
        log.info("registry version %d: collectors retry their parked tables now",
                 reg.version)
        return json_response({"version": reg.version,
                              "retry": "every collector retries its parked tables' staged "
                                       "rows when it reads this registry version"})

    # -- settings: flat key/value views of the same fields ---------------------------------

    async def get_source_settings(self, request: Request) -> Response:
        reg = await self.current()
        source = self._source(reg, request.path_params["id"])
        return json_response({"version": reg.version,
                              "settings": settings.source_settings(source)})

    async def patch_source_settings(self, request: Request) -> Response:
        source_id = request.path_params["id"]
        patch: settings.SettingsPatch = await self.body(request, settings.SettingsPatch)
        self._source(await self.current(), source_id)  # 404 before 400
        def change(r: Registry) -> Registry:
            return settings.update_source_settings(r, source_id, patch, clock=self.clock)
        await self.check(change)
        reg = await self._update(change)
        return json_response({"version": reg.version, "settings": settings.source_settings(
            self._source(reg, source_id))})

    async def get_sink_settings(self, request: Request) -> Response:
        reg = await self.current()
        _, sink = self._sink(reg, request.path_params["id"], request.path_params["sink"])
        return json_response({"version": reg.version,
                              "settings": settings.sink_settings(sink)})

    async def patch_sink_settings(self, request: Request) -> Response:
        """Import conditions included: the collector applies a new version within
        ``registry_poll_s`` and imports staged data at once when the new conditions hold."""
        source_id, name = request.path_params["id"], request.path_params["sink"]
        patch: settings.SettingsPatch = await self.body(request, settings.SettingsPatch)
        self._sink(await self.current(), source_id, name)  # 404 before 400
        def change(r: Registry) -> Registry:
            return settings.update_sink_settings(r, source_id, name, patch, clock=self.clock)
        await self.check(change, source_id)
        reg = await self._update(change)
        _, sink = self._sink(reg, source_id, name)
        return json_response({"version": reg.version, "settings": settings.sink_settings(sink)})

    # -- tasks ----------------------------------------------------------------------------

    async def get_task(self, request: Request) -> Response:
        task = self.tasks.get(request.path_params["task"])
        if task is None:
            raise ops.not_found("task", request.path_params["task"])
        return json_response({"task": task.to_json()})


def build_app(api: AdminApi) -> Starlette:
    g = api.guarded
    document = msgspec.json.encode(openapi_document())

    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(api.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def not_found(request: Request, exc: Exception) -> Response:
        if is_registry_path(request.url.path):
            return refuse(404, 404, f"no such endpoint: {request.method} {request.url.path} "
                          "(icefloe's schema registry serves the Confluent API's subjects, "
                          "schemas, config and compatibility paths only)")
        return error(404, "not_found", f"no such endpoint: {request.method} {request.url.path}")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        allow = allowed_methods(routes, request)
        message = f"{request.method} is not allowed on {request.url.path}; allowed: {allow}"
        response = refuse(405, 405, message) if is_registry_path(request.url.path) else \
            error(405, "method_not_allowed", message)
        response.headers["allow"] = allow
        return response

    sink = "/v1/sources/{id}/sinks/{sink}"
    routes = [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/health", healthz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/registry", g(api.get_registry), methods=["GET"]),
        Route("/v1/sources", g(api.list_sources), methods=["GET"]),
        Route("/v1/sources", g(api.create_source), methods=["POST"]),
        Route("/v1/sources/{id}/tokens", g(api.rotate_tokens), methods=["POST"]),
        Route("/v1/sources/{id}/sinks", g(api.list_sinks), methods=["GET"]),
        Route("/v1/sources/{id}/sinks", g(api.create_sink), methods=["POST"]),
        Route(sink + ":disable", g(api.disable_sink), methods=["POST"]),
        Route(sink + ":enable", g(api.enable_sink), methods=["POST"]),
        Route(sink + "/settings", g(api.get_sink_settings), methods=["GET"]),
        Route(sink + "/settings", g(api.patch_sink_settings), methods=["PATCH"]),
        Route("/v1/sources/{id}/settings", g(api.get_source_settings), methods=["GET"]),
        Route("/v1/sources/{id}/settings", g(api.patch_source_settings), methods=["PATCH"]),
        Route(sink, g(api.get_sink), methods=["GET"]),
        Route(sink, g(api.patch_sink), methods=["PATCH"]),
        Route(sink, g(api.delete_sink), methods=["DELETE"]),
        Route("/v1/sources/{id}", g(api.get_source), methods=["GET"]),
        Route("/v1/sources/{id}", g(api.patch_source), methods=["PATCH"]),
        Route("/v1/sources/{id}", g(api.delete_source), methods=["DELETE"]),
        Route("/v1/tasks/{task}", g(api.get_task), methods=["GET"]),
        Route("/v1/parked:retry", g(api.retry_parked), methods=["POST"]),
        *keboola_routes(api, g),
        *schema_registry_routes(SchemaRegistryApi(api.schemas, api.auth,
                                                  api.metrics.schema_requests)),
    ]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})


def _check_written_partitions(raw: Any, kind: type[Any]) -> None:
    """A sink as sent with both ``partition`` and ``partition_by``: refused whatever
    ``partition`` says. Why on the body as sent: decoded, ``partition = "day"`` cannot be
    told from the default, and ``partition_by`` would silently win over it."""
    sinks: list[tuple[str, Any]] = []
    if kind is ops.SinkSpec:
        sinks = [("sink", raw)]
    elif isinstance(raw, dict) and isinstance(raw.get("sinks"), list):
        sinks = [(f"sinks[{i}]", sink) for i, sink in enumerate(raw["sinks"])]
    for at, sink in sinks:
        if isinstance(sink, dict):
            try:
                check_raw_partition(sink, at)
            except ConfigError as exc:
                raise ops.from_config_error(exc) from None
