"""Producers' own types (#39): the same events as JSON, Protobuf and Avro, side by side.

Measures, in one run on the local store and a SQLite Iceberg catalog, three streams with the
same columns and the same values — one JSON (``pyarrow.json.read_json`` on canonical
payloads), one ``format = "protobuf"`` (the messages' bytes decoded straight into Arrow),
one ``format = "avro"`` (single-object-encoded data, decoded into Arrow):

* committed events/s through the collector with the Spark engine (packed path) and with the
  no-Spark engine (same decode and commit, in the collector process), best of ``TRIALS``
  drains of copies of one pre-filled store per stream;
* ingest requests/s over gRPC into a real ingestor process (``icefloe ingestor``, durable
  acks on the local store): 100-event ``Publish`` requests of Protobuf ``Event.data`` against
  the same events as ``Event.json``, from a load process with ``CONCURRENCY`` requests in
  flight, best of ``TRIALS`` rounds, each on a fresh ingestor and store, the first kind
  alternating;
* the ingestor's check of the same 100-event requests in this process (no network).

The issue's targets: Protobuf and Avro ≥ 1.0 of JSON through Spark; Protobuf over gRPC ≥ 1.0
of JSON over gRPC.

Usage: python bench/typed_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import io
import json
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
    Result,
    bench_parser,
    drain,
    local_config,
    print_table,
    publish_files,
    write_json,
)

from icefloe.config import Column, StreamConfig
from icefloe.formats.batch import BatchBuilder
from icefloe.formats.envelope import frame_encoded, frame_typed
from icefloe.streams.model import TypedSchema
from pipeline.load.run import LocalEngine, SparkEngine

TRIALS = 3
"""Drains (and load rounds) per stream; the best counts (a shared 2-core VM varies ±30 %)."""
CONCURRENCY = 8
"""gRPC requests in flight from the load process."""
PER_REQUEST = 100

PROTO = """
syntax = "proto3";
package bench.v1;
import "google/protobuf/timestamp.proto";
message PageView {
  string user_id = 1;
  string session_id = 2;
  string url = 3;
  string referrer = 4;
  int64 duration_ms = 5;
  google.protobuf.Timestamp ts = 6;
  int32 scroll = 7;
  double load_s = 8;
  bool bounced = 9;
  string country = 10;
}
"""
AVRO = {"type": "record", "name": "PageView", "namespace": "bench.v1", "fields": [
    {"name": "user_id", "type": "string"}, {"name": "session_id", "type": "string"},
    {"name": "url", "type": "string"}, {"name": "referrer", "type": "string"},
    {"name": "duration_ms", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "scroll", "type": "int"}, {"name": "load_s", "type": "double"},
    {"name": "bounced", "type": "boolean"}, {"name": "country", "type": "string"}]}
COLUMNS = (("user_id", "string"), ("session_id", "string"), ("url", "string"),
           ("referrer", "string"), ("duration_ms", "long"), ("ts", "timestamp"),
           ("scroll", "int"), ("load_s", "double"), ("bounced", "boolean"),
           ("country", "string"))
BASE_US = 1_795_000_000_000_000


def event(i: int) -> dict[str, Any]:
    return {"user_id": f"user-{i % 50_000:06d}", "session_id": f"s-{i // 7:08d}",
            "url": f"https://example.com/products/{i % 997}?ref=campaign-7",
            "referrer": "newsletter-2026-11", "duration_ms": i % 60_000,
            "ts_us": BASE_US + i * 1000, "scroll": i % 100, "load_s": (i % 300) / 100,
            "bounced": i % 5 == 0, "country": ("DE", "US", "FR", "JP")[i % 4]}


def json_payload(e: dict[str, Any]) -> bytes:
    ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(e["ts_us"] // 1_000_000))
    body = {k: v for k, v in e.items() if k != "ts_us"}
    body["ts"] = f"{ts}.{e['ts_us'] % 1_000_000:06d}Z"
    return msgspec.json.encode(body)


class Kinds:
    """The Protobuf message class and the Avro writer for the bench's events."""

    def __init__(self, root: Path) -> None:
        import grpc_tools  # type: ignore[import-untyped]
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        (root / "pv.proto").write_text(PROTO)
        include = Path(grpc_tools.__file__).parent / "_proto"
        self.descriptor_set = root / "pv.binpb"
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{root}",
                        f"-I{include}", "--include_imports",
                        f"--descriptor_set_out={self.descriptor_set}", "pv.proto"],
                       check=True)
        files = descriptor_pb2.FileDescriptorSet.FromString(self.descriptor_set.read_bytes())
        pool = descriptor_pool.DescriptorPool()
        for proto in files.file:
            pool.Add(proto)
        self.message = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("bench.v1.PageView"))
        self.avsc = root / "pv.avsc"
        self.avsc.write_text(json.dumps(AVRO))
        import fastavro

        self._avro = fastavro.parse_schema(AVRO)

    def protobuf(self, e: dict[str, Any]) -> bytes:
        msg: Any = self.message(**{k: v for k, v in e.items() if k != "ts_us"})  # dynamic
        msg.ts.seconds, msg.ts.nanos = divmod(e["ts_us"], 1_000_000)
        msg.ts.nanos *= 1000
        return bytes(msg.SerializeToString())

    def avro(self, e: dict[str, Any]) -> bytes:
        import fastavro

        out = io.BytesIO()
        record = {k: v for k, v in e.items() if k != "ts_us"}
        record["ts"] = e["ts_us"]
        fastavro.schemaless_writer(out, self._avro, record)
        return out.getvalue()


