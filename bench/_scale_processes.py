"""The real-processes row of ``scale_bench.py --processes`` (issue #25): a shape check.

K real ``icefloe ingestor`` processes and the real collector (Spark) against a moto S3
server with S3-like latency in front of it: every request waits 20-50 ms (seeded) in the
chaos fault layer's ``delay`` rule (:mod:`testing.chaos.http_faults`) before it is served.
The delay is applied before moto's lock, so delays overlap; **moto then serves requests
one at a time** (:mod:`testing.chaos.moto_server`: that is what makes its conditional PUTs
atomic), so the store's service time adds up across all clients — the figures are a check
of the model's shape on the real code path, not of S3's capacity.

Processes are started the way the chaos harness starts them (:class:`Cluster`: the
``ready`` JSON line, retried starts), with a config of icefloe's **defaults** for flushing
(``flush_age_ms``, ``flush_bytes``, the collector's commit interval) and ``[manifest]
shards = N``. The collector starts first (it brings the store to N shards), then the
ingestors, then the load: ``_grpc_load.py`` processes, closed loop, 100 events per unary
Publish. Figures come from the processes' own ``/metrics`` at the start and the end of the
measured window (entries appended, CAS writes and races, events accepted, rows the collector
committed), ack p50/p99 from the clients (request sent → durable answer). Before the load
a second of it is sent and committed, so Spark's first (slow) job is not in the window.
After the window
the load stops and the collector drains; then the events acknowledged by every ingestor
are compared with the rows the collector committed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from testing.chaos.cluster import Cluster, Proc, StoreTarget, free_port
from testing.chaos.http_faults import start_moto

HERE = Path(__file__).resolve().parent
SPARK_LOCK = "/tmp/icefloe-spark.lock"
"""Every Spark user on this machine takes this lock (one Spark at a time on 2 cores)."""
DELAY_S = (0.020, 0.050)


@dataclass(frozen=True)
class ProcessSpec:
    """One real-processes run; durations in seconds."""

    ingestors: int = 8
    shards: int = 1
    duration_s: float = 20.0
    warmup_s: float = 5.0
    concurrency: int = 4
    """Publish calls in flight per ingestor (closed loop)."""
    load_processes: int = 2
    drain_timeout_s: float = 120.0
    seed: int = 1


@dataclass
class ProcessRun:
    """What one run measured: differences over the window of ``window_s`` seconds, except
    the ``*_total`` figures (the whole run, after the drain)."""

    spec: ProcessSpec
    window_s: float
    entries: float = 0.0
    events: float = 0.0
    batch_bytes: float = 0.0
    cas_writes: float = 0.0
    conflicts: float = 0.0
    collector_rows: float = 0.0
    queue_at_end: float = 0.0
    client_events: int = 0
    ack_p50_ms: float = 0.0
    ack_p99_ms: float = 0.0
    shards_used: list[int] = field(default_factory=list)
    accepted_total: float = 0.0
    committed_total: float = 0.0
    drain_s: float | None = None
    load_avg: float = 0.0
    store_requests: Counter[str] = field(default_factory=Counter)
    """Requests moto served in the window, by HTTP method (from the delay rule's log)."""


CONFIG = """# written by bench/scale_bench.py --processes
[store]
url = "{url}"
endpoint_url = "{endpoint}"
region = "us-east-1"

[catalog]
uri = "sqlite:///{root}/catalog.db"
warehouse = "{warehouse}"

[manifest]
shards = {shards}

[ingestor]
host = "127.0.0.1"

[collector]
host = "127.0.0.1"
metrics_port = {metrics_port}
spark_driver_memory = "1g"

[[streams]]
name = "pageviews"
table = "web.pageviews"
columns = [
  {{ name = "user_id", type = "string", required = true }},
  {{ name = "url", type = "string" }},
  {{ name = "duration_ms", type = "long" }},
  {{ name = "ts", type = "timestamp" }},
  {{ name = "ref", type = "string" }},
]
"""


def scrape(url: str) -> dict[str, float]:
    """``name{labels}`` → value of every sample at ``url`` (labels joined, sorted)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def total(samples: dict[str, float], name: str) -> float:
    """Sum of ``name`` over all its label sets (and of ``name_total`` for counters)."""
    return sum(v for k, v in samples.items()
               if k.split("{", 1)[0] in (name, f"{name}_total"))


@contextlib.contextmanager
def spark_lock() -> Iterator[object]:
    """Hold the machine's Spark lock while the collector runs (do not wrap this bench in
    ``flock`` as well: that would wait for itself)."""
    with open(SPARK_LOCK, "a") as handle:
        print(f"  waiting for {SPARK_LOCK} ...", flush=True)
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield handle
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_faults(path: Path, seed: int) -> None:
    """Every request (every method) waits 20-50 ms before moto serves it."""
    path.write_text(json.dumps({"seed": seed, "rules": [
        {"layer": "http", "kind": "delay", "probability": 1.0, "delay_s": list(DELAY_S)}]}))


def _requests(cluster: Cluster) -> Counter[str]:
    """Requests the server saw so far, by method: the delay rule logs each one."""
    log = Path(f"{cluster.faults_file}.log")
    if not log.exists():
        return Counter()
    return Counter(word for word in log.read_text().split()
                   if word in ("GET", "PUT", "DELETE", "HEAD", "POST"))


def _ingestor_metrics(cluster: Cluster) -> list[dict[str, float]]:
    return [scrape(f"{url}/metrics") for url in cluster.http_urls()]


def sum_metric(per_process: list[dict[str, float]], name: str) -> float:
    return sum(total(m, name) for m in per_process)


def start_load(cluster: Cluster, spec: ProcessSpec) -> list[subprocess.Popen[str]]:
    targets = cluster.grpc_targets()
    groups = [targets[i::spec.load_processes] for i in range(spec.load_processes)]
    return [subprocess.Popen(
        [sys.executable, str(HERE / "_grpc_load.py"), ",".join(group), "unary",
         str(spec.duration_s), "100", str(spec.concurrency), str(spec.warmup_s)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for group in groups if group]


def read_load(procs: list[subprocess.Popen[str]], run: ProcessRun) -> None:
    """Sum the clients' counted events; ack percentiles: the worst client's (conservative,
    the clients do not share their samples)."""
    p50s, p99s = [], []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        data = json.loads(out.strip().splitlines()[-1])
        run.client_events += data["events"]
        if data["p50_ms"] is not None:
            p50s.append(data["p50_ms"])
            p99s.append(data["p99_ms"])
    run.ack_p50_ms = max(p50s, default=0.0)
    run.ack_p99_ms = max(p99s, default=0.0)


def warm_collector(cluster: Cluster, collector_url: str, timeout: float = 180) -> None:
    """Send a little, and wait for the collector to commit it: Spark's first job (JVM
    warm-up, the session's first plan) takes seconds, and in a short window it would stand
    for the collector's drain rate."""
    subprocess.run([sys.executable, str(HERE / "_grpc_load.py"), cluster.grpc_targets()[0],
                    "unary", "1", "100", "1"], capture_output=True, check=True, timeout=60)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if total(scrape(collector_url), "icefloe_collector_rows_committed") > 0:
            return
        time.sleep(0.5)
    raise RuntimeError("the collector committed nothing of the warm-up load")


