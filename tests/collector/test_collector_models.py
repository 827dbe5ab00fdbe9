"""The collector keeps selected SQL models fresh: it runs them after the commits that feed
them, a failing model never stops ingestion, and bad model settings are refused at start.

One Spark test runs the shipped example (``web.pageviews`` → ``staging.sessions`` view →
``mart.daily_traffic`` merge) inside a running collector and checks the mart against the
aggregate of exactly the events sent, twice (the second time only touched keys are
rewritten). The scheduling rules (staleness, interval, backlog, backoff) are checked with a
fake clock and no Spark.
"""

from __future__ import annotations

import asyncio
import collections
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from collector.metrics import CollectorMetrics
from collector.models import BACKLOG_DEFER_S, ModelRefresh, plan_refresh, source_tables
from icefloe.clock import ManualClock
from icefloe.config import Config, load_config
from icefloe.errors import ConfigError
from tests.collector_support import BASE_MS, collect_all, collector_config, publish_sync, read_table

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = load_config(ROOT / "examples" / "icefloe.toml")
PAGEVIEWS = EXAMPLE.stream("pageviews")
ORDERS = EXAMPLE.stream("orders")
BROKEN = """-- materialized: table
-- target: mart.broken
SELECT no_such_column FROM web.pageviews
"""
AFTER_BROKEN = """-- materialized: table
-- target: mart.after_broken
SELECT * FROM mart.broken
"""


def models_folder(root: Path, extra: dict[str, str] | None = None) -> Path:
    folder = root / "models"
    shutil.copytree(ROOT / "examples" / "models", folder)
    for name, text in (extra or {}).items():
        (folder / f"{name}.sql").write_text(text)
    return folder


def config_with(root: Path, models: list[str], **collector: Any) -> Config:
    assert PAGEVIEWS is not None
    assert ORDERS is not None
    folder = models_folder(root, {"broken": BROKEN, "after_broken": AFTER_BROKEN})
    return collector_config(root, (PAGEVIEWS, ORDERS), models=models, models_dir=str(folder),
                            commit_interval_s=0.05, poll_interval_s=0.02, **collector)


def view(i: int, day: int, url: str, session: str) -> tuple[str, str, int, bytes]:
    payload = msgspec.json.encode({"user_id": f"u{i}", "session_id": session, "url": url,
                                   "duration_ms": i, "ts": f"2026-11-{20 + day}T09:00:00Z"})
    return ("pageviews", f"v{i}", BASE_MS + i, payload)


def expected_mart(events: list[tuple[str, str, int, bytes]]) -> dict[tuple[str, str], tuple]:
    """What mart.daily_traffic must hold: views, sessions, time per (day, lower(url))."""
    views: dict[tuple[str, str], int] = collections.Counter()
    sessions: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    duration: dict[tuple[str, str], int] = collections.Counter()
    for _, _, _, payload in events:
        event = msgspec.json.decode(payload)
        key = (event["ts"][:10], event["url"].lower())
        views[key] += 1
        sessions[key].add(event["session_id"])
        duration[key] += event["duration_ms"]
    return {k: (views[k], len(sessions[k]), duration[k]) for k in views}


def mart(config: Config) -> dict[tuple[str, str], tuple]:
    return {(str(r["day"]), r["url"]): (r["views"], r["sessions"], r["duration_ms"])
            for r in read_table(config, "mart.daily_traffic").to_pylist()}