def streams(kinds: Kinds) -> dict[str, StreamConfig]:
    from icefloe.config.typed_streams import with_typed_columns

    plain = StreamConfig(name="pv_json", table="bench.pv_json",
                         columns=tuple(Column(n, t) for n, t in COLUMNS))
    proto = StreamConfig(name="pv_protobuf", table="bench.pv_protobuf", columns=(),
                         format="protobuf", schema=TypedSchema(
                             message="bench.v1.PageView",
                             descriptor_set=str(kinds.descriptor_set)))
    avro = StreamConfig(name="pv_avro", table="bench.pv_avro", columns=(), format="avro",
                        schema=TypedSchema(schema_file=str(kinds.avsc)))
    typed = with_typed_columns((plain, proto, avro), Path("/"), "bench")
    return {"json": typed[0], "protobuf": typed[1], "avro": typed[2]}


def batch_files(kinds: Kinds, kind: str, stream: str, count: int, per_batch: int
                ) -> Iterator[BatchFile]:
    """Batch files as the ingestor writes them (version 1 JSON, version 2 binary)."""
    now_ms = int(time.time() * 1000)
    encode = {"json": json_payload, "protobuf": kinds.protobuf, "avro": kinds.avro}[kind]
    for b in range(count):
        payloads = [encode(event(b * per_batch + i)) for i in range(per_batch)]
        ids = [f"e{b}-{i}".encode() for i in range(per_batch)]
        builder = BatchBuilder()
        if kind == "json":
            framed = frame_encoded(stream, now_ms, ids, payloads)
        else:
            framed = frame_typed(stream, now_ms, ids, payloads, 1 if kind == "protobuf" else 2,
                                 [0] * per_batch)
        builder.add_framed(framed, per_batch)
        yield builder.finish(), per_batch, (stream,)


def drain_rates(kinds: Kinds, spark: Any, batches: int, per_batch: int, root: Path
                ) -> dict[str, float]:
    configs = streams(kinds)
    for kind, stream in configs.items():  # one template store per stream, copied per trial
        config = local_config(root / f"template-{kind}", (stream,), max_run_entries=100_000,
                              max_run_bytes=1 << 34, dedup_window_s=0)
        asyncio.run(publish_files(config.store.url, batch_files(
            kinds, kind, stream.name, batches, per_batch)))
    for kind, stream in configs.items():  # warm the Python workers up on every decoder
        warm = root / f"warm-{kind}"      # (polars and ptars load once per worker)
        shutil.copytree(root / f"template-{kind}" / "store", warm / "store")
        config = local_config(warm, (stream,), max_run_entries=100_000,
                              max_run_bytes=1 << 34, dedup_window_s=0)
        asyncio.run(drain(config, SparkEngine(spark, 4), batches * per_batch))
        shutil.rmtree(warm)
    best: dict[str, float] = {}
    engines = (("spark", lambda: SparkEngine(spark, 4)), ("no-spark", LocalEngine))
    for trial in range(TRIALS):
        for kind, stream in configs.items():
            for name, engine in engines:
                trial_root = root / f"{kind}-{name}-{trial}"
                shutil.copytree(root / f"template-{kind}" / "store", trial_root / "store")
                config = local_config(trial_root, (stream,), max_run_entries=100_000,
                                      max_run_bytes=1 << 34, dedup_window_s=0)
                rate = asyncio.run(drain(config, engine(), batches * per_batch))[0]
                key = f"{kind} {name}"
                best[key] = max(best.get(key, 0.0), rate)
                print(f"  {key} run {trial + 1}: {rate:,.0f} events/s", flush=True)
                shutil.rmtree(trial_root)
    return best


