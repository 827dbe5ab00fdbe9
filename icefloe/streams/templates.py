"""``template`` columns: a Jsonnet expression per event, with Keboola's globals.

Keboola Data Streams map an event into a column with a Jsonnet template that may call
``Body()``, ``Body(path)``, ``Body(path, default)``, ``BodyStr()``, ``Header()``,
``Header(name)``, ``Header(name, default)``, ``HeaderStr()``, ``Ip()`` and ``Now([format])``.
The value stored is the template's result as compact JSON text (a string keeps its quotes),
as Keboola stores it; a ``Body(path)`` or ``Header(name)`` that finds nothing, or any other
error, fails that event for the column, and the pipeline dead-letters it with the reason.

Why batches: the ``jsonnet`` library re-reads its standard library on every evaluation
(~30 ms), so evaluating one event at a time would cap a core at ~30 events/s. One
evaluation takes a whole block of events as ``[T(i) for i in ...]``: the template is
parsed once, and the globals are native callbacks that read event ``i`` from Python
(:class:`TemplateRows`). A native that finds nothing records the failure for that event and
returns null, so one bad event does not abort its block; if the block fails anyway (the
template itself errs on some event), the block is split in halves until the failing events
are alone (bounded by :data:`MAX_PROBES` evaluations per block; the events of a range still
failing past the bound fail with that range's error).

Why ``Now()`` is the receive time: the collector may evaluate an entry again after a crash,
and a replay must compute the same values (``_received_at``, in UTC, formatted like
Keboola's ``%Y-%m-%dT%H:%M:%S.%fZ`` where ``%f`` is milliseconds).

This module only checks and evaluates; :mod:`ingestor.mappings` keeps the event's JSON
text (``BodyStr``) in the column's payload field, and :mod:`pipeline.load.mapped` calls
:func:`evaluate` on the executors.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

MAX_CONTENT = 4096
"""Longest template Keboola accepts (characters); icefloe keeps the same bound."""
BLOCK = 4096
"""Events per evaluation: the ~30 ms fixed cost is spread over this many."""
MAX_PROBES = 64
"""Evaluations a failing block may cost while its failing events are isolated."""
DEFAULT_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_UNDEFINED = "<<~~icefloe-undefined~~>>"
_MISSING = "<<~~icefloe-missing~~>>"
_PRELUDE = (
    # A native only takes primitives: any default other than a string (an object, a
    # number) waits in Jsonnet while the native is asked with the _MISSING marker. Why
    # primitiveEquals on the type: `==` and std.isString are Jsonnet code and cost the
    # common call (no default) half its speed; these two are built in.
    f'local Body(path="", default="{_UNDEFINED}") = if std.primitiveEquals(std.type(default), '
    '"string") then std.native("_body")(_i, path, default) else local v = std.native('
    f'"_body")(_i, path, "{_MISSING}"); if v == "{_MISSING}" then default else v;\n'
    f'local Header(name="", default="{_UNDEFINED}") = if std.primitiveEquals(std.type('
    'default), "string") then std.native("_header")(_i, name, default) else local v = '
    f'std.native("_header")(_i, name, "{_MISSING}"); if v == "{_MISSING}" then default '
    'else v;\n'
    'local BodyStr() = std.native("_bodyStr")(_i);\n'
    'local HeaderStr() = std.native("_headerStr")(_i);\n'
    'local Ip() = std.native("_ip")(_i);\n'
    f'local Now(format="{DEFAULT_TIME_FORMAT}") = std.native("_now")(_i, format);\n'
)
_PATH_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]|(\.)")


@functools.lru_cache(maxsize=1024)
def body_path(text: str) -> tuple[str | int, ...]:
    """Keboola's dot syntax (``issue.labels[0].name``) as steps; ValueError when malformed."""
    steps: list[str | int] = []
    pos = 0
    expect_key = True
    while pos < len(text):
        match = _PATH_STEP.match(text, pos)
        if match is None:
            raise ValueError(f"unsupported path syntax at offset {pos} in {text!r}; use "
                             "key.key[index] (Keboola's dot syntax)")
        key, index, dot = match.groups()
        if dot is not None:
            if expect_key:
                raise ValueError(f"empty key at offset {pos} in {text!r}")
            expect_key = True
        elif index is not None:
            steps.append(int(index))
            expect_key = False
        else:
            steps.append(key)
            expect_key = False
        pos = match.end()
    if not steps or expect_key:
        raise ValueError(f"path {text!r} is empty or ends with '.'")
    return tuple(steps)


def canonical_header(name: str) -> str:
    """``content-type`` → ``Content-Type`` (the form Keboola's ``Header()`` keys take)."""
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


def strftime(when: dt.datetime, fmt: str) -> str:
    """``strftime`` with ``%f`` as milliseconds (three digits), as Keboola formats it."""
    millis = f"{when.microsecond // 1000:03d}"
    return when.strftime(re.sub(r"%(.)", lambda m: millis if m.group(1) == "f"
                                else m.group(0), fmt))


