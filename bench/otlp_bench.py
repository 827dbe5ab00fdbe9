"""OTLP (#41): log records/s through OTLP/HTTP protobuf, spans/s through Spark, each against
the same data as JSON events, side by side in one run on this machine.

* **Log records/s into an ingestor.** Each round runs a fresh ``icefloe ingestor`` process
  (``[otlp] enabled``, durable acks on a local store) with the ingest benchmark's stand-in
  collector (``_drain.py``) and one load process (``_otlp_load.py``, ``CONCURRENCY``
  requests in flight over keep-alive connections). The OTLP row POSTs
  ``ExportLogsServiceRequest`` bodies of ``PER_REQUEST`` log records to ``/v1/logs`` as
  ``application/x-protobuf`` — prebuilt with ``opentelemetry-proto``'s classes, so the
  client only sends bytes (a record: severity, a body, six attributes of four types, trace
  and span ids; four services). The baseline POSTs the *same records* as the JSON events
  they become (``icefloe.otlp.rows.export_rows``, what the receiver admits) in arrays of
  ``PER_REQUEST`` to ``/v1/streams/otlp.logs/events`` on the same kind of ingestor: the
  ratio is what decoding OTLP costs over validating its rows. Every request's bytes are
  unique (``_otlp_load.PLACEHOLDER``). Best of ``TRIALS`` rounds per kind, the first kind
  alternating, each counted after ``WARMUP_S``; the ingestor's CPU-µs per record beside.
  Target ≥ 1.0.
* **Spans/s through the collector (Spark).** Batch files of ``otlp.spans`` rows (what the
  receiver writes: ``export_rows`` of span export requests — events, links, attribute
  maps — validated by the generated stream, ids derived from the request bytes) against
  the same spans as JSON events of a stream a user would declare by hand: the same
  top-level fields as flat columns, events/links/attribute maps as JSON text, partitioned
  by day of ``start_time`` only (the OTLP table adds a bucket of the service name).
  Committed events/s through the collector with the Spark engine (local[2], packed path)
  and, to tell Spark's share, the no-Spark engine; best of ``TRIALS`` drains of copies of
  one pre-filled store per stream, after a warm-up drain of each. Target ≥ 0.75.

Usage: python bench/otlp_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import (
    BatchFile,
    Result,
    bench_parser,
    drain,
    local_config,
    print_table,
    publish_files,
    write_json,
)
from _otlp_load import PLACEHOLDER
from ingest_bench import CONFIG, ICEFLOE, start_drain
from kafka_bench import cpu_seconds

from icefloe.config import Column, StreamConfig
from icefloe.manifest.publish import build_batch
from icefloe.otlp.config import OtlpSection, otlp_streams
from icefloe.otlp.rows import export_rows
from icefloe.otlp.wire import wire_rows
from ingestor.validate import CompiledStream
from pipeline.load.run import LocalEngine, SparkEngine

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
TRIALS = 3
"""Rounds (and drains) per kind in a full run; the best counts (a shared 2-core VM varies
±30 %)."""
WARMUP_S = 1.0
PER_REQUEST = 512
"""Log records per export request and events per JSON array: the JS and Python SDKs' batch
processors export up to 512 records per request by default."""
CONCURRENCY = 8
BODIES = 16
"""Distinct prebuilt bodies per kind (different records; each request also gets a unique
number, see ``_otlp_load.py``)."""
SERVICES = ("checkout", "payments", "search", "frontend")
OTLP_NAME = (f"OTLP/HTTP protobuf export, {PER_REQUEST} log records, {CONCURRENCY} in flight "
             "(target >= 1.0)")
JSON_NAME = (f"JSON events POST, the same records, {PER_REQUEST}-event arrays, {CONCURRENCY} "
             "in flight")
SPARK_NAME = "committed spans/s through Spark, OTLP spans table (target >= 0.75)"
SPARK_BASE = "committed events/s through Spark, the same spans as flat JSON events"
T0_NS = 1_796_000_000_000_000_000
"""2026-11-30: every record's time (one day's partitions)."""


def kv(key: str, value: Any) -> KeyValue:
    """An attribute of OTLP's type for ``value`` (str, bool, int or float)."""
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


