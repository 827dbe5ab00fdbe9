"""The local store's helper process (``[ingestor] store_helper``): what the contract suite
cannot see — it dies, its parent dies, it is closed, and who gets it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from ingest_support import make_config, read_manifest, running

from icefloe.config import ManifestSection, load_config
from icefloe.config.manifest import ManifestConfig
from icefloe.errors import NotFound, TransientStoreError
from icefloe.formats.batch import BatchBuilder
from icefloe.formats.envelope import frame_events
from icefloe.manifest.publish import new_batch_key
from icefloe.store import StoreOptions, open_async_store
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.failpoints import FAULTS_ENV
from icefloe.store.local import LocalStore
from icefloe.store.retry import RetryPolicy
from ingestor.errors import Overloaded, Unavailable
from ingestor.publish import (
    HelperPublisher,
    PublishJob,
    StorePublisher,
    publishes_in_helper,
    store_options,
)
from ingestor.runtime import IngestorRuntime
from ingestor.store_helper import HELPER_NICE, ProcessAsyncStore

WAIT_S = 30.0


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_should_fail_an_operation_in_flight_as_ambiguous_and_restart_when_the_helper_dies(
        tmp_path, caplog):
    async def scenario() -> None:
        store = ProcessAsyncStore(tmp_path)
        await store.put("batches/warm", b"up")
        first = store.helper_pid
        assert first is not None
        assert alive(first)
        # hold the key's lock from this process: the helper's put blocks after its temp
        # file is written, i.e. while the operation is really running in the helper
        with LocalStore(tmp_path)._locked("batches/x"):
            put = asyncio.create_task(store.put("batches/x", b"payload"))
            await until(lambda: any(n.startswith(".icefloe-tmp")
                                    for n in os.listdir(tmp_path / "batches")),
                        "the helper's temp file")
            os.kill(first, signal.SIGKILL)
            with pytest.raises(TransientStoreError) as failed:
                await put
        assert failed.value.ambiguous
        assert failed.value.code == "HelperExited"
        with pytest.raises(NotFound):  # killed before the rename: nothing landed
            await store.get("batches/x")
        await store.put("batches/x", b"again")  # a new helper serves the retry
        assert (await store.get("batches/x")).data == b"again"
        assert store.helper_pid not in (None, first)
        await store.close()

    with caplog.at_level(logging.WARNING, "icefloe.store"):
        asyncio.run(scenario())
    assert "helper process" in caplog.text
    assert "starting a new one" in caplog.text


def test_should_keep_serving_through_sigint_and_sigterm(tmp_path):
    async def scenario() -> None:
        store = ProcessAsyncStore(tmp_path)
        await store.put("a", b"1")
        pid = store.helper_pid
        assert pid is not None
        for sig in (signal.SIGINT, signal.SIGTERM):  # a shutdown's last flush needs it
            os.kill(pid, sig)
        await store.put("b", b"2")
        assert store.helper_pid == pid
        assert alive(pid)
        await store.close()
        assert not alive(pid)
        assert store.helper_pid is None

    asyncio.run(scenario())


def test_should_run_at_a_lower_priority_than_its_parent(tmp_path):
    """The event loop it serves is on every request's path; the helper is not."""
    async def scenario() -> int:
        store = ProcessAsyncStore(tmp_path)
        try:
            await store.put("a", b"1")  # the helper sets its priority before serving
            assert store.helper_pid is not None
            return os.getpriority(os.PRIO_PROCESS, store.helper_pid)
        finally:
            await store.close()

    assert asyncio.run(scenario()) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + HELPER_NICE)


def test_should_exit_when_its_parent_is_killed(tmp_path):
    script = (
        "import asyncio, sys\n"
        "from ingestor.store_helper import ProcessAsyncStore\n"
        "async def main():\n"
        "    store = ProcessAsyncStore(sys.argv[1])\n"
        "    await store.put('k', b'v')\n"
        "    print(store.helper_pid, flush=True)\n"
        "    await asyncio.sleep(3600)\n"
        "asyncio.run(main())\n")
    parent = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                              stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONPATH": str(Path.cwd())})
    try:
        assert parent.stdout is not None
        helper = int(parent.stdout.readline())
        assert alive(helper)
        parent.kill()
        parent.wait(WAIT_S)
        asyncio.run(until(lambda: not alive(helper), "the orphaned helper to exit"))
    finally:
        parent.kill()
        parent.wait(WAIT_S)
    assert LocalStore(tmp_path).get("k").data == b"v"


