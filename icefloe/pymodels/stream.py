"""``icefloe.define``: a model class as a stream definition, its TOML, and its encoder.

Why the class is the schema: a producer that declares its events as a dataclass or a
pydantic model would otherwise declare the same columns a second time in ``icefloe.toml``
or an admin API call, and the two drift. Here the columns, the primary key and the docs
come from the class (:mod:`icefloe.pymodels.fields`), are checked by the same rules as a
configured stream (:func:`icefloe.streams.check.validate_stream`), and every event is
encoded by the same walk, so what is sent always matches what is declared.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import msgspec

from icefloe.clock import SYSTEM, Clock
from icefloe.errors import ModelError
from icefloe.pymodels.fields import ModelField, model_fields
from icefloe.streams.check import validate_stream
from icefloe.streams.model import Column, StreamConfig

if TYPE_CHECKING:
    from icefloe.client.tls import ClientTls
    from icefloe.pymodels.client import ModelClient
    from icefloe.pymodels.register import Registered

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class ModelStream(Generic[T]):
    """A stream whose events are instances of ``model`` (made by :func:`define`).

    ``config`` is the stream as ``icefloe.toml`` would declare it; :meth:`to_toml` writes
    that block, :meth:`register` creates or evolves it through the admin API, and
    :meth:`client` sends instances to an ingestor."""

    model: type[T]
    config: StreamConfig
    fields: tuple[ModelField, ...]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def table(self) -> str:
        return self.config.table

    @property
    def columns(self) -> tuple[Column, ...]:
        return self.config.columns

    @property
    def description(self) -> str:
        """The class docstring's first paragraph (a dataclass's generated signature
        docstring does not count)."""
        doc = self.model.__dict__.get("__doc__") or ""
        if not doc or doc.startswith(f"{self.model.__name__}("):
            return ""
        return " ".join(doc.strip().split("\n\n", 1)[0].split())

    def encode(self, event: T) -> bytes:
        """``event`` as the stream's JSON object (None fields left out; datetimes RFC 3339
        UTC, decimals exact text, bytes base64, uuids text). Raises :class:`ModelError`
        naming the field for a value no column can hold (a naive datetime)."""
        if not isinstance(event, self.model):
            raise ModelError(f"stream {self.name!r} takes {self.model.__name__} instances, "
                             f"got {type(event).__name__}")
        out: dict[str, Any] = {}
        for field in self.fields:
            value = getattr(event, field.name)
            if value is not None:
                out[field.name] = field.kind.encode(value, f"{self.model.__name__}."
                                                           f"{field.name}")
        return _encode(out)

    def to_toml(self) -> str:
        """The ``[[streams]]`` block of ``icefloe.toml`` that declares this stream."""
        return stream_toml(self.config)

    def register(self, admin_url: str, token: str, *, timeout: float = 60.0,
                 tls: ClientTls | None = None, clock: Clock = SYSTEM) -> Registered:
        """Create the stream and its table through the admin API at ``admin_url`` (an admin
        token), or evolve them to this class: a new optional field adds a column; a
        removed required field, a new required field or a changed type is refused,
        naming the field (see :func:`icefloe.pymodels.register.evolve_columns`). Waits
        (up to ``timeout`` seconds) for the table task to finish.

        Raises:
            RegistryError: the server refused (status, code, message and details as it
                answered; a failed task's error likewise).
            ModelError: the change would break producers of the registered class.
        """
        from icefloe.pymodels.register import register  # lazy: httpx

        return register(self.config, self.model.__name__, self.description, admin_url,
                        token, timeout=timeout, tls=tls, clock=clock)

    def client(self, url: str, token: str | None = None, *,
               transport: Literal["http", "grpc"] = "http", **options: Any
               ) -> ModelClient[T]:
        """A client that sends instances of the model to this stream: over HTTP to ``url``
        (``http://host:8080``), or over gRPC to ``url`` (``host:50051``) with
        ``transport="grpc"``. ``options`` go to :class:`~icefloe.client.HttpClient` or
        :class:`~icefloe.client.GrpcClient` (``timeout``, ``retries``, ``tls``, ...)."""
        from icefloe.pymodels.client import ModelClient  # lazy: httpx / grpc

        return ModelClient(self.name, self.encode, url, token, transport=transport, **options)


def define(model: type[T], *, stream: str, table: str,
           unknown_fields: Literal["ignore", "reject", "evolve"] = "reject",
           event_id_field: str | None = None, tombstone_field: str | None = None,
           partition: str = "day", partition_by: Sequence[str] | None = None,
           sort_by: Sequence[str] = (), table_properties: Mapping[str, str] | None = None,
           tokens: Sequence[str] = ()) -> ModelStream[T]:
    """The stream ``stream`` writing table ``table`` (``namespace.table``) whose events are
    instances of ``model``, a dataclass or a pydantic model.

    Columns come from the annotations in field order (the mapping is in
    :mod:`icefloe.pymodels.fields` and docs/python-models.md); ``T | None`` fields are
    optional, all others required; ``Key[T]`` fields form the ``primary_key`` (the table
    keeps the latest row per key); a field's docstring, ``field(metadata={"doc": ...})``
    or pydantic ``Field(description=...)`` becomes its column's ``doc``.

    ``unknown_fields`` defaults to ``"reject"``: the client sends only the class's fields,
    so a field the stream does not know means an ingestor that has not yet seen the
    class's latest registration, and a 400 naming it beats dropping its values. The other
    keywords are the ``[[streams]]`` keys of the same names.

    Raises:
        ModelError: an annotation with no faithful column type (naming the field and the
            type), a bare ``Decimal``, a recursive model, an optional ``Key``.
        ConfigError: the stream breaks a rule of ``icefloe.toml`` (name, table, key types).
    """
    fields = model_fields(model)
    config = StreamConfig(
        name=stream, table=table, unknown_fields=unknown_fields,
        columns=tuple(Column(f.name, f.kind.type, required=not f.kind.nullable, doc=f.doc)
                      for f in fields),
        primary_key=tuple(f.name for f in fields if f.kind.key),
        event_id_field=event_id_field, tombstone_field=tombstone_field,
        partition=partition, partition_by=None if partition_by is None else tuple(partition_by),
        sort_by=tuple(sort_by), table_properties=dict(table_properties or {}),
        tokens=tuple(tokens))
    validate_stream(config, f"{model.__name__} (stream {stream!r})")
    return ModelStream(model, config, fields)


# -- TOML ------------------------------------------------------------------------------------


def stream_toml(stream: StreamConfig) -> str:
    """``stream`` as one ``[[streams]]`` block: name, table, every key that differs from
    its default, then one column per line."""
    lines = ["[[streams]]", f"name = {_toml(stream.name)}", f"table = {_toml(stream.table)}"]
    plain = StreamConfig(name=stream.name, table=stream.table, columns=stream.columns)
    for field in dataclasses.fields(_Keys):
        value = getattr(stream, field.name)
        if value != getattr(plain, field.name) and value is not None:
            lines.append(f"{field.name} = {_toml(msgspec.to_builtins(value))}")
    lines.append("columns = [")
    for column in stream.columns:
        parts = [f"name = {_toml(column.name)}", f"type = {_toml(column.type)}"]
        if column.required:
            parts.append("required = true")
        if column.doc:
            parts.append(f"doc = {_toml(column.doc)}")
        lines.append("  { " + ", ".join(parts) + " },")
    lines.append("]")
    return "\n".join(lines) + "\n"


@dataclass
class _Keys:
    """The ``[[streams]]`` keys a model stream may set besides name, table and columns
    (their order in :func:`stream_toml`)."""

    unknown_fields: str
    primary_key: tuple[str, ...]
    tombstone_field: str | None
    event_id_field: str | None
    partition: str
    partition_by: tuple[str, ...] | None
    sort_by: tuple[str, ...]
    table_properties: dict[str, str]
    tokens: tuple[str, ...]


def _toml(value: Any) -> str:
    """A TOML value: strings as basic strings (JSON's escapes are TOML's), arrays, inline
    tables, booleans."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, int | float):
        return repr(value)
    raise TypeError(f"no TOML form for {type(value).__name__}")

