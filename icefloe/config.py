"""``icefloe.toml``: one file configures every process.

Why msgspec Structs: the file is decoded straight into typed, frozen structs, so a wrong
type or an unknown key is caught at start with its exact path (``$.streams[0].columns[2]``)
— the error names the file, the key and the reason, never a stack trace from deep inside a
server. Precedence is flag > ``ICEFLOE_*`` environment > file > default; environment names
are ``ICEFLOE_<SECTION>_<KEY>`` (e.g. ``ICEFLOE_INGESTOR_HTTP_PORT``, ``ICEFLOE_STORE_URL``).
Relative ``file:`` paths, SQLite paths and TLS files resolve against the config file's
folder. Security settings (tokens, TLS, limits) are checked in :mod:`icefloe.config_security`.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from icefloe.config_security import validate_security
from icefloe.errors import ConfigError
from icefloe.manifest.config import SAFETY_MARGIN_S, ManifestConfig
from icefloe.mappings import check_mappings

COLUMN_TYPES = ("string", "long", "int", "float", "double", "boolean", "timestamp", "date",
                "json")
PARTITIONS = ("day", "hour", "month", "none")
"""Partitioning of a stream table by ``_received_at``; ``none`` leaves it unpartitioned."""
CONFIG_ENV = "ICEFLOE_CONFIG"
DEFAULT_CONFIG = "icefloe.toml"
_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,62}")
_RESERVED_COLUMNS = ("_event_id", "_received_at", "_sequence", "_stream")


class Column(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A declared column of a stream: JSON field ``name`` of type ``type``, unless a mapping
    says where its value comes from (at most one of ``path``, ``header``, ``from``, ``sql``;
    see :mod:`icefloe.mappings`). ``default`` fills a missing ``path``/``header`` value;
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

    @property
    def mapping(self) -> str | None:
        """``path``, ``header``, ``sql``, the ``from`` value, or None for a plain field."""
        if self.path is not None:
            return "path"
        if self.header is not None:
            return "header"
        if self.sql is not None:
            return "sql"
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


class StreamConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A stream: an ingest endpoint whose events land in one Iceberg table.

    ``tokens`` are hash lines (``icefloe token hash``) of tokens that may write to this
    stream only; tokens for several streams are top-level ``[[tokens]]``.
    """

    name: str
    table: str
    columns: tuple[Column, ...]
    unknown_fields: Literal["ignore", "reject"] = "ignore"
    tokens: tuple[str, ...] = ()
    event_id_field: str | None = None
    partition: str = "day"
    rate_limit: RateLimit | None = None

    @property
    def namespace(self) -> str:
        return self.table.split(".", 1)[0]

    @property
    def table_name(self) -> str:
        return self.table.split(".", 1)[1]


class TokenConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A named write token (``[[tokens]]``): its hash, the streams it may write to (``"*"``:
    all of them) and optionally its own rate limit. The name appears in logs and metrics,
    the token never does."""

    name: str
    hash: str
    streams: tuple[str, ...]
    rate_limit: RateLimit | None = None


class StoreSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``url``: batch files. ``control_url``: the manifest, registry and staging state, which
    are rewritten in place and so belong in an unversioned location (see
    :mod:`icefloe.store.split`); unset, they live under ``url`` as well."""

    url: str = "file://./icefloe-data/store"
    endpoint_url: str | None = None
    region: str | None = None
    control_url: str | None = None


class CatalogSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    type: Literal["sql", "glue", "rest"] = "sql"
    name: str = "icefloe"
    uri: str = "sqlite:///./icefloe-data/catalog.db"
    warehouse: str = "file://./icefloe-data/warehouse"
    properties: dict[str, str] = msgspec.field(default_factory=dict)


class ManifestSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[manifest]``; defaults come from :class:`ManifestConfig`, the one source of truth."""

    key: str = ManifestConfig.key
    max_entries: int = ManifestConfig.max_entries
    max_bytes: int = ManifestConfig.max_bytes
    append_deadline_s: float = ManifestConfig.append_deadline_s
    gc_grace_s: float = ManifestConfig.gc_grace_s
    producer_ttl_s: float = ManifestConfig.producer_ttl_s
    lease_s: float = ManifestConfig.lease_s

    def build(self) -> ManifestConfig:
        return ManifestConfig(**msgspec.structs.asdict(self))


class IngestorSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Ingestor settings; sizes in bytes, durations in milliseconds."""

    host: str = "0.0.0.0"
    http_port: int = 8080
    grpc_port: int = 50051
    reuse_port: bool = False
    """Share the ports with other ingestors on this host (``SO_REUSEPORT``; the kernel
    spreads connections). Off by default, so a second process on a taken port is an error
    rather than silently splitting traffic; ``icefloe up --ingestors N`` turns it on."""
    max_body_bytes: int = 16 * 1024 * 1024
    max_event_bytes: int = 1024 * 1024
    flush_age_ms: float = 100.0
    flush_bytes: int = 8 * 1024 * 1024
    flush_events: int = 100_000
    min_flush_interval_ms: float = 5.0
    early_flush_requests: int = 64
    """A flush may start before ``min_flush_interval_ms`` is over once this many requests
    wait for it (0: never). The interval bounds PUTs per second for small batches; a batch
    that many clients wait on is worth its PUT now (HTTP single events at 256 connections:
    31k → 38k/s on 2 cores)."""
    buffer_max_bytes: int = 256 * 1024 * 1024
    flush_timeout_s: float = 30.0
    shutdown_timeout_s: float = 20.0
    retry_after_s: int = 1
    cors_origins: tuple[str, ...] = ()
    zstd_level: int = 3
    tls_cert_file: str | None = None
    """PEM certificate chain for HTTP and gRPC; re-read when it changes (no restart)."""
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    """PEM CA bundle; when set, every client must present a certificate it signed (mTLS)."""
    plaintext: bool = False
    """Serve without TLS on a non-loopback address: only behind a TLS-terminating gateway."""
    trusted_proxies: tuple[str, ...] = ()
    """Peers (addresses or CIDRs) whose ``forwarded_header`` is believed."""
    forwarded_header: str = "x-forwarded-for"
    """The one header the trusted proxies write: ``x-forwarded-for`` or ``forwarded``. The
    other is client input the proxy passes through untouched, so it is never read."""
    client_rate_limit: RateLimit | None = None
    """Per client address, over all streams (file only: a table)."""
    keep_alive_s: float = 30.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 20.0
    body_min_bytes_per_s: int = 1024
    body_max_s: float = 300.0
    """Longest one HTTP body may take, however steadily it arrives (408 and a close)."""
    max_header_bytes: int = 64 * 1024
    """Request line plus headers of one HTTP request; counted as they arrive, 431 beyond."""
    max_headers: int = 100
    """Header fields of one HTTP request; 431 beyond."""
    max_connections: int = 10_000
    """Open HTTP connections of one process; more are closed as soon as they are accepted."""
    grpc_max_streams_per_connection: int = 100
    grpc_keepalive_time_s: float = 60.0
    """The server pings a connection quiet this long and closes it when the ping goes
    unanswered for ``grpc_keepalive_timeout_s``: dead peers do not hold streams forever."""
    grpc_keepalive_timeout_s: float = 20.0
    grpc_min_ping_interval_s: float = 10.0
    """Client pings closer together than this (without data) are strikes; past
    ``grpc_max_ping_strikes`` the connection gets GOAWAY ENHANCE_YOUR_CALM (a ping flood)."""
    grpc_max_ping_strikes: int = 2
    grpc_max_connection_idle_s: float = 300.0
    """A connection without calls for this long gets GOAWAY (the client reconnects)."""
    grpc_max_connection_age_s: float = 3600.0
    """Every connection gets GOAWAY at this age (±10 % jitter) and is closed after
    ``grpc_max_connection_age_grace_s`` more: no connection, nor its streams, lives forever,
    and load spreads again over ingestors that joined since."""
    grpc_max_connection_age_grace_s: float = 60.0
    grpc_stream_idle_s: float = 60.0
    """A PublishStream with nothing in flight that sends no request for this long is
    ended by the server (UNAVAILABLE ``stream_idle``)."""
    http_fast_lane: bool = True
    """Answer plain ingest POSTs (HTTP/1.1 keep-alive, Content-Length, no compression) from
    a callback instead of an ASGI task: same answers, ~2x the single-event rate. Off sends
    every request through the ASGI app (for comparison or as a fallback)."""
    store_helper: bool = True
    """Do a ``file://`` store's I/O in a helper process rather than in worker threads: a
    flush's dozen syscalls then never wait for the GIL of a busy event loop (a batch put
    under gRPC load: 4 ms in a thread, 1.4 ms in the helper). No effect on ``s3://``."""


