"""The configuration reference: every key, its environment variable, default and meaning.

Why generated: the table in docs/configuration.md is produced from the config structs
themselves (run ``python scripts/sync-config-reference.py``), and a test fails when a setting
has no entry here or the page's copy is stale — so the reference can never silently miss a key.
"""

from __future__ import annotations

from typing import Any

import msgspec

from icefloe.config.load import FILE_ONLY
from icefloe.config.model import (
    AdminSection,
    CatalogSection,
    CollectorSection,
    IngestorSection,
    ManifestSection,
    QuerySection,
    StoreSection,
)
from icefloe.otlp.config import OtlpSection

SECTIONS: dict[str, type[msgspec.Struct]] = {
    "store": StoreSection, "catalog": CatalogSection, "manifest": ManifestSection,
    "ingestor": IngestorSection, "collector": CollectorSection, "admin": AdminSection,
    "query": QuerySection, "otlp": OtlpSection}

MEANING: dict[str, str] = {
    "store.url": "object store: `file:///dir` or `s3://bucket/prefix`",
    "store.endpoint_url": "S3-compatible endpoint (MinIO: `http://minio:9000`); credentials "
                          "from the AWS chain",
    "store.region": "S3 region",
    "store.control_url": "where the manifest, registry and staging state go (unset: `url`); "
                         "give them an unversioned bucket (deploy/README.md says why)",
    "catalog.type": "`sql` (SQLite, PostgreSQL), `glue` or `rest`",
    "catalog.name": "catalog name inside pyiceberg",
    "catalog.uri": "`sqlite:///path`, `postgresql://user:pass@host/db`, or the REST URL",
    "catalog.warehouse": "where table data and metadata go: `file:///dir` or `s3://bucket/path`",
    "catalog.properties": "extra pyiceberg catalog/FileIO properties (`s3.endpoint`, "
                          "`glue.region`, `credential`, ...); file only",
    "manifest.key": "object key of the manifest queue inside the store",
    "manifest.max_entries": "queue bound in entries; beyond it appends fail (HTTP 429/503)",
    "manifest.max_bytes": "queue bound in manifest bytes",
    "manifest.append_deadline_s": "a producer never appends a batch file older than this",
    "manifest.gc_grace_s": "unreferenced batch files are deleted only when older than this "
                           "(≥ append_deadline_s + 300)",
    "manifest.producer_ttl_s": "idle producers leave the idempotent-producer table after this",
    "manifest.lease_s": "collector lease; a standby takes over this long after the active one "
                        "stops renewing",
    "manifest.shards": "manifest shards (1 to 256): ingestors spread appends over them; the "
                       "count on the store only grows (a lower value starts with the store's "
                       "count and a warning)",
    "ingestor.host": "bind address (`--host`)",
    "ingestor.http_port": "HTTP port (`--http-port`); also serves /healthz, /readyz, /metrics",
    "ingestor.grpc_port": "gRPC port (`--grpc-port`)",
    "ingestor.kafka_port": "Kafka produce-protocol port (`--kafka-port`; unset: off; "
                           "`icefloe up`: 9092)",
    "ingestor.kafka_advertised_host": "host Kafka Metadata tells clients to connect to (a "
                                      "load balancer's name); unset: the bind host",
    "ingestor.kafka_advertised_port": "port Kafka Metadata advertises; unset: the bound port",
    "ingestor.kafka_max_request_bytes": "largest Kafka request frame and decompressed record "
                                        "batch; a larger frame closes the connection",
    "ingestor.kafka_max_connections": "open Kafka connections per process; more are closed "
                                      "at once",
    "ingestor.kafka_idle_s": "a Kafka connection silent this long is closed",
    "ingestor.otlp_http_port": "OTLP/HTTP port besides `http_port` (`--otlp-http-port`; "
                               "unset: off; `icefloe up`: 4318; 0: any free)",
    "ingestor.otlp_grpc_port": "OTLP/gRPC port besides `grpc_port` (`--otlp-grpc-port`; "
                               "unset: off; `icefloe up`: 4317; 0: any free)",
    "ingestor.reuse_port": "share the ports with other ingestors on the host (SO_REUSEPORT); "
                           "`icefloe up --ingestors N` sets it",
    "ingestor.max_body_bytes": "request body limit, after decompression (413 beyond)",
    "ingestor.max_event_bytes": "one event's canonical JSON",
    "ingestor.flush_age_ms": "longest a waiting event sits before its flush starts",
    "ingestor.flush_bytes": "seal a batch file at this size",
    "ingestor.flush_events": "seal a batch file at this many events",
    "ingestor.min_flush_interval_ms": "lower bound between flush starts: under load, fewer "
                                      "and larger batches (bounds PUTs/s on S3, and fsyncs "
                                      "and CPU per event locally); ≤ `flush_age_ms`",
    "ingestor.early_flush_requests": "a flush may start before the minimum interval once "
                                     "this many requests wait (0: never)",
    "ingestor.buffer_max_bytes": "unacknowledged bytes per process; beyond it: 429",
    "ingestor.flush_timeout_s": "a flush (PUT + manifest append) slower than this fails its "
                                "requests with 503 (< manifest.append_deadline_s)",
    "ingestor.shutdown_timeout_s": "SIGTERM drain deadline",
    "ingestor.retry_after_s": "`Retry-After` on 429/503",
    "ingestor.cors_origins": "browser origins allowed to POST, and to send `text/plain` or "
                             "typeless bodies, which skip the preflight (env: "
                             "comma-separated)",
    "ingestor.zstd_level": "batch files' zstd level (1 is on every flush's path; raise it "
                           "for denser files)",
    "ingestor.batch_compression": "batch files' block codec: `zstd` or `none` (the footer's "
                                  "compression byte; readers take both)",
    "ingestor.tls_cert_file": "PEM certificate chain for HTTP and gRPC (relative: to the config "
                              "folder); re-read within seconds when it changes, no restart",
    "ingestor.tls_key_file": "PEM private key of `tls_cert_file` (unencrypted; keep it 0600)",
    "ingestor.tls_client_ca_file": "PEM CA bundle: clients must present a certificate it "
                                   "signed (mutual TLS); reloaded like the certificate",
    "ingestor.plaintext": "allow serving without TLS on a non-loopback `host` (behind a "
                          "TLS-terminating gateway); logs a warning at start",
    "ingestor.trusted_proxies": "addresses/CIDRs whose `forwarded_header` names the client "
                                "(env: comma-separated)",
    "ingestor.forwarded_header": "the header the trusted proxies set: `x-forwarded-for` or "
                                 "`forwarded` (RFC 7239); the other one is never read",
    "ingestor.client_rate_limit": "per client address, all streams: `{ events_per_s, "
                                  "bytes_per_s, burst_s }`; per process; file only",
    "ingestor.keep_alive_s": "an idle HTTP keep-alive connection is closed after this",
    "ingestor.header_timeout_s": "an HTTP request's headers must arrive within this (slow "
                                 "clients get 408 and a closed connection)",
    "ingestor.body_timeout_s": "an HTTP body must start arriving within this, and it is "
                               "extended by the bytes received at `body_min_bytes_per_s`",
    "ingestor.body_min_bytes_per_s": "slowest body upload rate tolerated (408 below it)",
    "ingestor.body_max_s": "longest one HTTP body may take to arrive, however steadily "
                           "(408 and a close; ≥ `body_timeout_s`)",
    "ingestor.max_header_bytes": "request line + headers of one HTTP request, counted as they "
                                 "arrive (431 and a close beyond; ≥ 1 KiB)",
    "ingestor.max_headers": "header fields of one HTTP request (431 and a close beyond)",
    "ingestor.max_connections": "open HTTP connections per process; more are closed as soon "
                                "as accepted (`icefloe_ingest_http_refused_total"
                                "{reason=\"max_connections\"}`)",
    "ingestor.grpc_max_streams_per_connection": "concurrent gRPC calls per connection "
                                                "(HTTP/2 `max_concurrent_streams`)",
    "ingestor.grpc_keepalive_time_s": "the server pings a gRPC connection quiet this long",
    "ingestor.grpc_keepalive_timeout_s": "an unanswered keepalive ping closes the connection "
                                         "after this (< `grpc_keepalive_time_s`)",
    "ingestor.grpc_min_ping_interval_s": "client pings closer than this (without data) are "
                                         "strikes",
    "ingestor.grpc_max_ping_strikes": "strikes after which a connection gets GOAWAY "
                                      "ENHANCE_YOUR_CALM",
    "ingestor.grpc_max_connection_idle_s": "a gRPC connection without calls this long gets "
                                           "GOAWAY",
    "ingestor.grpc_max_connection_age_s": "every gRPC connection gets GOAWAY at this age "
                                          "(±10 %)",
    "ingestor.grpc_max_connection_age_grace_s": "calls still running at the age limit get "
                                                "this long, then the connection closes "
                                                "(≥ `flush_timeout_s`)",
    "ingestor.grpc_stream_idle_s": "a PublishStream with nothing in flight that sends "
                                   "nothing this long is ended (UNAVAILABLE `stream_idle`)",
    "ingestor.http_fast_lane": "answer plain ingest POSTs (HTTP/1.1 keep-alive, "
                               "Content-Length, uncompressed) from a callback instead of "
                               "an ASGI task: same answers, less CPU (off: all via ASGI)",
    "ingestor.shard_index": "this ingestor's index among its peers (0, 1, 2…): it appends "
                           "to manifest shard `shard_index % shards`, an exact spread "
                           "(e.g. a StatefulSet ordinal); -1: by hashing a per-process "
                           "name, even only on average",
    "ingestor.store_helper": "flush through a helper process on a `file://` store: it "
                             "compresses, writes the batch and appends it to the manifest "
                             "(off the event loop, never waiting for its GIL); no effect "
                             "on `s3://`",
    "collector.host": "bind address of the collector's /metrics, /healthz, /readyz",
    "collector.metrics_port": "collector metrics and probes port (`--metrics-port`; 0 = any)",
    "collector.commit_interval_s": "a run with entries starts this long after the previous "
                                   "one began (freshness vs. commit cost)",
    "collector.poll_interval_s": "wait between looks at an empty queue",
    "collector.max_run_entries": "most batch files in one run (one Spark job, one commit per "
                                 "table)",
    "collector.max_run_bytes": "most batch-file bytes in one run",
    "collector.dedup_window_s": "drop rows whose `(source, _event_id)` was committed to the "
                                "same table this recently; 0 disables",
    "collector.dedup_max_ids": "bound on the event ids the dedup window of a table "
                               "remembers (oldest go first)",
    "collector.spark_master": "Spark master URL (`spark://...` for a cluster)",
    "collector.spark_partitions": "Spark partitions per run",
    "collector.spark_driver_memory": "Spark driver memory",
    "collector.spark_conf": "extra `spark.*` settings for the collector's SparkSession "
                            "(strings, numbers, booleans); the ones icefloe owns are "
                            "refused; file only",
    "collector.output": "`embedded` (rows appended on the driver) or `cluster` (executors "
                        "write Parquet, also staged rows and upserts' rewritten files, the driver "
                        "commits `add_files` or one overwrite; "
                        "runs where two sources write one table go the embedded way)",
    "collector.dequeue_every": "runs between bulk dequeues of acknowledged entries",
    "collector.overlap": "read the next run's batch files while this run commits, and "
                         "acknowledge and dequeue in the background after the commit",
    "collector.read_ahead_bytes": "most batch-file bytes of the one run read ahead (held "
                                  "in memory until the run before it has committed)",
    "collector.target_run_s": "size runs by time: about the bytes the Spark job reads in "
                              "this long (at least one entry per Spark partition, at most "
                              "`max_run_bytes` or 128 MiB per partition; 0: by "
                              "`max_run_entries`/`max_run_bytes` only)",
    "collector.gc_interval_s": "how often unreferenced batch files are collected",
    "collector.keep_batches_s": "keep committed batch files this long (0 = off) with an "
                                "index by sequence and time, for `icefloe replay`",
    "collector.maintenance_interval_s": "how often tables are compacted, expired and cleaned "
                                        "(a pass spreads over the gaps between runs, about "
                                        "`commit_interval_s` of it in each)",
    "collector.snapshot_keep_last": "snapshots always kept per table",
    "collector.snapshot_max_age_s": "older snapshots beyond the newest N are expired "
                                    "(≥ dedup_window_s unless dedup is off)",
    "collector.compact_min_files": "compact a partition once it has this many small files",
    "collector.compact_target_bytes": "target size of compacted files",
    "collector.orphan_age_s": "unreferenced table files are deleted only when older than this",
    "collector.retry_max_delay_s": "backoff cap between retries of a failed run",
    "collector.commit_workers": "tables one run commits at once (1-64; a table template's "
                                "run may touch hundreds): their dedup-journal PUTs overlap "
                                "on any catalog, their catalog commits on PostgreSQL, Glue "
                                "and REST (SQLite serialises its writes)",
    "collector.park_after_failures": "failed attempts of one table's own steps before it is "
                                     "parked: its rows are staged, the other tables go on",
    "collector.park_retry_s": "first retry of a parked table's staged rows (doubling, up to "
                              "ten times; and at once after a registry change)",
    "collector.park_max_bytes": "staged bytes of a parked table beyond which its rows are no "
                                "longer staged: each run fails at its end (after the other "
                                "tables committed) and its entries wait in the queue, which "
                                "then stops advancing for every table",
    "collector.sql_max_value_bytes": "largest value a `sql` mapping may compute for one row; "
                                     "a larger one becomes null (counted in "
                                     "`icefloe_collector_sql_errors_total`)",
    "collector.sql_max_run_s": "evaluation time the `sql` mappings of one run may take; past "
                               "it the values still missing become null (counted)",
    "admin.host": "admin API address (this machine only by default)",
    "admin.port": "admin API port (`icefloe admin`)",
    "admin.tokens": "hashes (`icefloe token hash`) of the bearer tokens the admin API accepts",
    "admin.registry_key": "object key of the stream registry inside the store",
    "admin.tombstone_grace_s": "deleted sources and sinks leave the registry this long after "
                               "their deletion, once no queued or staged event needs them "
                               "(≥ manifest.append_deadline_s + ingestor.flush_timeout_s + "
                               "registry_poll_s + 300)",
    "admin.tls_cert_file": "admin API certificate chain (PEM; reloaded when it changes)",
    "admin.tls_key_file": "admin API private key (PEM, unencrypted)",
    "admin.tls_client_ca_file": "mutual TLS: admin clients need a certificate this CA signed",
    "admin.plaintext": "allow the admin API without TLS on a non-loopback address (behind a "
                       "TLS-terminating gateway)",
    "admin.registry_poll_s": "how often ingestors and the collector look for a new registry "
                             "version (a change applies within this delay)",
    "collector.models": "SQL models the collector keeps fresh (`[\"*\"]`: all): run after "
                        "commits that add rows they read, with the stored models they read",
    "collector.models_dir": "folder of the `*.sql` models, relative to the config file",
    "collector.models_interval_s": "at least this long between two model runs (0: after "
                                   "every commit that adds rows they read)",
    "collector.evolve_max_columns": "schema evolution from the data: a table never grows "
                                    "past this many columns (beyond: the field goes to "
                                    "`_overflow`)",
    "collector.evolve_max_name_length": "schema evolution: longest name a new column may "
                                        "take (beyond: dead letter)",
    "collector.evolve_max_depth": "schema evolution: deepest nesting of a new field's value "
                                  "(beyond: dead letter)",
    "collector.tls_cert_file": "certificate chain for /metrics, /healthz, /readyz (PEM; "
                               "reloaded when it changes)",
    "collector.tls_key_file": "private key of `collector.tls_cert_file` (PEM, unencrypted)",
    "collector.tls_client_ca_file": "mutual TLS: scrapers and probes need a certificate "
                                    "this CA signed",
    "collector.plaintext": "allow /metrics, /healthz, /readyz without TLS on a non-loopback "
                           "address (behind a TLS-terminating gateway, or probes inside "
                           "the pod network)",
    "query.embedded_max_bytes": "`icefloe query --engine auto` answers with the embedded "
                                "DuckDB engine when the pinned data files total at most "
                                "this (0: always Spark)",
    "otlp.enabled": "generate the OTLP streams and tables (docs/otlp.md); the ingestor's "
                    "OTLP receivers write into them",
    "otlp.kinds": "which kinds of rows get a stream and table (a request carrying another "
                  "kind is refused)",
    "otlp.logs_table": "table of log records (stream `otlp.logs`)",
    "otlp.spans_table": "table of spans (stream `otlp.spans`)",
    "otlp.gauge_table": "table of gauge points (stream `otlp.gauge`)",
    "otlp.sum_table": "table of sum points (stream `otlp.sum`)",
    "otlp.histogram_table": "table of histogram points (stream `otlp.histogram`)",
    "otlp.exponential_histogram_table": "table of exponential histogram points (stream "
                                        "`otlp.exponential_histogram`)",
    "otlp.summary_table": "table of summary points (stream `otlp.summary`)",
    "otlp.tokens": "token hashes valid for every OTLP stream (`[[tokens]]` naming "
                   "`otlp.logs`, ... scope a token to some kinds)",
    "otlp.service_buckets": "tables are partitioned by day and by this many buckets of "
                            "`service_name` (1 to 1024)",
    "otlp.partition_by": "per kind, a `partition_by` replacing the default "
                         "(`spans = [\"hour(start_time)\"]`); file only",
    "otlp.sort_by": "per kind, the table's sort order (`logs = [\"service_name\", "
                    "\"time\"]`); file only",
    "otlp.table_properties": "Iceberg table properties of every OTLP table; file only",
    "otlp.rate_limit": "a rate limit on each OTLP stream (like a stream's `rate_limit`); "
                       "file only",
}

