"""Prometheus metrics of the collector (served on ``[collector] metrics_port``).

Why these: an operator must see whether the collector keeps up (queue length, lag of the
oldest unconsumed entry, last commit age), what it delivers (rows and bytes per table,
commit latency, deduplicated rows), and when it is in trouble (dead letters, fenced,
failed runs by kind) — without reading logs.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from collector.http import Health
from icefloe.manifest import ShardedConsumer

_COMMIT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class CollectorMetrics:
    def __init__(self) -> None:
        self.health = Health()
        """What ``/healthz`` and ``/readyz`` report (see :mod:`collector.http`)."""
        self.registry = r = CollectorRegistry()
        self._queue(r)
        self._commits(r)
        self._rows(r)
        self._failures(r)
        self._models(r)
        self._staging(r)
        self._role(r)
        self._run_now(r)

    def _run_now(self, r: CollectorRegistry) -> None:
        """``POST /v1/run`` (``icefloe run`` asking this collector)."""
        self.run_now_requests = Counter("icefloe_collector_run_now_requests",
                                        "POST /v1/run requests by outcome (ok, "
                                        "model_failed, run_failed, fenced, stopping, "
                                        "not_active, timeout, refused)", ["outcome"],
                                        registry=r)
        self.run_now_seconds = Histogram("icefloe_collector_run_now_seconds",
                                         "POST /v1/run: from the request to its answer",
                                         buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
                                         registry=r)

    def _queue(self, r: CollectorRegistry) -> None:
        """The manifest queue and the runs reading it."""
        self.queue_length = Gauge("icefloe_collector_queue_entries",
                                  "Manifest entries not yet acknowledged", registry=r)
        self.queue_max_entries = Gauge("icefloe_collector_queue_max_entries",
                                       "manifest.max_entries: beyond it ingestors get 429 "
                                       "queue_full (for alerts on queue_entries)", registry=r)
        self.lag_seconds = Gauge("icefloe_collector_lag_seconds",
                                 "Age of the oldest unconsumed manifest entry (store clock)",
                                 registry=r)

    def _commits(self, r: CollectorRegistry) -> None:
        """What the commits wrote, and how they went."""
        self.rows = Counter("icefloe_collector_rows_committed",
                            "Rows committed to Iceberg", ["table"], registry=r)
        self.bytes = Counter("icefloe_collector_bytes_committed",
                             "Arrow bytes committed to Iceberg", ["table"], registry=r)
        self.batch_bytes = Counter("icefloe_collector_batch_bytes_read",
                                   "Batch-file bytes consumed", registry=r)
        self.commit_seconds = Histogram("icefloe_collector_commit_seconds",
                                        "Iceberg commit latency", ["table"],
                                        buckets=_COMMIT_BUCKETS, registry=r)
        self.run_seconds = Histogram("icefloe_collector_run_seconds",
                                     "Whole run: read, Spark job, commits, ack",
                                     buckets=_COMMIT_BUCKETS, registry=r)
        self.last_commit = Gauge("icefloe_collector_last_commit_timestamp_seconds",
                                 "Unix time of the last successful commit", registry=r)
        self.committed_sequence = Gauge("icefloe_collector_committed_sequence",
                                        "Highest manifest sequence committed, per table",
                                        ["table"], registry=r)

    def _rows(self, r: CollectorRegistry) -> None:
        """Rows that did not reach their table as sent: dead letters, unrouted, duplicates,
        replays."""
        self.cdc_noops = Counter("icefloe_collector_cdc_noop_changes",
                                "Change-stream changes that did nothing, by reason (stale: "
                                "not newer than the row's stored position; unknown_delete: "
                                "a delete of a key the table does not hold)",
                                ["table", "reason"], registry=r)
        self.dead_letters = Counter("icefloe_collector_dead_letter_rows",
                                    "Rows sent to icefloe.dead_letters", ["reason"],
                                    registry=r)
        self.unrouted = Counter("icefloe_collector_unrouted_events",
                                "Events that no sink's where took, per source (dropped, "
                                "or dead-lettered when the source's unrouted says so)",
                                ["source"], registry=r)
        self.where_errors = Counter("icefloe_collector_where_errors",
                                    "Events a sink's where raised an error on (integer "
                                    "overflow, division by zero), dead-lettered with reason "
                                    "where_error, per source", ["source"], registry=r)
        self.duplicates = Counter("icefloe_collector_duplicates_dropped",
                                  "Rows dropped by event-id deduplication", ["stream"],
                                  registry=r)
        self.dedup_effective_window = Gauge(
            "icefloe_collector_dedup_effective_window_seconds",
            "How far back the dedup window reaches per table: collector.dedup_window_s, or "
            "less while collector.dedup_max_ids cuts it short", ["table"], registry=r)
        self.dedup_ids = Gauge("icefloe_collector_dedup_ids",
                               "Event ids the dedup window of a table remembers", ["table"],
                               registry=r)
        self.replayed = Counter("icefloe_collector_replayed_rows_skipped",
                                "Rows skipped because their table already held their sequence",
                                ["table"], registry=r)

    def _failures(self, r: CollectorRegistry) -> None:
        """Failed runs and commits, fencing, GC and table maintenance."""
        self.run_errors = Counter("icefloe_collector_run_errors",
                                  "Runs that failed and will be retried, by kind", ["kind"],
                                  registry=r)
        self.fenced = Counter("icefloe_collector_fenced",
                              "Times this collector found itself replaced", registry=r)
        self.commit_failed = Counter("icefloe_collector_commit_failed",
                                     "Commits rejected or of unknown outcome", ["table"],
                                     registry=r)
        self.gc_deleted = Counter("icefloe_collector_gc_deleted_files",
                                  "Batch files deleted by garbage collection", registry=r)
        self.gc_retained = Gauge("icefloe_collector_gc_retained_files",
                                 "Dequeued batch files the last GC run kept for retention "
                                 "(collector.keep_batches_s; icefloe replay can run them)",
                                 registry=r)
        self.maintenance = Counter("icefloe_collector_maintenance_runs",
                                   "Table maintenance runs by result", ["table", "result"],
                                   registry=r)

    def _models(self, r: CollectorRegistry) -> None:
        """SQL models the collector keeps fresh."""
        self.model_runs = Counter("icefloe_collector_model_runs",
                                  "SQL model runs by outcome (ran, up to date, view, failed, "
                                  "skipped)", ["model", "state"], registry=r)
        self.model_rows = Counter("icefloe_collector_model_rows",
                                  "Rows written by SQL model runs", ["model"], registry=r)
        self.model_seconds = Histogram("icefloe_collector_model_seconds",
                                       "SQL model run time", ["model"],
                                       buckets=_COMMIT_BUCKETS, registry=r)
        self.model_last_run = Gauge("icefloe_collector_model_last_run_timestamp_seconds",
                                    "Unix time of the model's last run that wrote rows",
                                    ["model"], registry=r)

    def _staging(self, r: CollectorRegistry) -> None:
        """Staged sinks, parked tables, routing."""
        self.staged_rows = Gauge("icefloe_collector_staged_rows",
                                 "Rows staged for a sink with import conditions, not yet "
                                 "committed", ["table"], registry=r)
        self.staged_bytes = Gauge("icefloe_collector_staged_bytes",
                                  "Parquet bytes staged for a sink, not yet committed",
                                  ["table"], registry=r)
        self.staged_oldest = Gauge("icefloe_collector_staged_oldest_received_seconds",
                                   "Receive time (unix) of the oldest staged row per table",
                                   ["table"], registry=r)
        self.staged_commits = Counter("icefloe_collector_staged_commits",
                                      "Commits of staged rows, by the condition that fired "
                                      "(age, bytes, events, drain)", ["table", "reason"],
                                      registry=r)
        self.embedded_runs = Counter("icefloe_collector_embedded_fallback_runs",
                                     "Runs of output = cluster that took the embedded path, "
                                     "by reason (shared-table: two sources write one table "
                                     "in one run; evolve: a sink of the run evolves its "
                                     "table from the data, unknown_fields = evolve, a "
                                     "change stream's too)",
                                     ["reason"], registry=r)
        self.sql_errors = Counter("icefloe_collector_sql_errors",
                                  "Rows whose sql mapping value is null because its "
                                  "expression threw at run time", ["stream", "column"],
                                  registry=r)
        self.registry_version = Gauge("icefloe_collector_registry_version",
                                      "Stream-registry version the collector routes by "
                                      "(0: config streams)", registry=r)
        self.table_parked = Gauge("icefloe_collector_table_parked",
                                  "1 while a table is parked (its own steps kept failing: "
                                  "its rows are staged, the other tables go on)", ["table"],
                                  registry=r)
        self.table_failures = Counter("icefloe_collector_table_failures",
                                      "Failed attempts of one table's own steps (evolve, "
                                      "write, commit), by exception kind",
                                      ["table", "kind"], registry=r)

    def _role(self, r: CollectorRegistry) -> None:
        """Liveness and role."""
        self.stalled = Gauge("icefloe_collector_stalled",
                             "1 while entries wait and no run finished for 5 commit "
                             "intervals (a run hangs or keeps failing)", registry=r)
        self.stalled.set_function(lambda: 1.0 if self.health.stalled() else 0.0)
        self.epoch = Gauge("icefloe_collector_epoch", "This collector's manifest epoch",
                           registry=r)
        self.spark_ready = Gauge("icefloe_collector_spark_ready",
                                 "1 once this collector's SparkSession is up (icefloe up's "
                                 "collector commits in-process until then)", registry=r)
        self.active = Gauge("icefloe_collector_active",
                            "1 when this collector holds the lease, 0 while on standby",
                            registry=r)

    def watch_shards(self, consumer: ShardedConsumer) -> None:
        """Export per-shard queue metrics of a multi-shard consumer (read at scrape time
        from what its last read saw: no store request per scrape)."""
        self.registry.register(_ShardCollector(consumer))


class _ShardCollector(Collector):
    """Per shard: entries not yet acknowledged, CAS writes by every writer (the shard's
    ``revision`` counts them all, so its rate is the shard's CAS rate) and this
    collector's own lost CAS races (ingestors export theirs)."""

    def __init__(self, consumer: ShardedConsumer) -> None:
        self.consumer = consumer

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        queued = GaugeMetricFamily("icefloe_collector_shard_queue_entries",
                                   "Manifest entries not yet acknowledged, per shard",
                                   labels=["shard"])
        writes = CounterMetricFamily("icefloe_collector_shard_cas_writes",
                                     "Manifest CAS writes by every writer, per shard (its "
                                     "revision)", labels=["shard"])
        conflicts = CounterMetricFamily("icefloe_collector_shard_cas_conflicts",
                                        "CAS races this collector lost, per shard",
                                        labels=["shard"])
        for number, manifest in sorted(self.consumer.last_read.items()):
            label = [str(number)]
            queued.add_metric(label, manifest.next_sequence
                              - manifest.consumer.acked_through - 1)
            writes.add_metric(label, manifest.revision)
        for number, stats in self.consumer.stats.items():
            conflicts.add_metric([str(number)], stats.conflicts)
        count = GaugeMetricFamily("icefloe_collector_shards",
                                  "Manifest shards the store records",
                                  value=self.consumer.shard_count)
        yield from (queued, writes, conflicts, count)