HTTP_GET = (kv("http.request.method", "GET"), kv("http.route", "/api/v1/items/{id}"))


def resource_attrs(service: str) -> list[KeyValue]:
    return [kv("service.name", service), kv("service.version", "1.4.2"),
            kv("host.name", "web-7f9c"), kv("bench.request", PLACEHOLDER.decode())]


def ids(n: int) -> tuple[bytes, bytes]:
    """A trace id and a span id, distinct per ``n``."""
    digest = hashlib.blake2b(n.to_bytes(8, "big"), digest_size=24).digest()
    return digest[:16], digest[16:]


def log_request(seed: int, count: int) -> ExportLogsServiceRequest:
    """``count`` log records over the services (one resource each), as an SDK batches them."""
    request = ExportLogsServiceRequest()
    per = count // len(SERVICES)
    for s, service in enumerate(SERVICES):
        scope_logs = request.resource_logs.add(
            resource={"attributes": resource_attrs(service)}).scope_logs.add(
            scope={"name": "io.opentelemetry.bench", "version": "1.0.0"})
        for i in range(per if s else count - per * (len(SERVICES) - 1)):
            n = seed * count + s * per + i
            trace_id, span_id = ids(n)
            error = n % 10 == 0
            scope_logs.log_records.add(
                time_unix_nano=T0_NS + n * 1_000_000,
                observed_time_unix_nano=T0_NS + n * 1_000_001,
                severity_number=17 if error else 9, severity_text="ERROR" if error else "INFO",
                body=AnyValue(string_value=f"GET /api/v1/items/{n % 997} took {n % 250} ms"),
                attributes=[*HTTP_GET, kv("http.response.status_code", 500 if error else 200),
                            kv("duration_ms", (n % 250) + 0.5), kv("retry", n % 7 == 0),
                            kv("user.id", f"user-{n % 50_000:06d}")],
                trace_id=trace_id, span_id=span_id, flags=1)
    return request


def span_request(seed: int, count: int) -> ExportTraceServiceRequest:
    """``count`` spans (a root per ten, children with an event and a link) over the services."""
    request = ExportTraceServiceRequest()
    per = count // len(SERVICES)
    for s, service in enumerate(SERVICES):
        scope_spans = request.resource_spans.add(
            resource={"attributes": resource_attrs(service)}).scope_spans.add(
            scope={"name": "io.opentelemetry.bench", "version": "1.0.0"})
        for i in range(per if s else count - per * (len(SERVICES) - 1)):
            n = seed * count + s * per + i
            trace_id, span_id = ids(n - n % 10)
            _, own = ids(n)
            start = T0_NS + n * 1_000_000
            span = scope_spans.spans.add(
                trace_id=trace_id, span_id=own, name=f"GET /api/v1/items/{{id}} #{n % 5}",
                kind=2 if n % 10 == 0 else 3, start_time_unix_nano=start,
                end_time_unix_nano=start + 1000 * (n % 5000),
                parent_span_id=b"" if n % 10 == 0 else span_id,
                attributes=[*HTTP_GET, kv("http.response.status_code", 200 if n % 13 else 503),
                            kv("server.address", "items.internal"), kv("retry", n % 7 == 0),
                            kv("db.rows", n % 40)],
                status={"code": 2 if n % 13 == 0 else 0,
                        "message": "upstream unavailable" if n % 13 == 0 else ""}, flags=1)
            if n % 10:
                span.events.add(time_unix_nano=start + 500, name="cache.miss",
                                attributes=[kv("cache.key", f"item:{n % 997}")])
                link_trace, link_span = ids(n + 7)
                span.links.add(trace_id=link_trace, span_id=link_span,
                               attributes=[kv("link.kind", "follows_from")])
    return request


