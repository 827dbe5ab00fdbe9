"""``icefloe run`` while a collector holds the lease asks that collector (``POST /v1/run``)
and never starts a Spark of its own (#43, item 4).

A real collector (``run_collector`` with its HTTP port, the LocalEngine decoding, the models
on the test session's Spark) runs in a thread with long poll and commit intervals, so only
the request makes it commit; ``icefloe run`` runs as a child process (to check that it
never imports pyspark) and in-process for the refusals. The fenced case takes the lease
over from inside the drain's run (the collector's ``after_job`` hook).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from ingest_support import TOKEN, TOKEN_HASH
from process_support import child_env, free_port

from collector.metrics import CollectorMetrics
from collector.run_now import Refusal, TokenCheck, _options
from icefloe.collector_address import Address
from icefloe.collector_address import publish as publish_address
from icefloe.collector_address import read as read_address
from icefloe.config import Config, load_config
from icefloe.manifest.sharded_consumer import ShardedConsumer
from icefloe.store import open_async_store
from icefloe_app.cli import main
from tests.collector_support import BASE_MS, collector_config, publish_sync, read_table

ROOT = Path(__file__).resolve().parents[2]
PAGEVIEWS = load_config(ROOT / "examples" / "icefloe.toml").stream("pageviews")
BROKEN = "-- materialized: table\n-- target: mart.broken\nSELECT no_such_column FROM " \
         "web.pageviews\n"
PROBE = ("import sys; from icefloe_app.cli import main; code = main(sys.argv[1:]); "
         "print('PYSPARK-LOADED' if 'pyspark' in sys.modules else 'NO-PYSPARK'); "
         "sys.exit(code)")
"""``icefloe run`` in a child that reports whether anything imported pyspark."""


def view(i: int, day: int, url: str) -> tuple[str, str, int, bytes]:
    payload = msgspec.json.encode({"user_id": f"u{i}", "session_id": f"s{i % 4}", "url": url,
                                   "duration_ms": i, "ts": f"2026-11-{20 + day}T09:00:00Z"})
    return ("pageviews", f"v{i}", BASE_MS + i, payload)


def expected_mart(events: list[tuple[str, str, int, bytes]]) -> dict[tuple[str, str], int]:
    views: dict[tuple[str, str], int] = collections.Counter()
    for _, _, _, payload in events:
        event = msgspec.json.decode(payload)
        views[(event["ts"][:10], event["url"].lower())] += 1
    return dict(views)


def mart_views(config: Config) -> dict[tuple[str, str], int]:
    return {(str(r["day"]), r["url"]): r["views"]
            for r in read_table(config, "mart.daily_traffic").to_pylist()}


class Live:
    """``run_collector`` with its HTTP port in a thread; ``port`` once it is active."""

    def __init__(self, config: Config, hook: Callable[[str], None] | None = None) -> None:
        self.config, self.hook = config, hook
        self.metrics = CollectorMetrics()
        self.port: int | None = None
        self.code: int | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        from collector.runner import run_collector  # why: pyspark via the runner
        from pipeline.load.run import LocalEngine  # why: as above

        async def go() -> int:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

            def ready(info: Any) -> None:
                self.port = info.metrics_port
                self._ready.set()
            return await run_collector(self.config, stop=self._stop, engine=LocalEngine(),
                                       metrics=self.metrics, on_ready=ready, hook=self.hook)
        try:
            self.code = asyncio.run(go())
        except BaseException as exc:
            self.error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> Live:
        self._thread.start()
        assert self._ready.wait(120)
        assert self.error is None, self.error
        deadline = time.monotonic() + 60  # its first (empty) run is done: it sleeps now
        while self.metrics.health.progress_at is None:
            assert self.error is None, self.error
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(120)
        assert not self._thread.is_alive()

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def setup(root: Path, hook: Callable[[str], None] | None = None, **collector: Any) -> Live:
    """A collector config (admin token, models folder, long intervals) and the CLI's file."""
    assert PAGEVIEWS is not None
    folder = root / "models"
    shutil.copytree(ROOT / "examples" / "models", folder)
    config = collector_config(root, (PAGEVIEWS,), models_dir=str(folder),
                              commit_interval_s=60.0, poll_interval_s=60.0, **collector)
    config = msgspec.structs.replace(config, admin=msgspec.structs.replace(
        config.admin, tokens=(TOKEN_HASH,)))
    return Live(config, hook)