def test_should_be_the_ingestors_default_and_nobody_elses(tmp_path):
    url = (tmp_path / "store").as_uri()
    assert isinstance(open_async_store(url).inner, ThreadedAsyncStore)  # type: ignore[attr-defined]
    config_file = tmp_path / "icefloe.toml"
    config_file.write_text(f'[store]\nurl = "{url}"\n')
    options = store_options(load_config(config_file))
    assert options.local_store is ProcessAsyncStore
    assert isinstance(open_async_store(url, options).inner, ProcessAsyncStore)  # type: ignore[attr-defined]
    config_file.write_text(f'[store]\nurl = "{url}"\n[ingestor]\nstore_helper = false\n')
    assert store_options(load_config(config_file)).local_store is None
    assert isinstance(open_async_store(url, StoreOptions()).inner, ThreadedAsyncStore)  # type: ignore[attr-defined]


# -- publishing in the helper (the ingestor's flushes) -------------------------------------


def test_should_choose_the_helpers_publisher_from_the_config_alone(tmp_path):
    """The helper appends to the manifest only on a plain ``file://`` store with the helper
    on: not with a control store elsewhere, not while faults are injected, not on S3."""
    config = make_config(tmp_path / "store")
    assert publishes_in_helper(config, {})
    assert not publishes_in_helper(make_config(tmp_path / "store", store_helper=False), {})
    assert not publishes_in_helper(config, {FAULTS_ENV: str(tmp_path / "faults.json")})
    split = msgspec.structs.replace(config, store=msgspec.structs.replace(
        config.store, control_url=(tmp_path / "control").as_uri()))
    assert not publishes_in_helper(split, {})
    same = msgspec.structs.replace(config, store=msgspec.structs.replace(
        config.store, control_url=config.store.url + "/"))
    assert publishes_in_helper(same, {})
    s3 = msgspec.structs.replace(config, store=msgspec.structs.replace(
        config.store, url="s3://bucket/prefix"))
    assert not publishes_in_helper(s3, {})



async def _ingest(runtime: IngestorRuntime, n: int) -> int:
    stream = runtime.service.stream("pageviews")
    body = b"[" + b",".join(b'{"user_id":"u%d"}' % i for i in range(n)) + b"]"
    return await runtime.service.ingest(stream, stream.from_json(body))


def test_should_write_and_append_each_batch_inside_the_helper(tmp_path):
    """One round trip per flush: the helper's own producer appends, and this process
    only sees its id and counters."""
    url = (tmp_path / "store").as_uri()

    async def scenario() -> None:
        async with running(make_config(tmp_path / "store")) as runtime:
            publisher = runtime.publisher
            assert isinstance(publisher, HelperPublisher)
            assert publisher.producer_id is None  # the helper makes it on the first batch
            for n in (3, 4, 5):
                assert await _ingest(runtime, n) == n
            manifest = await read_manifest(url)
            assert [e.record_count for e in manifest.entries] == [3, 4, 5]
            assert {e.producer_id for e in manifest.entries} == {publisher.producer_id}
            assert manifest.producers[publisher.producer_id].batch == 3
            assert publisher.stats.appended == 3
            assert publisher.stats.writes == 3
            metrics = runtime.metrics.registry.get_sample_value
            assert metrics("icefloe_ingest_manifest_batches_appended_total") == 3

    asyncio.run(scenario())


