"""Load process of bench/otlp_bench.py: POST prebuilt bodies with several requests in flight.

``python bench/_otlp_load.py URL CONTENT_TYPE BODIES_FILE RECORDS_PER_BODY SECONDS
CONCURRENCY WARMUP_S``

``BODIES_FILE`` holds the bodies, each a 4-byte big-endian length and the bytes. Every
request takes the next body and writes its request number over the 16-byte
:data:`PLACEHOLDER` (a resource attribute's value), so no two requests carry the same bytes
(an OTLP request's event ids come from its bytes: a repeated body would be a retry) at the
cost of one ``bytes.replace``. The same client sends both kinds of rows, so what it costs
falls on both alike. After ``WARMUP_S`` it prints ``counting``, after ``SECONDS`` more
``counted`` (the parent reads the ingestor's CPU time at each), then one JSON line:
``{"records", "seconds", "requests", "errors", "first_error"}``; a record counts when its
request's 2xx answer (OTLP: with no rejected records) arrives inside the window.
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
from pathlib import Path

import aiohttp

PLACEHOLDER = b"@@BENCHREQUEST@@"
"""16 bytes in every body, replaced by the request's number (``%016d``): same length, so a
protobuf body stays valid."""


def read_bodies(path: Path) -> list[bytes]:
    data = path.read_bytes()
    bodies, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack_from(">I", data, pos)
        bodies.append(data[pos + 4:pos + 4 + size])
        pos += 4 + size
    return bodies


def rejected(content_type: str, answer: bytes) -> int:
    """Records an OTLP answer's ``partial_success`` rejected (0 for the events route)."""
    if not answer or not content_type.startswith("application/x-protobuf"):
        return 0
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (  # why: OTLP only
        ExportLogsServiceResponse,
    )
    return int(ExportLogsServiceResponse.FromString(answer).partial_success.rejected_log_records)


class Load:
    """Shared state of the workers: the request counter and the counted window."""

    def __init__(self, bodies: list[bytes], per_body: int) -> None:
        self.bodies = bodies
        self.per_body = per_body
        self.next = 0
        self.counting = False
        self.stopped = False
        self.records = 0
        self.requests = 0
        self.errors = 0
        self.first_error = ""

    def body(self) -> bytes:
        n = self.next
        self.next += 1
        return self.bodies[n % len(self.bodies)].replace(PLACEHOLDER, b"%016d" % n)

    def fail(self, message: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or message


async def worker(session: aiohttp.ClientSession, url: str, content_type: str, load: Load
                 ) -> None:
    headers = {"Content-Type": content_type}
    while not load.stopped:
        try:
            async with session.post(url, data=load.body(), headers=headers) as response:
                answer = await response.read()
                if response.status // 100 != 2:
                    load.fail(f"{response.status}: {answer[:300]!r}")
                    continue
                lost = rejected(content_type, answer)
        except aiohttp.ClientError as exc:
            load.fail(repr(exc))
            continue
        if lost:
            load.fail(f"{lost} records rejected")
        if load.counting:
            load.records += load.per_body - lost
            load.requests += 1


async def main(url: str, content_type: str, bodies_file: str, per_body: str, seconds: str,
               concurrency: str, warmup: str) -> None:
    load = Load(read_bodies(Path(bodies_file)), int(per_body))
    connector = aiohttp.TCPConnector(limit=int(concurrency))
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        tasks = [asyncio.create_task(worker(session, url, content_type, load))
                 for _ in range(int(concurrency))]
        await asyncio.sleep(float(warmup))
        print("counting", flush=True)
        load.counting = True
        started = time.perf_counter()
        await asyncio.sleep(float(seconds))
        load.counting = False
        took = time.perf_counter() - started
        print("counted", flush=True)
        load.stopped = True
        await asyncio.gather(*tasks)
    print(json.dumps({"records": load.records, "seconds": took, "requests": load.requests,
                      "errors": load.errors, "first_error": load.first_error}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:8]))