def wait_drained(collector_url: str, cluster: Cluster, timeout: float) -> float | None:
    """Seconds until the collector's queue is empty and it committed every accepted event."""
    began = time.monotonic()
    accepted = sum_metric(_ingestor_metrics(cluster), "icefloe_ingest_events_accepted")
    while time.monotonic() - began < timeout:
        samples = scrape(collector_url)
        if total(samples, "icefloe_collector_queue_entries") == 0 and \
                total(samples, "icefloe_collector_rows_committed") >= accepted:
            return time.monotonic() - began
        time.sleep(0.5)
    return None


def run_processes(spec: ProcessSpec, say: Callable[[str], None] = print) -> ProcessRun:
    """One measured run; raises if a process does not start. The caller holds
    :func:`spark_lock` (once for all its runs, so no other Spark starts between them)."""
    with tempfile.TemporaryDirectory(prefix="scale-proc-") as tmp:
        root = Path(tmp)
        faults = root / "faults.json"  # the file Cluster points every process at
        write_faults(faults, spec.seed)
        moto = start_moto(str(faults))
        cluster: Cluster | None = None
        try:
            url = moto.bucket_url("scale")
            cluster = Cluster(root, StoreTarget(url, moto.endpoint), spec.ingestors)
            # Cluster empties the file; the rule goes back (the in-process fault layer
            # ignores "layer": "http" rules, the server reloads the file when it changes)
            write_faults(faults, spec.seed)
            metrics_port = free_port()
            cluster.config.write_text(CONFIG.format(
                url=url, endpoint=moto.endpoint, root=root, shards=spec.shards,
                warehouse=(root / "warehouse").as_uri(), metrics_port=metrics_port))
            collector_url = f"http://127.0.0.1:{metrics_port}/metrics"
            return _measure(spec, cluster, collector_url, say)
        finally:
            if cluster is not None:
                for proc in [*cluster.collectors, *(p for p in cluster.ingestors if p)]:
                    stop_process(proc)
                cluster.close()
            moto.stop()


