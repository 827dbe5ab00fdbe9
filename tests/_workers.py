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


def self_checking(seed: int, size: int) -> bytes:
    """``size`` bytes whose last 16 are a digest of the rest: a torn or mixed read fails
    :func:`is_whole`."""
    import hashlib

    body = (seed.to_bytes(8, "little") * (size // 8 + 1))[:size]
    return body + hashlib.blake2b(body, digest_size=16).digest()


def is_whole(data: bytes) -> bool:
    import hashlib

    return len(data) > 16 and hashlib.blake2b(data[:-16], digest_size=16).digest() == data[-16:]


def replace_and_read(root: str, key: str, seconds: float, seed: int,
                     start: multiprocessing.synchronize.Event) -> tuple[int, int, int]:
    """Replace ``key`` with self-checking versions of varying size and read it back, in
    turns, for ``seconds``; return (puts, reads, reads that were not one whole version)."""
    from icefloe.store.local import LocalStore

    store = LocalStore(root)
    puts = reads = bad = 0
    start.wait()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        store.put(key, self_checking(seed * 1_000_003 + puts, 1000 + (puts * 7919) % 20000))
        puts += 1
        for _ in range(3):
            reads += 1
            bad += not is_whole(store.get(key).data)
    return puts, reads, bad
