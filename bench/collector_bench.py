"""Collector benchmark: manifest → Spark pipeline → Iceberg, against a no-Spark baseline.

Measures, in one run on the local store and a SQLite Iceberg catalog:

* committed events/s through the collector with the Spark engine (Python data source,
  local[2]) against two baselines in the same run: the issue's — plain pyarrow decode and
  one pyiceberg ``Table.append``, no Spark, no collector — and the collector itself with
  its no-Spark engine (same decode and commit path as Spark's run, minus Spark), which
  isolates what Spark costs; best of ``TRIALS`` runs each, on copies of one pre-filled
  store;
* commit latency (the collector's written files + ``add_files``) and, for comparison,
  the plain ``Table.append`` latency;
* freshness under a steady ingest load (event received → committed, i.e. visible to a
  reader), p50/p99, with the default 1 s commit interval, in three table modes side by
  side: append, an evolving schema (``unknown_fields = "evolve"``, a new field every
  10,000 events) and upserts (``primary_key``, every event replaces an existing key);
  the publisher runs in a process of its own, as ingestors do; ``--freshness-only`` runs
  just these rows;
* data files per table before and after one maintenance pass;
* the cluster output path on a Spark standalone cluster of two one-core workers (master
  and workers started here with pyspark's ``spark-class``) against the same path on
  ``local[2]``, each in its own driver process (``_cluster_trial.py``); ``--no-cluster``
  skips it.

Usage: python bench/collector_bench.py [--quick] [--no-cluster] [--freshness-only] [--json PATH]
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import (
    BatchFile,
    Event,
    Result,
    bench_parser,
    drain,
    local_config,
    manifest_entries,
    open_collector,
    print_table,
    publish_every,
    publish_files,
    write_json,
)

from collector.runner import Runner
from icefloe.config import Column, Config, StreamConfig
from icefloe.manifest.publish import build_batch
from ingestor.validate import CompiledStream
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.load.run import LocalEngine, SparkEngine, run_local
from pipeline.load.spec import run_spec

TRIALS = 3
"""Runs per engine; the best counts (single runs on a shared 2-core VM vary by ±30 %)."""

STREAM = StreamConfig(name="events", table="bench.events", columns=(
    Column("user_id", "string"), Column("url", "string"), Column("duration_ms", "long"),
    Column("ts", "timestamp"), Column("country", "string"), Column("device", "string"),
    Column("app_version", "string")))


def payload(i: int) -> bytes:
    return msgspec.json.encode({
        "user_id": f"user-{i % 50_000:06d}", "url": f"https://shop.example.com/p/{i % 9973}",
        "duration_ms": i % 60_000, "ts": "2026-11-23T10:00:00.123Z", "country": "DE",
        "device": "mobile" if i % 3 else "desktop", "app_version": f"5.{i % 40}.{i % 7}"})


EVOLVE_EVERY = 10_000
"""Evolve mode: a new top-level field per this many events (issue #27's measure)."""
MODES: dict[str, StreamConfig] = {
    "append": STREAM,
    "evolve": msgspec.structs.replace(STREAM, unknown_fields="evolve"),
    "upsert": msgspec.structs.replace(STREAM, primary_key=("user_id",)),
}
"""Freshness modes, one stream each. Upsert keys cycle over 50,000 users, so after the
first 5 s every event replaces a row already in the table (copy-on-write each commit)."""


def evolving_payload(i: int) -> bytes:
    """:func:`payload` plus fields ``f0..f<i // EVOLVE_EVERY>``: a new column per
    :data:`EVOLVE_EVERY` events."""
    body = msgspec.json.decode(payload(i))
    body.update({f"f{k}": i + k for k in range(i // EVOLVE_EVERY + 1)})
    return msgspec.json.encode(body)


def make_config(root: Path, stream: StreamConfig = STREAM, **collector: Any) -> Config:
    return local_config(root, (stream,), **{"max_run_entries": 100_000,
                                            "max_run_bytes": 1 << 34, "dedup_window_s": 0,
                                            **collector})


def batch_files(count: int, per_batch: int, start: int = 0) -> Iterator[BatchFile]:
    now_ms = int(time.time() * 1000)
    for b in range(count):
        base = start + b * per_batch
        yield build_batch(
            ("events", f"e{base + i}", now_ms, payload(base + i)) for i in range(per_batch))


def prefill(config, batches: int, per_batch: int, start: int = 0) -> int:
    asyncio.run(publish_files(config.store.url, batch_files(batches, per_batch, start)))
    return batches * per_batch


def plain_append(config, events: int) -> tuple[float, float]:
    """The issue's baseline: plain pyarrow decode (no Spark) + pyiceberg ``Table.append``,
    no collector around it; (events/s, append seconds)."""
    catalog = open_catalog(config.catalog)
    table = ensure_stream_table(catalog, STREAM)
    spec = run_spec(config, asyncio.run(manifest_entries(config.store.url)))
    started = time.perf_counter()
    rows = run_local(spec).tables[STREAM.name]
    appended = time.perf_counter()
    table.append(rows)
    seconds = time.perf_counter() - started
    assert rows.num_rows == events, f"decoded {rows.num_rows} of {events}"
    return events / seconds, time.perf_counter() - appended


async def throughput(config, engine, events: int) -> tuple[float, float]:
    """Drain a pre-filled manifest in one run; return (events/s, commit seconds)."""
    rate, collector = await drain(config, engine, events)
    return rate, collector.metrics.commit_seconds.labels(STREAM.table)._sum.get()


async def freshness(config, engine, seconds: float, rate: int,
                    mode: str = "append") -> tuple[list[float], int]:
    """Publish ``rate`` events/s in 10 batches/s while the collector runs; per-event
    (committed time - publish time) for every event.

    The publisher is a separate process (:func:`publish_for`), as ingestors are: in the
    collector's process it would share the GIL with the collector's Python work and
    publish late exactly when that work grows. Payloads go through the stream's ingest
    validation first, as an ingestor would send them (evolve mode's new fields)."""
    collector, store = await open_collector(config, engine)
    committed: dict[int, float] = {}
    stop = asyncio.Event()
    runner = Runner(collector, stop)
    # the runner's one run, overlapped or not (``collector.overlap``, on by default)
    original = runner._run_one

    async def timed_run() -> Any:  # stamp each run's entries when their commit returns
        result = await original()
        now = time.time()
        for seq in range(result.first_sequence, result.last_sequence + 1):
            committed.setdefault(seq, now)
        return result

    runner._run_one = timed_run  # type: ignore[method-assign]
    task = asyncio.create_task(runner.run())
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        published = await asyncio.to_thread(
            pool.apply, publish_for, (config.store.url, config.streams[0], mode, seconds, rate))
    deadline = time.monotonic() + 30
    last = max(published, default=0)
    while last not in committed and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stop.set()
    await task
    await store.close()
    samples = [committed[seq] - at for seq, (at, count) in published.items()
               if seq in committed for _ in range(count)]
    if not samples:  # a figure of nothing must not print as a freshness
        raise RuntimeError(f"freshness ({mode}): none of the {len(published)} published "
                           "batches was seen committed; the bench's hook missed the runs")
    return samples, sum(count for _, count in published.values())


def publish_for(store_url: str, stream: StreamConfig, mode: str, seconds: float,
                rate: int) -> dict[int, tuple[float, int]]:
    """The publisher process of :func:`freshness`: ``rate`` events/s in 10 batches/s for
    ``seconds``; each manifest sequence's (publish time, events)."""
    payload_of = evolving_payload if mode == "evolve" else payload
    compiled = CompiledStream(stream)
    per_batch = rate // 10

    def batch_of(i: int) -> list[Event]:
        first, now_ms = i * per_batch, int(time.time() * 1000)
        payloads = compiled.from_events([payload_of(first + k)
                                         for k in range(per_batch)]).payloads
        return [("events", f"f{first + k}", now_ms, p) for k, p in enumerate(payloads)]

    return asyncio.run(publish_every(store_url, seconds, batch_of))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def data_files(config) -> int:
    table = open_catalog(config.catalog).load_table(STREAM.table)
    return len(list(table.scan().plan_files()))


def main() -> None:
    parser = bench_parser(__doc__, "short run: 200k events per trial, 12 s freshness runs "
                          "(about 4 minutes with Spark's start and the cluster rows)")
    parser.add_argument("--no-cluster", action="store_true",
                        help="skip the standalone-cluster rows (~1-2 min more)")
    parser.add_argument("--freshness-only", action="store_true",
                        help="only the freshness rows (append, evolve, upsert)")
    args = parser.parse_args()
    batches, per_batch = (20, 10_000) if args.quick else (100, 10_000)
    fresh_s = 12 if args.quick else 60
    from pipeline.spark import get_spark

    print("starting Spark (local[2]) ...", flush=True)
    spark = get_spark("local[2]", "icefloe-bench", {"spark.driver.memory": "4g"})
    results: list[Result] = []
    if args.freshness_only:
        with tempfile.TemporaryDirectory() as tmp:
            fresh_rows(Path(tmp), spark, fresh_s, results, warm_up=True)
        spark.stop()
        print_table("collector: freshness at 10k events/s, append / evolve / upsert", results)
        write_json(args.json, results)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # The JVM compiles its hot paths during the first large queries: warm it up with
        # two runs of the same shape, so the figures are the steady state of a collector.
        for round_ in range(2):
            for rows in (False, True):
                config = make_config(root / f"warm-up-{round_}-{rows}")
                events = prefill(config, batches // 2, per_batch)
                asyncio.run(throughput(config, SparkEngine(spark, 4, rows=rows), events))
        # One pre-filled store, copied for each trial: every trial drains the same files.
        template = make_config(root / "template")
        events = prefill(template, batches, per_batch)
        print(f"{events:,} events pre-filled in {batches} batch files; best of {TRIALS} "
              "runs per engine, alternating", flush=True)
        rates: dict[str, float] = {}
        commits: dict[str, float] = {}
        engines = (("plain", None), ("no-spark", LocalEngine()),
                   ("spark", SparkEngine(spark, 4)),
                   ("spark-rows", SparkEngine(spark, 4, rows=True)))
        for trial in range(TRIALS):
            for name, engine in engines:
                trial_root = root / f"{name}-{trial}"
                shutil.copytree(root / "template" / "store", trial_root / "store")
                trial_config = make_config(trial_root)
                rate, commit = plain_append(trial_config, events) if engine is None else \
                    asyncio.run(throughput(trial_config, engine, events))
                if rate > rates.get(name, 0.0):
                    rates[name], commits[name] = rate, commit
                print(f"  {name} run {trial + 1}: {rate:,.0f} events/s", flush=True)
                shutil.rmtree(trial_root)
        results.append(Result("baseline: pyarrow decode + pyiceberg append, no Spark",
                              rates["plain"], "events/s"))
        results.append(Result("committed events/s through Spark (collector)", rates["spark"],
                              "events/s", rates["plain"]))
        results.append(Result("  same, Spark row path (runs with sql columns)",
                              rates["spark-rows"], "events/s", rates["plain"]))
        results.append(Result("committed events/s, collector without Spark", rates["no-spark"],
                              "events/s"))
        results.append(Result("Spark vs the collector without Spark", rates["spark"],
                              "events/s", rates["no-spark"]))
        results.append(Result("commit latency, collector (written files + add_files)",
                              commits["spark"], "s"))
        results.append(Result("append latency, plain pyiceberg Table.append", commits["plain"],
                              "s"))
        config = fresh_rows(root, spark, fresh_s, results)
        before = data_files(config)
        from pipeline.iceberg.maintenance import MaintenanceSettings, run_maintenance

        table = open_catalog(config.catalog).load_table(STREAM.table)
        run_maintenance(table, epoch=10**6, settings=MaintenanceSettings(min_input_files=2))
        results.append(Result("data files before maintenance", before, "files"))
        results.append(Result("data files after maintenance", data_files(config), "files"))
    spark.stop()
    if not args.no_cluster:
        results += cluster_rows(batches // 2, per_batch)
    print_table("collector: manifest → Spark → Iceberg (local store, SQLite catalog)", results)
    write_json(args.json, results)


def fresh_rows(root: Path, spark, seconds: float, results: list[Result],
               warm_up: bool = False):
    """Freshness at 10k events/s in each of :data:`MODES`, one after the other in this run
    (same Spark session, same machine load), after a short throwaway run when ``warm_up``
    (a JVM that ran nothing yet); returns the append run's config (for the maintenance
    rows)."""
    configs = {}
    if warm_up:  # a fresh JVM compiles its hot paths in the first runs: not a mode's cost
        print("freshness warm-up: 5 s, append ...", flush=True)
        asyncio.run(freshness(make_config(root / "fresh-warm-up", commit_interval_s=1.0,
                                          poll_interval_s=0.05, max_run_entries=2000),
                              SparkEngine(spark, 2), 5, 10_000))
    for mode, stream in MODES.items():
        config = make_config(root / f"fresh-{mode}", stream, commit_interval_s=1.0,
                             poll_interval_s=0.05, max_run_entries=2000)
        configs[mode] = config
        print(f"freshness, {mode}: {seconds} s at 10,000 events/s ...", flush=True)
        samples, sent = asyncio.run(freshness(config, SparkEngine(spark, 2), seconds, 10_000,
                                              mode))
        label = "" if mode == "append" else f", {mode}"
        results.append(Result(f"freshness p50 at 10k events/s{label}",
                              percentile(samples, 0.5), "s"))
        results.append(Result(f"freshness p99 at 10k events/s{label}",
                              percentile(samples, 0.99), "s"))
        results.append(Result(f"events committed in freshness run{label}", len(samples),
                              "events", sent))
        results.append(Result(f"  offered rate{label} (publisher in its own process)",
                              sent / seconds, "events/s", 10_000))
    rows = open_catalog(configs["upsert"].catalog).load_table(STREAM.table).scan(
        selected_fields=("user_id",)).to_arrow()
    results.append(Result("upsert table rows after its run (one per key)", rows.num_rows,
                          "rows"))
    return configs["append"]


def cluster_rows(batches: int, per_batch: int) -> list[Result]:
    """The cluster output path: a standalone cluster of two one-core workers vs local[2]."""
    from testing.spark_standalone import Standalone, spark_env

    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        template = make_config(root / "template")
        events = prefill(template, batches, per_batch)
        cluster = Standalone(root / "spark", workers=2)
        print(f"standalone cluster (2 workers x 1 core) and local[2], cluster output, "
              f"{events:,} events per run ...", flush=True)
        try:
            cluster.start()
            for name, master in (("local[2]", "local[2]"), ("standalone", cluster.url)):
                done = subprocess.run(
                    [sys.executable, str(Path(__file__).with_name("_cluster_trial.py")),
                     "--master", master, "--template", str(root / "template"),
                     "--work", str(root / name), "--events", str(events)],
                    env=spark_env(), stdout=subprocess.PIPE, text=True, timeout=900,
                    check=True)
                rates[name] = json.loads(done.stdout.strip().splitlines()[-1])["events_per_s"]
        finally:
            cluster.stop()
    return [Result("cluster output, local[2] (own driver process)", rates["local[2]"],
                   "events/s"),
            Result("cluster output, standalone cluster, 2 workers x 1 core",
                   rates["standalone"], "events/s", rates["local[2]"])]


if __name__ == "__main__":
    main()
