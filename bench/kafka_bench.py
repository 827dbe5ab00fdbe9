"""Kafka produce (#40): records/s per ingestor process from librdkafka vs HTTP batches, and
produce latency at light load.

Runs, side by side in one run, on this machine, each round on a fresh local store with its
own ``icefloe ingestor`` process (``--kafka-port``, durable acks) and the ingest benchmark's
stand-in collector (``_drain.py``, which dequeues the manifest every second):

* the baseline, the ingest benchmark's row ``HTTP 100-event batch, durable, 128 conns``:
  ``wrk`` POSTing the ingest benchmark's 100-event body over 128 connections
  (``ingest_bench.wrk``; install Debian's ``wrk``);
* records/s from one librdkafka producer (confluent-kafka, ``_kafka_load.py``) as its
  users configure it for throughput: ``enable.idempotence`` on (acks=all, 5 requests in
  flight), ``batch.size`` 1 MiB, ``batch.num.messages`` and the queue limits at their
  defaults, ``linger.ms`` 5 (librdkafka's default) and 20, compression none and zstd; the
  same records (the ingest benchmark's ~190-byte event with varying numbers), keyed by
  user id over the stream's ``KAFKA_PARTITIONS`` partitions; a record counts when its
  delivery callback reports success;
* produce latency at light load: ``LIGHT_RATE`` records/s, one record per ``produce()``
  (``linger.ms`` 5), timed from ``produce()`` to its delivery callback; the baseline is the
  ingest benchmark's light-load HTTP latency (single-event POSTs, one client) on the same
  ingestor.

The throughput rounds of a full run are ``TRIALS`` passes over every kind, the first kind
alternating, each counted after ``WARMUP_S``; the best of each kind counts (a shared 2-core
VM varies ±30 %). The issue's targets: Kafka (linger.ms 5, no compression) ≥ 1.0 of the
HTTP batches; p99 produce latency at light load ≤ 50 ms.

Usage: python bench/kafka_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Result, bench_parser, print_table, write_json
from ingest_bench import CONFIG, ICEFLOE, batch_body, light_latency, start_drain, wrk

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
TRIALS = 3
"""Passes over every kind in a full run; the best of each kind counts."""
WARMUP_S = 1.0
"""Load before counting (connections, InitProducerId, Metadata; wrk's connections)."""
HTTP_CONNECTIONS = 128
KAFKA_PARTITIONS = 4
LIGHT_RATE = 200
"""Records/s of the latency round, one per ``produce()``."""
LINGERS = (5, 20)
CODECS = ("none", "zstd")
TOPIC = "pageviews"


def kafka_name(linger: int, codec: str) -> str:
    name = (f"Kafka produce, librdkafka linger.ms={linger}, batch.size=1MiB, idempotent, "
            f"compression {codec}")
    return f"{name} (target >= 1.0)" if (linger, codec) == (5, "none") else name


HTTP_NAME = f"HTTP 100-event batch POST, durable, {HTTP_CONNECTIONS} conns (wrk)"
LATENCY = f"Kafka produce latency, {LIGHT_RATE} records/s, one per produce(), linger.ms=5"
HTTP_LATENCY = "HTTP single-event POST ack latency, light load (1 client)"


@contextlib.contextmanager
def ingestor(home: Path) -> Iterator[tuple[int, int]]:
    """A fresh ``icefloe ingestor`` (HTTP and Kafka on free ports) on a fresh store under
    ``home``, with the stand-in collector draining it; yields (http port, kafka port).
    A failure to start says what the ingestor printed."""
    home.mkdir()
    config = (CONFIG.replace("grpc_port = 0\n", "grpc_port = 0\nkafka_port = 0\n")
              .replace('table = "web.pageviews"\n',
                       f'table = "web.pageviews"\nkafka_partitions = {KAFKA_PARTITIONS}\n'))
    (home / "icefloe.toml").write_text(config)
    log = home / "ingestor.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([ICEFLOE, "ingestor", "--config", str(home / "icefloe.toml"),
                                 "--log-level", "warning"], cwd=home, stdout=subprocess.PIPE,
                                stderr=sink, text=True)
    drain = None
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the ingestor did not start: {log.read_text()[-1500:]}")
        ready = json.loads(line)
        drain = start_drain(home)
        yield ready["http_port"], ready["kafka_port"]
    finally:
        for child in (proc, drain):
            if child is not None:
                child.send_signal(signal.SIGTERM)
                child.wait(60)


