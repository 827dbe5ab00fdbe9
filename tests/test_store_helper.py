"""The local store's helper process (``[ingestor] store_helper``): what the contract suite
cannot see — it dies, its parent dies, it is closed, and who gets it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from icefloe.config import load_config
from icefloe.errors import NotFound, TransientStoreError
from icefloe.store import StoreOptions, open_async_store
from icefloe.store.adapters import ThreadedAsyncStore
from icefloe.store.local import LocalStore
from icefloe.store.process import HELPER_NICE, ProcessAsyncStore
from ingestor.runtime import store_options

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
        "from icefloe.store.process import HELPER_NICE, ProcessAsyncStore\n"
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
    assert options.local_helper
    assert isinstance(open_async_store(url, options).inner, ProcessAsyncStore)  # type: ignore[attr-defined]
    config_file.write_text(f'[store]\nurl = "{url}"\n[ingestor]\nstore_helper = false\n')
    assert not store_options(load_config(config_file)).local_helper
    assert isinstance(open_async_store(url, StoreOptions()).inner, ThreadedAsyncStore)  # type: ignore[attr-defined]
