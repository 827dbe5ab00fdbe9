"""The ingest HTTP API's OpenAPI 3.1 document, served by every ingestor at ``/openapi.json``.

Why written out here rather than derived: the HTTP front is a raw ASGI app with no
framework to introspect (see :mod:`ingestor.http.app`), and events are validated against
each stream's columns, which change at runtime through the registry. So the document
describes the routes, headers and answers, and says that the event schema is the stream's;
the test suite runs schemathesis against a real ingestor serving it, so a route, status or
body that the document does not describe fails there.
"""

from __future__ import annotations

from typing import Any

from icefloe import __version__

_REF = "#/components/schemas/{name}"

ERROR: dict[str, Any] = {
    "type": "object", "required": ["error", "message", "details"],
    "description": "Every refusal. Nothing of the request was accepted.",
    "properties": {
        "error": {"type": "string", "description": "stable error code, e.g. invalid_event, "
                  "unknown_stream, queue_full, store_unavailable"},
        "message": {"type": "string", "description": "what went wrong and what to do"},
        "details": {"type": "array", "description": "per-event problems (index, field, "
                    "reason) for a refused batch", "items": {"type": "object"}},
        "may_be_stored": {"type": "boolean", "description": "503 only: the failed flush "
                          "may still have stored the events (it timed out, or a write's "
                          "answer was lost), so a resend without an Idempotency-Key or "
                          "event ids may store them twice"}}}
EVENT: dict[str, Any] = {
    "type": "object", "description": "One event: a JSON object checked against the "
    "stream's declared columns (required fields, types; unknown fields per the stream)."}
ACCEPTED: dict[str, Any] = {
    "type": "object", "required": ["accepted"],
    "properties": {"accepted": {"type": "integer", "minimum": 0,
                                "description": "events now durable (all of the request's, "
                                               "but those dead-lettered)"},
                   "dead_lettered": {"type": "integer", "minimum": 0,
                                     "description": "on_invalid = \"dead_letter\" streams "
                                                    "only: invalid events written to "
                                                    "icefloe.dead_letters instead"}}}

_ERRORS = {
    400: "malformed JSON, a failed validation (every bad event in details), a bad header; "
         "also invalid_utf8, empty_body, json_too_deep (stored JSON values nest at most 64 "
         "levels), number_out_of_range, invalid_event_id, invalid_idempotency_key "
         "(control characters), duplicate_header (Authorization or Idempotency-Key twice)",
    401: "the stream needs a write token: send Authorization: Bearer TOKEN",
    403: "the token is not one of this stream's",
    404: "no such stream (or no stream routes to this table)",
    408: "the headers or body arrived too slowly (ingestor.header_timeout_s, "
         "body_timeout_s) or the upload took over ingestor.body_max_s",
    413: "the body is over ingestor.max_body_bytes (received or decompressed)",
    415: "Content-Type or Content-Encoding not accepted (text/plain, a form type and a "
         "missing Content-Type only from requests without Origin or from an allowed origin)",
    429: "backpressure: the buffer or the manifest queue is full, or a rate limit; retry "
         "after Retry-After seconds",
    431: "the request headers are over ingestor.max_header_bytes or max_headers",
    500: "a bug; the ingestor logged it and accepted nothing",
    501: "a Transfer-Encoding other than plain chunked",
    503: "the object store is unreachable or the ingestor is shutting down; retry after "
         "Retry-After seconds",
    505: "an HTTP version other than 1.0 or 1.1 on this port",
}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying",
                                "schema": {"type": "string"}}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _errors(*codes: int) -> dict[str, Any]:
    out = {}
    for code in codes:
        out[str(code)] = {"description": _ERRORS[code], **_json(_ref("Error"))}
        if code in (429, 503):
            out[str(code)]["headers"] = _RETRY_AFTER
    return out


def _path(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "path", "required": True,
             "schema": {"type": "string", "minLength": 1, "pattern": "^[^/]+$"}}
            for n in names]


_HEADERS = [
    {"name": "Idempotency-Key", "in": "header", "required": False,
     "description": "makes a retried request safe: events without an id get "
                    "KEY:index as their id, and the collector drops repeats",
     "schema": {"type": "string"}},
    {"name": "Content-Encoding", "in": "header", "required": False,
     "description": "a compressed body (the size limit applies after decompression too)",
     "schema": {"enum": ["gzip", "zstd", "identity"]}},
]