def stop_process(proc: Proc) -> None:
    with contextlib.suppress(Exception):
        proc.terminate(timeout=30)


def _measure(spec: ProcessSpec, cluster: Cluster, collector_url: str,
             say: Callable[[str], None]) -> ProcessRun:
    started = time.monotonic()
    collector = cluster.start_collector()
    if collector.wait_ready(300) is None:
        raise RuntimeError(f"the collector did not become active; see {cluster.root}")
    say(f"  collector active after {time.monotonic() - started:.0f} s; starting "
        f"{spec.ingestors} ingestors")
    for index in range(spec.ingestors):
        # ports picked now, not when the cluster was made: Spark's driver, started since,
        # binds ports of its own and may have taken one picked earlier
        cluster.ports[index] = (free_port(), free_port(), free_port())
        try:
            cluster.start_ingestor(index, timeout=120, attempts=3)
        except RuntimeError as exc:
            log = (cluster.root / "processes.log").read_text(errors="replace")
            raise RuntimeError(f"{exc}; its log ends:\n{log[-3000:]}") from exc
    warm_collector(cluster, collector_url)
    load = start_load(cluster, spec)
    run = ProcessRun(spec, spec.duration_s)
    time.sleep(spec.warmup_s)
    before, c_before = _ingestor_metrics(cluster), scrape(collector_url)
    r_before, t0 = _requests(cluster), time.monotonic()
    time.sleep(spec.duration_s)
    after, c_after = _ingestor_metrics(cluster), scrape(collector_url)
    run.store_requests = _requests(cluster) - r_before
    run.window_s = time.monotonic() - t0
    run.load_avg = os.getloadavg()[0]
    for name, attr in (("icefloe_ingest_manifest_batches_appended", "entries"),
                       ("icefloe_ingest_events_accepted", "events"),
                       ("icefloe_ingest_batch_bytes_sum", "batch_bytes"),
                       ("icefloe_ingest_manifest_cas_writes", "cas_writes"),
                       ("icefloe_ingest_manifest_cas_conflicts", "conflicts")):
        setattr(run, attr, sum_metric(after, name) - sum_metric(before, name))
    run.collector_rows = total(c_after, "icefloe_collector_rows_committed") - \
        total(c_before, "icefloe_collector_rows_committed")
    run.queue_at_end = total(c_after, "icefloe_collector_queue_entries")
    run.shards_used = sorted(int(total(m, "icefloe_ingest_manifest_shard")) for m in after)
    read_load(load, run)
    say("  load stopped; waiting for the collector to drain")
    run.drain_s = wait_drained(collector_url, cluster, spec.drain_timeout_s)
    run.accepted_total = sum_metric(_ingestor_metrics(cluster), "icefloe_ingest_events_accepted")
    run.committed_total = total(scrape(collector_url), "icefloe_collector_rows_committed")
    return run
