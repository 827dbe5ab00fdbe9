"""End to end with real processes (issue #43 item 2): does the one collector keep up?

Four runs: 4 and 8 real ``icefloe ingestor`` processes, each with the real collector on
Spark ``local[2]`` and on a standalone cluster of two one-core workers (master and workers
started here with pyspark's ``spark-class``; the collector's ``output = "cluster"``, so the
executors write the data files). The store is a moto S3 server with S3-like latency in
front of it (20-50 ms per request, seeded; moto then serves one request at a time: see
:mod:`_scale_processes`); the catalog is SQLite. The load is ``_grpc_load.py`` processes,
closed loop, 100 events per unary Publish, 4 in flight per ingestor: the ingestors take all
they can, so the question is whether the collector commits as fast as they accept.

Sampled every few seconds from the processes' own ``/metrics``: events accepted (sum over
the ingestors), rows committed and the queue depth (the collector's), and the CPU seconds of
each role's process tree (``/proc``). Reported per run: accepted and committed events/s over
the window (committed against accepted as the baseline), the queue depth's slope over the
window's last four fifths (four minutes of a full run's five), freshness p50/p99 (receipt →
the append snapshot that first holds the row, read from the table itself) and where the CPU
went. ``bench/results/e2e.png`` plots accepted/s, committed/s and the queue for each run.

Usage: python bench/e2e_bench.py [--quick] [--json PATH] [--plot PATH] [--window S]
(``--quick``: 4 ingestors on ``local[2]`` only, a 20 s window; a full run takes ~30 min and
needs the machine to itself.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, print_table, write_json
from _proc_cpu import process_table, tree_cpu
from _scale_processes import (
    CONFIG,
    ProcessRun,
    ProcessSpec,
    read_load,
    scrape,
    spark_lock,
    start_load,
    stop_process,
    sum_metric,
    total,
    wait_drained,
    warm_collector,
    write_faults,
)

from testing.chaos.cluster import Cluster, StoreTarget, free_port
from testing.chaos.http_faults import start_moto
from testing.spark_standalone import DRIVER_CONF, Standalone

TABLE = "web.pageviews"
SAMPLE_S = 5.0
TICKS_PER_S = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}


@dataclass(frozen=True)
class E2ESpec:
    ingestors: int
    standalone: bool
    window_s: float
    warmup_s: float = 10.0

    @property
    def label(self) -> str:
        spark = "standalone, 2 workers" if self.standalone else "local[2]"
        return f"{self.ingestors} ingestors, Spark {spark}"


@dataclass
class Sample:
    t: float
    accepted: float
    committed: float
    queue: float
    cpu: dict[str, float]


@dataclass
class E2ERun:
    spec: E2ESpec
    samples: list[Sample] = field(default_factory=list)
    freshness_s: list[float] = field(default_factory=list)
    accepted_total: float = 0.0
    committed_total: float = 0.0
    drain_s: float | None = None
    client_events: int = 0
    ack_p99_ms: float = 0.0

    def window(self) -> list[Sample]:
        """The samples of the measured window: after the warm-up, while the load runs (the
        load clients' CPU cannot be read once they have exited)."""
        start = self.samples[0].t + self.spec.warmup_s
        end = start + self.spec.window_s
        return [s for s in self.samples if start - 1e-6 <= s.t <= end]

    def rate(self, attr: str) -> float:
        w = self.window()
        return (getattr(w[-1], attr) - getattr(w[0], attr)) / (w[-1].t - w[0].t)

    def queue_slope(self) -> float:
        """Least-squares slope of the queue depth (entries/min) over the window's last
        four fifths."""
        w = self.window()
        cut = w[0].t + (w[-1].t - w[0].t) / 5
        tail = [s for s in w if s.t >= cut]
        if len(tail) < 2:
            return 0.0
        slope = np.polyfit([s.t for s in tail], [s.queue for s in tail], 1)[0]
        return float(slope) * 60

    def cpu_seconds(self) -> dict[str, float]:
        w = self.window()
        return {role: w[-1].cpu[role] - w[0].cpu.get(role, 0.0) for role in w[-1].cpu}


def _collector_settings(standalone: Standalone | None) -> str:
    """The [collector] lines for the Spark master (CONFIG's driver-memory line + these)."""
    if standalone is None:
        return 'spark_driver_memory = "1g"'
    conf = ", ".join(f'"{k}" = "{v}"' for k, v in DRIVER_CONF.items())
    return (f'spark_driver_memory = "1g"\nspark_master = "{standalone.url}"\n'
            f'output = "cluster"\nspark_conf = {{ {conf} }}')


class Sampler:
    """A thread scraping the processes' metrics and CPU every ``SAMPLE_S`` seconds."""

    def __init__(self, cluster: Cluster, collector_url: str,
                 roles: dict[str, list[int]]) -> None:
        self.cluster, self.collector_url, self.roles = cluster, collector_url, roles
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="sampler")

    def take(self) -> Sample:
        ingestors = [scrape(f"{url}/metrics") for url in self.cluster.http_urls()]
        collector = scrape(self.collector_url)
        table = process_table()
        cpu = {role: tree_cpu(pids, table) for role, pids in self.roles.items()}
        own = table.get(os.getpid())
        cpu["moto + this bench (one process)"] = own[1] if own else 0.0
        return Sample(time.monotonic(), sum_metric(ingestors, "icefloe_ingest_events_accepted"),
                      total(collector, "icefloe_collector_rows_committed"),
                      total(collector, "icefloe_collector_queue_entries"), cpu)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            with contextlib.suppress(OSError):
                self.samples.append(self.take())

    def __enter__(self) -> Sampler:
        self.samples.append(self.take())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.take())


