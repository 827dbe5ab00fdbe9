"""Column-mapping benchmark: a mapping-heavy stream against the same data as plain columns.

Both streams carry the same seven values per event. ``plain`` declares them as top-level
fields; ``mapped`` reads four of them from nested JSON paths, adds the client address, a
header, the receive time and the event id (envelope meta → decode), and three ``sql``
columns Spark computes (``lower``, a decimal cast, a date format). Measured side by side in
one run, plain as the baseline:

* ingest validation (the ingestor's CPU per event): ``CompiledStream.from_json`` on
  100-event arrays, events/s on one core;
* decode without Spark (one worker's share of the collector): batch file → Arrow table;
* the whole Spark pipeline (``local[2]``, the collector's embedded path): batch files in
  the store → rows on the driver, rows/s — this is where ``sql`` columns are computed.

A last pair of rows sets one ``template`` column (Keboola's Jsonnet, ``Body('user.id')``)
beside the same value read by a ``path`` column, decode only (the executors' work, one core).

Usage: python bench/mappings_bench.py [--quick] [--json PATH] [--templates-only]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import (
    Result,
    bench_parser,
    manifest_entries,
    print_table,
    publish_files,
    write_json,
)

from icefloe.config import Column, Config, StoreSection, StreamConfig
from icefloe.formats.batch import BatchBuilder
from icefloe.formats.envelope import frame_events
from ingestor.validate import CompiledStream
from pipeline.load.decode import decode_batch_file
from pipeline.load.spec import EntryFile, run_spec, stream_specs

PLAIN = StreamConfig(name="plain", table="bench.plain", columns=(
    Column("user_id", "string"), Column("url", "string"), Column("duration_ms", "long"),
    Column("ts", "timestamp"), Column("country", "string"), Column("device", "string"),
    Column("price", "string")))
MAPPED = StreamConfig(name="mapped", table="bench.mapped", columns=(
    Column("user_id", "string", path="$.user.id"), Column("url", "string"),
    Column("duration_ms", "long", path="$.timing.duration_ms"),
    Column("ts", "timestamp", path="$.timing.ts"),
    Column("country", "string", path="$.user.geo.country"), Column("device", "string"),
    Column("price", "string"), Column("ip", "string", source="ip"),
    Column("agent", "string", header="User-Agent"),
    Column("received", "timestamp", source="datetime"), Column("eid", "string", source="id"),
    Column("url_lower", "string", sql="lower(url)"),
    Column("price_2dp", "double", sql="CAST(price AS DECIMAL(10,2))"),
    Column("day", "string", sql="date_format(ts, 'yyyy-MM-dd')")))


def plain_event(i: int) -> dict[str, object]:
    return {"user_id": f"user-{i % 50_000:06d}", "url": f"https://Shop.example.com/p/{i % 9973}",
            "duration_ms": i % 60_000, "ts": "2026-11-23T10:00:00.123Z", "country": "DE",
            "device": "mobile" if i % 3 else "desktop", "price": f"{i % 500}.499"}


def mapped_event(i: int) -> dict[str, object]:
    p = plain_event(i)
    return {"user": {"id": p["user_id"], "geo": {"country": p["country"]}}, "url": p["url"],
            "timing": {"duration_ms": p["duration_ms"], "ts": p["ts"]},
            "device": p["device"], "price": p["price"]}


def rate(fn: Callable[[], int], seconds: float,
         clock: Callable[[], float] = time.perf_counter) -> float:
    """Items per second of ``fn`` (which returns how many it handled), best of 3 rounds;
    with ``clock=time.process_time``, per second of this process's CPU time (one core's
    work when ``fn`` is single-threaded, whatever else shares the machine)."""
    best = 0.0
    for _ in range(3):
        done, started = 0, clock()
        while (elapsed := clock() - started) < seconds / 3:
            done += fn()
        best = max(best, done / elapsed)
    return best


def bodies(make: Callable[[int], dict[str, object]], count: int = 20) -> list[bytes]:
    return [msgspec.json.encode([make(r * 100 + i) for i in range(100)]) for r in range(count)]


def ingest_rates(seconds: float) -> tuple[float, float]:
    results = []
    for stream, make in ((PLAIN, plain_event), (MAPPED, mapped_event)):
        compiled = CompiledStream(stream)
        requests = bodies(make)
        cursor = iter(range(1 << 62))

        def one(compiled=compiled, requests=requests, cursor=cursor) -> int:
            body = requests[next(cursor) % len(requests)]
            compiled.request_meta("203.0.113.9", {"user-agent": "bench/1.0"}.get)
            return len(compiled.from_json(body).payloads)
        results.append(rate(one, seconds))
    return results[0], results[1]

PATH_ONE = StreamConfig(name="path_one", table="bench.path_one", columns=(
    Column("user_id", "string", path="$.user.id"),))
TEMPLATE_ONE = StreamConfig(name="template_one", table="bench.template_one", columns=(
    Column("user_id", "string", template="Body('user.id')"),))
"""The same value as a ``path`` column and as a Keboola ``template`` (Jsonnet) column."""


def batch_file(stream: StreamConfig, make: Callable[[int], dict[str, object]], start: int,
               events: int) -> tuple[bytes, int]:
    """A batch as the ingestor writes it: 100-event requests, each with its meta."""
    compiled = CompiledStream(stream)
    builder = BatchBuilder()
    now_ms = int(time.time() * 1000)
    for first in range(start, start + events, 100):
        body = msgspec.json.encode([make(first + i) for i in range(100)])
        meta = compiled.request_meta("203.0.113.9", {"user-agent": "bench/1.0"}.get)
        payloads = compiled.from_json(body).payloads
        builder.add_framed(frame_events(stream.name, now_ms, [f"e{first + i}" for i in
                                                              range(100)], payloads,
                                        meta=meta), 100)
    return builder.finish(), builder.record_count


def decode_rates(seconds: float, events: int) -> tuple[float, float]:
    results = []
    for stream, make in ((PLAIN, plain_event), (MAPPED, mapped_event)):
        data, count = batch_file(stream, make, 0, events)
        plans = {s.name: s.plan() for s in stream_specs([stream])}
        ref = EntryFile(0, "bench", len(data), 0)

        def one(data=data, plans=plans, ref=ref, count=count, name=stream.name) -> int:
            rows = decode_batch_file(data, ref, plans).tables[name].num_rows
            assert rows == count
            return rows
        results.append(rate(one, seconds))
    return results[0], results[1]


def template_rates(seconds: float, events: int) -> list[Result]:
    """Decode (one executor core's work) of one column read by ``path`` (the baseline) and
    by a ``template``, whose Jsonnet runs in the decode: per second of wall time, and per
    second of CPU time (what one core does when others share the machine)."""
    ones = []
    for stream in (PATH_ONE, TEMPLATE_ONE):
        data, count = batch_file(stream, mapped_event, 0, events)
        plans = {s.name: s.plan() for s in stream_specs([stream])}
        ref = EntryFile(0, "bench", len(data), 0)

        def one(data=data, plans=plans, ref=ref, count=count, name=stream.name) -> int:
            decoded = decode_batch_file(data, ref, plans)
            assert not len(decoded.dead), decoded.dead.message[:1]
            table = decoded.tables[name]
            assert table.num_rows == count
            return count
        ones.append(one)
    out = []
    for label, clock in (("rows/s", time.perf_counter), ("rows/CPU-s", time.process_time)):
        path_rate, template_rate = (rate(one, seconds, clock) for one in ones)
        out += [Result(f"decode, one path column ($.user.id), {label}", path_rate, label),
                Result(f"decode, the same as a template (Body('user.id')), {label}",
                       template_rate, label, path_rate)]
    return out


def spark_rates(root: Path, files: int, per_file: int, rows: bool) -> tuple[float, float]:
    from pipeline.load.run import SparkEngine
    from pipeline.spark import get_spark

    spark = get_spark("local[2]", "icefloe-mappings-bench", {"spark.driver.memory": "2g"})
    results = []
    for stream, make in ((PLAIN, plain_event), (MAPPED, mapped_event)):
        config = Config(store=StoreSection(url=(root / stream.name).as_uri()),
                        streams=(stream,))
        asyncio.run(publish_files(config.store.url, (
            (*batch_file(stream, make, f * per_file, per_file), (stream.name,))
            for f in range(files))))
        spec = run_spec(config, asyncio.run(manifest_entries(config.store.url)), partitions=4)
        # rows=False: as the collector runs it (packed, but a stream with sql columns
        # takes the row path); rows=True: both on the row path, so the ratio there is the
        # mappings' own cost
        engine = SparkEngine(spark, 4, rows=rows)
        engine.run(spec)  # warm: Python workers, plan caches
        best = 0.0
        for _ in range(3):
            started = time.perf_counter()
            out = engine.run(spec)
            elapsed = time.perf_counter() - started
            assert out.tables[stream.name].num_rows == files * per_file
            best = max(best, files * per_file / elapsed)
        if stream is MAPPED:  # the sql columns really were computed
            row = out.tables["mapped"].slice(0, 1).to_pylist()[0]
            assert row["url_lower"] == row["url"].lower()
            assert row["day"] == "2026-11-23"
        results.append(best)
    return results[0], results[1]


def main() -> None:
    parser = bench_parser(__doc__, "small sizes, done in < 1 min")
    parser.add_argument("--templates-only", action="store_true",
                        help="only the template-vs-path decode rows")
    args = parser.parse_args()
    seconds = 1.5 if args.quick else 6.0
    files, per_file = (8, 10_000) if args.quick else (20, 25_000)

    if args.templates_only:
        results = template_rates(seconds, per_file)
        print_table("template vs path column (decode, one core)", results)
        write_json(args.json, results)
        return
    results = []
    plain, mapped = ingest_rates(seconds)
    results += [Result("ingest validate, plain columns", plain, "events/s"),
                Result("ingest validate, mapped (4 paths + meta)", mapped, "events/s", plain)]
    plain, mapped = decode_rates(seconds, per_file)
    results += [Result("decode, plain columns", plain, "rows/s"),
                Result("decode, mapped (+ip, header, datetime, id)", mapped, "rows/s", plain)]
    results += template_rates(seconds, per_file)
    for rows, path in ((False, "as collected"), (True, "both as rows")):
        with tempfile.TemporaryDirectory(prefix="icefloe-mappings-bench-") as tmp:
            plain, mapped = spark_rates(Path(tmp), files, per_file, rows)
        results += [Result(f"spark pipeline ({path}), plain columns", plain, "rows/s"),
                    Result(f"spark pipeline ({path}), mapped (+3 sql columns)", mapped,
                           "rows/s", plain)]
    print_table(f"column mappings ({files} files x {per_file} events for Spark)", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
