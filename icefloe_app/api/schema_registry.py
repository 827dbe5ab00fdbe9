"""The Confluent Schema Registry REST API's core, served by the admin process at its root.

Why here: the paths (``/subjects``, ``/schemas``, ``/config``, ``/compatibility``) do not
collide with the admin API's ``/v1/...``, and the admin process already owns the stream
registry in the object store, its tokens and its loopback-only plaintext rule — so
producers' registry clients (``schema.registry.url = http://host:8081``) need no extra
process. Errors have Confluent's shape, ``{"error_code": 40401, "message": ...}``, with its
codes, and every response its content type, so the clients branch on them as they do
against Confluent's server. Requests authenticate as registry clients send it: HTTP basic
auth whose password is an admin token (``basic.auth.user.info = "any-user:<token>"``); a
bearer admin token works too.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from icefloe.errors import ManifestCorruptError, SchemaRegistryError, StoreError
from icefloe.schemas import formats
from icefloe.schemas.model import LEVELS, TYPES, Reference, SchemaDocument, SchemaRecord
from icefloe.schemas.store import Candidate, SchemaStore, check_level, parse_version
from icefloe_app.api.auth import AdminAuth, Throttled

log = logging.getLogger("icefloe.admin")

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
MAX_BODY = 4 * 1024 * 1024
PREFIXES = ("/subjects", "/schemas", "/config", "/compatibility", "/mode", "/contexts",
            "/exporters", "/dek-registry", "/keks", "/deks", "/v1/metadata", "/v1/keks")
"""Paths that are the schema registry's: an unknown one there is refused in its shape."""

Handler = Callable[[Request], Awaitable[Response]]


def reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(body), status, headers=headers,
                    media_type=CONTENT_TYPE)


def refuse(status: int, error_code: int, message: str,
           headers: dict[str, str] | None = None) -> Response:
    return reply({"error_code": error_code, "message": message}, status, headers)


def is_registry_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in PREFIXES)


class ReferenceIn(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    subject: str
    version: int


class SchemaIn(msgspec.Struct, forbid_unknown_fields=True):
    """A register, lookup or compatibility request's body. Confluent's data contracts
    (``metadata``, ``ruleSet``) and imports with a given ``id``/``version`` are refused when
    set, never dropped."""

    schema: str
    schemaType: str = "AVRO"  # Confluent's field names
    references: list[ReferenceIn] | None = None
    metadata: Any = None
    ruleSet: Any = None
    id: int | None = None
    version: int | None = None

    def candidate(self) -> Candidate:
        for name in ("metadata", "ruleSet", "id", "version"):
            if getattr(self, name) is not None:
                raise SchemaRegistryError(422, 42201, f"Invalid schema: {name!r} is not "
                                          "supported by icefloe's schema registry (data "
                                          "contracts and imports with a given id are not "
                                          "served); send the request without it")
        refs = tuple(Reference(r.name, r.subject, r.version) for r in self.references or [])
        return Candidate(self.schemaType.upper(), self.schema, refs)


class LevelIn(msgspec.Struct):
    compatibility: str | None = None
    compatibilityLevel: str | None = None  # both spellings are sent


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "").lower() in ("1", "true", "yes")


def _int_path(request: Request, name: str) -> int:
    try:
        return int(request.path_params[name])
    except ValueError:
        raise SchemaRegistryError(404, 40403, "Schema not found") from None