_START = "<!-- config-reference:start (generated: python -m icefloe.config.reference) -->"
_END = "<!-- config-reference:end -->"


def _default(value: Any) -> str:
    if value is None or value == () or value == {}:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ", ".join(f"`{item}`" for item in value)
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"{value // (1024 * 1024)} MiB"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"`{value}`"


UNDER_DATA_DIR = {"store.url": "DATA_DIR/store", "catalog.uri": "DATA_DIR/catalog.db",
                  "catalog.warehouse": "DATA_DIR/warehouse"}
"""Where the CLI puts these when neither the file nor the environment names them."""


def rows() -> list[tuple[str, str, str, str]]:
    """(key, env, default, meaning) for every setting, in struct order."""
    out = []
    for section, struct in SECTIONS.items():
        defaults = struct()
        for field in struct.__struct_fields__:
            key = f"{section}.{field}"
            env = "—" if field in FILE_ONLY else f"`ICEFLOE_{section.upper()}_{field.upper()}`"
            default = (f"`{UNDER_DATA_DIR[key]}`" if key in UNDER_DATA_DIR
                       else _default(getattr(defaults, field)))
            out.append((f"`{key}`", env, default, MEANING.get(key, "")))
    return out


def markdown() -> str:
    """The README block, markers included."""
    lines = [_START, "| key | environment | default | meaning |", "|---|---|---|---|"]
    lines += [f"| {k} | {e} | {d} | {m} |" for k, e, d, m in rows()]
    lines.append(_END)
    return "\n".join(lines)


def readme_block(text: str) -> str | None:
    """The block as it stands in a README, or None if the markers are missing."""
    if _START not in text or _END not in text:
        return None
    start = text.index(_START)
    return text[start:text.index(_END, start) + len(_END)]


if __name__ == "__main__":
    print(markdown())