OUTPUT_PATHS = ("embedded", "cluster")


class CollectorSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Collector settings; durations in seconds, sizes in bytes.

    ``commit_interval_s`` bounds how long entries wait before a run (freshness vs. the
    ~0.1-0.2 s and ~4 metadata objects each Iceberg commit costs); ``max_run_entries`` and
    ``max_run_bytes`` bound one run's memory on the driver. ``output`` picks the output
    path: ``embedded`` collects each run's rows to the driver and appends them there (one
    machine); ``cluster`` keeps the rows on the Spark executors, which write Parquet files
    the driver commits with one ``add_files`` per table (only event ids reach the driver).
    ``models`` names the SQL models (``"*"``: all) the collector keeps fresh: it runs them
    (and the stored models they read) after a commit that added rows to a table they read,
    at most once per ``models_interval_s``; ``models_dir`` is relative to the config file.
    """

    host: str = "0.0.0.0"
    metrics_port: int = 9464
    commit_interval_s: float = 1.0
    poll_interval_s: float = 0.2
    max_run_entries: int = 2000
    max_run_bytes: int = 512 * 1024 * 1024
    dedup_window_s: float = 600.0
    dedup_max_ids: int = 5_000_000
    spark_master: str = "local[2]"
    spark_partitions: int = 4
    spark_driver_memory: str = "2g"
    output: str = "embedded"
    dequeue_every: int = 10
    gc_interval_s: float = 60.0
    maintenance_interval_s: float = 300.0
    snapshot_keep_last: int = 100
    snapshot_max_age_s: float = 600.0
    compact_min_files: int = 8
    compact_target_bytes: int = 128 * 1024 * 1024
    orphan_age_s: float = 3600.0
    retry_max_delay_s: float = 30.0
    models: tuple[str, ...] = ()
    models_dir: str = "models"
    models_interval_s: float = 0.0
    tls_cert_file: str | None = None
    """TLS for ``/metrics``, ``/healthz``, ``/readyz``: same rules as ``[ingestor]``."""
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    plaintext: bool = False


class AdminSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The admin API (``icefloe admin``): sources and sinks at runtime.

    Bound to this machine by default; every call but ``/healthz`` and ``/openapi.json``
    needs a bearer token whose hash (``icefloe token hash``) is in ``tokens``.
    ``registry_key`` is the registry object inside the store.
    """

    host: str = "127.0.0.1"
    port: int = 8081
    tokens: tuple[str, ...] = ()
    registry_key: str = "registry/registry.json"
    registry_poll_s: float = 2.0
    tombstone_grace_s: float = 3600.0
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    plaintext: bool = False


class QuerySection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``icefloe query``. ``embedded_max_bytes``: with ``--engine auto``, queries whose pinned
    data and delete files total at most this many bytes run on the embedded DuckDB engine
    (answers in about a second, reads into this process's memory); larger ones go to Spark.
    0 sends every query to Spark."""

    embedded_max_bytes: int = 1024 * 1024 * 1024


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole configuration. ``source`` is the file it came from (or None)."""

    store: StoreSection = msgspec.field(default_factory=StoreSection)
    catalog: CatalogSection = msgspec.field(default_factory=CatalogSection)
    manifest: ManifestSection = msgspec.field(default_factory=ManifestSection)
    ingestor: IngestorSection = msgspec.field(default_factory=IngestorSection)
    collector: CollectorSection = msgspec.field(default_factory=CollectorSection)
    admin: AdminSection = msgspec.field(default_factory=AdminSection)
    query: QuerySection = msgspec.field(default_factory=QuerySection)
    streams: tuple[StreamConfig, ...] = ()
    tokens: tuple[TokenConfig, ...] = ()
    source: str | None = None

    def stream(self, name: str) -> StreamConfig | None:
        for stream in self.streams:
            if stream.name == name:
                return stream
        return None


def find_config(path: str | os.PathLike[str] | None, env: Mapping[str, str] = os.environ
                ) -> Path | None:
    """``--config``, else ``$ICEFLOE_CONFIG``, else ``./icefloe.toml`` if present."""
    if path is not None:
        return Path(path)
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV])
    default = Path(DEFAULT_CONFIG)
    return default if default.exists() else None