def freshness(config_path: Path) -> list[float]:
    """Seconds from receipt to visibility of every row: the first append snapshot that
    added the row's data file, minus the row's ``_received_at``.

    Read from the table's own snapshots and manifests (not from the collector's metrics),
    as any reader would see it."""
    import pyarrow.parquet as pq  # why: only after the run, when the table is complete

    from icefloe.config import load_config
    from pipeline.iceberg.catalog import open_catalog

    table = open_catalog(load_config(config_path).catalog).load_table(TABLE)
    io, out = table.io, []
    for snapshot in table.snapshots():
        summary = snapshot.summary
        if summary is None or summary.operation.value != "append":
            continue
        for manifest in snapshot.manifests(io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(io):
                if entry.snapshot_id != snapshot.snapshot_id:
                    continue
                with io.new_input(entry.data_file.file_path).open() as handle:
                    received = pq.read_table(handle, columns=["_received_at"]).column(0)
                ticks = received.cast(pa.int64()).to_numpy(zero_copy_only=False)
                seconds = ticks / TICKS_PER_S[received.type.unit]
                out.extend((snapshot.timestamp_ms / 1000.0 - seconds).tolist())
    return out


def run_e2e(spec: E2ESpec, say=print) -> E2ERun:
    """One run; the caller holds :func:`spark_lock`."""
    with tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        root = Path(tmp)
        faults = root / "faults.json"
        write_faults(faults, 1)
        moto = start_moto(str(faults))
        standalone = Standalone(root / "spark", workers=2) if spec.standalone else None
        cluster: Cluster | None = None
        try:
            if standalone is not None:
                standalone.start()
            url = moto.bucket_url("e2e")
            cluster = Cluster(root, StoreTarget(url, moto.endpoint), spec.ingestors)
            write_faults(faults, 1)
            metrics_port = free_port()
            text = CONFIG.format(url=url, endpoint=moto.endpoint, root=root, shards=1,
                                 warehouse=(root / "warehouse").as_uri(),
                                 metrics_port=metrics_port)
            cluster.config.write_text(text.replace('spark_driver_memory = "1g"',
                                                   _collector_settings(standalone)))
            return _measure(spec, cluster, standalone,
                            f"http://127.0.0.1:{metrics_port}/metrics", say)
        finally:
            if cluster is not None:
                for proc in [*cluster.collectors, *(p for p in cluster.ingestors if p)]:
                    stop_process(proc)
                cluster.close()
            if standalone is not None:
                standalone.stop()
            moto.stop()


def _start(spec: E2ESpec, cluster: Cluster, collector_url: str, say) -> None:
    started = time.monotonic()
    collector = cluster.start_collector()
    if collector.wait_ready(300) is None:
        raise RuntimeError(f"the collector did not become active; see {cluster.root}")
    say(f"  collector active after {time.monotonic() - started:.0f} s")
    for index in range(spec.ingestors):
        cluster.ports[index] = (free_port(), free_port(), free_port())
        cluster.start_ingestor(index, timeout=120, attempts=3)
    warm_collector(cluster, collector_url)


def _measure(spec: E2ESpec, cluster: Cluster, standalone: Standalone | None,
             collector_url: str, say) -> E2ERun:
    _start(spec, cluster, collector_url, say)
    roles = {"ingestors": [p.popen.pid for p in cluster.ingestors if p],
             "collector (Python + Spark driver JVM)": [p.popen.pid for p in cluster.collectors]}
    if standalone is not None:
        roles["Spark master + workers + executors"] = [p.pid for p in standalone.procs]
    load_spec = ProcessSpec(spec.ingestors, duration_s=spec.window_s, warmup_s=spec.warmup_s)
    run = E2ERun(spec)
    load = start_load(cluster, load_spec)
    roles["load clients"] = [p.pid for p in load]
    say(f"  load on: {spec.warmup_s:g} s warm-up, {spec.window_s:g} s window")
    clients = ProcessRun(load_spec, spec.window_s)
    with Sampler(cluster, collector_url, roles) as sampler:
        for proc in load:  # read_load's own timeout is shorter than a full window
            proc.wait(spec.warmup_s + spec.window_s + 120)
        read_load(load, clients)
    run.client_events, run.ack_p99_ms = clients.client_events, clients.ack_p99_ms
    run.samples = sampler.samples
    say("  load stopped; waiting for the collector to drain")
    run.drain_s = wait_drained(collector_url, cluster, 300)
    run.accepted_total = sum_metric([scrape(f"{u}/metrics") for u in cluster.http_urls()],
                              "icefloe_ingest_events_accepted")
    run.committed_total = total(scrape(collector_url), "icefloe_collector_rows_committed")
    run.freshness_s = freshness(cluster.config)
    return run


def results(run: E2ERun) -> list[Result]:
    label = f"real processes, {run.spec.label}"
    accepted, committed = run.rate("accepted"), run.rate("committed")
    fresh = np.array(run.freshness_s) if run.freshness_s else np.zeros(1)
    cpu = run.cpu_seconds()
    seconds = run.window()[-1].t - run.window()[0].t
    rows = [
        Result(f"{label}: events/s accepted by the ingestors", accepted, "events/s"),
        Result(f"{label}: events/s committed (baseline: accepted)", committed, "events/s",
               accepted),
        Result(f"{label}: queue depth slope over the window's last 4/5", run.queue_slope(),
               "entries/min"),
        Result(f"{label}: freshness p50 (receipt -> visible)",
               float(np.percentile(fresh, 50)), "s"),
        Result(f"{label}: freshness p99", float(np.percentile(fresh, 99)), "s"),
        Result(f"{label}: accepted - committed after the drain",
               run.accepted_total - run.committed_total, "events"),
    ]
    rows += [Result(f"{label}: CPU share, {role}", 100 * used / (seconds * (os.cpu_count() or 1)),
                    "% of the machine") for role, used in cpu.items()]
    return rows


def plot(runs: list[E2ERun], path: Path) -> None:
    """Accepted/s and committed/s (left axis) and the queue (right axis) over time, one
    panel per run."""
    import matplotlib  # why: plotting is this bench's alone (a dev dependency)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # why: after the backend is chosen

    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.2 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        s = run.samples
        t = np.array([x.t for x in s]) - s[0].t
        mid = (t[1:] + t[:-1]) / 2
        for attr, name in (("accepted", "accepted/s"), ("committed", "committed/s")):
            values = np.array([getattr(x, attr) for x in s])
            ax.plot(mid, np.diff(values) / np.diff(t), label=name)
        ax.set_ylabel("events/s")
        ax.set_title(run.spec.label, fontsize=10)
        queue_ax = ax.twinx()
        queue_ax.plot(t, [x.queue for x in s], color="grey", linestyle="--", label="queue")
        queue_ax.set_ylabel("queue (entries)")
        ax.axvline(run.spec.warmup_s, color="black", linewidth=0.5)
        handles = ax.get_legend_handles_labels()[0] + queue_ax.get_legend_handles_labels()[0]
        ax.legend(handles, [h.get_label() for h in handles], loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the load started (line: end of warm-up)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    print(f"wrote {path}")


def e2e_specs(quick: bool, window: float | None) -> Iterator[E2ESpec]:
    if quick:
        yield E2ESpec(4, False, window or 20.0, warmup_s=5.0)
        return
    for standalone in (False, True):
        for ingestors in (4, 8):
            yield E2ESpec(ingestors, standalone, window or 300.0)


def main() -> None:
    parser = bench_parser(__doc__, "4 ingestors on local[2] only, a 20 s window")
    parser.add_argument("--plot", default=None, metavar="PATH",
                        help="where the PNG goes (default bench/results/e2e.png; "
                             "with --quick, none unless given)")
    parser.add_argument("--window", type=float, default=None,
                        help="the measured window in seconds (default 300; --quick 20)")
    args = parser.parse_args()
    runs: list[E2ERun] = []
    rows: list[Result] = []
    with spark_lock():
        for spec in e2e_specs(args.quick, args.window):
            print(f"{spec.label}: starting", flush=True)
            run = run_e2e(spec)
            drain = "not drained" if run.drain_s is None else f"drained in {run.drain_s:.0f} s"
            print(f"  {run.client_events} events acknowledged to the clients, {drain}; "
                  f"ack p99 {run.ack_p99_ms:.0f} ms", flush=True)
            runs.append(run)
            rows += results(run)
    print_table("end to end, real processes (moto behind 20-50 ms per request, one request "
                "at a time; SQLite catalog)", rows)
    plot_path = args.plot or (None if args.quick else "bench/results/e2e.png")
    if plot_path:
        plot(runs, Path(plot_path))
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
