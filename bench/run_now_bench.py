"""``icefloe run`` against a warm collector (``POST /v1/run``, issue #43 item 4).

Measures, in one run on a local store, a SQLite Iceberg catalog and the real collector
(``run_collector`` with its default Spark ``local[2]`` engine, its HTTP port, the example
models of ``examples/models`` over ``web.pageviews``):

* the collector's start until it is active (JVM start, Spark's Python workers, catalog):
  what an ``icefloe run`` that starts its own Spark pays before its first commit at least;
* after a warm-up request, ``POST /v1/run`` with N events queued (10 batch files), for N in
  1k and 10k (``--quick``: 1k and 10k once; full: 3 rounds each, the median): the whole
  answer (commit of everything queued + the example models), and its two parts as the
  collector reports them (the drain's runs, the models);
* the ``icefloe run`` command itself (a child process: Python start, lease read, the
  request) with 10k queued, as many rounds.

Each round with 10k queued is a row of its own (the runs of record), beside the medians.

The collector's own poll and commit intervals are set to 60 s, so only the requests commit
(what a user with queued events sees). Target: 10k queued events answered in <= 2 s.

Usage: python bench/run_now_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, local_config, print_table, publish_files, write_json

from icefloe.config import Config, load_config
from icefloe.manifest.publish import build_batch
from icefloe.tokens import hash_token

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ifl_bench_run_now"


def config_for(root: Path) -> Config:
    example = load_config(ROOT / "examples" / "icefloe.toml")
    stream = example.stream("pageviews")
    assert stream is not None
    shutil.copytree(ROOT / "examples" / "models", root / "models")
    config = local_config(root, (stream,), host="127.0.0.1", metrics_port=0,
                          commit_interval_s=60.0, poll_interval_s=60.0,
                          models_dir=str(root / "models"))
    return msgspec.structs.replace(config, admin=msgspec.structs.replace(
        config.admin, tokens=(hash_token(TOKEN, log2_n=10),)))


def queue(config: Config, events: int, first: int, batches: int = 10) -> None:
    """``events`` page views in ``batches`` batch files, appended to the manifest."""
    now_ms = int(time.time() * 1000)
    per = events // batches

    def one(i: int) -> tuple[str, str, int, bytes]:
        body = {"user_id": f"u{i % 500}", "session_id": f"s{i % 2000}",
                "url": f"/p/{i % 50}", "duration_ms": i % 9000,
                "ts": f"2026-11-{10 + i % 5}T09:00:00Z"}
        return ("pageviews", f"v{i}", now_ms, msgspec.json.encode(body))
    files = (build_batch(one(first + b * per + i) for i in range(per)) for b in range(batches))
    asyncio.run(publish_files(config.store.url, files))


class Collector:
    """The real collector in a thread: ``port`` once active."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.port: int | None = None
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop: asyncio.Event | None = None
        threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True).start()

    async def _main(self) -> None:
        from collector.runner import run_collector  # why: pyspark

        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()

        def on_ready(info: Any) -> None:
            self.port = info.metrics_port
            self.ready.set()
        await run_collector(self.config, stop=self.stop, on_ready=on_ready)

    def close(self) -> None:
        if self.loop is not None and self.stop is not None:
            self.loop.call_soon_threadsafe(self.stop.set)


def ask(port: int) -> dict[str, Any]:
    response = httpx.post(f"http://127.0.0.1:{port}/v1/run", json={},
                          headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600)
    response.raise_for_status()
    return dict(response.json())


def cli(root: Path, port: int) -> float:
    """``icefloe run`` as a user types it (a child process), in seconds."""
    path = root / "cli.toml"
    path.write_text(f'[store]\nurl = "{(root / "store").as_uri()}"\n'
                    f'[collector]\nhost = "127.0.0.1"\nmetrics_port = {port}\n')
    env = {**os.environ, "ICEFLOE_ADMIN_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "icefloe", "run", "--config", str(path)], env=env,
                   check=True, capture_output=True, timeout=600)
    return time.perf_counter() - started


def main() -> None:
    parser = bench_parser(__doc__, "one round per size")
    args = parser.parse_args()
    rounds = 1 if args.quick else 3
    results: list[Result] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = config_for(root)
        started = time.perf_counter()
        collector = Collector(config)
        assert collector.ready.wait(900), "the collector did not become active"
        assert collector.port is not None
        start_s = time.perf_counter() - started
        results.append(Result("collector start until active (JVM, workers, catalog)",
                              start_s, "s"))
        queue(config, 100, 0, batches=1)
        ask(collector.port)  # warm-up: the models' first Spark jobs
        first = 100
        for events in (1_000, 10_000):
            whole, drain, models = [], [], []
            for round_ in range(rounds):
                queue(config, events, first)
                first += events
                t0 = time.perf_counter()
                report = ask(collector.port)
                whole.append(time.perf_counter() - t0)
                drain.append(sum(r["seconds"] for r in report["runs"]))
                models.append(sum(m["seconds"] for m in report["models"]))
                if events == 10_000:  # the target's size: each run in the table
                    results.append(Result(f"POST /v1/run, {events:,} queued events, run "
                                          f"{round_ + 1}: commit + models", whole[-1], "s",
                                          baseline=start_s))
            results += [
                Result(f"POST /v1/run, {events:,} queued events: commit + models",
                       statistics.median(whole), "s", baseline=start_s),
                Result(f"POST /v1/run, {events:,} queued events: commit part",
                       statistics.median(drain), "s"),
                Result(f"POST /v1/run, {events:,} queued events: models part",
                       statistics.median(models), "s")]
        for round_ in range(rounds):
            queue(config, 10_000, first)
            first += 10_000
            results.append(Result(f"icefloe run (child process), 10,000 queued events, run "
                                  f"{round_ + 1}", cli(root, collector.port), "s",
                                  baseline=start_s))
        collector.close()
    print_table("icefloe run against a warm collector", results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