class SchemaRegistryApi:
    """The routes over one :class:`SchemaStore`, authenticated by the admin tokens."""

    def __init__(self, schemas: SchemaStore, auth: AdminAuth, requests: Counter) -> None:
        self.schemas = schemas
        self.auth = auth
        self.requests = requests
        """``icefloe_schema_registry_requests_total`` by operation and status."""

    # -- plumbing -------------------------------------------------------------------------

    def guarded(self, handler: Handler) -> Handler:
        async def wrapped(request: Request) -> Response:
            response = await self._checked(handler, request)
            self.requests.labels(handler.__name__, str(response.status_code)).inc()
            return response
        return wrapped

    async def _checked(self, handler: Handler, request: Request) -> Response:
        token = self._token(request.headers.get("authorization", ""))
        if token is None:
            return refuse(401, 401, "Unauthorized: send HTTP basic auth whose password is an "
                          "icefloe admin token (basic.auth.user.info = \"user:<token>\")",
                          {"www-authenticate": 'Basic realm="icefloe"'})
        client = request.client.host if request.client else None
        try:
            if not await self.auth.check(token, client):
                return refuse(401, 401, "Unauthorized: the password is not an icefloe admin "
                              "token", {"www-authenticate": 'Basic realm="icefloe"'})
        except Throttled:
            return refuse(429, 42901, "Too many wrong admin tokens from this address; wait "
                          "and retry", {"retry-after": "1"})
        try:
            return await handler(request)
        except SchemaRegistryError as exc:
            return refuse(exc.status, exc.error_code, str(exc))
        except ManifestCorruptError as exc:
            return refuse(500, 50001, str(exc))
        except StoreError as exc:
            log.warning("schema registry %s %s: store unavailable: %s", request.method,
                        request.url.path, exc)
            return refuse(500, 50001, f"Error in the backend data store: the object store "
                          f"is unreachable ({type(exc).__name__}); nothing was changed, retry",
                          {"retry-after": "1"})

    @staticmethod
    def _token(header: str) -> str | None:
        scheme, _, value = header.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and value:
            return value
        if scheme.lower() != "basic" or not value:
            return None
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
        _, colon, password = decoded.partition(":")
        return password if colon and password else None

    @staticmethod
    async def body(request: Request, kind: type[Any]) -> Any:
        data = b""
        async for chunk in request.stream():
            data += chunk
            if len(data) > MAX_BODY:
                raise SchemaRegistryError(413, 413, f"The body exceeds {MAX_BODY} bytes")
        try:
            return msgspec.json.decode(data, type=kind)
        except msgspec.ValidationError as exc:
            raise SchemaRegistryError(422, 422, f"Unrecognized or invalid field: {exc}"
                                      ) from None
        except msgspec.DecodeError as exc:
            raise SchemaRegistryError(400, 400, f"The body is not JSON: {exc}") from None

    async def _candidate(self, request: Request) -> Candidate:
        candidate: Candidate = (await self.body(request, SchemaIn)).candidate()
        if candidate.schema_type not in TYPES:
            raise formats.invalid(f"unknown schemaType {candidate.schema_type!r}; one of "
                                  f"{', '.join(TYPES)}")
        return candidate

    def _schema_text(self, request: Request, doc: SchemaDocument, record: SchemaRecord
                     ) -> str:
        """The registered text, or with ``?format=serialized`` a Protobuf schema as its
        base64 descriptor (what Confluent's Protobuf deserializer asks for)."""
        wanted = request.query_params.get("format", "")
        if wanted == "serialized" and record.schema_type == "PROTOBUF":
            return formats.serialized(self.schemas.parsed(doc, record))
        return record.schema

    def _described(self, request: Request, doc: SchemaDocument, record: SchemaRecord
                   ) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": self._schema_text(request, doc, record)}
        if record.schema_type != "AVRO":
            out["schemaType"] = record.schema_type
        if record.references:
            out["references"] = [msgspec.to_builtins(r) for r in record.references]
        return out

    # -- subjects and versions ------------------------------------------------------------

    async def list_subjects(self, request: Request) -> Response:
        doc = await self.schemas.read()
        deleted = _flag(request, "deleted")
        prefix = request.query_params.get("subjectPrefix", "")
        return reply([s.name for s in doc.subjects if s.name.startswith(prefix)
                      and (s.versions if deleted else s.live())])

    async def register(self, request: Request) -> Response:
        subject = request.path_params["subject"]
        schema_id, _ = await self.schemas.register(subject, await self._candidate(request))
        return reply({"id": schema_id})

    async def lookup(self, request: Request) -> Response:
        subject = request.path_params["subject"]
        candidate = await self._candidate(request)
        await self.schemas.prepare(candidate)
        doc = await self.schemas.read()
        entry, record = self.schemas.lookup(doc, subject, candidate,
                                            deleted=_flag(request, "deleted"))
        return reply({"subject": subject, "id": record.id, "version": entry.version,
                      **self._described(request, doc, record)})

    async def list_versions(self, request: Request) -> Response:
        doc = await self.schemas.read()
        deleted = _flag(request, "deleted")
        subject = self.schemas.subject_of(doc, request.path_params["subject"], deleted=deleted)
        return reply([v.version for v in (subject.versions if deleted else subject.live())])

    async def get_version(self, request: Request) -> Response:
        doc = await self.schemas.read()
        subject = request.path_params["subject"]
        entry, record = self.schemas.version_of(doc, subject, request.path_params["version"],
                                                deleted=_flag(request, "deleted"))
        return reply({"subject": subject, "id": record.id, "version": entry.version,
                      **self._described(request, doc, record)})

    async def get_version_schema(self, request: Request) -> Response:
        doc = await self.schemas.read()
        _, record = self.schemas.version_of(doc, request.path_params["subject"],
                                            request.path_params["version"],
                                            deleted=_flag(request, "deleted"))
        return Response(self._schema_text(request, doc, record), media_type=CONTENT_TYPE)

    async def referenced_by(self, request: Request) -> Response:
        doc = await self.schemas.read()
        subject = request.path_params["subject"]
        entry, _ = self.schemas.version_of(doc, subject, request.path_params["version"])
        return reply([r.id for r in doc.schemas if any(
            ref.subject == subject and ref.version == entry.version for ref in r.references)])

    async def delete_subject(self, request: Request) -> Response:
        return reply(await self.schemas.delete_subject(request.path_params["subject"],
                                                       permanent=_flag(request, "permanent")))

    async def delete_version(self, request: Request) -> Response:
        return reply(await self.schemas.delete_version(
            request.path_params["subject"], request.path_params["version"],
            permanent=_flag(request, "permanent")))

    # -- schemas by id --------------------------------------------------------------------

    async def get_schema(self, request: Request) -> Response:
        doc = await self.schemas.read()
        record = self.schemas.record(doc, _int_path(request, "id"))
        return reply(self._described(request, doc, record))

    async def get_schema_text(self, request: Request) -> Response:
        doc = await self.schemas.read()
        record = self.schemas.record(doc, _int_path(request, "id"))
        return Response(self._schema_text(request, doc, record), media_type=CONTENT_TYPE)

    async def get_schema_versions(self, request: Request) -> Response:
        doc = await self.schemas.read()
        record = self.schemas.record(doc, _int_path(request, "id"))
        deleted = _flag(request, "deleted")
        return reply([{"subject": s.name, "version": v.version} for s in doc.subjects
                      for v in (s.versions if deleted else s.live()) if v.id == record.id])

    async def get_schema_subjects(self, request: Request) -> Response:
        doc = await self.schemas.read()
        record = self.schemas.record(doc, _int_path(request, "id"))
        deleted = _flag(request, "deleted")
        return reply(sorted({s.name for s in doc.subjects
                             for v in (s.versions if deleted else s.live())
                             if v.id == record.id}))

    async def schema_types(self, request: Request) -> Response:
        return reply(sorted(TYPES))

    # -- compatibility levels -------------------------------------------------------------

    async def get_config(self, request: Request) -> Response:
        return reply({"compatibilityLevel": (await self.schemas.read()).compatibility})

    async def _level_body(self, request: Request) -> str:
        body: LevelIn = await self.body(request, LevelIn)
        level = body.compatibility or body.compatibilityLevel
        if level is None:
            raise SchemaRegistryError(422, 42203, "Invalid compatibility level: send "
                                      f"{{\"compatibility\": ...}}, one of {', '.join(LEVELS)}")
        return check_level(level.upper())

    async def put_config(self, request: Request) -> Response:
        level = await self._level_body(request)
        return reply({"compatibility": await self.schemas.set_level(None, level)})

    async def get_subject_config(self, request: Request) -> Response:
        doc = await self.schemas.read()
        subject = request.path_params["subject"]
        found = doc.subject(subject)
        if found is not None and found.compatibility is not None:
            return reply({"compatibilityLevel": found.compatibility})
        if _flag(request, "defaultToGlobal"):
            return reply({"compatibilityLevel": doc.compatibility})
        raise SchemaRegistryError(404, 40408, f"Subject '{subject}' does not have "
                                  "subject-level compatibility configured")

    async def put_subject_config(self, request: Request) -> Response:
        level = await self._level_body(request)
        return reply({"compatibility": await self.schemas.set_level(
            request.path_params["subject"], level)})

    async def delete_subject_config(self, request: Request) -> Response:
        return reply({"compatibilityLevel": await self.schemas.clear_level(
            request.path_params["subject"])})

    # -- compatibility checks -------------------------------------------------------------

    async def check_version(self, request: Request) -> Response:
        return await self._compatibility(request, request.path_params["version"])

    async def check_all(self, request: Request) -> Response:
        return await self._compatibility(request, None)

    async def _compatibility(self, request: Request, version: str | None) -> Response:
        subject = request.path_params["subject"]
        candidate = await self._candidate(request)
        parsed = await self.schemas.prepare(candidate, subject)
        doc = await self.schemas.read()
        level = doc.level(subject)
        if version is None:  # every version the level checks against
            found = doc.subject(subject)
            against = found.live() if found is not None else ()
        else:
            parse_version(version)
            against = (self.schemas.version_of(doc, subject, version)[0],)
            level = level.removesuffix("_TRANSITIVE")
        problems = self.schemas.incompatibilities(doc, subject, parsed, against, level)
        out: dict[str, Any] = {"is_compatible": not problems}
        if _flag(request, "verbose"):
            out["messages"] = problems
        return reply(out)


