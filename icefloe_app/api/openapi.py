"""The admin API's OpenAPI 3.1 document, served at ``/openapi.json``.

Why generated from the request structs: the JSON Schemas of bodies come from the very
msgspec types the server decodes with (:mod:`icefloe.registry.ops`), so the document
cannot drift from what is accepted; the test suite runs schemathesis against it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from icefloe.registry import ops, settings

_REF = "#/components/schemas/{name}"

ERROR = {"type": "object", "required": ["error", "message", "details"], "properties": {
    "error": {"type": "string"}, "message": {"type": "string"},
    "details": {"type": "array", "items": {"type": "object", "properties": {
        "field": {"type": "string"}, "reason": {"type": "string"}}}}}}
TASK = {"type": "object", "required": ["id", "kind", "state", "progress"], "properties": {
    "id": {"type": "string"}, "kind": {"type": "string"}, "target": {"type": "string"},
    "state": {"enum": ["pending", "running", "succeeded", "failed"]},
    "progress": {"type": "string"}, "result": {"type": ["object", "null"]},
    "error": {"anyOf": [{"type": "null"}, {"$ref": _REF.format(name="Error")}]},
    "created_at": {"type": "number"}, "finished_at": {"type": ["number", "null"]}}}
SINK = {"type": "object", "required": ["name", "table", "columns", "enabled", "source"],
        "properties": {"name": {"type": "string"}, "table": {"type": "string"},
                       "source": {"type": "string"}, "columns": {"type": "array"},
                       "enabled": {"type": "boolean"}, "conditions": {"type": "object"},
                       "created_version": {"type": "integer"}}}
SETTING = {"type": "object", "required": ["key", "type", "value", "default", "overwritten"],
           "properties": {"key": {"type": "string"}, "type": {"type": "string"},
                          "description": {"type": "string"}, "value": {},
                          "default": {}, "overwritten": {"type": "boolean"}}}
SOURCE = {"type": "object", "required": ["id", "tokens", "sinks"], "properties": {
    "id": {"type": "string"}, "description": {"type": "string"},
    "tokens": {"type": "integer", "description": "how many write tokens (never the tokens)"},
    "unrouted": {"enum": ["drop", "dead_letter"],
                 "description": "an event no sink's where takes: dropped or dead-lettered"},
    "sinks": {"type": "array", "items": {"$ref": _REF.format(name="Sink")}}}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name=name)}


def _obj(**props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": list(props), "properties": props}


def _errors(*codes: int) -> dict[str, Any]:
    reasons = {400: "invalid request (field and reason in details)",
               401: "no bearer token", 403: "not an admin token", 404: "no such resource",
               409: "conflicts with the registry (taken, owned, too many, undelivered, "
                    "column clash, cluster output)",
               413: "body too large", 429: "too many wrong admin tokens from this address",
               500: "the registry object cannot be read",
               503: "the object store is unreachable"}
    return {str(c): {"description": reasons[c], **_json(_ref("Error"))}
            for c in (401, 403, 429, 500, 503, *codes)}


def _op(summary: str, ok: dict[str, Any], *codes: int, body: str | None = None,
        params: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**ok, **_errors(*codes)},
                          "security": [{"bearer": []}]}
    if body is not None:
        op["requestBody"] = {"required": True, **_json(_ref(body))}
    if params:
        op["parameters"] = params
    return op


def _path(*names: str) -> list[dict[str, Any]]:
    return [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
            for n in names]


def _flag(name: str, doc: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": doc,
            "schema": {"type": "boolean"}}


def openapi_document() -> dict[str, Any]:
    """The whole document: the request structs' schemas and every path of the admin API."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "icefloe admin API", "version": "1",
                 "description": "Sources (ingest endpoints), their sinks (Iceberg tables "
                                "with columns and import conditions), tokens and tasks."},
        "components": {"schemas": _components(), "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {**_source_paths(), **_sink_paths(), **_other_paths()},
    }


def _components() -> dict[str, Any]:
    """The schemas: the request structs' (from msgspec) and the answers' own."""
    (_, components) = msgspec.json.schema_components(
        [ops.SourceSpec, ops.SourcePatch, ops.SinkSpec, ops.SinkPatch,
         settings.SettingsPatch],
        ref_template=_REF)
    components.update({"Error": ERROR, "Task": TASK, "Sink": SINK, "Source": SOURCE,
                       "Setting": SETTING})
    return components


# -- the answers several paths share (built per document: nothing shared is mutable) ------