def load_config(path: str | os.PathLike[str] | None = None, *,
                env: Mapping[str, str] = os.environ,
                overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Load, merge (flag > env > file > default), resolve paths and validate."""
    source = find_config(path, env)
    raw: dict[str, Any] = {}
    where = "defaults"
    if source is not None:
        where = str(source)
        try:
            raw = tomllib.loads(source.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{source}: config file not found") from None
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read config file: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    _apply_env(raw, env, where)
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    try:
        config = msgspec.convert(raw, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{where}: {_key_path(str(exc))}") from None
    base = source.parent.absolute() if source is not None else Path.cwd()
    config = _resolve_paths(config, base, str(source) if source else None)
    validate(config, where)
    return config


def split_key_path(message: str) -> tuple[str | None, str]:
    """msgspec says 'Expected `int`, got `str` - at `$.ingestor.http_port`': (key, reason),
    key None when the message names none."""
    if " - at `$." in message:
        reason, key = message.rsplit(" - at `$.", 1)
        return key.rstrip("`"), reason
    return None, message


def _key_path(message: str) -> str:
    """A msgspec message led by the key it is about."""
    key, reason = split_key_path(message)
    return reason if key is None else f"{key}: {reason}"


FILE_ONLY = frozenset({"properties", "client_rate_limit"})
"""Settings that are tables: set in the file only, never from the environment."""
_LIST_FIELDS = frozenset({"cors_origins", "trusted_proxies", "models", "tokens"})
"""Lists the environment gives comma-separated."""


_HASH_START = re.compile(r",(?=\s*(?:scrypt|pbkdf2-sha256)\$)")
"""A comma that starts another token hash: a scrypt hash has commas of its own
(``scrypt$ln=14,r=8,p=1$...``), so token lists split only before the next hash."""


def _split_list(field: str, value: str) -> list[str]:
    return _HASH_START.split(value) if field == "tokens" else value.split(",")


def _apply_env(raw: dict[str, Any], env: Mapping[str, str], where: str) -> None:
    sections = {"store": StoreSection, "catalog": CatalogSection,
                "manifest": ManifestSection, "ingestor": IngestorSection,
                "collector": CollectorSection, "admin": AdminSection, "query": QuerySection}
    for section, struct in sections.items():
        for field in struct.__struct_fields__:
            name = f"ICEFLOE_{section.upper()}_{field.upper()}"
            if name in env and field not in FILE_ONLY:
                value: Any = env[name]
                if field in _LIST_FIELDS:
                    value = [v.strip() for v in _split_list(field, value) if v.strip()]
                raw.setdefault(section, {})[field] = value


def _resolve(url: str, base: Path) -> str:
    """``file://relative/x`` → ``file:///abs/x`` against the config folder."""
    if url.startswith("file://") and not url.startswith("file:///"):
        return (base / url[len("file://"):]).resolve().as_uri()
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return "sqlite:///" + str((base / url[len("sqlite:///"):]).resolve())
    return url


def _resolve_file(path: str | None, base: Path) -> str | None:
    """A relative file path (TLS files) against the config folder.

    Symlinks are deliberately *not* resolved: a Kubernetes secret volume rotates a
    certificate by swapping a symlink, and the reloader must keep following the name.
    """
    return None if not path else os.path.normpath(base / path)


def _resolve_paths(config: Config, base: Path, source: str | None) -> Config:
    store = msgspec.structs.replace(
        config.store, url=_resolve(config.store.url, base),
        control_url=_resolve(config.store.control_url, base) if config.store.control_url
        else None)
    catalog = msgspec.structs.replace(config.catalog, uri=_resolve(config.catalog.uri, base),
                                      warehouse=_resolve(config.catalog.warehouse, base))
    ing = config.ingestor
    ingestor = msgspec.structs.replace(
        ing, tls_cert_file=_resolve_file(ing.tls_cert_file, base),
        tls_key_file=_resolve_file(ing.tls_key_file, base),
        tls_client_ca_file=_resolve_file(ing.tls_client_ca_file, base))
    col = config.collector
    collector = msgspec.structs.replace(
        col, models_dir=_resolve_file(col.models_dir, base) or "",
        tls_cert_file=_resolve_file(col.tls_cert_file, base),
        tls_key_file=_resolve_file(col.tls_key_file, base),
        tls_client_ca_file=_resolve_file(col.tls_client_ca_file, base))
    adm = config.admin
    admin = msgspec.structs.replace(
        adm, tls_cert_file=_resolve_file(adm.tls_cert_file, base),
        tls_key_file=_resolve_file(adm.tls_key_file, base),
        tls_client_ca_file=_resolve_file(adm.tls_client_ca_file, base))
    return msgspec.structs.replace(config, store=store, catalog=catalog, ingestor=ingestor,
                                   collector=collector, admin=admin, source=source)


def validate(config: Config, where: str) -> None:
    """Cross-field rules msgspec cannot express; every message names the key."""
    try:
        config.manifest.build()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    _validate_collector(config.collector, where)
    _validate_admin(config.admin, where)
    if config.query.embedded_max_bytes < 0:
        raise ConfigError(f"{where}: query.embedded_max_bytes must be >= 0 (0: always Spark)")
    _validate_pairs(config, where)
    ing = config.ingestor
    for key in ("http_port", "grpc_port"):
        port = getattr(ing, key)
        if not 0 <= port <= 65535:
            raise ConfigError(f"{where}: ingestor.{key}: {port} is not a TCP port (0-65535)")
    for key in ("max_body_bytes", "max_event_bytes", "flush_bytes", "flush_events",
                "buffer_max_bytes", "flush_age_ms", "flush_timeout_s"):
        if getattr(ing, key) <= 0:
            raise ConfigError(f"{where}: ingestor.{key} must be > 0")
    for key in ("min_flush_interval_ms", "early_flush_requests"):
        if getattr(ing, key) < 0:
            raise ConfigError(f"{where}: ingestor.{key} must be >= 0")
    _validate_http_limits(ing, where)
    if ing.buffer_max_bytes < ing.max_body_bytes:
        raise ConfigError(f"{where}: ingestor.buffer_max_bytes ({ing.buffer_max_bytes}) must "
                          f"be >= ingestor.max_body_bytes ({ing.max_body_bytes}): a request "
                          "larger than the buffer could never be accepted")
    if ing.buffer_max_bytes < ing.flush_bytes:
        raise ConfigError(f"{where}: ingestor.buffer_max_bytes ({ing.buffer_max_bytes}) must "
                          f"be >= ingestor.flush_bytes ({ing.flush_bytes})")
    names: set[str] = set()
    tables: set[str] = set()
    for index, stream in enumerate(config.streams):
        validate_stream(stream, f"{where}: streams[{index}]")
        if stream.name in names:
            raise ConfigError(f"{where}: streams[{index}].name: duplicate stream {stream.name!r}")
        if stream.table in tables:
            raise ConfigError(f"{where}: streams[{index}].table: table {stream.table!r} is "
                              "already fed by another stream")
        names.add(stream.name)
        tables.add(stream.table)
    validate_security(config, where)


def _validate_http_limits(ing: IngestorSection, where: str) -> None:
    """The HTTP front's limits (issue #29): each must leave room for an ordinary request."""
    if ing.max_header_bytes < 1024:
        raise ConfigError(f"{where}: ingestor.max_header_bytes ({ing.max_header_bytes}) must "
                          "be >= 1024: a request line, Host and a token need that much")
    for key in ("max_headers", "max_connections", "body_max_s"):
        if getattr(ing, key) <= 0:
            raise ConfigError(f"{where}: ingestor.{key} must be > 0")
    if ing.body_max_s < ing.body_timeout_s:
        raise ConfigError(f"{where}: ingestor.body_max_s ({ing.body_max_s:g}) must be >= "
                          f"ingestor.body_timeout_s ({ing.body_timeout_s:g}): the cap on a "
                          "body's whole upload cannot be shorter than the time it may take "
                          "to start")


def _validate_pairs(config: Config, where: str) -> None:
    """Settings of different sections that rest on each other; each message names both keys.

    Why at start: each pair is an assumption some part makes about another part's timing,
    and a config that breaks it does not fail loudly later — it loses or duplicates data.
    """
    deadline = config.manifest.append_deadline_s
    ing, col, admin = config.ingestor, config.collector, config.admin
    if ing.flush_timeout_s >= deadline:
        raise ConfigError(
            f"{where}: ingestor.flush_timeout_s ({ing.flush_timeout_s:g}) must be less than "
            f"manifest.append_deadline_s ({deadline:g}): a flush must give up (503, nothing "
            "acknowledged) before its batch can pass the append deadline, never wait for a "
            "batch the manifest producer may already have refused")
    # an ingestor that has not seen a deletion yet (one registry poll) accepts events under
    # the older version; their flush may take flush_timeout_s, and the batch file may be
    # appended until append_deadline_s after it was written: the tombstone must outlive
    # all of that (plus the margin GC keeps) or the entry would name a sink already pruned
    need = admin.registry_poll_s + ing.flush_timeout_s + deadline + SAFETY_MARGIN_S
    if admin.tombstone_grace_s < need:
        raise ConfigError(
            f"{where}: admin.tombstone_grace_s ({admin.tombstone_grace_s:g}) must be at "
            f"least manifest.append_deadline_s ({deadline:g}) + ingestor.flush_timeout_s "
            f"({ing.flush_timeout_s:g}) + admin.registry_poll_s ({admin.registry_poll_s:g}) "
            f"+ {SAFETY_MARGIN_S:g} s = {need:g}: events accepted just before a deletion "
            "may reach the manifest that late, and their entries must still find the "
            "deleted sink to be routed")
    _validate_control_url(config.store, where)
    if col.dedup_window_s > 0 and col.snapshot_max_age_s < col.dedup_window_s:
        raise ConfigError(
            f"{where}: collector.snapshot_max_age_s ({col.snapshot_max_age_s:g}) must be at "
            f"least collector.dedup_window_s ({col.dedup_window_s:g}): a restarted "
            "collector rebuilds the dedup window from the snapshots committed within it, "
            "and snapshot expiry would drop them")


def _validate_control_url(store: StoreSection, where: str) -> None:
    """The control location must not be the data location's batch folder: garbage
    collection lists that folder and deletes what no manifest entry names."""
    control = store.control_url
    if control and control.rstrip("/").startswith(store.url.rstrip("/") + "/batches"):
        raise ConfigError(
            f"{where}: store.control_url ({control}) must not lie inside the batch files "
            f"of store.url ({store.url}): garbage collection deletes what it finds there")


def _validate_admin(admin: AdminSection, where: str) -> None:
    from icefloe.config_security import check_hash

    if not 0 <= admin.port <= 65535:
        raise ConfigError(f"{where}: admin.port: {admin.port} is not a TCP port (0-65535)")
    for i, entry in enumerate(admin.tokens):
        check_hash(entry, f"{where}: admin.tokens[{i}]")
    if bool(admin.tls_cert_file) != bool(admin.tls_key_file):
        raise ConfigError(f"{where}: admin.tls_cert_file and admin.tls_key_file go together")
    if admin.tls_client_ca_file and not admin.tls_cert_file:
        raise ConfigError(f"{where}: admin.tls_client_ca_file needs admin.tls_cert_file and "
                          "admin.tls_key_file (mutual TLS is TLS first)")
    if admin.tombstone_grace_s < 60:
        raise ConfigError(f"{where}: admin.tombstone_grace_s ({admin.tombstone_grace_s:g}) "
                          "must be at least 60 s: an ingestor may not have seen a deletion "
                          "yet")
    if not 0.05 <= admin.registry_poll_s <= 300:
        raise ConfigError(f"{where}: admin.registry_poll_s must be between 0.05 and 300 s")
    if not admin.registry_key or admin.registry_key.startswith("/"):
        raise ConfigError(f"{where}: admin.registry_key: {admin.registry_key!r} must be a "
                          "relative object key")


def _validate_collector(col: CollectorSection, where: str) -> None:
    if not 0 <= col.metrics_port <= 65535:
        raise ConfigError(f"{where}: collector.metrics_port: {col.metrics_port} is not a TCP "
                          "port (0-65535)")
    for key in ("commit_interval_s", "poll_interval_s", "max_run_entries", "max_run_bytes",
                "dedup_max_ids", "spark_partitions", "dequeue_every", "gc_interval_s",
                "maintenance_interval_s", "snapshot_keep_last", "compact_min_files",
                "compact_target_bytes", "orphan_age_s", "retry_max_delay_s"):
        if getattr(col, key) <= 0:
            raise ConfigError(f"{where}: collector.{key} must be > 0")
    if col.output not in OUTPUT_PATHS:
        raise ConfigError(f"{where}: collector.output: unknown output path {col.output!r} "
                          f"(expected {' or '.join(OUTPUT_PATHS)})")
    if col.dedup_window_s < 0:
        raise ConfigError(f"{where}: collector.dedup_window_s must be >= 0 (0 disables "
                          "deduplication by event id)")
    if col.models_interval_s < 0:
        raise ConfigError(f"{where}: collector.models_interval_s must be >= 0 (0: run the "
                          "models after every commit that added rows they read)")
    if col.models and not col.models_dir:
        raise ConfigError(f"{where}: collector.models_dir: a folder is needed to run "
                          f"{', '.join(col.models)}")
    if bool(col.tls_cert_file) != bool(col.tls_key_file):
        raise ConfigError(f"{where}: collector.tls_cert_file and collector.tls_key_file go "
                          "together")
    if col.tls_client_ca_file and not col.tls_cert_file:
        raise ConfigError(f"{where}: collector.tls_client_ca_file needs "
                          "collector.tls_cert_file and collector.tls_key_file (mutual TLS is "
                          "TLS first)")
    if col.plaintext and col.tls_cert_file:
        raise ConfigError(f"{where}: collector.plaintext: true contradicts "
                          "collector.tls_cert_file (TLS is on); remove one of them")
    if col.orphan_age_s < 60:
        raise ConfigError(f"{where}: collector.orphan_age_s ({col.orphan_age_s:g}) must be at "
                          "least 60 s: younger unreferenced files may belong to a commit "
                          "still in flight")


def validate_stream(stream: StreamConfig, at: str) -> None:
    """One stream's own rules (name, table, columns, mappings, id field, partition); ``at``
    prefixes every message (the config key, or the admin API's field)."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", stream.name):
        raise ConfigError(f"{at}.name: {stream.name!r} must be 1-128 letters, digits, '_', '-' "
                          "or '.'")
    parts = stream.table.split(".")
    if stream.table == "icefloe.dead_letters":
        raise ConfigError(f"{at}.table: 'icefloe.dead_letters' is icefloe's dead-letter "
                          "table; choose another name")
    if len(parts) != 2 or not all(_NAME_RE.fullmatch(p) for p in parts):
        raise ConfigError(f"{at}.table: {stream.table!r} must be 'namespace.table' in lower "
                          "case letters, digits and '_'")
    if not stream.columns:
        raise ConfigError(f"{at}.columns: a stream needs at least one column")
    seen: set[str] = set()
    for i, column in enumerate(stream.columns):
        if column.type not in COLUMN_TYPES:
            raise ConfigError(f"{at}.columns[{i}].type: unknown type {column.type!r} "
                              f"(expected one of {', '.join(COLUMN_TYPES)})")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", column.name):
            raise ConfigError(f"{at}.columns[{i}].name: {column.name!r} is not a valid column "
                              "name (letters, digits, '_')")
        if column.name in _RESERVED_COLUMNS:
            raise ConfigError(f"{at}.columns[{i}].name: {column.name!r} is reserved by icefloe")
        if column.name in seen:
            raise ConfigError(f"{at}.columns[{i}].name: duplicate column {column.name!r}")
        seen.add(column.name)
    check_mappings(stream, at)
    if stream.event_id_field is not None and stream.event_id_field not in seen:
        raise ConfigError(f"{at}.event_id_field: {stream.event_id_field!r} is not a declared "
                          "column")
    if stream.partition not in PARTITIONS:
        raise ConfigError(f"{at}.partition: unknown partition {stream.partition!r} (expected "
                          f"one of {', '.join(PARTITIONS)}; it partitions the table by "
                          "_received_at)")
