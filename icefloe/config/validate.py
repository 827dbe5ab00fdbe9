"""Cross-key checks of a loaded :class:`Config`: the rules msgspec cannot express.

Why at start: a wrong value, or two settings that rest on each other and disagree, must
stop every process with a :class:`ConfigError` naming the key (both keys, for a pair), not
lose or duplicate data later. Each stream is checked by :func:`icefloe.streams.check.
validate_stream`, the security settings by :mod:`icefloe.config.security`.
"""

from __future__ import annotations

import math
import posixpath
from typing import Any

import msgspec

from icefloe.config.manifest import SAFETY_MARGIN_S
from icefloe.config.model import (
    OUTPUT_PATHS,
    AdminSection,
    CollectorSection,
    Config,
    IngestorSection,
    StoreSection,
)
from icefloe.config.security import check_hash, validate_security
from icefloe.errors import ConfigError
from icefloe.streams.check import validate_stream
from icefloe.streams.dynamic_tables import is_template
from icefloe.streams.model import StreamConfig


def validate(config: Config, where: str) -> None:
    """Cross-field rules msgspec cannot express; every message names the key."""
    check_finite(config, where)
    try:
        config.manifest.build()
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    _validate_collector(config.collector, where)
    _validate_admin(config.admin, where)
    _validate_manifest_key(config, where)
    if config.query.embedded_max_bytes < 0:
        raise ConfigError(f"{where}: query.embedded_max_bytes must be >= 0 (0: always Spark)")
    _validate_pairs(config, where)
    ing = config.ingestor
    for key in ("http_port", "grpc_port"):
        port = getattr(ing, key)
        if not 0 <= port <= 65535:
            raise ConfigError(f"{where}: ingestor.{key}: {port} is not a TCP port (0-65535)")
    _validate_kafka(ing, where)
    _validate_otlp_ports(config, where)
    check_port_clashes(where, {f"ingestor.{key}": getattr(ing, key) for key in INGESTOR_PORTS})
    for key in ("max_body_bytes", "max_event_bytes", "flush_bytes", "flush_events",
                "buffer_max_bytes", "flush_age_ms", "flush_timeout_s"):
        if getattr(ing, key) <= 0:
            raise ConfigError(f"{where}: ingestor.{key} must be > 0")
    for key in ("min_flush_interval_ms", "early_flush_requests"):
        if getattr(ing, key) < 0:
            raise ConfigError(f"{where}: ingestor.{key} must be >= 0")
    if ing.shard_index < -1:
        raise ConfigError(f"{where}: ingestor.shard_index must be >= 0 (or -1: hashed)")
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
    check_template_namespaces(config.streams, where)
    validate_security(config, where)


def check_finite(value: Any, where: str, key: str = "") -> None:
    """Every float anywhere in the config (sections, streams, tokens, tables) is a finite
    number: TOML has ``nan`` and ``inf``, and NaN compares false with every bound, so it
    would pass each ``<= 0`` check below and then break what the setting times."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{where}: {key}: {value} is not a finite number; give a number "
                              "such as 30 or 0.5")
    elif isinstance(value, msgspec.Struct):
        for field in value.__struct_fields__:
            check_finite(getattr(value, field), where, f"{key}.{field}" if key else field)
    elif isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            check_finite(item, where, f"{key}[{index}]")
    elif isinstance(value, dict):
        for name, item in value.items():
            check_finite(item, where, f"{key}.{name!r}")


INGESTOR_PORTS = ("http_port", "grpc_port", "kafka_port", "otlp_http_port", "otlp_grpc_port")
"""The listeners of one ingestor process (``kafka_advertised_port`` is what Metadata tells
clients, not a listener)."""


def check_port_clashes(where: str, ports: dict[str, int | None]) -> None:
    """Listeners of one process (``ports``: key to port) on one port: the second bind would
    fail at start, or, with ``reuse_port``, two protocols would share the port's traffic.
    0 (any free port) and None (off) never clash."""
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if not port:
            continue
        if port in seen:
            raise ConfigError(f"{where}: {key} ({port}) is the same port as {seen[port]}: "
                              "each listener of one process needs a port of its own; change "
                              "one of them")
        seen[port] = key


def check_template_namespaces(streams: tuple[StreamConfig, ...], where: str) -> None:
    """A table template's namespace is its own (:mod:`icefloe.streams.dynamic_tables`):
    no other stream may write a table there, so a value never lands in another stream's
    table and ``max_tables`` counts the template's tables only."""
    owners = {s.namespace: (i, s) for i, s in enumerate(streams) if is_template(s.table)}
    for index, stream in enumerate(streams):
        owner = owners.get(stream.namespace)
        if owner is not None and owner[0] != index:
            raise ConfigError(
                f"{where}: streams[{index}].table: namespace {stream.namespace!r} belongs to "
                f"the table template {owner[1].table!r} of stream {owner[1].name!r}; a "
                "template's namespace holds its tables only: choose another namespace")


