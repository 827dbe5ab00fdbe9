"""Prometheus metrics of one ingestor process.

Why a registry per instance: tests (and ``icefloe up``) may run several ingestors in one
process; the global registry would refuse the second set. ``/metrics`` serves this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from icefloe.manifest import ProducerStats
from icefloe.metric_total import metric_total
from ingestor.loop_histogram import LoopHistogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class IngestMetrics:
    """Requests, events, buffer, flushes and acks, labelled by transport and stream."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("icefloe_ingest_requests", "Ingest requests by outcome",
                                ["transport", "stream", "status"], registry=r)
        self.events_accepted = Counter("icefloe_ingest_events_accepted",
                                       "Events acknowledged as durable", ["stream"], registry=r)
        self.events_rejected = Counter("icefloe_ingest_events_rejected",
                                       "Events refused, by reason", ["stream", "reason"],
                                       registry=r)
        self.events_dead_lettered = Counter(
            "icefloe_ingest_events_dead_lettered", "Invalid events of on_invalid = "
            "\"dead_letter\" streams buffered as dead letters instead of refusing the "
            "request", ["stream"], registry=r)
        self.cdc_nulls_ignored = Counter(
            "icefloe_ingest_cdc_null_values_ignored", "Null Kafka record values (Debezium's "
            "tombstone after a delete) a change stream ignored", ["stream"], registry=r)
        self.client_errors = Counter(
            "icefloe_ingest_client_errors", "Requests refused because of the client (4xx but "
            "429), by error code (ingestor.client_errors)", ["code"], registry=r)
        self.client_error_logs_suppressed = Counter(
            "icefloe_ingest_client_error_logs_suppressed", "Client-error log lines left out "
            "by the per-code rate limit", registry=r)
        self.buffer_bytes = Gauge("icefloe_ingest_buffer_bytes",
                                  "Bytes buffered or being flushed (not yet acknowledged)",
                                  registry=r)
        self.buffer_limit_bytes = Gauge("icefloe_ingest_buffer_limit_bytes",
                                        "Buffer bound; beyond it requests get 429", registry=r)
        self.registry_version = Gauge("icefloe_ingest_registry_version",
                                      "Stream-registry version in use (0: config streams)",
                                      registry=r)
        self.registry_errors = Counter("icefloe_ingest_registry_errors",
                                       "Failed reads of the stream registry (the last good "
                                       "version stays in use)", registry=r)
        self.flushes = Counter("icefloe_ingest_flushes", "Batch flushes by result", ["result"],
                               registry=r)
        self._histograms(r)
        self.grpc_idle_streams = Counter(
            "icefloe_ingest_grpc_idle_streams_closed", "PublishStreams the server ended "
            "because they sent nothing for grpc_stream_idle_s with nothing in flight",
            registry=r)
        self.rate_limited_requests = Counter(
            "icefloe_ingest_rate_limited_requests", "Requests refused by a rate limit, by the "
            "limit's scope (stream, token or client); their events count in "
            "icefloe_ingest_events_rejected{reason=\"rate_limited\"}", ["stream", "scope"],
            registry=r)
        self.rate_limit = Gauge(
            "icefloe_ingest_rate_limit", "Configured rate limits of this process (each "
            "ingestor enforces its own)", ["scope", "name", "measure"], registry=r)
        self.kafka_connections = Gauge("icefloe_ingest_kafka_connections",
                                       "Open Kafka connections", registry=self.registry)
        self.kafka_closed = Counter(
            "icefloe_ingest_kafka_closed", "Kafka connections the listener closed, by reason "
            "(too_large, malformed, unsupported, sasl, slow, too_many_connections, "
            "acks0_refused, idle)",
            ["reason"], registry=self.registry)
        self.kafka_epoch_bumps = Counter(
            "icefloe_ingest_kafka_epoch_bumps", "Idempotent Kafka producers that bumped their "
            "own epoch (KIP-360; librdkafka does it after records ran out of "
            "message.timeout.ms): records it renumbers under the new epoch get new event "
            "ids, so one whose earlier attempt was stored may be stored again", registry=r)
        self.http_refused = Counter(
            "icefloe_ingest_http_refused", "HTTP connections and requests the front refused "
            "before any route saw them, by reason (max_connections, header_bytes, "
            "header_count, http_version, transfer_encoding)", ["reason"], registry=r)

    def _histograms(self, r: CollectorRegistry) -> None:
        """The histograms, all observed on the event loop, per flush or per request: they
        take no lock each time (:mod:`ingestor.loop_histogram`)."""
        self.flush_seconds = LoopHistogram("icefloe_ingest_flush_seconds",
                                           "Batch PUT + manifest append latency",
                                           buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_bytes = LoopHistogram("icefloe_ingest_batch_bytes",
                                         "Compressed batch file size",
                                         buckets=(1e3, 1e4, 1e5, 1e6, 4e6, 8e6, 16e6, 64e6),
                                         registry=r)
        self.batch_events = LoopHistogram("icefloe_ingest_batch_events",
                                          "Events per batch file",
                                          buckets=(1, 10, 100, 1e3, 1e4, 1e5, 1e6), registry=r)
        self.ack_seconds = LoopHistogram("icefloe_ingest_ack_seconds",
                                         "Time from request received to durable "
                                         "acknowledgement",
                                         ["transport"], buckets=_LATENCY_BUCKETS, registry=r)

    def totals(self) -> dict[str, float]:
        """Accepted/rejected events over all streams and the buffered bytes, for progress
        lines (``icefloe up`` sums them over its ingestor processes)."""
        return {"accepted": metric_total(self.events_accepted),
                "rejected": metric_total(self.events_rejected),
                "buffered_bytes": metric_total(self.buffer_bytes)}

    def watch_shard(self, shard: Callable[[], int | None]) -> None:
        """Export the manifest shard this process appends to (-1 before the first
        append); join it with the CAS counters for per-shard rates and conflicts."""
        gauge = Gauge("icefloe_ingest_manifest_shard", "Manifest shard this ingestor "
                      "appends to (-1: none yet)", registry=self.registry)
        gauge.set_function(lambda: -1 if (current := shard()) is None else current)

    def watch_producer(self, stats: ProducerStats) -> None:
        """Export the manifest producer's counters (read at scrape time, never copied)."""
        self.registry.register(_ProducerCollector(stats))


class _ProducerCollector(Collector):
    def __init__(self, stats: ProducerStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        s = self.stats
        for name, doc, value in (
            ("icefloe_ingest_manifest_cas_writes", "Manifest CAS writes", s.writes),
            ("icefloe_ingest_manifest_cas_conflicts", "Manifest CAS races lost", s.conflicts),
            ("icefloe_ingest_manifest_cas_stale", "Appends begun on the manifest this "
             "process wrote last that someone had replaced since (then read afresh)",
             s.stale),
            ("icefloe_ingest_manifest_batches_appended", "Batches appended", s.appended),
            ("icefloe_ingest_manifest_queue_full", "Appends refused: queue full", s.queue_full),
            ("icefloe_ingest_manifest_deadline_exceeded", "Appends refused: too old",
             s.deadline_exceeded),
            ("icefloe_ingest_manifest_duplicates_skipped",
             "Ambiguous appends found already applied", s.duplicates_skipped),
        ):
            yield CounterMetricFamily(name, doc, value=value)
