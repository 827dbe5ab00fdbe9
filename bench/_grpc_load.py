"""gRPC load generator (runs in its own process): unary or client-streaming, 100 events/msg.

``python bench/_grpc_load.py TARGET unary|stream SECONDS EVENTS_PER_MSG CONCURRENCY [WARMUP]``
prints one JSON line: {"events": n, "seconds": s, "p50_ms": .., "p99_ms": ..}. TARGET may be
several ``host:port`` joined by commas (unary: worker ``w`` sends to target ``w % len``, the
workers being CONCURRENCY per target). With WARMUP seconds, the first WARMUP seconds are sent
but not counted (``seconds`` is then the counted window).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import grpc
import uvloop

from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

EVENT = (b'{"user_id":"user-%05d","url":"https://example.com/products/%d?ref=campaign-7",'
         b'"duration_ms":%d,"ts":"2026-11-23T01:02:03.456Z","ref":"newsletter-2026-11"}')


def request(seq: int, per_msg: int) -> ingest_pb2.PublishRequest:
    events = [ingest_pb2.Event(json=EVENT % (i % 50000, i % 997, i % 60000))
              for i in range(seq * per_msg, (seq + 1) * per_msg)]
    return ingest_pb2.PublishRequest(stream="pageviews", events=events)


async def main(target: str, mode: str, seconds: float, per_msg: int, concurrency: int,
               warmup: float = 0.0) -> None:
    pool = [request(i, per_msg) for i in range(64)]
    latencies: list[float] = []
    events = 0
    targets = target.split(",")
    channels = [grpc.aio.insecure_channel(t) for t in targets]
    stubs = [ingest_pb2_grpc.IngestStub(c) for c in channels]
    stub = stubs[0]
    counted_from = time.monotonic() + warmup
    deadline = counted_from + seconds
    try:

        async def unary(worker: int) -> None:
            nonlocal events
            i = worker
            own = stubs[worker % len(stubs)]
            while time.monotonic() < deadline:
                started = time.perf_counter()
                response = await own.Publish(pool[i % len(pool)])
                if time.monotonic() >= counted_from:
                    latencies.append(time.perf_counter() - started)
                    events += response.accepted
                i += concurrency * len(stubs)

        async def stream(worker: int) -> None:
            nonlocal events
            sent: asyncio.Queue[float] = asyncio.Queue(maxsize=32)

            async def requests():
                i = worker
                while time.monotonic() < deadline:
                    await sent.put(time.perf_counter())
                    yield pool[i % len(pool)]
                    i += 1

            async for response in stub.PublishStream(requests()):
                latency = time.perf_counter() - sent.get_nowait()
                if time.monotonic() >= counted_from:
                    latencies.append(latency)
                    events += response.accepted

        worker = unary if mode == "unary" else stream
        workers = concurrency * (len(stubs) if mode == "unary" else 1)
        await asyncio.gather(*(worker(w) for w in range(workers)))
        elapsed = time.monotonic() - counted_from
    finally:
        for channel in channels:
            await channel.close()
    sample = sorted(latencies)
    print(json.dumps({"events": events, "seconds": elapsed,
                      "p50_ms": 1000 * sample[len(sample) // 2] if sample else None,
                      "p99_ms": 1000 * sample[int(len(sample) * 0.99)] if sample else None}))


if __name__ == "__main__":
    target, mode, seconds, per_msg, concurrency = sys.argv[1:6]
    warmup = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    uvloop.run(main(target, mode, float(seconds), int(per_msg), int(concurrency), warmup))
