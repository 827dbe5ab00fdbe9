"""The ``[otlp]`` config section, and the streams it generates.

Why generated streams: with ``enabled = true`` the loader appends one ordinary JSON stream
per kind (:data:`~icefloe.otlp.kinds.KINDS`) to ``Config.streams``, with the columns of
:mod:`icefloe.otlp.schemas`. Every role (ingestor, collector, admin API, query) then sees
them like declared streams, and nothing downstream of the receivers knows OTLP. Event ids
are derived by the receivers from the request bytes, so the streams name no
``event_id_field``. A clash with what the file declares (a stream of a generated name, a
table another stream feeds) stops the load with a :class:`ConfigError` naming both keys.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from icefloe.errors import ConfigError
from icefloe.otlp.kinds import KINDS
from icefloe.otlp.schemas import COLUMNS, TIME_COLUMN
from icefloe.streams.check import validate_stream
from icefloe.streams.model import RateLimit, StreamConfig

STREAM_PREFIX = "otlp."
"""Generated stream names are ``otlp.<kind>``: ``otlp.logs``, ``otlp.spans``,
``otlp.gauge``, ... (what ``[[tokens]]`` entries name to scope a token to some kinds)."""
DEFAULT_TABLES: dict[str, str] = {
    "logs": "otel.logs", "spans": "otel.spans", "gauge": "otel.metrics_gauge",
    "sum": "otel.metrics_sum", "histogram": "otel.metrics_histogram",
    "exponential_histogram": "otel.metrics_exp_histogram",
    "summary": "otel.metrics_summary"}
MAX_SERVICE_BUCKETS = 1024
"""Why a bound: every bucket is a partition per day; past a thousand, a day's small files
cost more than the pruning saves."""


class OtlpSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[otlp]``: OTLP data into Iceberg tables (docs/otlp.md).

    ``kinds`` limits the generated streams (a request carrying another kind is refused by
    the receivers); ``tokens`` are hash lines valid for every generated stream (a
    ``[[tokens]]`` entry naming ``otlp.logs`` and so on scopes a token to some kinds).
    ``partition_by`` and ``sort_by`` are per kind and replace the default layout
    (``day(<time column>)`` and ``bucket(service_buckets, service_name)``);
    ``table_properties`` and ``rate_limit`` apply to every generated stream.
    """

    enabled: bool = False
    kinds: tuple[str, ...] = KINDS
    logs_table: str = DEFAULT_TABLES["logs"]
    spans_table: str = DEFAULT_TABLES["spans"]
    gauge_table: str = DEFAULT_TABLES["gauge"]
    sum_table: str = DEFAULT_TABLES["sum"]
    histogram_table: str = DEFAULT_TABLES["histogram"]
    exponential_histogram_table: str = DEFAULT_TABLES["exponential_histogram"]
    summary_table: str = DEFAULT_TABLES["summary"]
    tokens: tuple[str, ...] = ()
    service_buckets: int = 16
    partition_by: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    sort_by: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    table_properties: dict[str, str] = msgspec.field(default_factory=dict)
    rate_limit: RateLimit | None = None

    def table(self, kind: str) -> str:
        """The table of one kind's rows."""
        name: str = getattr(self, f"{kind}_table")
        return name


def otlp_stream_names(section: OtlpSection) -> dict[str, str]:
    """kind -> generated stream name, for the kinds the section turns on (none when off)."""
    if not section.enabled:
        return {}
    return {kind: STREAM_PREFIX + kind for kind in KINDS if kind in section.kinds}


def otlp_streams(section: OtlpSection, where: str) -> tuple[StreamConfig, ...]:
    """The generated streams, in :data:`KINDS` order; each setting checked by name
    (a layout's mistake as ``otlp.<kind>.partition_by[0]: ...``)."""
    _check_section(section, where)
    streams = []
    for kind, name in otlp_stream_names(section).items():
        time = TIME_COLUMN[kind]
        default = (f"day({time})", f"bucket({section.service_buckets}, service_name)")
        stream = StreamConfig(
            name=name, table=section.table(kind), columns=COLUMNS[kind],
            unknown_fields="reject", tokens=section.tokens,
            partition_by=section.partition_by.get(kind, default),
            sort_by=section.sort_by.get(kind, ()),
            table_properties=dict(section.table_properties),
            rate_limit=section.rate_limit)
        validate_stream(stream, f"{where}: otlp.{kind}")
        streams.append(stream)
    return tuple(streams)


def with_otlp_streams(declared: Sequence[StreamConfig], section: OtlpSection, where: str
                      ) -> tuple[StreamConfig, ...]:
    """``declared`` followed by the generated streams; a declared stream that takes a
    generated stream's name or table is refused, naming both."""
    generated = otlp_streams(section, where)
    names = {s.name: s for s in generated}
    tables = {s.table: s for s in generated}
    for index, stream in enumerate(declared):
        if stream.name in names:
            raise ConfigError(
                f"{where}: streams[{index}].name: {stream.name!r} is the stream [otlp] "
                f"generates for {stream.name.removeprefix(STREAM_PREFIX)} rows; rename "
                "the declared stream (names starting with 'otlp.' belong to [otlp]) or "
                "leave that kind out of otlp.kinds")
        other = tables.get(stream.table)
        if other is not None:
            kind = other.name.removeprefix(STREAM_PREFIX)
            raise ConfigError(
                f"{where}: streams[{index}].table: {stream.table!r} is otlp.{kind}_table, "
                f"the table of OTLP {kind} rows; a table is fed by one stream: choose "
                f"another table for stream {stream.name!r} or set otlp.{kind}_table")
    return (*declared, *generated)


def _check_section(section: OtlpSection, where: str) -> None:
    """The section's own rules: known kinds, distinct tables, a sane bucket count."""
    for key, kinds in (("kinds", section.kinds), ("partition_by", section.partition_by),
                       ("sort_by", section.sort_by)):
        for kind in kinds:
            if kind not in KINDS:
                raise ConfigError(f"{where}: otlp.{key}: unknown kind {kind!r} (expected "
                                  f"one of {', '.join(KINDS)})")
    if len(set(section.kinds)) != len(section.kinds):
        raise ConfigError(f"{where}: otlp.kinds: a kind is listed twice")
    if not section.enabled:
        return
    if not section.kinds:
        raise ConfigError(f"{where}: otlp.kinds: empty; list the kinds of rows to keep, or "
                          "set otlp.enabled = false")
    if not 1 <= section.service_buckets <= MAX_SERVICE_BUCKETS:
        raise ConfigError(f"{where}: otlp.service_buckets: {section.service_buckets} must be "
                          f"between 1 and {MAX_SERVICE_BUCKETS} (the tables are partitioned "
                          "by a bucket of the service name)")
    seen: dict[str, str] = {}
    for kind in section.kinds:
        table = section.table(kind)
        if table in seen:
            raise ConfigError(f"{where}: otlp.{kind}_table: {table!r} is also "
                              f"otlp.{seen[table]}_table; each kind of row needs its own "
                              "table (their columns differ)")
        seen[table] = kind
    for key, per_kind in (("partition_by", section.partition_by),
                          ("sort_by", section.sort_by)):
        for kind in per_kind:
            if kind not in section.kinds:
                raise ConfigError(f"{where}: otlp.{key}.{kind}: {kind} is not in otlp.kinds, "
                                  "so it has no table to shape; remove the entry")