def _validate_kafka(ing: IngestorSection, where: str) -> None:
    for key in ("kafka_port", "kafka_advertised_port", "otlp_http_port", "otlp_grpc_port"):
        port = getattr(ing, key)
        if port is not None and not 0 <= port <= 65535:
            raise ConfigError(f"{where}: ingestor.{key}: {port} is not a TCP port (0-65535)")
    for key in ("kafka_max_request_bytes", "kafka_max_connections", "kafka_idle_s"):
        if getattr(ing, key) <= 0:
            raise ConfigError(f"{where}: ingestor.{key} must be > 0")


def _validate_otlp_ports(config: Config, where: str) -> None:
    """An OTLP port with ``[otlp]`` off would serve nothing but 404s: refused at start."""
    for key in ("otlp_http_port", "otlp_grpc_port"):
        if getattr(config.ingestor, key) is not None and not config.otlp.enabled:
            raise ConfigError(f"{where}: ingestor.{key} is set but [otlp] is off: the port "
                              "would receive nothing; set [otlp] enabled = true, or unset "
                              f"ingestor.{key}")


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
    _validate_flush_timing(ing, where)
    if col.dedup_window_s > 0 and col.snapshot_max_age_s < col.dedup_window_s:
        raise ConfigError(
            f"{where}: collector.snapshot_max_age_s ({col.snapshot_max_age_s:g}) must be at "
            f"least collector.dedup_window_s ({col.dedup_window_s:g}): a restarted "
            "collector rebuilds the dedup window from the snapshots committed within it, "
            "and snapshot expiry would drop them")


def _validate_flush_timing(ing: IngestorSection, where: str) -> None:
    """The age limit seals a batch; the minimum interval spaces flush *starts*. With an age
    below the interval, a batch sealed at its age waits for the interval anyway, and each
    sealed batch gets a flush of its own: one age's worth of events per interval, so under
    steady load the flushes fall behind by interval/age and the buffer fills with 429s
    (unless ``early_flush_requests`` happen to rescue each batch). At or above the
    interval, the open batch keeps absorbing arrivals until its flush can start."""
    if ing.flush_age_ms < ing.min_flush_interval_ms:
        raise ConfigError(
            f"{where}: ingestor.flush_age_ms ({ing.flush_age_ms:g}) must be at least "
            f"ingestor.min_flush_interval_ms ({ing.min_flush_interval_ms:g}): a batch "
            "sealed at its age would wait out the interval anyway, one flush per interval "
            "for one age's worth of events, and the flushes would fall behind the load")


def _validate_control_url(store: StoreSection, where: str) -> None:
    """The control location must not be the data location's batch folder: garbage
    collection lists that folder and deletes what no manifest entry names."""
    control = store.control_url
    if control and control.rstrip("/").startswith(store.url.rstrip("/") + "/batches"):
        raise ConfigError(
            f"{where}: store.control_url ({control}) must not lie inside the batch files "
            f"of store.url ({store.url}): garbage collection deletes what it finds there")


