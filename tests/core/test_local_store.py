"""Local-store specifics the contract suite cannot see: processes, atomicity, layout."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest
from _workers import increment

from icefloe.errors import ConfigError, PermanentStoreError
from icefloe.store import local_path, open_store
from icefloe.store.local import LocalStore


def test_should_serialize_conditional_puts_across_processes(tmp_path):
    processes, times = 4, 50
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        start = manager.Event()
        futures = [pool.submit(increment, str(tmp_path), "counter", times, start)
                   for _ in range(processes)]
        start.set()
        conflicts = sum(f.result(timeout=120) for f in futures)
    assert int(LocalStore(tmp_path).get("counter").data) == processes * times
    assert conflicts > 0  # the processes really raced


def test_should_leave_no_temp_or_lock_files_in_listings(tmp_path):
    store = LocalStore(tmp_path)
    store.put("batches/a", b"1")
    store.put("batches/b", b"2", if_none_match="*")
    assert [o.key for o in store.list().objects] == ["batches/a", "batches/b"]
    leftovers = [n for n in os.listdir(tmp_path / "batches") if n.startswith(".icefloe-tmp")]
    assert leftovers == []


def test_should_keep_the_old_object_when_a_conditional_put_fails(tmp_path):
    store = LocalStore(tmp_path)
    first = store.put("k", b"old")
    with pytest.raises(Exception, match="changed"):
        store.put("k", b"new", if_match='"stale"')
    assert store.get("k").data == b"old"
    assert store.get("k").etag == first.etag


def test_should_change_etag_with_bytes_and_only_with_bytes(tmp_path):
    store = LocalStore(tmp_path)
    a = store.put("k", b"A").etag
    b = store.put("k", b"B").etag
    assert a != b
    assert store.put("k", b"A").etag == a  # content-derived, like S3


def test_should_refuse_an_unusable_root_with_a_clear_message(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermanentStoreError, match="cannot create the local store directory"):
        LocalStore(blocker / "store")


def test_should_parse_store_urls_and_refuse_unknown_schemes(tmp_path):
    assert local_path("file:///var/lib/icefloe") == "/var/lib/icefloe"
    store = open_store(tmp_path.as_uri())
    store.put("x/y", b"1")
    assert store.get("x/y").data == b"1"
    with pytest.raises(ConfigError, match="unsupported store url"):
        open_store("gs://bucket/x")
    with pytest.raises(ConfigError, match="absolute path"):
        open_store("file://relative/path")


def test_should_answer_store_calls_while_the_default_executor_is_busy(tmp_path):
    """A collector's long blocking work (runs, maintenance) fills the loop's default
    executor; a lease renewal through the local store must not queue behind it."""
    import asyncio
    import threading

    from icefloe.store.adapters import ThreadedAsyncStore

    async def main() -> None:
        store = ThreadedAsyncStore(LocalStore(tmp_path / "store"))
        release = threading.Event()
        loop = asyncio.get_running_loop()
        busy = [loop.run_in_executor(None, release.wait) for _ in range(64)]
        try:
            put = await asyncio.wait_for(store.put("lease", b"renewed"), timeout=10)
            got = await asyncio.wait_for(store.get("lease"), timeout=10)
            assert (got.data, got.etag) == (b"renewed", put.etag)
            assert not any(job.done() for job in busy)  # the executor was full all along
        finally:
            release.set()
            await asyncio.gather(*busy)

    asyncio.run(main())