class Running:
    """``run_collector`` in a background thread (the LocalEngine decodes; the models get
    the test session's SparkSession through the collector's fallback)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = CollectorMetrics()
        self.error: BaseException | None = None
        self.code: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        from collector.runner import run_collector
        from pipeline.load.run import LocalEngine

        async def go() -> int:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._started.set()
            return await run_collector(self.config, stop=self._stop, engine=LocalEngine(),
                                       serve_metrics=False, metrics=self.metrics)
        try:
            self.code = asyncio.run(go())
        except BaseException as exc:
            self.error = exc
            self._started.set()

    def __enter__(self) -> Running:
        self._thread.start()
        assert self._started.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(120)
        assert not self._thread.is_alive()
        if self.error is not None:
            raise self.error

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def wait_for(self, what: str, condition: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.05)


RUNS = "icefloe_collector_model_runs_total"


@pytest.fixture
def running(tmp_path: Path, spark: Any) -> Iterator[Running]:
    config = config_with(tmp_path, ["*"])
    with Running(config) as run:
        yield run


def test_should_keep_the_example_mart_fresh_and_survive_a_broken_model(running: Running
                                                                       ) -> None:
    config = running.config
    first = [view(i, i % 2, "/A" if i % 3 else "/b", f"s{i % 4}") for i in range(40)]
    publish_sync(config, [first[:25], first[25:]])
    running.wait_for("the first model run", lambda: running.sample(
        RUNS, model="mart_daily_traffic", state="ran") >= 1 and len(mart(config)) == 4)
    assert mart(config) == expected_mart(first)
    assert running.sample(RUNS, model="broken", state="failed") >= 1
    assert running.sample(RUNS, model="staging_sessions", state="view") >= 1

    rows_before = running.sample("icefloe_collector_model_rows_total",
                                 model="mart_daily_traffic")
    second = [view(100 + i, 2, "/c", "s9") for i in range(5)]
    publish_sync(config, [second])
    everything = first + second
    running.wait_for("the incremental model run", lambda: mart(config) == expected_mart(
        everything))
    # Only the one (day, url) key the new views touched was recomputed and upserted.
    assert running.sample("icefloe_collector_model_rows_total",
                          model="mart_daily_traffic") == rows_before + 1
    # The broken model failed every time and never held up ingestion: the raw table is exact.
    raw = read_table(config, "web.pageviews")
    assert sorted(raw.column("_event_id").to_pylist()) == sorted(e[1] for e in everything)
    assert not running.sample(RUNS, model="broken", state="ran")


# ----------------------------------------------------------- scheduling, without Spark


def refresh(tmp_path: Path, models: list[str], spark: Callable[[], Any] | None = None,
            **collector: Any) -> tuple[ModelRefresh, ManualClock]:
    config = config_with(tmp_path, models, **collector)
    plan = plan_refresh(config)
    assert plan is not None
    clock = ManualClock(1000.0)
    return ModelRefresh(config, *plan, spark=spark or (lambda: None),
                        metrics=CollectorMetrics(), clock=clock), clock


def test_should_run_the_named_models_with_what_they_read(tmp_path: Path) -> None:
    config = config_with(tmp_path, ["mart_daily_traffic"])
    plan = plan_refresh(config)
    assert plan is not None
    project, names = plan
    assert names == ["staging_sessions", "mart_daily_traffic"]  # the view it reads, first
    assert source_tables(project, names) == {"web.pageviews"}
    assert plan_refresh(config_with(tmp_path / "none", [])) is None


def test_should_become_stale_only_through_the_tables_the_models_read(tmp_path: Path) -> None:
    models, _clock = refresh(tmp_path, ["mart_daily_traffic"])
    assert models.due(backlog=False)  # once at start: rows may have landed while down
    models.pending.clear()  # as after a run
    models.note_commits({"shop.orders": 50})
    assert not models.due(backlog=False)
    models.note_commits({"web.pageviews": 0})
    assert not models.due(backlog=False)
    models.note_commits({"web.pageviews": 3})
    assert models.due(backlog=False)
    # the view in between reads web.pageviews too: both run, in order
    assert models.runnable(_clock.monotonic()) == ["staging_sessions", "mart_daily_traffic"]


def test_should_mark_stale_only_the_models_fed_by_a_commit(tmp_path: Path) -> None:
    models, clock = refresh(tmp_path, ["*"])
    models.pending.clear()
    models.note_commits({"shop.orders": 5})
    assert models.runnable(clock.monotonic()) == []  # no model reads shop.orders
    models.note_commits({"web.pageviews": 5})
    assert models.runnable(clock.monotonic()) == [
        "broken", "after_broken", "staging_sessions", "mart_daily_traffic"]


def test_should_wait_out_the_interval_and_a_backlog(tmp_path: Path) -> None:
    models, clock = refresh(tmp_path, ["mart_daily_traffic"], models_interval_s=10)
    models.pending.clear()  # as after a successful run
    models.next_at = clock.monotonic() + 10
    models.note_commits({"web.pageviews": 1})
    assert not models.due(backlog=False)
    clock.advance(10)
    assert models.due(backlog=False)
    assert not models.due(backlog=True)  # the raw tables catch up first ...
    clock.advance(BACKLOG_DEFER_S)
    assert models.due(backlog=True)  # ... but not for ever


def test_should_back_off_after_a_failure_and_never_raise(tmp_path: Path) -> None:
    def no_spark() -> Any:
        raise RuntimeError("Spark is gone")

    models, clock = refresh(tmp_path, ["mart_daily_traffic"], spark=no_spark)
    assert models.run() == []
    assert models.stale
    assert models.failures("mart_daily_traffic") == 1
    assert not models.due(backlog=False)
    clock.advance(2)
    assert models.due(backlog=False)
    models.run()
    # doubling, capped by retry_max_delay_s
    assert models.pending["mart_daily_traffic"].retry_at == clock.monotonic() + 4


def test_should_back_off_a_failing_model_alone(tmp_path: Path, spark: Any) -> None:
    """A broken model (and the model reading it) waits out its own backoff; the mart
    still runs right after each commit that feeds it, with the wall-clock gauge read
    from the injected clock."""
    from pipeline.load.run import LocalEngine

    models, clock = refresh(tmp_path, ["*"], spark=lambda: spark, retry_max_delay_s=600)
    config = models.config
    first = [view(i, 0, "/a", f"s{i % 3}") for i in range(12)]
    publish_sync(config, [first])
    asyncio.run(collect_all(config, LocalEngine()))
    states = {o.name: o.state for o in models.run()}
    assert states == {"broken": "failed", "after_broken": "skipped",
                      "staging_sessions": "view", "mart_daily_traffic": "ran"}
    assert models.failures("broken") == 1
    assert models.metrics.registry.get_sample_value(
        "icefloe_collector_model_last_run_timestamp_seconds",
        {"model": "mart_daily_traffic"}) == clock.time()

    second = [view(100 + i, 1, "/b", "s9") for i in range(4)]
    publish_sync(config, [second])
    asyncio.run(collect_all(config, LocalEngine()))
    models.note_commits({"web.pageviews": len(second)})
    assert models.due(backlog=False)  # at once: the broken model's backoff is its own
    states = {o.name: o.state for o in models.run()}
    assert states == {"staging_sessions": "view", "mart_daily_traffic": "ran"}
    assert mart(config) == expected_mart(first + second)
    assert not models.due(backlog=False)  # the broken pair still backs off
    clock.advance(2)
    states = {o.name: o.state for o in models.run()}
    assert states == {"broken": "failed", "after_broken": "skipped"}
    assert models.failures("broken") == 2
    assert models.pending["broken"].retry_at == clock.monotonic() + 4


# ------------------------------------------------------------------- bad settings


@pytest.mark.parametrize(("models", "message"), [
    (["nope"], "no model named 'nope'"),
    (["mart_daily_traffic", "nope"], "no model named 'nope'"),
])
def test_should_refuse_unknown_models_before_touching_the_queue(tmp_path: Path, models,
                                                                 message: str) -> None:
    from collector.runner import run_collector
    from pipeline.load.run import LocalEngine

    config = config_with(tmp_path, models)
    with pytest.raises(ConfigError, match=f"collector.models: {message}"):
        asyncio.run(run_collector(config, engine=LocalEngine(), serve_metrics=False))
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").rglob("*"))


def test_should_refuse_a_missing_folder_and_a_cycle(tmp_path: Path) -> None:
    from collector.runner import run_collector
    from pipeline.load.run import LocalEngine

    config = config_with(tmp_path, ["a"])
    gone = msgspec.structs.replace(config, collector=msgspec.structs.replace(
        config.collector, models_dir=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match=r"is not a folder of \*\.sql models"):
        asyncio.run(run_collector(gone, engine=LocalEngine(), serve_metrics=False))
    folder = Path(config.collector.models_dir)
    (folder / "a.sql").write_text("-- target: m.a\nSELECT * FROM b\n")
    (folder / "b.sql").write_text("-- target: m.b\nSELECT * FROM a\n")
    with pytest.raises(ConfigError, match="cycle"):
        asyncio.run(run_collector(config, engine=LocalEngine(), serve_metrics=False))


def test_should_read_model_settings_from_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "icefloe.toml"
    path.write_text('[collector]\nmodels = ["mart_daily_traffic"]\nmodels_dir = "sql"\n')
    config = load_config(path, env={})
    assert config.collector.models == ("mart_daily_traffic",)
    assert config.collector.models_dir == str(tmp_path / "sql")
    env = load_config(path, env={"ICEFLOE_COLLECTOR_MODELS": "a, b",
                                 "ICEFLOE_COLLECTOR_MODELS_INTERVAL_S": "30"})
    assert env.collector.models == ("a", "b")
    assert env.collector.models_interval_s == 30
    path.write_text("[collector]\nmodels_interval_s = -1\n")
    with pytest.raises(ConfigError, match=r"collector\.models_interval_s must be >= 0"):
        load_config(path, env={})