def schema_registry_routes(api: SchemaRegistryApi) -> list[Route]:
    g = api.guarded
    subject = "/subjects/{subject:path}"
    version = subject + "/versions/{version}"
    return [
        Route("/subjects", g(api.list_subjects), methods=["GET"]),
        Route(version + "/schema", g(api.get_version_schema), methods=["GET"]),
        Route(version + "/referencedby", g(api.referenced_by), methods=["GET"]),
        Route(version, g(api.get_version), methods=["GET"]),
        Route(version, g(api.delete_version), methods=["DELETE"]),
        Route(subject + "/versions", g(api.list_versions), methods=["GET"]),
        Route(subject + "/versions", g(api.register), methods=["POST"]),
        Route(subject, g(api.lookup), methods=["POST"]),
        Route(subject, g(api.delete_subject), methods=["DELETE"]),
        Route("/schemas/types", g(api.schema_types), methods=["GET"]),
        Route("/schemas/ids/{id}/schema", g(api.get_schema_text), methods=["GET"]),
        Route("/schemas/ids/{id}/versions", g(api.get_schema_versions), methods=["GET"]),
        Route("/schemas/ids/{id}/subjects", g(api.get_schema_subjects), methods=["GET"]),
        Route("/schemas/ids/{id}", g(api.get_schema), methods=["GET"]),
        Route("/config", g(api.get_config), methods=["GET"]),
        Route("/config", g(api.put_config), methods=["PUT"]),
        Route("/config/{subject:path}", g(api.get_subject_config), methods=["GET"]),
        Route("/config/{subject:path}", g(api.put_subject_config), methods=["PUT"]),
        Route("/config/{subject:path}", g(api.delete_subject_config), methods=["DELETE"]),
        Route("/compatibility/subjects/{subject:path}/versions/{version}", g(api.check_version),
              methods=["POST"]),
        Route("/compatibility/subjects/{subject:path}/versions", g(api.check_all),
              methods=["POST"]),
    ]