def rows_array(signal_name: str, request: Any, kind: str) -> bytes:
    """The JSON array of ``request``'s rows of ``kind``: what the receiver admits."""
    out = export_rows(signal_name, request)
    if out.rejected:
        raise RuntimeError(f"export_rows rejected {out.rejected}: {out.message}")
    return b"[" + b",".join(out.rows[kind]) + b"]"


# -- log records/s into an ingestor ------------------------------------------------------------


def write_bodies(path: Path, bodies: list[bytes]) -> Path:
    with path.open("wb") as out:
        for body in bodies:
            out.write(struct.pack(">I", len(body)) + body)
    return path


def log_bodies(root: Path) -> dict[str, Path]:
    """The two kinds' body files: the same records as OTLP protobuf and as JSON rows."""
    requests = [log_request(seed, PER_REQUEST) for seed in range(BODIES)]
    return {"otlp": write_bodies(root / "otlp.bin",
                                 [r.SerializeToString() for r in requests]),
            "json": write_bodies(root / "json.bin",
                                 [rows_array("logs", r, "logs") for r in requests])}


@contextlib.contextmanager
def ingestor(home: Path) -> Iterator[tuple[int, int]]:
    """A fresh ``icefloe ingestor`` with ``[otlp]`` on (OTLP/HTTP on its HTTP port) and the
    stand-in collector, on a fresh store under ``home``: (HTTP port, process id)."""
    home.mkdir()
    (home / "icefloe.toml").write_text(CONFIG + "\n[otlp]\nenabled = true\n")
    log = home / "ingestor.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([ICEFLOE, "ingestor", "--config", str(home / "icefloe.toml"),
                                 "--log-level", "warning"], cwd=home, stdout=subprocess.PIPE,
                                stderr=sink, text=True)
    drainer = None
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the ingestor did not start: {log.read_text()[-1500:]}")
        drainer = start_drain(home)
        yield json.loads(line)["http_port"], proc.pid
    finally:
        for child in (proc, drainer):
            if child is not None:
                child.send_signal(signal.SIGTERM)
                child.wait(60)


def log_round(home: Path, kind: str, bodies: Path, seconds: float) -> tuple[float, float]:
    """Records/s of one round and the ingestor's CPU-µs per record."""
    with ingestor(home) as (port, pid):
        url, content_type = ((f"http://127.0.0.1:{port}/v1/logs", "application/x-protobuf")
                             if kind == "otlp" else
                             (f"http://127.0.0.1:{port}/v1/streams/otlp.logs/events",
                              "application/json"))
        cpu: list[float] = []
        lines: list[str] = []
        with subprocess.Popen([PYTHON, str(HERE / "_otlp_load.py"), url, content_type,
                               str(bodies), str(PER_REQUEST), str(seconds), str(CONCURRENCY),
                               str(WARMUP_S)], stdout=subprocess.PIPE, text=True) as load:
            for line in load.stdout:  # type: ignore[union-attr]
                if line.strip() in ("counting", "counted"):
                    cpu.append(cpu_seconds(pid))
                else:
                    lines.append(line)
    if load.returncode or not lines or len(cpu) != 2:
        raise RuntimeError(f"the {kind} load failed (exit {load.returncode})")
    figures = json.loads(lines[-1])
    if figures["errors"] or not figures["records"]:
        raise RuntimeError(f"{kind}: {figures['errors']} requests failed, the first: "
                           f"{figures['first_error']}")
    return (figures["records"] / figures["seconds"],
            (cpu[1] - cpu[0]) * 1e6 / figures["records"])


def log_rates(root: Path, seconds: float, trials: int
              ) -> tuple[dict[str, float], dict[str, float]]:
    """Best records/s and least CPU-µs per record of each kind over ``trials`` passes."""
    bodies = log_bodies(root)
    best: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for trial in range(trials):
        kinds = ("otlp", "json") if trial % 2 == 0 else ("json", "otlp")
        for kind in kinds:
            rate, cpu_us = log_round(root / f"logs-{kind}-{trial}", kind, bodies[kind], seconds)
            best[kind] = max(best.get(kind, 0.0), rate)
            cpu[kind] = min(cpu.get(kind, float("inf")), cpu_us)
            print(f"  logs {kind}: {rate:,.0f} records/s, ingestor {cpu_us:.1f} CPU-us per "
                  "record", flush=True)
    return best, cpu