def test_should_answer_503_when_the_helper_dies_mid_flush_and_go_on_with_a_new_producer(
        tmp_path, caplog):
    url = (tmp_path / "store").as_uri()

    async def scenario() -> None:
        async with running(make_config(tmp_path / "store")) as runtime:
            publisher = runtime.publisher
            assert isinstance(publisher, HelperPublisher)
            assert await _ingest(runtime, 2) == 2
            first_id, helper = publisher.producer_id, publisher.helper.helper_pid
            # hold the manifest's lock: the helper's append blocks mid-CAS, then dies.
            # Locks are striped over 64 files, so one batch key in 64 shares the manifest's
            # stripe and the helper blocks on the batch's rename instead: mid-flush either
            # way, so wait for the helper's temp file wherever it is.
            with LocalStore(tmp_path / "store")._locked(ManifestConfig().key):
                waiting = asyncio.create_task(_ingest(runtime, 3))
                await until(lambda: publisher.helper.helper_pid == helper and any(
                    n.startswith(".icefloe-tmp")
                    for _, _, names in os.walk(tmp_path / "store") for n in names),
                    "the helper's temp file of a batch or the manifest")
                os.kill(helper, signal.SIGKILL)
                with pytest.raises(Unavailable) as refused:
                    await waiting
            assert refused.value.code == "store_unavailable"  # 503: never acknowledged
            assert await _ingest(runtime, 4) == 4
            assert publisher.producer_id not in (None, first_id)
            assert publisher.stats.appended == 2  # one batch per helper
            manifest = await read_manifest(url)
            assert [e.record_count for e in manifest.entries] == [2, 4]
            assert [e.producer_id for e in manifest.entries] == [first_id,
                                                                 publisher.producer_id]

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert "the store helper restarted" in caplog.text


def test_should_refuse_with_queue_full_from_the_helpers_producer(tmp_path):
    config = make_config(tmp_path / "store")
    config = msgspec.structs.replace(config, manifest=ManifestSection(max_entries=1))

    async def scenario() -> None:
        async with running(config) as runtime:
            assert isinstance(runtime.publisher, HelperPublisher)
            assert await _ingest(runtime, 1) == 1
            with pytest.raises(Overloaded) as full:
                await _ingest(runtime, 1)
            assert full.value.code == "queue_full"
            assert runtime.publisher.stats.queue_full == 1

    asyncio.run(scenario())


def test_should_publish_from_this_process_when_faults_are_injected_or_no_helper(
        tmp_path, monkeypatch):
    """Injected faults must see every write, so a faulty store never hands them over."""
    async def kind(config: Any) -> type:
        async with running(config) as runtime:
            assert await _ingest(runtime, 1) == 1
            return type(runtime.publisher)

    faults = tmp_path / "faults.json"
    faults.write_text('{"rules": []}')
    assert asyncio.run(kind(make_config(tmp_path / "a", store_helper=False))) is StorePublisher
    monkeypatch.setenv(FAULTS_ENV, str(faults))
    assert asyncio.run(kind(make_config(tmp_path / "b"))) is StorePublisher


def test_should_send_a_submitted_job_before_the_loop_turn_ends(tmp_path):
    """``submit_job`` is how a flush sealed mid-turn gets written while the turn goes on:
    the job must reach the helper from within the call, not when the loop next runs."""
    builder = BatchBuilder()
    builder.add_framed(frame_events("pageviews", 0, ["e1"], [b'{"user_id":"u"}']), 1)

    def job() -> PublishJob:
        return PublishJob(new_batch_key(), builder.to_block(), ("pageviews",), 0,
                          ManifestConfig(), RetryPolicy())

    async def scenario() -> None:
        store = ProcessAsyncStore(tmp_path)
        try:
            assert store.submit_job(job()) is None  # no helper yet: run_job starts one
            await store.put("warm", b"up")
            batch = job()
            sent = store.submit_job(batch)
            assert sent is not None
            deadline = time.monotonic() + WAIT_S
            while not (tmp_path / batch.key).exists():  # no await: the loop is held here
                assert time.monotonic() < deadline, "the job never reached the helper"
                time.sleep(0.005)
            outcome = await sent
            assert outcome.error is None
            assert outcome.sequence == 0  # the manifest's first entry
        finally:
            await store.close()

    asyncio.run(scenario())


