"""Collecting one export request's rows: per kind, in request order, with the records
that could not become rows counted and the first reason kept.

Why its own module: the log and span rows (:mod:`icefloe.otlp.rows`) and the metric points
(:mod:`icefloe.otlp.metric_rows`) fill the same collector, and its loop is the hot one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import msgspec

from icefloe.otlp.values import Rejected

_ENCODE = msgspec.json.Encoder().encode
Attributes = Callable[[Any], Any]
"""How a ``KeyValue`` list becomes a column value: a JSON object, or canonical entries."""


class ExportRows(NamedTuple):
    """What one export request becomes: ``rows`` per kind (JSON object bytes, in request
    order; only kinds with rows appear), and the records that could not become rows."""

    rows: dict[str, list[bytes]]
    rejected: int
    message: str
    """Why the first rejected record was (with the count when more were); "" when none."""
    canonical: bool = False
    """The rows are in the generated streams' canonical form (``export_rows(canonical=
    True)``): buffered as they are, only into a stream that is still the generated one."""


class Out:
    """Rows per kind, and the rejected count with the first reason."""

    def __init__(self) -> None:
        self.rows: dict[str, list[bytes]] = {}
        self.rejected = 0
        self.first = ""
        self._rows: list[bytes] = []
        self._shared = b"}"

    def scope(self, kind: str, shared: bytes) -> None:
        """Rows added next are of ``kind`` and end with ``shared`` (``,"k":v...}``)."""
        rows = self.rows.get(kind)
        if rows is None:
            rows = self.rows[kind] = []
        self._rows = rows
        self._shared = shared

    def add(self, build: Callable[[Any, Attributes], Any], records: Iterable[Any],
            attrs: Attributes) -> None:
        """The row ``build`` makes of each record, or one more rejected record.

        Why a loop here rather than a call per record: this is the hot loop of the whole
        module, and a method call per record is a tenth of a record's cost."""
        append, shared, encode = self._rows.append, self._shared, _ENCODE
        for record in records:
            try:
                payload = encode(build(record, attrs))
            except Rejected as exc:
                self.reject(str(exc))
                continue
            except UnicodeEncodeError:  # a lone surrogate (a JSON request's "\ud800")
                self.reject("a string is not valid UTF-8 (a lone surrogate)")
                continue
            append(payload[:-1] + shared)

    def reject(self, why: str) -> None:
        if not self.rejected:
            self.first = why
        self.rejected += 1

    def result(self) -> ExportRows:
        rows = {kind: found for kind, found in self.rows.items() if found}
        message = self.first
        if self.rejected > 1:
            message = f"{self.rejected} records rejected; the first: {self.first}"
        return ExportRows(rows, self.rejected, message)
