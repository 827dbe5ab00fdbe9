"""The ingestor's half of column mappings: ``path`` and ``body`` values, request metadata.

Why here: the ingestor already parses every event to validate it, so reading a value at a
JSON path costs one small decode of the subtree it lives in, and a value of the wrong type
is refused with the event index, the column and the path — the producer learns at once
instead of finding nulls or dead letters later. The extracted values become ordinary
top-level fields of the canonical payload, so the collector's columnar fast path reads them
like any plain column. ``ip`` and ``header`` values are request metadata: only the ones a
mapping names are kept, once per record, in the envelope's meta (:func:`request_meta`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from icefloe.config import Column, StreamConfig
from icefloe.mappings import Step, parse_path

META_IP = "ip"
META_HEADERS = "h"
"""Keys of the envelope meta object: ``{"ip": "1.2.3.4", "h": {"user-agent": "..."}}``."""

Convert = Callable[[str, Any, bool], Any]


class MappingViolation(Exception):
    """An event's mapped value is missing or of the wrong type."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason)
        self.field = field
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Path:
    column: Column
    root: str
    rest: tuple[Step, ...]


_MISSING = object()


def _walk(value: Any, steps: tuple[Step, ...]) -> Any:
    for step in steps:
        if isinstance(step, str):
            if not isinstance(value, dict):
                return _MISSING
            value = value.get(step, _MISSING)
        else:
            if not isinstance(value, list) or step >= len(value):
                return _MISSING
            value = value[step]
        if value is _MISSING:
            return _MISSING
    return value


class EventMappings:
    """Evaluates a stream's ``path`` and ``body`` columns for decoded events.

    ``roots`` maps each path's first key to the struct attribute holding that field's raw
    JSON (the validator adds one ``msgspec.Raw`` field per root, so ``unknown_fields =
    "reject"`` counts them as known and the subtree arrives undecoded).
    """

    def __init__(self, stream: StreamConfig, roots: dict[str, str], convert: Convert) -> None:
        self._convert = convert
        self._roots = roots
        self._paths: list[_Path] = []
        for column in stream.columns:
            if column.path is not None:
                steps = parse_path(column.path)
                self._paths.append(_Path(column, str(steps[0]), steps[1:]))
        self.bodies = [c for c in stream.columns if c.source == "body"]
        self._decode = msgspec.json.decode

    @property
    def needs_raw(self) -> bool:
        """True when a ``from = "body"`` column needs each event's own JSON text."""
        return bool(self.bodies)

    def extract(self, event: Any, raw: bytes | None) -> list[tuple[str, Any]]:
        """``(column, canonical value)`` of every mapped value present, in column order."""
        out: list[tuple[str, Any]] = []
        decoded: dict[str, Any] = {}
        for path in self._paths:
            column = path.column
            root = decoded.get(path.root, _MISSING)
            if root is _MISSING:
                text = getattr(event, self._roots[path.root])
                root = decoded[path.root] = None if text is None else self._decode(text)
            value = _walk(root, path.rest) if root is not None else _MISSING
            if value is _MISSING or value is None:
                if column.default is not None:
                    value = column.default
                elif column.required:
                    raise MappingViolation(column.name, f"required value at {column.path} is "
                                           "missing or null")
                else:
                    continue
            try:
                out.append((column.name, self._convert(column.type, value, column.raw)))
            except (msgspec.ValidationError, ValueError) as exc:
                reason = str(exc)
                raise MappingViolation(column.name, f"value at {column.path}: "
                                       f"{reason[:1].lower()}{reason[1:]}") from None
        for column in self.bodies:
            assert raw is not None
            out.append((column.name, bytes(raw).decode()))
        return out


def header_columns(stream: StreamConfig) -> list[Column]:
    return [c for c in stream.columns if c.header is not None]


def request_meta(stream: StreamConfig, client: str | None,
                 header: Callable[[str], str | None]) -> dict[str, Any] | None:
    """The meta object a request's records carry, or None when no mapping needs one.

    ``header(name)`` looks a request header up by its lower-case name. A missing required
    header raises :class:`MappingViolation`; a missing optional one takes its default or is
    left out (the column is null).
    """
    wants_ip = any(c.source == "ip" for c in stream.columns)
    headers = header_columns(stream)
    if not wants_ip and not headers:
        return None
    meta: dict[str, Any] = {}
    if wants_ip and client is not None:
        meta[META_IP] = client
    values: dict[str, str] = {}
    for column in headers:
        name = column.header.lower()  # type: ignore[union-attr]
        value = header(name)
        if value is None:
            if column.default is not None:
                value = str(column.default)
            elif column.required:
                raise MappingViolation(column.name, f"required header {column.header!r} is "
                                       "missing")
            else:
                continue
        values[name] = value
    if values:
        meta[META_HEADERS] = values
    return meta


def meta_header_names(streams: Sequence[StreamConfig]) -> set[bytes]:
    """Lower-case header names any stream maps (the HTTP front keeps only those)."""
    return {c.header.lower().encode() for s in streams for c in header_columns(s)}  # type: ignore[union-attr]