def test_should_send_a_batch_block_out_of_band_to_the_helper():
    """The records go from the builder's buffer to the socket without being copied into
    the pickle, and arrive intact (as a view of the request frame)."""
    from ingestor.store_helper import _framed, _unframed

    builder = BatchBuilder()
    for i in range(200):
        builder.add_framed(frame_events("pageviews", i, [f"e{i}"], [b'{"user_id":"u%d"}' % i]),
                           1)
    block = builder.to_block()
    parts, offsets = _framed((7, "job", (block,), {}))
    assert offsets == []  # no arena: in the socket
    assert sum(len(part) for part in parts[2:3]) < 1024  # the pickle: no records inside
    frame = memoryview(b"".join(parts)[4:])
    request_id, op, (arrived,), kwargs = _unframed(frame)
    assert (request_id, op, kwargs) == (7, "job", {})
    assert isinstance(arrived.block, memoryview)
    assert bytes(arrived.block) == bytes(block.block)
    assert arrived.encode() == block.encode()  # the same batch file either way
    # an in-band pickle (any other pickler) still carries the records itself
    import pickle
    assert bytes(pickle.loads(pickle.dumps(block)).block) == bytes(block.block)


def test_should_let_a_job_in_flight_finish_before_the_helper_exits(tmp_path):
    """The job loop's thread is a daemon: without the wait, an append in flight when the
    parent goes away would be cut off at exit."""
    from ingestor.store_helper import _JobLoop

    class SlowWrite:
        async def run(self, store: LocalStore, state: dict[str, Any]) -> None:
            await asyncio.sleep(0.3)
            store.put("late", b"done")

    answers: list[tuple[int, bool, Any]] = []
    answered = threading.Event()

    def answer(*reply: Any) -> None:
        answers.append(reply)
        answered.set()

    jobs = _JobLoop(LocalStore(tmp_path), answer)
    jobs.submit(7, SlowWrite())  # type: ignore[arg-type]
    assert jobs.finish() == 0  # none left behind
    assert LocalStore(tmp_path).get("late").data == b"done"
    assert answered.wait(WAIT_S)  # the answer follows the result, from the loop's thread
    assert answers == [(7, True, None)]


def test_should_give_up_on_a_stuck_job_at_exit_within_its_budget(tmp_path):
    """A job that never finishes must not hold the helper (and the ingestor's shutdown,
    which waits for it) forever: the helper exits after its budget, saying how many it
    left, before its parent would have to kill it."""
    from ingestor.store_helper import _JobLoop

    class Stuck:
        async def run(self, store: LocalStore, state: dict[str, Any]) -> None:
            await asyncio.Event().wait()

    jobs = _JobLoop(LocalStore(tmp_path), lambda *reply: None)
    jobs.submit(1, Stuck())  # type: ignore[arg-type]
    started = time.monotonic()
    assert jobs.finish(timeout_s=0.2) == 1
    assert time.monotonic() - started < 5.0
    for stuck in list(jobs.running):
        stuck.cancel()


def _large_block(events: int = 2000) -> Any:
    builder = BatchBuilder()
    for i in range(events):
        builder.add_framed(frame_events("pageviews", i, [f"e{i}"],
                                        [b'{"user_id":"user-%06d","n":%d}' % (i, i * 7)]), 1)
    return builder.to_block()


def test_should_carry_a_large_block_in_the_shared_arena_not_the_socket():
    """A block past MIN_SHARED_BYTES is copied into the arena and only its place travels in
    the frame; the helper's view of the arena gives the same records and the same file."""
    from ingestor.helper_arena import MIN_SHARED_BYTES, Arena, attach
    from ingestor.store_helper import _framed, _unframed

    arena = Arena.create(1024 * 1024)
    assert arena is not None, "this Linux machine has memfd_create"
    try:
        block = _large_block()
        assert len(block) >= MIN_SHARED_BYTES
        parts, offsets = _framed((3, "job", (block,), {}), arena)
        assert offsets == [0]
        assert arena.used_bytes == len(block)
        frame = b"".join(parts)
        assert len(frame) < 1024  # neither the pickle nor the frame holds the records
        helper_view = attach(os.dup(arena.fd), arena.size)  # as the helper maps it
        _, _, (arrived,), _ = _unframed(memoryview(frame)[4:], helper_view)
        assert bytes(arrived.block) == bytes(block.block)
        assert arrived.encode() == block.encode()
        # a frame that names the arena cannot be read without one: said, not misread
        with pytest.raises(ValueError, match="shared arena"):
            _unframed(memoryview(frame)[4:])
        # small buffers stay in the frame
        small = BatchBuilder()
        small.add_framed(frame_events("pageviews", 0, ["e"], [b'{"user_id":"u"}']), 1)
        _, none = _framed((4, "job", (small.to_block(),), {}), arena)
        assert none == []
    finally:
        arena.close()