def _ingest(summary: str, body: dict[str, Any], params: list[dict[str, Any]]
            ) -> dict[str, Any]:
    return {
        "summary": summary,
        "description": "Answered 202 only once every event of the request is in a batch "
                       "file in the object store and listed in the manifest (durable). "
                       "A request is all or nothing.",
        "parameters": [*params, *_HEADERS],
        "security": [{}, {"bearer": []}],
        "requestBody": {"required": True, "content": body},
        "responses": {"202": {"description": "durable", **_json(_ref("Accepted"))},
                      **_errors(400, 401, 403, 404, 408, 413, 415, 429, 431, 500, 501,
                                  503, 505)},
    }


def _preflight(params: list[dict[str, Any]]) -> dict[str, Any]:
    return {"summary": "CORS preflight (allowed origins: ingestor.cors_origins)",
            "parameters": params, "security": [],
            "responses": {"204": {"description": "Allow, and the CORS grant for an allowed "
                                  "Origin"}}}


def openapi_document() -> dict[str, Any]:
    """The whole document (static: the event schema belongs to each stream)."""
    as_json = {"application/json": {"schema": {"oneOf": [
        _ref("Event"), {"type": "array", "items": _ref("Event"), "minItems": 1}]}},
        "text/plain": {"schema": {"type": "string", "description": "read as JSON (what "
                                  "navigator.sendBeacon can send), only from requests "
                                  "without Origin or from an origin in cors_origins"}},
        "application/x-ndjson": {"schema": {"type": "string",
                                            "description": "one JSON object per line"}}}
    form = {"schema": {"type": "string", "description": "read as JSON (curl -d sends this "
                       "type), unless the stream's form_body is \"refuse\""}}
    one = {"application/json": {"schema": _ref("Event")},
           "text/plain": {"schema": {"type": "string"}},
           "application/x-www-form-urlencoded": form}
    many = {"application/json": {"schema": {"type": "array", "items": _ref("Event"),
                                            "minItems": 1}},
            "text/plain": {"schema": {"type": "string"}},
            "application/x-www-form-urlencoded": form}
    stream, table = _path("stream"), _path("schema", "table")
    health = {"type": "object", "required": ["status"], "properties": {
        "status": {"type": "string"}, "detail": {"type": "string"},
        "registry_version": {"type": "integer"}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "icefloe ingest API", "version": __version__,
                 "description": "Send JSON events to icefloe streams over HTTP; an "
                                "acknowledgement means durable. The same API over gRPC is "
                                "proto/icefloe/v1/ingest.proto."},
        "components": {
            "schemas": {"Error": ERROR, "Event": EVENT, "Accepted": ACCEPTED},
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "a write token, for streams that have tokens"}}},
        "paths": {
            "/v1/streams/{stream}/events": {
                "post": _ingest("send events: one object, an array, or NDJSON", as_json,
                                stream),
                "options": _preflight(stream)},
            "/ingest/{stream}": {
                "post": _ingest("the same as /v1/streams/{stream}/events", as_json, stream),
                "options": _preflight(stream)},
            "/collect/{schema}/{table}": {
                "post": _ingest("one object to the stream whose table is schema.table", one,
                                table),
                "options": _preflight(table)},
            "/collect/{schema}/{table}/batch": {
                "post": _ingest("an array to the stream whose table is schema.table", many,
                                table),
                "options": _preflight(table)},
            "/healthz": {"get": {"summary": "alive", "security": [], "responses": {
                "200": {"description": "the process answers", **_json(health)}}}},
            "/health": {"get": {"summary": "alive (alias of /healthz)", "security": [],
                                "responses": {"200": {"description": "the process answers",
                                                      **_json(health)}}}},
            "/readyz": {"get": {"summary": "ready: config loaded and the store answers",
                                "security": [], "responses": {
                                    "200": {"description": "ready", **_json(health)},
                                    **_errors(503)}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "security": [],
                                 "responses": {"200": {"description": "text exposition",
                                                       "content": {"text/plain": {
                                                           "schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"summary": "this document", "security": [],
                                      "responses": {"200": {"description": "OpenAPI 3.1",
                                                            **_json({"type": "object"})}}}},
        },
    }
