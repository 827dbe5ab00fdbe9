"""The configuration's sections and the whole :class:`Config`: typed, frozen msgspec structs.

Why msgspec Structs: the file is decoded straight into them, so a wrong type or an unknown
key is caught at start with its exact path (``$.streams[0].columns[2]``). The stream model
(:class:`~icefloe.streams.model.StreamConfig` and its columns) is the core's
:mod:`icefloe.streams`; loading is :mod:`icefloe.config.load`, cross-key checks
:mod:`icefloe.config.validate`.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from icefloe.config.manifest import ManifestConfig
from icefloe.otlp.config import OtlpSection
from icefloe.streams.model import RateLimit, StreamConfig


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
    shards: int = ManifestConfig.shards

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
    min_flush_interval_ms: float = 4.0
    """Why 4: on a local disk a flush takes about 2 ms (two fsynced files and their
    directories), and the clients it answers wait on average half the interval plus that.
    In alternating rounds on 2 cores, 4 ms beat both 5 (the old default; the wait) and
    3 (more flushes, whose fixed cost on the loop and the helper ate the gain) for 32 gRPC
    calls of 100 events and 256 HTTP connections of single events alike."""
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
    zstd_level: int = 1
    """Batch files' zstd level. Why 1: the store helper compresses every flush before its
    fsync, so the level is on each ack's path; on this project's event JSON level 1 was
    about 1.6x as fast as level 3 at the same or a better ratio (a 665 KB flush of the
    ingest benchmark: 242 vs 388 µs, 21.8 vs 27.3 KB), and the collector decompresses
    either at the same speed. Raise it for denser files when flush latency matters less."""
    batch_compression: Literal["zstd", "none"] = "zstd"
    """The batch files' block codec (the footer's compression byte: 1 zstd, 0 none). The
    readers take both, so a change applies to new files only and needs no migration."""
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
    kafka_port: int | None = None
    """Serve Kafka's produce protocol on this port (None: off; ``icefloe up`` uses 9092;
    0: any free port). Topics are streams (docs/kafka.md)."""
    kafka_advertised_host: str | None = None
    """The host Metadata tells Kafka clients to connect to (clients connect to what
    Metadata advertises, not to the bootstrap address): the load balancer's name. None: the
    bind host, or this machine's name (``socket.getfqdn()``) when that is a wildcard."""
    kafka_advertised_port: int | None = None
    """The port Metadata advertises (None: the bound Kafka port)."""
    kafka_max_request_bytes: int = 16 * 1024 * 1024
    """Largest Kafka request frame, and largest decompressed record batch; a bigger frame
    closes the connection (as a broker's ``socket.request.max.bytes``)."""
    kafka_max_connections: int = 10_000
    """Open Kafka connections of one process; more are closed as soon as they are accepted."""
    kafka_idle_s: float = 600.0
    """A Kafka connection that sends nothing for this long is closed (a broker's
    ``connections.max.idle.ms``)."""
    otlp_http_port: int | None = None
    """Serve OTLP/HTTP (``/v1/logs``, ``/v1/traces``, ``/v1/metrics``) on this port too (None:
    only on ``http_port``; ``icefloe up`` uses 4318; 0: any free port). Needs ``[otlp]``
    enabled (docs/otlp-receivers.md)."""
    otlp_grpc_port: int | None = None
    """Serve the OTLP/gRPC Export services on this port too (None: only on ``grpc_port``;
    ``icefloe up`` uses 4317; 0: any free port). Needs ``[otlp]`` enabled."""
    http_fast_lane: bool = True
    """Answer plain ingest POSTs (HTTP/1.1 keep-alive, Content-Length, no compression) from
    a callback instead of an ASGI task: same answers, ~2x the single-event rate. Off sends
    every request through the ASGI app (for comparison or as a fallback)."""
    shard_index: int = -1
    """This ingestor's index among its peers (0, 1, 2, ...): it appends to manifest shard
    ``shard_index % shards``, an exact spread. -1: the shard is picked by hashing a
    per-process name, even only on average (with one shard per ingestor, some shards get
    3-5 ingestors and others none, and a shard's ack latency grows with its writers)."""
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
    spark_conf: dict[str, Any] = msgspec.field(default_factory=dict)
    """Extra ``spark.*`` settings for the collector's SparkSession (a cluster's executor
    memory, an event log, ...); the ones icefloe owns are refused (see
    :data:`pipeline.spark.OWNED_CONF`, checked in :mod:`icefloe.config.validate`)."""
    output: str = "embedded"
    dequeue_every: int = 10
    overlap: bool = True
    """Overlap the runs (:mod:`collector.overlap`): read the next run's batch files (fetch,
    decompress, parse: its Spark job) while this run commits, and acknowledge and dequeue
    in the background once the commit is confirmed. Off: each run reads, commits and
    acknowledges before the next one starts."""
    read_ahead_bytes: int = 256 * 1024 * 1024
    """Most batch-file bytes of the one run read ahead (its decoded rows wait in memory
    until the run before it has committed)."""
    target_run_s: float = 5.0
    """Size runs by time: a run takes about the bytes the Spark job reads in this long, by
    the rate measured on the runs so far (never fewer entries than ``spark_partitions``,
    never more than ``max_run_entries`` and the byte cap: ``max_run_bytes``, or more with
    many partitions, :mod:`collector.run_size`). 0: by those limits only."""
    gc_interval_s: float = 60.0
    keep_batches_s: float = 0.0
    """Keep committed batch files this long after they are committed (0: off), with a
    retention index so ``icefloe replay`` can run them again (:mod:`collector.retention`)."""
    maintenance_interval_s: float = 300.0
    snapshot_keep_last: int = 100
    snapshot_max_age_s: float = 600.0
    compact_min_files: int = 8
    compact_target_bytes: int = 128 * 1024 * 1024
    orphan_age_s: float = 3600.0
    retry_max_delay_s: float = 30.0
    commit_workers: int = 4
    """Tables one run commits at once (a table template's run may touch hundreds). 1: one
    after the other. More overlap the tables' store round trips (each table's dedup-journal
    record is a PUT before its commit; on a slow store those PUTs in series were most of a
    run) and their catalog round trips where the catalog takes concurrent commits
    (PostgreSQL, Glue, REST; the SQLite catalog serialises its writes)."""
    park_after_failures: int = 3
    """Failed attempts of one table's own steps (evolve, write, commit) after which it is
    parked: its rows are staged and every other table goes on (:mod:`collector.bulkhead`)."""
    park_retry_s: float = 60.0
    """First retry of a parked table's staged rows (doubling, up to ten times this)."""
    park_max_bytes: int = 10 * 1024**3
    """Staged bytes of a parked table beyond which its rows become dead letters."""
    sql_max_value_bytes: int = 16 * 1024 * 1024
    """Largest value one ``sql`` mapping may compute for one row (strings and binaries, in
    bytes): a larger one costs that row its value (null, counted), never the run."""
    sql_max_run_s: float = 60.0
    """Evaluation time the ``sql`` mappings of one run may take; past it the run's Spark
    job is cancelled and the values still missing are null (counted), never the run."""
    models: tuple[str, ...] = ()
    models_dir: str = "models"
    models_interval_s: float = 0.0
    evolve_max_columns: int = 1000
    """Schema evolution from the data (``unknown_fields = "evolve"``): a table never grows
    past this many columns; an event whose new field would pass it is dead-lettered."""
    evolve_max_name_length: int = 128
    """Longest name a new column may take (longer: the event is dead-lettered)."""
    evolve_max_depth: int = 8
    """Deepest nesting of objects and arrays a new field's value may have."""
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
    otlp: OtlpSection = msgspec.field(default_factory=OtlpSection)
    """OTLP tables (:mod:`icefloe.otlp`); when enabled, its generated streams are in
    ``streams`` after the declared ones."""
    streams: tuple[StreamConfig, ...] = ()
    tokens: tuple[TokenConfig, ...] = ()
    source: str | None = None

    def stream(self, name: str) -> StreamConfig | None:
        for stream in self.streams:
            if stream.name == name:
                return stream
        return None