def _validate_admin(admin: AdminSection, where: str) -> None:
    if not 0 <= admin.port <= 65535:
        raise ConfigError(f"{where}: admin.port: {admin.port} is not a TCP port (0-65535)")
    for i, entry in enumerate(admin.tokens):
        check_hash(entry, f"{where}: admin.tokens[{i}]")
    if bool(admin.tls_cert_file) != bool(admin.tls_key_file):
        raise ConfigError(f"{where}: admin.tls_cert_file and admin.tls_key_file go together")
    if admin.tls_client_ca_file and not admin.tls_cert_file:
        raise ConfigError(f"{where}: admin.tls_client_ca_file needs admin.tls_cert_file and "
                          "admin.tls_key_file (mutual TLS is TLS first)")
    if admin.plaintext and admin.tls_cert_file:
        raise ConfigError(f"{where}: admin.plaintext: true contradicts admin.tls_cert_file "
                          "(TLS is on); remove one of them")
    if admin.tombstone_grace_s < 60:
        raise ConfigError(f"{where}: admin.tombstone_grace_s ({admin.tombstone_grace_s:g}) "
                          "must be at least 60 s: an ingestor may not have seen a deletion "
                          "yet")
    if not 0.05 <= admin.registry_poll_s <= 300:
        raise ConfigError(f"{where}: admin.registry_poll_s must be between 0.05 and 300 s")
    if not admin.registry_key or admin.registry_key.startswith("/"):
        raise ConfigError(f"{where}: admin.registry_key: {admin.registry_key!r} must be a "
                          "relative object key")


def _validate_manifest_key(config: Config, where: str) -> None:
    """The manifest's key, like the registry's: a relative object key, and another object
    than the registry (or than one of the manifest's own shards and shard record), which
    each writer would otherwise overwrite with a document of its own kind."""
    key, registry = config.manifest.key, config.admin.registry_key
    if not key or key.startswith("/"):
        raise ConfigError(f"{where}: manifest.key: {key!r} must be a relative object key")
    if posixpath.normpath(registry) in (posixpath.normpath(key),
                                        posixpath.normpath(f"{key}.shards")) or (
            registry.startswith(f"{key}-shard") and registry[len(key) + 6:].isdigit()):
        raise ConfigError(f"{where}: manifest.key ({key!r}) and admin.registry_key "
                          f"({registry!r}) name the same object (or a manifest shard's): "
                          "give one of them another key")


def _validate_collector(col: CollectorSection, where: str) -> None:
    if not 0 <= col.metrics_port <= 65535:
        raise ConfigError(f"{where}: collector.metrics_port: {col.metrics_port} is not a TCP "
                          "port (0-65535)")
    for key in ("commit_interval_s", "poll_interval_s", "max_run_entries", "max_run_bytes",
                "dedup_max_ids", "spark_partitions", "dequeue_every", "gc_interval_s",
                "maintenance_interval_s", "snapshot_keep_last", "compact_min_files",
                "compact_target_bytes", "orphan_age_s", "retry_max_delay_s",
                "park_after_failures", "park_retry_s", "park_max_bytes",
                "sql_max_value_bytes", "sql_max_run_s", "read_ahead_bytes"):
        if getattr(col, key) <= 0:
            raise ConfigError(f"{where}: collector.{key} must be > 0")
    if not 0 <= col.target_run_s <= 3600:
        raise ConfigError(f"{where}: collector.target_run_s must be between 0 (size runs by "
                          f"max_run_entries and max_run_bytes only) and 3600 s, got "
                          f"{col.target_run_s}")
    if not 1 <= col.commit_workers <= 64:
        raise ConfigError(f"{where}: collector.commit_workers: {col.commit_workers} is not "
                          "1-64 (tables one run commits at once)")
    if col.output not in OUTPUT_PATHS:
        raise ConfigError(f"{where}: collector.output: unknown output path {col.output!r} "
                          f"(expected {' or '.join(OUTPUT_PATHS)})")
    if col.dedup_window_s < 0:
        raise ConfigError(f"{where}: collector.dedup_window_s must be >= 0 (0 disables "
                          "deduplication by event id)")
    if col.snapshot_max_age_s < 0:
        raise ConfigError(f"{where}: collector.snapshot_max_age_s must be >= 0 (0: expire "
                          "every snapshot outside the newest snapshot_keep_last)")
    if not 0 <= col.keep_batches_s <= 10 * 365 * 86400:
        raise ConfigError(f"{where}: collector.keep_batches_s must be between 0 (off) and "
                          f"ten years in seconds, got {col.keep_batches_s}")
    for key in ("evolve_max_columns", "evolve_max_name_length", "evolve_max_depth"):
        if getattr(col, key) <= 0:
            raise ConfigError(f"{where}: collector.{key} must be > 0")
    if col.models_interval_s < 0:
        raise ConfigError(f"{where}: collector.models_interval_s must be >= 0 (0: run the "
                          "models after every commit that added rows they read)")
    if col.models and not col.models_dir:
        raise ConfigError(f"{where}: collector.models_dir: a folder is needed to run "
                          f"{', '.join(col.models)}")
    _validate_collector_tls(col, where)
    _validate_spark_conf(col, where)
    if col.orphan_age_s < 60:
        raise ConfigError(f"{where}: collector.orphan_age_s ({col.orphan_age_s:g}) must be at "
                          "least 60 s: younger unreferenced files may belong to a commit "
                          "still in flight")