@dataclass(slots=True)
class TemplateRows:
    """The events one template is evaluated over: body texts, request data, receive times.

    ``headers`` are the JSON texts a ``from = "headers"`` column would store (lower-case
    names, secrets left out), or None where the record has none."""

    bodies: Sequence[str | None]
    ips: Sequence[str | None]
    headers: Sequence[str | None]
    received_ms: Sequence[int]
    _parsed: dict[int, Any] = field(default_factory=dict)
    _headers: dict[int, dict[str, str]] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)

    def body(self, i: int) -> Any:
        if i not in self._parsed:
            text = self.bodies[i]
            self._parsed[i] = {} if not text else msgspec.json.decode(text)
        return self._parsed[i]

    def header_map(self, i: int) -> dict[str, str]:
        if i not in self._headers:
            text = self.headers[i]
            self._headers[i] = {} if not text else msgspec.json.decode(text)
        return self._headers[i]

    def fail(self, i: int, message: str) -> None:
        self.failures.setdefault(i, message)

    # -- the natives (argument names differ from the Jsonnet wrappers': the library refuses
    # a native whose parameter names repeat the calling function's) ------------------------

    def n_body(self, a: float, b: str, c: Any) -> Any:
        i = int(a)
        value = self.body(i)
        if b == "":
            return value
        for step in body_path(b):
            found = (isinstance(value, list) and step < len(value)) if isinstance(step, int) \
                else (isinstance(value, dict) and step in value)
            if not found:
                if c == _UNDEFINED:
                    self.fail(i, f'path "{b}" not found in the body')
                    return None
                return c
            value = value[step]
        return value

    def n_header(self, a: float, b: str, c: Any) -> Any:
        i = int(a)
        headers = self.header_map(i)
        if b == "":
            return {canonical_header(k): v for k, v in headers.items()}
        value = headers.get(b.lower())
        if value is None:
            if c == _UNDEFINED:
                self.fail(i, f'header "{canonical_header(b)}" not found')
                return None
            return c
        return value

    def n_body_str(self, a: float) -> str:
        return self.bodies[int(a)] or ""

    def n_header_str(self, a: float) -> str:
        headers = self.header_map(int(a))
        lines = sorted(f"{canonical_header(k)}: {v}\n" for k, v in headers.items())
        return "".join(lines)

    def n_ip(self, a: float) -> str:
        return self.ips[int(a)] or ""

    def n_now(self, a: float, b: str) -> str:
        when = dt.datetime.fromtimestamp(self.received_ms[int(a)] / 1000, dt.UTC)
        return strftime(when, b)

    def natives(self) -> dict[str, Any]:
        return {"_body": (("a", "b", "c"), self.n_body),
                "_header": (("a", "b", "c"), self.n_header),
                "_bodyStr": (("a",), self.n_body_str),
                "_headerStr": (("a",), self.n_header_str),
                "_ip": (("a",), self.n_ip),
                "_now": (("a", "b"), self.n_now)}


def _snippet(content: str, first: int, last: int) -> str:
    return (f"local T(_i) =\n{_PRELUDE}({content}\n);\n"
            f"[T(i) for i in std.range({first}, {last})]")


_OFFSET = _PRELUDE.count("\n") + 1
"""Lines before the template's first in the evaluated snippet (errors name its own lines)."""


def _error_text(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = re.sub(r"template:(\d+):", lambda m: f"line {int(m.group(1)) - _OFFSET}:", text)
    return text.removeprefix("RUNTIME ERROR: ").removeprefix("STATIC ERROR: ")[:500]


def check_template(content: str) -> None:
    """ValueError naming the problem when ``content`` is not a Jsonnet expression (a syntax
    error, an unknown variable) or is longer than :data:`MAX_CONTENT`."""
    import _jsonnet  # the jsonnet package: imported only where templates are used

    if not content.strip():
        raise ValueError("the template is empty")
    if len(content) > MAX_CONTENT:
        raise ValueError(f"the template has {len(content)} characters; at most "
                         f"{MAX_CONTENT}")
    rows = TemplateRows([None], [None], [None], [0])
    # Bodies and headers are empty here, so a runtime error is expected and fine; only a
    # static one (syntax, unknown name) means the template can never work.
    try:
        _jsonnet.evaluate_snippet("template", _snippet(content, 0, 0),
                                  native_callbacks=rows.natives(), max_stack=200)
    except RuntimeError as exc:
        if str(exc).startswith("STATIC ERROR"):
            raise ValueError(f"not a Jsonnet expression: {_error_text(exc)}") from None


def evaluate(content: str, rows: TemplateRows) -> tuple[list[str | None], dict[int, str]]:
    """Each event's value (compact JSON text) and ``{event: reason}`` for the events that
    failed (their value is None)."""
    import _jsonnet  # optional dep

    count = len(rows.received_ms)
    values: list[str | None] = [None] * count
    errors: dict[int, str] = {}
    natives = rows.natives()
    encode = msgspec.json.encode

    def run(first: int, last: int) -> list[Any]:
        text = _jsonnet.evaluate_snippet("template", _snippet(content, first, last),
                                         native_callbacks=natives, max_stack=200)
        return msgspec.json.decode(text, type=list[Any])

    for start in range(0, count, BLOCK):
        pending = [(start, min(start + BLOCK, count) - 1)]
        probes = 0
        while pending:
            first, last = pending.pop()
            rows.failures.clear()
            try:
                probes += 1
                out = run(first, last)
            except RuntimeError as exc:
                if first == last or probes >= MAX_PROBES:
                    for i in range(first, last + 1):
                        errors[i] = rows.failures.get(i, _error_text(exc))
                    continue
                middle = (first + last) // 2
                pending += [(first, middle), (middle + 1, last)]
                continue
            for offset, value in enumerate(out):
                i = first + offset
                if i in rows.failures:
                    errors[i] = rows.failures[i]
                else:
                    values[i] = encode(value).decode()
    return values, errors