def log_steps(seconds: float) -> dict[str, float]:
    """CPU-µs per record of the OTLP receiver's steps, in this process, best of alternating
    passes: parsing the protobuf request, ``export_rows``, and the stream's validation of the
    rows (the JSON baseline's only step): where the two rows' difference goes;
    ``export_rows(canonical=True)``, whose payloads need no validation; and ``wire``, the
    receiver's bytes-to-rows step as it runs (the compiled decoder, icefloe/otlp/_wire.pyx,
    where built; else parse + canonical rows)."""
    request = log_request(0, PER_REQUEST)
    body, array = request.SerializeToString(), rows_array("logs", request, "logs")
    compiled = CompiledStream(otlp_streams(OtlpSection(enabled=True, kinds=("logs",)),
                                           "bench")[0])
    steps = {"parse": lambda: ExportLogsServiceRequest.FromString(body),
             "rows": lambda: export_rows("logs", request),
             "validate": lambda: compiled.from_json(array),
             "canonical": lambda: export_rows("logs", request, canonical=True),
             "wire": lambda: wire_rows("logs", body) or export_rows(
                 "logs", ExportLogsServiceRequest.FromString(body), canonical=True)}
    best: dict[str, float] = {}
    for _ in range(3):
        for name, step in steps.items():
            done, started = 0, time.process_time()
            while (took := time.process_time() - started) < seconds / 12:
                step()
                done += PER_REQUEST
            best[name] = min(best.get(name, float("inf")), took * 1e6 / max(1, done))
    return best


# -- spans/s through the collector -------------------------------------------------------------

SCALAR = frozenset({"string", "long", "int", "double", "boolean", "timestamp"})


def span_streams() -> dict[str, StreamConfig]:
    """The generated ``otlp.spans`` stream and the hand-declared one of the same spans."""
    otlp = otlp_streams(OtlpSection(enabled=True, kinds=("spans",)), "bench")[0]
    flat = StreamConfig(
        name="spans_json", table="bench.spans_json", unknown_fields="reject",
        columns=tuple(Column(c.name, c.type if c.type in SCALAR else "string")
                      for c in otlp.columns),
        partition_by=("day(start_time)",))
    return {"otlp": otlp, "json": flat}


def flat_event(row: dict[str, Any]) -> dict[str, Any]:
    """An OTLP span row as a flat JSON event: nested values as their JSON text."""
    return {k: msgspec.json.encode(v).decode() if isinstance(v, dict | list) else v
            for k, v in row.items()}


def span_files(kind: str, stream: StreamConfig, batches: int, per_batch: int
               ) -> Iterator[BatchFile]:
    """Batch files as the ingestor writes them: OTLP rows with ids from the request bytes,
    or the same spans as flat events."""
    compiled = CompiledStream(stream)
    now_ms = int(time.time() * 1000)
    for b in range(batches):
        request = span_request(b, per_batch)
        array = rows_array("traces", request, "spans")
        if kind == "otlp":
            stem = f"otlp:spans:{hashlib.sha256(request.SerializeToString()).hexdigest()[:32]}:"
        else:
            array = msgspec.json.encode([flat_event(r) for r in msgspec.json.decode(array)])
            stem = f"e{b}-"
        payloads = compiled.from_json(array).payloads
        yield build_batch((stream.name, f"{stem}{i}", now_ms, p) for i, p in enumerate(payloads))


def span_config(root: Path, stream: StreamConfig) -> Any:
    return local_config(root, (stream,), max_run_entries=100_000, max_run_bytes=1 << 34,
                        dedup_window_s=0)


def prefill(root: Path, kind: str, stream: StreamConfig, batches: int, per_batch: int) -> int:
    config = span_config(root, stream)
    asyncio.run(publish_files(config.store.url, span_files(kind, stream, batches, per_batch)))
    return batches * per_batch