def _validate_collector_tls(col: CollectorSection, where: str) -> None:
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


SPARK_FIXED: dict[str, tuple[str, str]] = {
    "spark.sql.session.timeZone": (
        "UTC", "timestamps are read and written as UTC instants"),
    "spark.ui.showConsoleProgress": (
        "false", "a progress bar on stderr would break the JSON log lines and the progress "
        "line of `icefloe up`"),
    "spark.python.worker.reuse": (
        "true", "the collector starts its Python workers once and reuses them every run"),
    "spark.submit.deployMode": (
        "client", "the driver is the collector process itself"),
    "spark.pyspark.driver.python": (
        "", "the driver is the interpreter running the collector"),
    "spark.sql.timeType.enabled": (
        "true", "`time` columns pass through Spark as its TIME type, which the pinned "
        "Spark keeps behind this flag"),
    "spark.executor.killOnFatalError.depth": (
        "0", "a task running out of memory (one row's sql value) must fail its job, not end "
        "the collector's JVM and with it every table"),
}
"""``spark_conf`` keys icefloe owns (:mod:`pipeline.spark` sets them and depends on them):
the only value accepted and why. ``spark.master`` and ``spark.driver.memory`` have keys of
their own; the driver's addresses are icefloe's on a ``local`` master."""

SPARK_PAIRED = {"spark.master": "spark_master", "spark.driver.memory": "spark_driver_memory"}
_LOCAL_ONLY = ("spark.driver.host", "spark.driver.bindAddress")


def spark_value(value: object) -> str:
    """A ``spark_conf`` value as Spark reads it: booleans lower-case, numbers as written."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _validate_spark_conf(col: CollectorSection, where: str) -> None:
    """Pass-through ``spark.*`` settings, minus the ones icefloe owns (each refusal names
    the key; a paired one names both keys)."""
    for key, value in col.spark_conf.items():
        name = f"{where}: collector.spark_conf.{key!r}"
        if not key.startswith("spark."):
            raise ConfigError(f"{name}: only spark.* settings are passed to Spark")
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(f"{name}: {value!r} is not a string, number or boolean")
        text = spark_value(value)
        paired = SPARK_PAIRED.get(key)
        if paired is not None and text != str(getattr(col, paired)):
            raise ConfigError(f"{name} = {text!r} contradicts collector.{paired} = "
                              f"{getattr(col, paired)!r}; set collector.{paired} instead")
        fixed = SPARK_FIXED.get(key)
        if fixed is not None and text != fixed[0]:
            must = f"must be {fixed[0]!r}" if fixed[0] else "is icefloe's"
            raise ConfigError(f"{name} = {text!r}: {must}, because {fixed[1]}")
        if key in _LOCAL_ONLY and col.spark_master.startswith("local"):
            raise ConfigError(f"{name}: with collector.spark_master = {col.spark_master!r} "
                              "the driver binds to loopback (set it for a cluster master)")