LOAD = r'''
import asyncio, json, sys, time
import grpc
from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

async def main(target, stream, field, path, seconds, concurrency):
    bodies = json.load(open(path))
    requests = [ingest_pb2.PublishRequest(stream=stream, events=[
        ingest_pb2.Event(**{field: bytes.fromhex(b)}) for b in group]) for group in bodies]
    async with grpc.aio.insecure_channel(target) as channel:
        stub = ingest_pb2_grpc.IngestStub(channel)
        await stub.Publish(requests[0])
        done = 0
        deadline = time.perf_counter() + seconds
        async def worker(w):
            nonlocal done
            i = w
            while time.perf_counter() < deadline:
                try:
                    await stub.Publish(requests[i % len(requests)])
                except grpc.aio.AioRpcError as exc:  # back-pressure: wait as a client would
                    if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                          grpc.StatusCode.UNAVAILABLE):
                        raise
                    await asyncio.sleep(0.05)
                    continue
                done += 1
                i += concurrency
        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        print(json.dumps({"requests": done, "seconds": time.perf_counter() - started}))

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]),
                 int(sys.argv[6])))
'''


def ingest_rates(kinds: Kinds, root: Path, seconds: float) -> dict[str, float]:
    """Requests/s of 100-event ``Publish`` calls, JSON vs Protobuf. Each round starts its
    own ingestor on a fresh store, and the kind that goes first alternates: an ingestor's
    manifest grows with every flush (nothing dequeues here), so a shared one would make
    whichever kind ran later pay for the other's entries."""
    bodies = {
        "json": [[json_payload(event(r * PER_REQUEST + i)).hex() for i in range(PER_REQUEST)]
                 for r in range(32)],
        "protobuf": [[kinds.protobuf(event(r * PER_REQUEST + i)).hex()
                      for i in range(PER_REQUEST)] for r in range(32)]}
    for kind, groups in bodies.items():
        (root / f"{kind}.json").write_text(json.dumps(groups))
    (root / "load.py").write_text(LOAD)
    best: dict[str, float] = {}
    order = [("json", "pv_json", "json"), ("protobuf", "pv_protobuf", "data")]
    for trial in range(TRIALS):
        for kind, stream, field in order if trial % 2 == 0 else order[::-1]:
            rate = _round(kinds, root / f"ingest-{trial}-{kind}", stream, field,
                          root / f"{kind}.json", seconds)
            best[kind] = max(best.get(kind, 0.0), rate)
            print(f"  gRPC {kind}: {rate:,.0f} requests/s", flush=True)
    return best


def _round(kinds: Kinds, home: Path, stream: str, field: str, bodies: Path,
           seconds: float) -> float:
    """One ingestor process on a fresh store under ``home`` and one load process against
    it: requests/s. A failure says what the load and the ingestor printed."""
    from ingest_bench import free_port, wait_port

    home.mkdir()
    config_file = home / "icefloe.toml"
    config_file.write_text(
        f'[store]\nurl = "{(home / "store").as_uri()}"\n'
        f'[ingestor]\nhost = "127.0.0.1"\n'
        '[[streams]]\nname = "pv_json"\ntable = "bench.pv_json"\ncolumns = ['
        + ", ".join(f'{{ name = "{n}", type = "{t}" }}' for n, t in COLUMNS) + "]\n"
        '[[streams]]\nname = "pv_protobuf"\ntable = "bench.pv_protobuf"\n'
        'format = "protobuf"\n'
        f'schema = {{ message = "bench.v1.PageView", descriptor_set = '
        f'"{kinds.descriptor_set}" }}\n')
    grpc_port = free_port()
    while (http_port := free_port()) == grpc_port:
        pass
    log = home / "ingestor.log"
    with log.open("w") as sink, subprocess.Popen(
            [sys.executable, "-m", "icefloe", "ingestor", "--config", str(config_file),
             "--http-port", str(http_port), "--grpc-port", str(grpc_port)],
            stdout=sink, stderr=sink, text=True) as ingestor:
        try:
            wait_port(http_port)
            wait_port(grpc_port)
            deadline = time.monotonic() + 60  # the ports open before it serves: its line
            while '"event": "ready"' not in log.read_text():
                if time.monotonic() > deadline or ingestor.poll() is not None:
                    raise RuntimeError(f"the ingestor did not start: {log.read_text()[-1500:]}")
                time.sleep(0.05)
            done = subprocess.run(
                [sys.executable, str(home.parent / "load.py"), f"127.0.0.1:{grpc_port}",
                 stream, field, str(bodies), str(seconds), str(CONCURRENCY)],
                capture_output=True, text=True, check=False)
            if done.returncode:
                raise RuntimeError(f"the gRPC load failed: {done.stderr[-1500:]}; the "
                                   f"ingestor (exit {ingestor.poll()}) printed: "
                                   f"{log.read_text()[-1500:]}")
        finally:
            ingestor.terminate()
            ingestor.wait(30)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return float(figures["requests"] / figures["seconds"])


