"""Stand-in collector for benchmarks: ack and dequeue the manifest every second.

``python bench/_drain.py STORE_URL`` — runs until SIGTERM. Without a consumer the manifest
would grow for the whole run and every append would rewrite an ever larger object, which
no deployment (where the collector dequeues each commit interval) ever sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys

from icefloe.manifest import ManifestConsumer
from icefloe.store import open_async_store


async def main(url: str) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    consumer = ManifestConsumer(open_async_store(url), holder="bench-drain")
    await consumer.initialize()
    print("ready", flush=True)
    while not stop.is_set():
        entries = await consumer.read()
        if entries:
            await consumer.ack(entries[-1].sequence, dequeue=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
