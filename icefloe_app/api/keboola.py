"""Keboola's Stream API paths and JSON shapes over icefloe's registry.

Why a translation layer and not a second registry: a Keboola source is an icefloe source
and a Keboola sink an icefloe sink, so everything the admin API guarantees (compare-and-swap
changes, tasks that create the table first, versioned routing, import conditions) holds for
both, and a sink made here is listed and changed by icefloe's own paths too. What differs is
only the shape: ``/v1/branches/{branchId}/sources/...`` (the one branch is ``default``),
``sourceId``/``sinkId``, ``table.mapping.columns`` with Keboola's column types, ``primaryKey``,
``path`` in dot syntax with ``rawString``/``defaultValue``, ``template`` with Jsonnet, and the
``storage.level.target.import.trigger.*`` settings with Keboola's ranges and defaults
(time 30 s to 24 h, 1 min; size 100 B to 500 MB, 50 MB; count 1 to 10 M, 50 k).

A column maps as Keboola fills it: ``id`` and ``uuid`` → the event id, ``datetime`` → the
receive time (``timestamp``), ``ip``, ``body``, ``headers`` → ``from = ...`` (``string``);
``path`` → a ``path`` mapping, a ``json`` column (the value's JSON text, a string in quotes)
or with ``rawString`` a ``string`` column taking a JSON string without its quotes;
``template`` → a ``template`` column (its value's JSON text).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from ulid import ULID

from icefloe.errors import RegistryError
from icefloe.registry import ops
from icefloe.registry.model import Conditions, Registry, Sink, Source
from icefloe.streams.model import Column
from icefloe.streams.templates import body_path, check_template
from icefloe_app.api.tasks import Task

Handler = Callable[[Request], Awaitable[Response]]
BRANCH = "default"
MB = 1000 * 1000
"""Keboola writes sizes as ``50MB``; here a megabyte is 10^6 bytes (icefloe's own unit)."""
KEY_COUNT = "storage.level.target.import.trigger.count"
KEY_SIZE = "storage.level.target.import.trigger.size"
KEY_INTERVAL = "storage.level.target.import.trigger.interval"
DEFAULTS = Conditions(max_age_s=60.0, max_bytes=50 * MB, max_events=50_000)
"""Keboola's import conditions for a sink created through these paths."""
RANGES = {KEY_INTERVAL: (30.0, 86_400.0), KEY_SIZE: (100, 500 * MB),
          KEY_COUNT: (1, 10_000_000)}
RESULTS = {"source.create": "source created", "source.delete": "source deleted",
           "sink.create": "sink created", "sink.update": "sink updated",
           "sink.delete": "sink deleted"}
COLUMN_TYPES = ("id", "uuid", "datetime", "ip", "body", "headers", "path", "template")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
               "h": 3600.0}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|kB)", re.IGNORECASE)
_SIZE_UNIT = {"b": 1, "kb": 1000, "mb": MB, "gb": 1000 * MB}
_TABLE_PART = re.compile(r"[^A-Za-z0-9_]+")


def invalid(field: str, reason: str) -> RegistryError:
    return ops.invalid(field, reason)


# -- request shapes ----------------------------------------------------------------------


class KTemplate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    language: str
    content: str