def kafka_load(mode: str, port: int, seconds: float, linger: int, codec: str,
               *extra: str) -> dict[str, float]:
    """One ``_kafka_load.py`` run; refuses a run in which any record failed."""
    done = subprocess.run([PYTHON, str(HERE / "_kafka_load.py"), mode, f"127.0.0.1:{port}",
                           TOPIC, str(seconds), str(linger), codec, str(WARMUP_S), *extra],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the Kafka load failed: {done.stderr[-1500:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    if figures["errors"]:
        raise RuntimeError(f"{figures['errors']} Kafka records failed, the first: "
                           f"{figures['first_error']}")
    return figures


def throughput_round(home: Path, kind: tuple[int, str] | None, seconds: float) -> float:
    """Events/s of one round: ``kind`` None is the HTTP baseline, else (linger.ms, codec)."""
    with ingestor(home) as (http_port, kafka_port):
        if kind is None:
            url = f"http://127.0.0.1:{http_port}/v1/streams/{TOPIC}/events"
            body = batch_body(100)
            wrk(url, body, WARMUP_S, HTTP_CONNECTIONS, home)
            return wrk(url, body, seconds, HTTP_CONNECTIONS, home)[0] * 100
        figures = kafka_load("throughput", kafka_port, seconds, *kind)
        return figures["records"] / figures["seconds"]


def throughput(root: Path, seconds: float, trials: int) -> dict[tuple[int, str] | None, float]:
    """The best events/s of each kind over ``trials`` passes, the first kind alternating
    (a later round runs on a warmer, or busier, machine)."""
    kinds: list[tuple[int, str] | None] = [None, *((ms, c) for c in CODECS for ms in LINGERS)]
    best: dict[tuple[int, str] | None, float] = {}
    for trial in range(trials):
        for n, kind in enumerate(kinds if trial % 2 == 0 else kinds[::-1]):
            rate = throughput_round(root / f"round-{trial}-{n}", kind, seconds)
            best[kind] = max(best.get(kind, 0.0), rate)
            label = "HTTP batches" if kind is None else f"Kafka linger.ms={kind[0]} {kind[1]}"
            print(f"  {label}: {rate:,.0f} events/s", flush=True)
    return best


def latency(root: Path, seconds: float) -> tuple[dict[str, float], tuple[float, float]]:
    """Kafka produce latency at ``LIGHT_RATE`` and, on the same ingestor after it, the HTTP
    light-load latency (p50, p99)."""
    with ingestor(root / "latency") as (http_port, kafka_port):
        figures = kafka_load("latency", kafka_port, seconds, 5, "none", str(LIGHT_RATE))
        print(f"  Kafka latency: p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} "
              f"ms over {figures['records']} records", flush=True)
        http = light_latency(f"http://127.0.0.1:{http_port}/v1/streams/{TOPIC}/events",
                             seconds / 2)
    return figures, http


def main() -> None:
    parser = bench_parser(__doc__, "one pass of 2 s rounds (under a minute)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("kafka_bench needs wrk for its HTTP baseline (Debian: apt-get install wrk)")
    seconds, trials = (2.0, 1) if args.quick else (8.0, TRIALS)
    with tempfile.TemporaryDirectory(prefix="icefloe-kafka-bench-") as tmp:
        root = Path(tmp)
        best = throughput(root, seconds, trials)
        kafka, http = latency(root, 4.0 if args.quick else 20.0)
    results = [Result(HTTP_NAME, best[None], "events/s")]
    results += [Result(kafka_name(linger, codec), best[(linger, codec)], "records/s",
                       best[None]) for codec in CODECS for linger in LINGERS]
    results += [Result(f"{LATENCY}: p50", kafka["p50_ms"], "ms", http[0]),
                Result(f"{LATENCY}: p99 (target <= 50 ms)", kafka["p99_ms"], "ms", http[1]),
                Result(f"{HTTP_LATENCY}: p50", http[0], "ms"),
                Result(f"{HTTP_LATENCY}: p99", http[1], "ms")]
    print_table("Kafka produce vs HTTP batches (one ingestor process, durable acks on a local "
                "store; baseline = HTTP, same run)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
