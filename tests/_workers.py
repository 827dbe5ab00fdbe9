"""Code that runs in child processes spawned by tests (must be importable by path)."""

from __future__ import annotations

import asyncio
import multiprocessing.synchronize
import time

from icefloe.manifest import BatchRef, ManifestConfig, ManifestProducer
from icefloe.store import StoreOptions, open_async_store


def store_options(endpoint_url: str | None) -> StoreOptions:
    if endpoint_url is None:
        return StoreOptions()
    from icefloe.store.s3 import S3Options

    return StoreOptions(s3=S3Options(endpoint_url=endpoint_url, region="us-east-1"))


def produce(url: str, endpoint_url: str | None, name: str, appends: int, concurrency: int,
            start: multiprocessing.synchronize.Event) -> list[tuple[str, int | None]]:
    """Append ``appends`` batches named ``name-i``, ``concurrency`` at a time."""

    async def run() -> list[tuple[str, int | None]]:
        store = open_async_store(url, store_options(endpoint_url))
        producer = ManifestProducer(store, ManifestConfig())
        results: list[tuple[str, int | None]] = []
        start.wait()
        for wave in range(0, appends, concurrency):
            refs = [BatchRef(f"batches/{name}-{i}", 100, 7, 10, ("s",), time.time())
                    for i in range(wave, min(appends, wave + concurrency))]
            seqs = await asyncio.gather(*(producer.append(ref) for ref in refs))
            results.extend((ref.location, seq) for ref, seq in zip(refs, seqs, strict=True))
        await store.close()
        return results

    return asyncio.run(run())


def increment(root: str, key: str, times: int,
              start: multiprocessing.synchronize.Event) -> int:
    """CAS-increment a counter object ``times`` times; return the conflicts seen."""
    from icefloe.errors import NotFound, PreconditionFailed
    from icefloe.store.local import LocalStore

    store = LocalStore(root)
    conflicts = 0
    start.wait()
    for _ in range(times):
        while True:
            try:
                current = store.get(key)
                value, etag = int(current.data), current.etag
            except NotFound:
                value, etag = 0, None
            try:
                if etag is None:
                    store.put(key, str(value + 1).encode(), if_none_match="*")
                else:
                    store.put(key, str(value + 1).encode(), if_match=etag)
                break
            except PreconditionFailed:
                conflicts += 1
    return conflicts