class KColumn(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: str
    name: str
    primaryKey: bool = False
    path: str | None = None
    rawString: bool = False
    defaultValue: str | None = None
    template: KTemplate | None = None


class KMapping(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    columns: tuple[KColumn, ...]


class KTable(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tableId: str
    mapping: KMapping
    type: str = "keboola"


class KSinkCreate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    table: KTable
    type: str = "table"
    sinkId: str = ""
    description: str = ""
    allowedSignals: tuple[str, ...] = ()


class KSinkUpdate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str | None = None
    description: str | None = None
    changeDescription: str | None = None
    type: str | None = None
    table: KTable | None = None


class KSourceCreate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str
    type: str = "http"
    sourceId: str = ""
    description: str = ""


class KSourceUpdate(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str | None = None
    description: str | None = None
    changeDescription: str | None = None
    type: str | None = None


class KSetting(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: str
    value: Any = None


class KSettingsPatch(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    settings: tuple[KSetting, ...]
    changeDescription: str | None = None


# -- translation -------------------------------------------------------------------------


def icefloe_path(text: str, at: str) -> str:
    """Keboola's ``issue.labels[0].name`` → icefloe's ``$['issue']['labels'][0]['name']``."""
    try:
        steps = body_path(text)
    except ValueError as exc:
        raise invalid(at, str(exc)) from None
    if not isinstance(steps[0], str):
        raise invalid(at, f"path {text!r} must start with a key (an event is an object)")
    parts = ["$"]
    for step in steps:
        parts.append(f"[{step}]" if isinstance(step, int) else
                     "['" + step.replace("\\", "\\\\").replace("'", "\\'") + "']")
    return "".join(parts)


def column_of(col: KColumn, at: str) -> Column:
    """One Keboola column as an icefloe column (see the module doc)."""
    if col.type not in COLUMN_TYPES:
        raise invalid(f"{at}.type", f"{col.type!r} is not a Keboola column type (expected "
                      f"one of {', '.join(COLUMN_TYPES)})")
    if col.type != "path" and (col.path is not None or col.rawString or
                               col.defaultValue is not None):
        raise invalid(f"{at}.path", "path, rawString and defaultValue belong to a path column")
    if col.type != "template" and col.template is not None:
        raise invalid(f"{at}.template", "template belongs to a template column")
    if col.type in ("id", "uuid"):
        return Column(col.name, "string", source="id")
    if col.type == "datetime":
        return Column(col.name, "timestamp", source="datetime")
    if col.type in ("ip", "body", "headers"):
        return Column(col.name, "string", source=col.type)
    if col.type == "path":
        if not col.path:
            raise invalid(f"{at}.path", "a path column needs a path (e.g. \"issue.id\")")
        path = icefloe_path(col.path, f"{at}.path")
        if col.rawString:
            return Column(col.name, "string", path=path, raw=True, default=col.defaultValue,
                          required=col.primaryKey and col.defaultValue is None)
        default = None if col.defaultValue is None else \
            msgspec.json.encode(col.defaultValue).decode()
        return Column(col.name, "json", path=path, default=default,
                      required=col.primaryKey and col.defaultValue is None)
    if col.template is None:
        raise invalid(f"{at}.template", "a template column needs "
                      "{\"language\": \"jsonnet\", \"content\": \"...\"}")
    if col.template.language != "jsonnet":
        raise invalid(f"{at}.template.language", f"{col.template.language!r}: only "
                      "\"jsonnet\" is supported")
    try:
        check_template(col.template.content)
    except ValueError as exc:
        raise invalid(f"{at}.template.content", str(exc)) from None
    return Column(col.name, "string", template=col.template.content)


def table_of(table_id: str, at: str) -> str:
    """Keboola's ``in.c-github.issues`` (stage.bucket.table) → ``in_c_github.issues``: the
    bucket is the namespace, every other character than a letter, digit or ``_`` one ``_``."""
    bucket, dot, name = table_id.rpartition(".")
    if not dot or not bucket or not name:
        raise invalid(at, f"{table_id!r} is not a table id like \"in.c-bucket.table\"")
    namespace = _TABLE_PART.sub("_", bucket).strip("_")
    table = _TABLE_PART.sub("_", name).strip("_")
    if not namespace or not table:
        raise invalid(at, f"{table_id!r} has no letter or digit in its bucket or name")
    return f"{namespace}.{table}"


def sink_spec(body: KSinkCreate) -> ops.SinkSpec:
    if body.type != "table":
        raise invalid("type", f"{body.type!r}: only \"table\" sinks are supported")
    if body.table.type != "keboola":
        raise invalid("table.type", f"{body.table.type!r}: only \"keboola\" is supported")
    columns = tuple(column_of(c, f"table.mapping.columns[{i}]")
                    for i, c in enumerate(body.table.mapping.columns))
    if not columns:
        raise invalid("table.mapping.columns", "give at least one column")
    key = tuple(c.name for c in body.table.mapping.columns if c.primaryKey)
    name = body.sinkId or ops.slug(body.name)
    if not name:
        raise invalid("name", f"{body.name!r} has no letter or digit to make a sinkId from")
    return ops.SinkSpec(table=table_of(body.table.tableId, "table.tableId"), name=name,
                        columns=columns, primary_key=key, conditions=DEFAULTS)


def k_column(column: Column, key: tuple[str, ...]) -> dict[str, Any]:
    """An icefloe column back in Keboola's shape."""
    out: dict[str, Any]
    if column.source in ("id", "datetime", "ip", "body", "headers"):
        out = {"type": column.source, "name": column.name}
    elif column.path is not None:
        steps = re.findall(r"\['((?:[^'\\]|\\.)*)'\]|\[(\d+)\]", column.path)
        text = ""
        for key_step, index in steps:
            text += f"[{index}]" if index else ("." if text else "") + \
                re.sub(r"\\(.)", r"\1", key_step)
        out = {"type": "path", "name": column.name, "path": text}
        if column.raw:
            out["rawString"] = True
        if column.default is not None:
            out["defaultValue"] = column.default if column.raw else \
                msgspec.json.decode(column.default)
    elif column.template is not None:
        out = {"type": "template", "name": column.name,
               "template": {"language": "jsonnet", "content": column.template}}
    else:
        out = {"type": column.mapping or "plain", "name": column.name}
    if column.name in key:
        out["primaryKey"] = True
    return out


def k_sink(source: Source, sink: Sink) -> dict[str, Any]:
    namespace, table = sink.table.split(".", 1)
    return {"projectId": 0, "branchId": BRANCH, "sourceId": source.id, "sinkId": sink.name,
            "type": "table", "name": sink.name, "description": "",
            "disabled": None if sink.enabled else {"reason": "disabled"},
            "table": {"type": "keboola", "tableId": f"{namespace}.{table}",
                      "mapping": {"columns": [k_column(c, sink.primary_key)
                                              for c in sink.columns]}}}


def k_source(source: Source) -> dict[str, Any]:
    return {"projectId": 0, "branchId": BRANCH, "sourceId": source.id, "type": "http",
            "name": source.description or source.id, "description": source.description,
            "http": {"url": f"/v1/streams/{source.id}/events"},
            "sinks": [k_sink(source, s) for s in source.live_sinks()]}


# -- settings ----------------------------------------------------------------------------


def duration_s(value: Any) -> float:
    """``"1m0s"``, ``"30s"``, ``"24h"`` (Go durations) or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like \"1m0s\"")
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str) or not value:
        raise ValueError("expected a duration like \"1m0s\"")
    pos, total = 0, 0.0
    while pos < len(value):
        match = _DURATION.match(value, pos)
        if match is None:
            raise ValueError(f"{value!r} is not a duration like \"1m0s\"")
        total += float(match.group(1)) * _DURATION_S[match.group(2)]
        pos = match.end()
    return total


def size_bytes(value: Any) -> int:
    """``"50MB"``, ``"100B"`` (MB = 10^6 bytes) or a number of bytes."""
    if isinstance(value, bool):
        raise ValueError("expected a size like \"50MB\"")
    if isinstance(value, int):
        return value
    match = _SIZE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"{value!r} is not a size like \"50MB\"")
    return int(float(match.group(1)) * _SIZE_UNIT[match.group(2).lower()])


def go_duration(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    tail = f"{secs}s" if seconds == whole else f"{secs + seconds - whole:g}s"
    return (f"{hours}h{minutes}m" if hours else f"{minutes}m" if minutes else "") + tail


def size_text(count: int) -> str:
    return f"{count // MB}MB" if count % MB == 0 else \
        f"{count // 1000}KB" if count % 1000 == 0 else f"{count}B"


def k_settings(conditions: Conditions) -> list[dict[str, Any]]:
    rows = [(KEY_COUNT, "uint64", "Records count to trigger file import.",
             conditions.max_events, DEFAULTS.max_events, "required,min=1,max=10000000"),
            (KEY_INTERVAL, "string", "Duration from the last import to trigger the next "
             "import.", go_duration(conditions.max_age_s), go_duration(DEFAULTS.max_age_s),
             "required,minDuration=30s,maxDuration=24h"),
            (KEY_SIZE, "string", "Records size to trigger file import.",
             size_text(conditions.max_bytes), size_text(DEFAULTS.max_bytes),
             "required,minBytes=100B,maxBytes=500MB")]
    return [{"key": key, "type": kind, "description": text, "value": value,
             "defaultValue": default, "overwritten": value != default, "protected": False,
             "validation": rule} for key, kind, text, value, default, rule in rows]


def patched_conditions(conditions: Conditions, patch: KSettingsPatch) -> Conditions:
    """``conditions`` with the patch applied (null: Keboola's default); a value out of
    Keboola's range, of the wrong form or an unknown key is a 400 naming it."""
    seen: set[str] = set()
    values = msgspec.structs.asdict(conditions)
    for i, item in enumerate(patch.settings):
        if item.key not in RANGES:
            raise invalid(f"settings[{i}].key", f"unknown setting {item.key!r} (known: "
                          f"{', '.join(sorted(RANGES))})")
        if item.key in seen:
            raise invalid(f"settings[{i}].key", f"{item.key!r} is given twice")
        seen.add(item.key)
        low, high = RANGES[item.key]
        try:
            if item.key == KEY_INTERVAL:
                value: float | int = DEFAULTS.max_age_s if item.value is None else \
                    duration_s(item.value)
                shown = go_duration(float(value))
                bounds = f"{go_duration(float(low))} to {go_duration(float(high))}"
                field = "max_age_s"
            elif item.key == KEY_SIZE:
                value = DEFAULTS.max_bytes if item.value is None else size_bytes(item.value)
                shown, bounds, field = size_text(int(value)), "100B to 500MB", "max_bytes"
            else:
                if item.value is not None and (isinstance(item.value, bool) or
                                               not isinstance(item.value, int)):
                    raise ValueError("expected an integer")
                value = DEFAULTS.max_events if item.value is None else item.value
                shown, bounds, field = str(value), "1 to 10000000", "max_events"
        except ValueError as exc:
            raise invalid(item.key, str(exc)) from None
        if not low <= value <= high:
            raise invalid(item.key, f"{shown} is out of range ({bounds})")
        values[field] = value
    return Conditions(**values)


# -- the routes --------------------------------------------------------------------------


class KeboolaApi:
    """The Keboola-shaped routes, on top of an :class:`icefloe_app.api.app.AdminApi`."""

    def __init__(self, api: Any) -> None:
        self.api = api

    @staticmethod
    def _branch(request: Request) -> None:
        branch = request.path_params["branchId"]
        if branch != BRANCH:
            raise RegistryError(404, "branch_not_found", f"branch {branch!r} does not exist: "
                                "icefloe has one branch, \"default\"",
                                [{"field": "branchId", "reason": "not found"}])

    def _task(self, task: Any, kind: str, source_id: str, sink_id: str | None = None
              ) -> dict[str, Any]:
        status = {"succeeded": "success", "failed": "error"}.get(task.state, "processing")
        out: dict[str, Any] = {
            "taskId": f"{kind}/{task.id}", "type": kind,
            "url": f"/v1/branches/{BRANCH}/sources/{source_id}/tasks/{kind}/{task.id}",
            "status": status, "isFinished": status != "processing",
            "createdAt": task.created_at, "outputs": {"branchId": BRANCH,
                                                      "sourceId": source_id}}
        if sink_id is not None:
            out["outputs"]["sinkId"] = sink_id
        if task.finished_at is not None:
            out["finishedAt"] = task.finished_at
            out["duration"] = int((task.finished_at - task.created_at) * 1000)
        if task.error is not None:
            out["error"] = task.error.get("message", str(task.error))
        if status == "success":
            out["result"] = RESULTS.get(kind, "done")
        return out

    def _done(self, kind: str, source_id: str, sink_id: str | None = None) -> Response:
        """A change applied at once, answered as Keboola's finished task."""
        now = self.api.clock.time()
        task = Task(id=self._tasks_id(), kind=kind, target=source_id, state="succeeded",
                    created_at=now, finished_at=now)
        self.api.tasks.remember(task)
        return self.api.json(self._task(task, kind, source_id, sink_id), 202)

    @staticmethod
    def _tasks_id() -> str:
        return str(ULID())

    async def create_source(self, request: Request) -> Response:
        self._branch(request)
        body: KSourceCreate = await self.api.body(request, KSourceCreate)
        if body.type != "http":
            raise invalid("type", f"{body.type!r}: only \"http\" sources are supported")
        spec = ops.named_source(ops.SourceSpec(id=body.sourceId, name=body.name,
                                               description=body.description or body.name))
        await self.api.check(lambda r: ops.create_source(r, spec, clock=self.api.clock))
        await self.api.registry.update(lambda r: ops.create_source(r, spec,
                                                                   clock=self.api.clock))
        return self._done("source.create", spec.id)

    async def list_sources(self, request: Request) -> Response:
        self._branch(request)
        reg = await self.api.current()
        sources = [k_source(s) for s in reg.live_sources()]
        return self.api.json({"projectId": 0, "branchId": BRANCH, "page": {
            "limit": len(sources), "totalCount": len(sources), "afterId": "",
            "lastId": sources[-1]["sourceId"] if sources else ""}, "sources": sources})

    async def get_source(self, request: Request) -> Response:
        self._branch(request)
        reg = await self.api.current()
        return self.api.json(k_source(self.api._source(reg, request.path_params["sourceId"])))

    async def update_source(self, request: Request) -> Response:
        self._branch(request)
        source_id = request.path_params["sourceId"]
        body: KSourceUpdate = await self.api.body(request, KSourceUpdate)
        if body.type not in (None, "http"):
            raise invalid("type", f"{body.type!r}: only \"http\" sources are supported")
        text = body.description if body.description is not None else body.name
        if text is not None:
            patch = ops.SourcePatch(description=text)
            await self.api.check(lambda r: ops.update_source(r, source_id, patch,
                                                             clock=self.api.clock))
            await self.api.registry.update(lambda r: ops.update_source(
                r, source_id, patch, clock=self.api.clock))
        reg = await self.api.current()
        return self.api.json(k_source(self.api._source(reg, source_id)))

    async def delete_source(self, request: Request) -> Response:
        self._branch(request)
        response = await self.api.delete_source(request)
        if response.status_code != 200:
            return response
        return self._done("source.delete", request.path_params["sourceId"])

    # -- sinks -----------------------------------------------------------------------------

    async def create_sink(self, request: Request) -> Response:
        self._branch(request)
        source_id = request.path_params["sourceId"]
        body: KSinkCreate = await self.api.body(request, KSinkCreate)
        spec = sink_spec(body)
        task = await self.api.start_sink(source_id, spec)
        return self.api.json(self._task(task, "sink.create", source_id, spec.name), 202)

    async def list_sinks(self, request: Request) -> Response:
        self._branch(request)
        reg = await self.api.current()
        source = self.api._source(reg, request.path_params["sourceId"])
        sinks = [k_sink(source, s) for s in source.live_sinks()]
        return self.api.json({"projectId": 0, "branchId": BRANCH, "sourceId": source.id,
                              "page": {"limit": len(sinks), "totalCount": len(sinks),
                                       "afterId": "", "lastId": sinks[-1]["sinkId"]
                                       if sinks else ""}, "sinks": sinks})

    async def get_sink(self, request: Request) -> Response:
        self._branch(request)
        reg = await self.api.current()
        source, sink = self.api._sink(reg, request.path_params["sourceId"],
                                      request.path_params["sinkId"])
        return self.api.json(k_sink(source, sink))

    async def update_sink(self, request: Request) -> Response:
        self._branch(request)
        source_id, name = request.path_params["sourceId"], request.path_params["sinkId"]
        body: KSinkUpdate = await self.api.body(request, KSinkUpdate)
        reg = await self.api.current()
        _, sink = self.api._sink(reg, source_id, name)
        if body.table is None:
            return self.api.json(k_sink(*self.api._sink(reg, source_id, name)))
        columns = tuple(column_of(c, f"table.mapping.columns[{i}]")
                        for i, c in enumerate(body.table.mapping.columns))
        if table_of(body.table.tableId, "table.tableId") != sink.table:
            raise invalid("table.tableId", "a sink's table is fixed here; create another "
                          "sink to write elsewhere")
        key = tuple(c.name for c in body.table.mapping.columns if c.primaryKey)
        patch = ops.SinkPatch(columns=columns, primary_key=key)
        task = await self.api.start_sink_update(source_id, name, patch)
        return self.api.json(self._task(task, "sink.update", source_id, name), 202)

    async def delete_sink(self, request: Request) -> Response:
        self._branch(request)
        source_id, name = request.path_params["sourceId"], request.path_params["sinkId"]
        self.api._sink(await self.api.current(), source_id, name)
        await self.api.registry.update(
            lambda r: ops.delete_sink(r, source_id, name, clock=self.api.clock))
        return self._done("sink.delete", source_id, name)

    # -- settings --------------------------------------------------------------------------

    async def get_sink_settings(self, request: Request) -> Response:
        self._branch(request)
        reg = await self.api.current()
        _, sink = self.api._sink(reg, request.path_params["sourceId"],
                                 request.path_params["sinkId"])
        return self.api.json({"settings": k_settings(sink.conditions)})

    async def patch_sink_settings(self, request: Request) -> Response:
        self._branch(request)
        source_id, name = request.path_params["sourceId"], request.path_params["sinkId"]
        patch: KSettingsPatch = await self.api.body(request, KSettingsPatch)
        _, sink = self.api._sink(await self.api.current(), source_id, name)
        patched_conditions(sink.conditions, patch)  # 400 before any write

        def change(r: Registry) -> Registry:
            _, now = self.api._sink(r, source_id, name)
            return ops.update_sink(r, source_id, name, ops.SinkPatch(
                conditions=ops.ConditionsPatch.of(patched_conditions(now.conditions, patch))),
                clock=self.api.clock)
        reg = await self.api.registry.update(change)
        _, sink = self.api._sink(reg, source_id, name)
        return self.api.json({"settings": k_settings(sink.conditions)})

    async def get_source_settings(self, request: Request) -> Response:
        """The conditions shared by the source's sinks (Keboola's defaults when it has none
        or they differ)."""
        self._branch(request)
        reg = await self.api.current()
        source = self.api._source(reg, request.path_params["sourceId"])
        shared = {s.conditions for s in source.live_sinks()}
        return self.api.json({"settings": k_settings(shared.pop() if len(shared) == 1
                                                     else DEFAULTS)})

    async def patch_source_settings(self, request: Request) -> Response:
        """Applies the conditions to every sink of the source, in one registry change."""
        self._branch(request)
        source_id = request.path_params["sourceId"]
        patch: KSettingsPatch = await self.api.body(request, KSettingsPatch)
        self.api._source(await self.api.current(), source_id)
        patched_conditions(DEFAULTS, patch)

        def change(r: Registry) -> Registry:
            for sink in self.api._source(r, source_id).live_sinks():
                r = ops.update_sink(r, source_id, sink.name, ops.SinkPatch(
                    conditions=ops.ConditionsPatch.of(
                        patched_conditions(sink.conditions, patch))),
                    clock=self.api.clock)
            return r
        reg = await self.api.registry.update(change)
        shared = {s.conditions for s in self.api._source(reg, source_id).live_sinks()}
        return self.api.json({"settings": k_settings(shared.pop() if len(shared) == 1
                                                     else DEFAULTS)})

    async def get_task(self, request: Request) -> Response:
        self._branch(request)
        source_id = request.path_params["sourceId"]
        kind, _, task_id = request.path_params["taskId"].rpartition("/")
        task = self.api.tasks.get(task_id)
        if task is None:
            raise ops.not_found("task", request.path_params["taskId"])
        kind = kind or {"create_sink": "sink.create", "update_sink": "sink.update",
                        "create_source": "source.create"}.get(task.kind, task.kind)
        sink_id = task.target.split("/", 1)[1] if "/" in task.target else None
        return self.api.json(self._task(task, kind, source_id, sink_id))


def keboola_routes(api: Any, guard: Callable[[Handler], Handler]) -> list[Route]:
    k = KeboolaApi(api)
    base = "/v1/branches/{branchId}/sources"
    source = base + "/{sourceId}"
    sink = source + "/sinks/{sinkId}"
    return [
        Route(base, guard(k.list_sources), methods=["GET"]),
        Route(base, guard(k.create_source), methods=["POST"]),
        Route(source + "/settings", guard(k.get_source_settings), methods=["GET"]),
        Route(source + "/settings", guard(k.patch_source_settings), methods=["PATCH"]),
        Route(source + "/sinks", guard(k.list_sinks), methods=["GET"]),
        Route(source + "/sinks", guard(k.create_sink), methods=["POST"]),
        Route(sink + "/settings", guard(k.get_sink_settings), methods=["GET"]),
        Route(sink + "/settings", guard(k.patch_sink_settings), methods=["PATCH"]),
        Route(sink, guard(k.get_sink), methods=["GET"]),
        Route(sink, guard(k.update_sink), methods=["PATCH"]),
        Route(sink, guard(k.delete_sink), methods=["DELETE"]),
        Route(source + "/tasks/{taskId:path}", guard(k.get_task), methods=["GET"]),
        Route(source, guard(k.get_source), methods=["GET"]),
        Route(source, guard(k.update_source), methods=["PATCH"]),
        Route(source, guard(k.delete_source), methods=["DELETE"]),
    ]