def test_should_place_first_fit_reuse_released_ranges_and_fall_back_when_full():
    from ingestor.helper_arena import Arena

    arena = Arena.create(100)
    assert arena is not None
    try:
        a = arena.place(memoryview(b"a" * 40))
        b = arena.place(memoryview(b"b" * 40))
        assert (a, b) == (0, 40)
        assert arena.place(memoryview(b"c" * 40)) is None  # 20 bytes left: the socket
        arena.release(0)
        assert arena.place(memoryview(b"d" * 30)) == 0  # the first range that holds it
        assert arena.place(memoryview(b"e" * 20)) == 80
        assert arena.place(memoryview(b"f" * 11)) is None  # 10 free at 30: too small
        assert arena.place(memoryview(b"g" * 10)) == 30
        assert arena.used_bytes == 100
        arena.release(40)
        arena.release(40)  # twice: harmless
        assert arena.used_bytes == 60
    finally:
        arena.close()


@pytest.mark.parametrize("shared_memory", [True, False])
def test_should_write_a_large_batch_through_the_helper_either_way(tmp_path, shared_memory):
    """A real helper writes a block sent through the arena (or, without one, the socket)
    into the same batch file, and the arena is free again once the job is answered."""
    block = _large_block()

    async def scenario() -> None:
        store = ProcessAsyncStore(tmp_path / "store", shared_memory=shared_memory)
        try:
            await store.put("warm", b"up")  # starts the helper
            channel = store._channel
            assert channel is not None
            assert (channel.arena is not None) is shared_memory
            jobs = [PublishJob(new_batch_key(), block, ("pageviews",), 0, ManifestConfig(),
                               RetryPolicy()) for _ in range(3)]
            outcomes = await asyncio.gather(*(store.run_job(job) for job in jobs))
            assert [o.error for o in outcomes] == [None] * 3
            for job in jobs:
                data = (tmp_path / "store" / job.key).read_bytes()
                assert data == block.encode()
            if channel.arena is not None:
                assert channel.arena.used_bytes == 0
                assert channel.shared == {}
        finally:
            await store.close()

    asyncio.run(scenario())


def test_should_give_a_new_helper_a_fresh_arena_after_the_old_one_dies(tmp_path):
    """A helper's death closes the arena it shared (a range it was reading may be half
    used), and the helper started for the next operation gets a new one that large blocks
    go through as before."""
    block = _large_block()

    async def scenario() -> None:
        store = ProcessAsyncStore(tmp_path / "store")
        try:
            await store.put("warm", b"up")
            first_channel, first_pid = store._channel, store.helper_pid
            assert first_channel is not None
            assert first_pid is not None
            old = first_channel.arena
            assert old is not None
            os.kill(first_pid, signal.SIGKILL)
            await until(lambda: first_channel.closed, "the dead helper's channel to close")
            assert old._map.closed
            with pytest.raises(OSError, match="Bad file descriptor"):
                os.fstat(old.fd)
            job = PublishJob(new_batch_key(), block, ("pageviews",), 0, ManifestConfig(),
                             RetryPolicy())
            outcome = await store.run_job(job)
            assert outcome.error is None
            channel = store._channel
            assert channel is not None
            assert channel is not first_channel
            assert store.helper_pid not in (None, first_pid)
            assert channel.arena is not None
            assert channel.arena is not old
            assert not channel.arena._map.closed
            assert (tmp_path / "store" / job.key).read_bytes() == block.encode()
            assert channel.arena.used_bytes == 0
            assert channel.shared == {}
        finally:
            await store.close()

    asyncio.run(scenario())