def validator_rates(kinds: Kinds, seconds: float) -> dict[str, float]:
    """events/s of the ingestor's check of 100-event requests, in this process: JSON
    (``CompiledStream.from_events``, as gRPC ``Event.json``) vs Protobuf (``from_binary``,
    as ``Event.data``); best of ``TRIALS`` alternating rounds."""
    from ingestor.validate import CompiledStream

    configs = streams(kinds)
    work = {
        "json": (CompiledStream(configs["json"]).from_events,
                 [[json_payload(event(r * PER_REQUEST + i)) for i in range(PER_REQUEST)]
                  for r in range(20)]),
        "protobuf": (CompiledStream(configs["protobuf"]).from_binary,
                     [[kinds.protobuf(event(r * PER_REQUEST + i)) for i in range(PER_REQUEST)]
                      for r in range(20)])}
    best: dict[str, float] = {}
    for _ in range(TRIALS):
        for kind, (check, requests) in work.items():
            done = 0
            started = time.perf_counter()
            while time.perf_counter() - started < seconds:
                for request in requests:
                    check(request)
                done += PER_REQUEST * len(requests)
            best[kind] = max(best.get(kind, 0.0), done / (time.perf_counter() - started))
    return best


def main() -> None:
    parser = bench_parser(__doc__, "short run (under a minute after Spark's ~15 s start)")
    args = parser.parse_args()
    batches, per_batch = (6, 10_000) if args.quick else (30, 10_000)
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        kinds = Kinds(root)
        checks = validator_rates(kinds, 0.5 if args.quick else 1.0)
        results.append(Result(f"ingestor check, {PER_REQUEST}-event requests, JSON",
                              checks["json"], "events/s"))
        results.append(Result(f"ingestor check, {PER_REQUEST}-event requests, Protobuf",
                              checks["protobuf"], "events/s", checks["json"]))
        grpc = ingest_rates(kinds, root, 2.0 if args.quick else 5.0)
        results.append(Result(f"gRPC Publish, {PER_REQUEST} JSON events per request",
                              grpc["json"], "requests/s"))
        results.append(Result(f"gRPC Publish, {PER_REQUEST} Protobuf messages (target >= 1.0)",
                              grpc["protobuf"], "requests/s", grpc["json"]))
        from pipeline.spark import get_spark

        print("starting Spark (local[2]) ...", flush=True)
        spark = get_spark("local[2]", "icefloe-bench", {"spark.driver.memory": "4g"})
        best = drain_rates(kinds, spark, batches, per_batch, root)
        spark.stop()
    results.append(Result("committed events/s through Spark, JSON", best["json spark"],
                          "events/s"))
    for kind in ("protobuf", "avro"):
        results.append(Result(f"committed events/s through Spark, {kind} (target >= 1.0)",
                              best[f"{kind} spark"], "events/s", best["json spark"]))
    results.append(Result("committed events/s, collector without Spark, JSON",
                          best["json no-spark"], "events/s"))
    for kind in ("protobuf", "avro"):
        results.append(Result(f"committed events/s, collector without Spark, {kind}",
                              best[f"{kind} no-spark"], "events/s", best["json no-spark"]))
    print_table(f"producers' own types: JSON vs Protobuf vs Avro "
                f"({batches * per_batch:,} events per drain)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