def span_rates(root: Path, spark: Any, batches: int, per_batch: int, trials: int
               ) -> dict[str, float]:
    """Best committed rows/s of each stream and engine, on copies of one pre-filled store."""
    streams = span_streams()
    for kind, stream in streams.items():  # warm the JVM and the Python workers on both shapes
        events = prefill(root / f"warm-{kind}", kind, stream, max(1, batches // 3), per_batch)
        asyncio.run(drain(span_config(root / f"warm-{kind}", stream), SparkEngine(spark, 4),
                          events))
        prefill(root / f"template-{kind}", kind, stream, batches, per_batch)
    best: dict[str, float] = {}
    engines = (("spark", lambda: SparkEngine(spark, 4)), ("no-spark", LocalEngine))
    for trial in range(trials):
        for kind, stream in streams.items():
            for name, engine in engines:
                trial_root = root / f"{kind}-{name}-{trial}"
                shutil.copytree(root / f"template-{kind}" / "store", trial_root / "store")
                rate = asyncio.run(drain(span_config(trial_root, stream), engine(),
                                         batches * per_batch))[0]
                key = f"{kind} {name}"
                best[key] = max(best.get(key, 0.0), rate)
                print(f"  spans {key} run {trial + 1}: {rate:,.0f} rows/s", flush=True)
                shutil.rmtree(trial_root)
    return best


def main() -> None:
    parser = bench_parser(__doc__, "one 2 s round per kind and one drain per stream (about a "
                          "minute, Spark's start included)")
    args = parser.parse_args()
    seconds, trials = (2.0, 1) if args.quick else (10.0, TRIALS)
    batches, per_batch = (3, 5_000) if args.quick else (20, 10_000)
    with tempfile.TemporaryDirectory(prefix="icefloe-otlp-bench-") as tmp:
        root = Path(tmp)
        logs, cpu = log_rates(root, seconds, trials)
        steps = log_steps(1.0 if args.quick else 6.0)
        from pipeline.spark import get_spark  # lazy: the JVM only after the ingest rounds

        print("starting Spark (local[2]) ...", flush=True)
        spark = get_spark("local[2]", "icefloe-bench", {"spark.driver.memory": "4g"})
        spans = span_rates(root, spark, batches, per_batch, trials)
        spark.stop()
    results = [
        Result(JSON_NAME, logs["json"], "records/s"),
        Result(OTLP_NAME, logs["otlp"], "records/s", logs["json"]),
        Result(SPARK_BASE, spans["json spark"], "events/s"),
        Result(SPARK_NAME, spans["otlp spark"], "spans/s", spans["json spark"]),
        Result("committed events/s, collector without Spark, the same spans as flat JSON events",
               spans["json no-spark"], "events/s"),
        Result("committed spans/s, collector without Spark, OTLP spans table",
               spans["otlp no-spark"], "spans/s", spans["json no-spark"]),
        Result("diagnostic: ingestor CPU per record, JSON events", cpu["json"], "CPU-us"),
        Result("diagnostic: ingestor CPU per record, OTLP/HTTP protobuf", cpu["otlp"], "CPU-us",
               cpu["json"]),
        Result("diagnostic: protobuf parse of the export request, per record",
               steps["parse"], "CPU-us"),
        Result("diagnostic: export_rows (request to JSON rows), per record", steps["rows"],
               "CPU-us"),
        Result("diagnostic: stream validation of the JSON rows, per record", steps["validate"],
               "CPU-us"),
        Result("diagnostic: export_rows(canonical=True), payloads needing no validation, per "
               "record", steps["canonical"], "CPU-us"),
        Result("diagnostic: protobuf bytes to canonical rows as the receiver does it (compiled "
               "wire decoder where built), per record", steps["wire"], "CPU-us"),
    ]
    print_table(f"OTLP vs JSON events (logs: one ingestor process, durable acks on a local store; "
                f"spans: {batches * per_batch:,} rows through the collector)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