def cli_config(live: Live, root: Path) -> Path:
    """The config ``icefloe run`` reads: the same store, and the collector's HTTP port."""
    path = root / "cli.toml"
    path.write_text(f'[store]\nurl = "{live.config.store.url}"\n[manifest]\nlease_s = 2.0\n'
                    f'[collector]\nhost = "127.0.0.1"\nmetrics_port = {live.port}\n')
    return path


@pytest.fixture
def live(tmp_path: Path, spark: Any) -> Iterator[Live]:
    with setup(tmp_path) as running:
        yield running
    assert running.error is None
    assert running.code == 0


def test_run_asks_the_live_collector_and_starts_no_spark(live: Live, tmp_path: Path) -> None:
    config = live.config
    events = [view(i, i % 2, "/A" if i % 3 else "/b") for i in range(40)]
    publish_sync(config, [events[:25], events[25:]])
    env = {**child_env(), "PYTHONPATH": str(ROOT), "ICEFLOE_ADMIN_TOKEN": TOKEN}
    started = time.monotonic()
    child = subprocess.run([sys.executable, "-c", PROBE, "run", "--config",
                            str(cli_config(live, tmp_path))], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert child.returncode == 0, child.stderr
    assert child.stdout.rstrip().endswith("NO-PYSPARK")  # the command started no Spark
    assert "web.pageviews: 40 rows" in child.stdout
    assert "mart_daily_traffic" in child.stdout
    assert "ran" in child.stdout
    assert "catalog version" in child.stdout
    print(f"icefloe run via the collector: {took:.2f} s for 2 batches (40 events), "
          f"child start included:\n{child.stdout}")
    # Everything queued was committed by the collector before it answered, exactly once.
    raw = read_table(config, "web.pageviews")
    assert sorted(raw.column("_event_id").to_pylist()) == sorted(e[1] for e in events)
    assert mart_views(config) == expected_mart(events)
    assert live.sample("icefloe_collector_run_now_requests_total", outcome="ok") == 1
    assert live.sample("icefloe_collector_run_now_seconds_count") == 1


def test_run_says_which_tables_are_parked_and_exits_1(tmp_path: Path, spark: Any) -> None:
    """The queue is committed, but a parked table's rows wait in its staging area: the
    answer names the table and why, and ``icefloe run`` warns and exits 1 rather than
    report a plain success."""
    from testing.catalog_pointer import lost, metadata_pointer

    with setup(tmp_path, park_after_failures=1, park_retry_s=3600) as live:
        config = live.config
        shutil.rmtree(tmp_path / "models")  # (the mart cannot run on a table not loadable)
        publish_sync(config, [[view(0, 0, "/a")]])
        env = {**child_env(), "PYTHONPATH": str(ROOT), "ICEFLOE_ADMIN_TOKEN": TOKEN}
        argv = [sys.executable, "-m", "icefloe", "run", "--config",
                str(cli_config(live, tmp_path))]
        first = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=120)
        assert first.returncode == 0, first.stderr
        good = metadata_pointer(config.catalog.uri, "web.pageviews")
        assert good is not None
        metadata_pointer(config.catalog.uri, "web.pageviews", lost(good))
        publish_sync(config, [[view(1, 0, "/a")]])
        failing = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True,
                                 text=True, timeout=120)
        assert failing.returncode == 75, failing.stderr  # the run failed: parks the table
        publish_sync(config, [[view(2, 0, "/a")]])
        parked = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        assert parked.returncode == 1, (parked.stdout, parked.stderr)
        assert "table web.pageviews is parked (" in parked.stderr
        answer = subprocess.run([*argv, "--json"], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert answer.returncode == 1
        assert list(json.loads(answer.stdout)["parked"]) == ["web.pageviews"]
    assert live.error is None


def test_refusals_are_precise(live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    path = str(cli_config(live, tmp_path))
    monkeypatch.delenv("ICEFLOE_COLLECTOR_URL", raising=False)
    monkeypatch.delenv("ICEFLOE_ADMIN_TOKEN", raising=False)
    assert main(["run", "--config", path]) == 2
    err = capsys.readouterr().err
    assert "holds the queue's lease" in err
    assert "set ICEFLOE_ADMIN_TOKEN" in err

    monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", "ifl_wrong")
    assert main(["run", "--config", path]) == 4
    assert "answered 403 forbidden: this token is not an admin token" in \
        capsys.readouterr().err

    monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", TOKEN)
    nobody = f"http://127.0.0.1:{free_port()}"
    assert main(["run", "--config", path, "--collector-url", nobody]) == 3
    err = capsys.readouterr().err
    assert f"does not answer at {nobody}" in err
    assert "--takeover" in err

    bad = Path(live.config.collector.models_dir) / "bad.sql"
    bad.write_text("-- materialized: nonsense\nSELECT 1 AS x\n")
    assert main(["run", "--config", path]) == 2  # a model file the collector cannot load
    err = capsys.readouterr().err
    assert "answered 422 bad_models" in err
    assert "bad.sql" in err or "nonsense" in err
    bad.unlink()

    (Path(live.config.collector.models_dir) / "broken.sql").write_text(BROKEN)
    publish_sync(live.config, [[view(i, 0, "/c") for i in range(3)]])
    assert main(["run", "--config", path, "--json"]) == 1  # a model failed
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == ["broken"]
    broken = next(m for m in report["models"] if m["name"] == "broken")
    assert broken["state"] == "failed"
    assert "no_such_column" in broken["reason"].lower()
    assert sum(r["entries"] for r in report["runs"]) == 1
    assert live.sample("icefloe_collector_run_now_requests_total",
                       outcome="model_failed") == 1


def published(config: Config) -> Address:
    """The address the live collector published once active (in the background: awaited)."""
    async def get() -> Address | None:
        store = open_async_store(config.store.url)
        try:
            return await read_address(store)
        finally:
            await store.close()
    deadline = time.monotonic() + 30
    while (address := asyncio.run(get())) is None:
        assert time.monotonic() < deadline, "no collector address published"
        time.sleep(0.05)
    return address


def test_run_finds_the_holder_where_it_published_its_address(
        live: Live, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A config whose metrics_port is not the holder's (``icefloe up``'s standby serves on a
    free port) still reaches it: the holder published its address when it took the lease.
    A record naming another holder is not used (the config's address is asked)."""
    address = published(live.config)
    assert address.port == live.port
    assert address.epoch >= 1
    monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", TOKEN)
    monkeypatch.delenv("ICEFLOE_COLLECTOR_URL", raising=False)
    elsewhere = free_port()
    path = tmp_path / "elsewhere.toml"
    path.write_text(f'[store]\nurl = "{live.config.store.url}"\n[manifest]\nlease_s = 2.0\n'
                    f'[collector]\nhost = "127.0.0.1"\nmetrics_port = {elsewhere}\n')
    publish_sync(live.config, [[view(i, 1, "/p") for i in range(4)]])
    assert main(["run", "--config", str(path)]) == 0
    out = capsys.readouterr()
    assert f"at http://127.0.0.1:{live.port} to commit" in out.err
    assert "web.pageviews: 4 rows" in out.out

    async def other_holder() -> None:
        store = open_async_store(live.config.store.url)
        try:
            await publish_address(store, msgspec.structs.replace(address,
                                                                 holder="collector-gone"))
        finally:
            await store.close()
    asyncio.run(other_holder())
    assert main(["run", "--config", str(path)]) == 3
    assert f"does not answer at http://127.0.0.1:{elsewhere}" in capsys.readouterr().err


def test_a_collector_fenced_mid_request_answers_retriable(tmp_path: Path, spark: Any,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    armed = threading.Event()

    def take_over(stage: str) -> None:
        if stage == "after_job" and armed.is_set():
            armed.clear()
            config = running.config

            async def thief() -> None:
                store = open_async_store(config.store.url)
                try:
                    await ShardedConsumer(store, config.manifest.build(),
                                          holder="thief").initialize()
                finally:
                    await store.close()
            thread = threading.Thread(target=asyncio.run, args=(thief(),))
            thread.start()
            thread.join(30)

    running = setup(tmp_path, take_over)
    with running:
        publish_sync(running.config, [[view(i, 0, "/a") for i in range(5)]])
        armed.set()
        monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", TOKEN)
        monkeypatch.delenv("ICEFLOE_COLLECTOR_URL", raising=False)
        assert main(["run", "--config", str(cli_config(running, tmp_path))]) == 75
        err = capsys.readouterr().err
        assert "answered 503 fenced" in err
        assert "retry" in err
    assert running.code == 3  # the collector itself exits as fenced
    assert running.sample("icefloe_collector_run_now_requests_total", outcome="fenced") == 1


def test_tokens_and_bodies_are_checked_before_anything_queues() -> None:
    with pytest.raises(Refusal) as off:
        TokenCheck(()).check(f"Bearer {TOKEN}")
    assert off.value.status == 403
    assert "[admin] tokens" in str(off.value)
    check = TokenCheck((TOKEN_HASH,))
    check.check(f"Bearer {TOKEN}")
    for header, status in ((None, 401), ("Basic abc", 401), ("Bearer nope", 403)):
        with pytest.raises(Refusal) as refused:
            check.check(header)
        assert refused.value.status == status
    assert _options(b"") == (False, 300.0)
    assert _options(b'{"full_refresh": true, "timeout_s": 2}') == (True, 2.0)
    for body in (b"[", b'{"other": 1}', b'{"timeout_s": 0}', b'{"full_refresh": 1}'):
        with pytest.raises(Refusal) as bad:
            _options(body)
        assert bad.value.status == 400


def test_a_body_length_that_is_no_number_answers_400_and_queues_nothing() -> None:
    """A ``Content-Length`` that is not a number gets an answer, not a dropped connection,
    and never reaches the request handler."""
    import socket

    from prometheus_client import CollectorRegistry

    from collector.http import Health, HttpServer

    handled: list[bytes] = []

    class Recording:
        def handle(self, header: str | None, body: bytes) -> tuple[int, dict[str, object]]:
            handled.append(body)
            return 200, {}

    server = HttpServer("127.0.0.1", 0, CollectorRegistry(), Health(), run_now=Recording())
    try:
        for length, status in ((b"abc", b"400"), (b"99999999", b"413")):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                sock.sendall(b"POST /v1/run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t"
                             b"\r\nContent-Length: " + length + b"\r\n\r\n")
                answer = b""
                while chunk := sock.recv(4096):
                    answer += chunk
                    if b"}" in answer:
                        break
            assert answer.startswith(b"HTTP/1.0 " + status) or \
                answer.startswith(b"HTTP/1.1 " + status), answer[:80]
            if status == b"400":
                assert b"Content-Length is not a whole number" in answer
        assert handled == []
    finally:
        server.shutdown()


def test_help_names_the_token_and_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "ICEFLOE_ADMIN_TOKEN" in text
    assert "--collector-url" in text
    assert "75" in text
    assert os.environ.get("ICEFLOE_ADMIN_TOKEN") != TOKEN  # no leak between tests


def test_a_request_not_done_in_time_answers_504_naming_what_runs(
        tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    slow = threading.Event()

    def hold(stage: str) -> None:
        if stage == "after_job" and slow.is_set():
            slow.clear()
            time.sleep(1.0)  # the run's Spark job "takes" longer than the request may

    running = setup(tmp_path, hold)
    with running:
        publish_sync(running.config, [[view(i, 0, "/a") for i in range(5)]])
        slow.set()
        monkeypatch.setenv("ICEFLOE_ADMIN_TOKEN", TOKEN)
        monkeypatch.delenv("ICEFLOE_COLLECTOR_URL", raising=False)
        path = str(cli_config(running, tmp_path))
        assert main(["run", "--config", path, "--timeout", "0.3"]) == 75
        err = capsys.readouterr().err
        assert "answered 504 timeout" in err
        assert "still running: committing the queue" in err
        assert main(["run", "--config", path, "--json"]) == 0  # done meanwhile: nothing new
        assert json.loads(capsys.readouterr().out)["runs"] == []
    assert sorted(read_table(running.config, "web.pageviews").column("_event_id")
                  .to_pylist()) == sorted(f"v{i}" for i in range(5))
    assert running.sample("icefloe_collector_run_now_requests_total", outcome="timeout") == 1
