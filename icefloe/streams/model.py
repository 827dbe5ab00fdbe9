"""The stream model: a stream's declared columns, its rate limit, and the stream itself.

Why in the core and apart from the rest of the config: a stream is configured in
``icefloe.toml`` or registered at runtime through the admin API, and the ingestor, the
collector and the pipeline all read it; nothing here knows about files, environment
variables or the other sections (:mod:`icefloe.config` builds on this, not the reverse).
Decoded by msgspec, so a wrong type or unknown key fails with its exact path.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

COLUMN_TYPES = ("string", "long", "int", "float", "double", "boolean", "timestamp", "date",
                "json", "uuid", "binary", "time", "timestamp_ntz")
"""The type names without parameters; ``decimal(p,s)``, ``list<T>``, ``map<string,T>`` and
``struct<...>`` are built by the grammar in :mod:`icefloe.streams.typespec`. ``timestamp``
is an instant (UTC); ``timestamp_ntz`` a wall-clock date and time without a zone (Avro's
local timestamps, Iceberg's ``timestamp``), both in microseconds."""

FORM_BODIES = ("collect", "json", "refuse")
"""``form_body``: where a body typed ``application/x-www-form-urlencoded`` (curl's default
with ``-d``) is read as JSON: on the ``/collect`` routes only, on every route, or nowhere."""
PARTITIONS = ("day", "hour", "month", "none")
"""Partitioning of a stream table by ``_received_at``; ``none`` leaves it unpartitioned."""


class Column(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A declared column of a stream: JSON field ``name`` of type ``type``, unless a mapping
    says where its value comes from (at most one of ``path``, ``header``, ``from``, ``sql``,
    ``template``;
    see :mod:`icefloe.streams.mappings`). ``default`` fills a missing ``path``/``header`` value;
    ``raw`` lets a ``path`` string column take any JSON value as its JSON text; ``dialect``
    is the SQL dialect of ``sql`` (spark, duckdb or postgres)."""

    name: str
    type: str
    required: bool = False
    doc: str = ""
    path: str | None = None
    header: str | None = None
    source: str | None = msgspec.field(default=None, name="from")
    sql: str | None = None
    dialect: str = "spark"
    default: Any = None
    raw: bool = False
    template: str | None = None
    """A Jsonnet template with Keboola's globals (``Body('a.b')``, ``Header()``, ``Now()``
    ...), evaluated per event by the collector (:mod:`icefloe.streams.templates`)."""

    @property
    def mapping(self) -> str | None:
        """``path``, ``header``, ``sql``, ``template``, the ``from`` value, or None for a
        plain field."""
        if self.path is not None:
            return "path"
        if self.header is not None:
            return "header"
        if self.sql is not None:
            return "sql"
        if self.template is not None:
            return "template"
        return self.source


class RateLimit(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Token buckets of one stream, token or client address, local to each ingestor.

    ``events_per_s`` and ``bytes_per_s`` (canonical event JSON) refill continuously; each
    bucket holds ``burst_s`` seconds' worth, so a quiet client may send that much at once.
    Either rate may be left out (no bound on that measure).
    """

    events_per_s: float | None = None
    bytes_per_s: float | None = None
    burst_s: float = 1.0


class EvolveQuota(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How many new columns one client may add to a table by schema evolution from the data
    (``unknown_fields = "evolve"``); 0 means no bound but ``collector.evolve_max_columns``.

    Why per client: on a shared stream, one token's events could otherwise fill the table
    to its column limit and leave no room for anybody else's fields. A *client* is the
    write token an event came with (its config name), or the source itself for events sent
    without one; the source bounds are over all its clients. Hours are clock hours (UTC).
    Fields over a bound are kept in the table's ``_overflow`` json column, never dropped
    (see :mod:`icefloe.streams.evolve_quota`)."""

    token_columns_per_hour: int = 100
    token_columns_total: int = 500
    source_columns_per_hour: int = 0
    source_columns_total: int = 0


class TypedSchema(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a ``format = "protobuf"`` or ``"avro"`` stream's type comes from (#39).

    Protobuf: ``message`` (the full name, ``acme.orders.v1.OrderPlaced``) in a
    ``descriptor_set`` file (``buf build -o``, ``protoc --include_imports
    --descriptor_set_out``); ``enums`` as their value names (``string``) or numbers
    (``int``). Avro: a ``schema_file`` (``.avsc``). ``text`` is what the loader read from
    the file (base64 of the descriptor set, or the Avro schema's JSON), so every process
    and every Spark executor derives the same type from the config alone.

    Or ``subject``: a subject of icefloe's schema registry, instead of a file (a Protobuf
    stream still names its ``message``). Its latest version is the stream's type; the
    loader cannot read the registry, so ``text`` stays empty until the ingestor and the
    collector resolve it (:mod:`icefloe.registry.subjects`), and again at each new version."""

    message: str | None = None
    descriptor_set: str | None = None
    schema_file: str | None = None
    enums: Literal["string", "int"] = "string"
    text: str = ""
    subject: str | None = None
    subject_version: int = 0
    """The subject's version ``text`` holds (0: not resolved, or not a subject)."""


class DynamicTables(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Limits of a sink whose table is a template (``dynamic_tables = {...}``; the rules:
    :mod:`icefloe.streams.dynamic_tables`)."""

    max_tables: int = 1000
    """Tables the sink may have in its namespace; a row that would create one more goes to
    the dead letters (``dynamic_table:max_tables``)."""
    max_name_length: int = 128
    """Longest table name (after the namespace, literal parts included); longer:
    ``dynamic_table:name_too_long``."""


class CdcConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Change data capture (#42): each event is a change of a keyed table's row, applied in
    the source's order (see :mod:`icefloe.streams.cdc`, docs/cdc.md).

    ``format``: ``debezium`` (an envelope with ``op``, ``before``, ``after``, ``source``,
    bare or inside the JSON converter's ``schema``/``payload`` wrapper) or ``op`` (the row
    itself with an operation field: ``op_field``, its values mapped by ``ops`` to c/u/d/r,
    an optional ``before_field`` object). ``position``: ``auto`` (by
    ``source.connector``), ``postgresql``, ``mysql``, or JSON paths of integers.
    ``before_columns``: declared columns whose before image lands in ``before_<name>``."""

    format: Literal["debezium", "op"] = "debezium"
    position: str | tuple[str, ...] = "auto"
    op_field: str = "op"
    ops: dict[str, str] = msgspec.field(default_factory=dict)
    before_field: str | None = None
    before_columns: tuple[str, ...] = ()
    deletes: Literal["remove", "keep"] = "remove"
    """``remove``: a delete removes the key's row; ``keep``: it stays as a row with
    ``_cdc_deleted`` true (its position kept, so a late older change is a no-op)."""


class StreamConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A stream: an ingest endpoint whose events land in one Iceberg table.

    ``tokens`` are hash lines (``icefloe token hash``) of tokens that may write to this
    stream only; tokens for several streams are top-level ``[[tokens]]``.

    ``form_body`` (:data:`FORM_BODIES`) says where a form-typed body is read as JSON: the
    ``/collect`` routes take what ``curl -d`` sends by default; a stream may opt every
    route in, or refuse it everywhere (415) so that browsers must pass a CORS preflight.

    ``partition_by`` (Iceberg transforms of any column; overrides ``partition``), ``sort_by``
    and ``table_properties`` shape the table: :mod:`icefloe.streams.layout`.
    """

    name: str
    table: str
    columns: tuple[Column, ...]
    unknown_fields: Literal["ignore", "reject", "evolve"] = "ignore"
    """Fields the stream does not declare: dropped, refused (400), or kept so the collector
    adds them as columns (``evolve``, see :mod:`icefloe.streams.evolution`)."""
    tokens: tuple[str, ...] = ()
    event_id_field: str | None = None
    partition: str = "day"
    rate_limit: RateLimit | None = None
    form_body: Literal["collect", "json", "refuse"] = "collect"
    partition_by: tuple[str, ...] | None = None
    sort_by: tuple[str, ...] = ()
    table_properties: dict[str, str] = msgspec.field(default_factory=dict)
    primary_key: tuple[str, ...] = ()
    """Upserts (#27): the table keeps the latest row per key (copy-on-write, see
    :mod:`pipeline.iceberg.upsert`); empty: append-only."""
    tombstone_field: str | None = None
    """A boolean column; a row whose value is true deletes its key (needs ``primary_key``)."""
    where: str | None = None
    """Routing by content: a SQL predicate over the columns; only events it holds for
    reach this table (see :mod:`icefloe.streams.where`)."""
    unrouted: Literal["drop", "dead_letter"] = "drop"
    """An event no sink's ``where`` takes: counted and dropped, or also dead-lettered."""
    evolve_quota: EvolveQuota | None = None
    """Bounds on the columns each client may add (``unknown_fields = "evolve"``); None:
    the defaults of :class:`EvolveQuota`."""
    payload: Literal["json", "bytes"] = "json"
    """What an event is: a JSON object, or one opaque byte entry (opendata's ingest
    buffer) kept whole in the stream's single ``binary`` column (:mod:`icefloe.streams.entries`)."""
    on_invalid: Literal["reject", "dead_letter"] = "reject"
    """A request holding events that fail validation: refused whole (400, nothing kept), or
    its valid events accepted and the invalid ones written to ``icefloe.dead_letters`` with
    their reason (Moose's dead-letter queue; an explicit, opt-in exception)."""

    format: Literal["json", "protobuf", "avro"] = "json"
    """What an event is on the wire: a JSON object, a Protobuf message or an Avro datum
    (#39); for the last two the columns come from the type ``schema`` names."""
    schema: TypedSchema | None = None
    kafka_partitions: int = 1
    """Partitions the Kafka listener presents for this stream's topic (producers spread
    records and keep idempotence sequences per partition; icefloe itself has no
    partitions: the number only shapes the producers' batching)."""
    dynamic_tables: DynamicTables | None = None
    """Limits of a table template (``table = "ns.events_{tenant_id}"``); None: the
    defaults of :class:`DynamicTables` (refused unless ``table`` is a template)."""

    cdc: CdcConfig | None = None
    """Change data capture: events are row changes applied to the keyed table in source
    order (:class:`CdcConfig`); None: events are rows."""

    @property
    def namespace(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.table.split(".", 1)[1]