def _versioned(**props: dict[str, Any]) -> dict[str, Any]:
    """An answer that carries the registry ``version`` it was made at, and ``props``."""
    return _obj(version={"type": "integer"}, **props)


def _one_source() -> dict[str, Any]:
    return {"200": {"description": "the source", **_json(_versioned(source=_ref("Source")))}}


def _one_sink() -> dict[str, Any]:
    return {"200": {"description": "the sink", **_json(_versioned(sink=_ref("Sink")))}}


def _accepted() -> dict[str, Any]:
    return {"202": {"description": "a task creates or evolves the table(s), then applies "
                    "the change; poll Location", **_json(_obj(task=_ref("Task")))}}


def _deleted() -> dict[str, Any]:
    return {"200": {"description": "deleted", **_json(
        _versioned(deleted={"type": "string"}))}}


def _settings_listed() -> dict[str, Any]:
    return {"200": {"description": "the settings (key, type, value, default, overwritten)",
                    **_json(_versioned(settings={"type": "array",
                                                 "items": _ref("Setting")}))}}


# -- the paths ------------------------------------------------------------------------------

def _source_paths() -> dict[str, Any]:
    src = _path("id")
    return {
        "/v1/registry": {"get": _op("registry version", {"200": {
            "description": "version", **_json(_versioned())}})},
        "/v1/sources": {
            "get": _op("list sources", {"200": {"description": "sources", **_json(_versioned(
                sources={"type": "array", "items": _ref("Source")}))}}),
            "post": _op("create a source", {"201": {"description": "created", **_json(
                _versioned(source=_ref("Source")))}, **_accepted()}, 400, 409, 413,
                body="SourceSpec")},
        "/v1/sources/{id}": {
            "get": _op("one source", _one_source(), 404, params=src),
            "patch": _op("change a source", _one_source(), 400, 404, 413, body="SourcePatch",
                         params=src),
            "delete": _op("delete a source", _deleted(), 404, 409, params=[
                *src, _flag("force", "delete even with undelivered events (they are "
                            "still delivered)")])},
        "/v1/sources/{id}/tokens": {"post": _op(
            "rotate the write tokens (the new token is shown once)", {"201": {
                "description": "new token", **_json(_versioned(
                    token={"type": "string"}, tokens={"type": "integer"}))}},
            404, params=[*src, _flag("keep_previous", "keep the old tokens valid")])},
    }


def _sink_paths() -> dict[str, Any]:
    src, snk = _path("id"), _path("id", "sink")
    return {
        "/v1/sources/{id}/sinks": {
            "get": _op("list sinks", {"200": {"description": "sinks", **_json(_versioned(
                sinks={"type": "array", "items": _ref("Sink")}))}}, 404, params=src),
            "post": _op("create a sink", _accepted(), 400, 404, 409, 413, body="SinkSpec",
                        params=src)},
        "/v1/sources/{id}/sinks/{sink}": {
            "get": _op("one sink", _one_sink(), 404, params=snk),
            "patch": _op("change a sink", {**_one_sink(), **_accepted()}, 400, 404, 413,
                         body="SinkPatch", params=snk),
            "delete": _op("delete a sink", _deleted(), 404, params=snk)},
        "/v1/sources/{id}/settings": {
            "get": _op("a source's settings", _settings_listed(), 404, params=_path("id")),
            "patch": _op("change a source's settings (value null: the default)",
                         _settings_listed(), 400, 404, 413, body="SettingsPatch",
                         params=_path("id"))},
        "/v1/sources/{id}/sinks/{sink}/settings": {
            "get": _op("a sink's settings, import conditions included", _settings_listed(),
                       404, params=snk),
            "patch": _op("change a sink's settings (value null: the default)",
                         _settings_listed(), 400, 404, 409, 413, body="SettingsPatch",
                         params=snk)},
        "/v1/sources/{id}/sinks/{sink}:disable": {"post": _op(
            "stop delivering to a sink", _one_sink(), 404, params=snk)},
        "/v1/sources/{id}/sinks/{sink}:enable": {"post": _op(
            "resume delivering to a sink", _one_sink(), 404, params=snk)},
    }


def _other_paths() -> dict[str, Any]:
    return {
        "/v1/tasks/{task}": {"get": _op("a task", {"200": {"description": "the task", **_json(
            _obj(task=_ref("Task")))}}, 404, params=_path("task"))},
        "/v1/parked:retry": {"post": _op(
            "collectors retry their parked tables' staged rows now", {"200": {
                "description": "the registry version that asks for it", **_json(
                    _obj(version={"type": "integer"}, retry={"type": "string"}))}})},
    }
