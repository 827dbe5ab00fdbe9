"""``icefloe demo`` against a real cluster: an ingestor on a free port and a collector.

The cluster runs in a background thread with its own event loop — the ingestor's real HTTP
server (:func:`ingestor.server.serve`) and the collector (:func:`collector.runner.run_collector`
with the Spark-free :class:`pipeline.load.run.LocalEngine`) on a local store and a SQLite catalog
— while the demo runs in the test's main thread through ``icefloe_app.cli.main``, as a user would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import socket
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from icefloe.config import Config, load_config
from icefloe.tokens import hash_token
from icefloe_app.cli import main
from icefloe_app.cli.demo_events import EventFactory
from pipeline.iceberg.catalog import open_catalog

CONFIG = """
[store]
url = "file://store"
[catalog]
uri = "sqlite:///catalog.db"
warehouse = "file://warehouse"
[manifest]
lease_s = 2.0
[ingestor]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
[collector]
host = "127.0.0.1"
metrics_port = 0
commit_interval_s = 0.3
poll_interval_s = 0.05
gc_interval_s = 3600
maintenance_interval_s = 3600

[[streams]]
name = "pageviews"
table = "web.pageviews"
columns = [
  {{ name = "user_id", type = "string", required = true }},
  {{ name = "session_id", type = "string" }},
  {{ name = "url", type = "string", required = true }},
  {{ name = "referrer", type = "string" }},
  {{ name = "duration_ms", type = "long" }},
  {{ name = "ts", type = "timestamp" }},
]

[[streams]]
name = "orders"
table = "shop.orders"
event_id_field = "order_id"
unknown_fields = "reject"
tokens = ["{token_hash}"]
columns = [
  {{ name = "order_id", type = "string", required = true }},
  {{ name = "customer_id", type = "string", required = true }},
  {{ name = "amount", type = "double", required = true }},
  {{ name = "currency", type = "string" }},
  {{ name = "items", type = "int" }},
  {{ name = "paid", type = "boolean" }},
  {{ name = "attributes", type = "json" }},
  {{ name = "ordered_at", type = "timestamp" }},
  {{ name = "ship_by", type = "date" }},
  {{ name = "discount_rate", type = "float" }},
]

[[streams]]
name = "ghost"
table = "web.ghost"
columns = [{{ name = "url", type = "string" }}]
"""
TOKEN = "demo-s3cret"
TOKEN_HASH = hash_token(TOKEN, log2_n=10)


@pytest.fixture(autouse=True)
def demo_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo sends $ICEFLOE_TOKEN to streams that need a token (``orders`` here)."""
    monkeypatch.setenv("ICEFLOE_TOKEN", TOKEN)


def write_config(root: Path) -> Path:
    path = root / "icefloe.toml"
    path.write_text(textwrap.dedent(CONFIG.format(token_hash=TOKEN_HASH)))
    return path


@dataclass
class Cluster:
    url: str
    config: Config
    path: Path


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Ingestor + collector in a background thread; the collector skips stream ``ghost``.

    The ingestor accepts ``ghost`` events, but the collector's config does not know the
    stream, so they never reach a table: a deterministic way to make ``--wait`` time out.
    """
    from collector.runner import run_collector
    from ingestor.server import serve
    from pipeline.load.run import LocalEngine

    path = write_config(tmp_path)
    config = load_config(path)
    collecting = msgspec.structs.replace(
        config, streams=tuple(s for s in config.streams if s.name != "ghost"))
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def run() -> None:
        stop = asyncio.Event()
        state["stop"], state["loop"] = stop, asyncio.get_running_loop()

        def on_ready(ports: Any) -> None:
            state["port"] = ports.http
            ready.set()

        await asyncio.gather(
            serve(config, on_ready=on_ready, stop=stop),
            run_collector(collecting, stop=stop, engine=LocalEngine(), serve_metrics=False))

    def thread_main() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:
            state["error"] = exc
            ready.set()

    thread = threading.Thread(target=thread_main, name="cluster", daemon=True)
    thread.start()
    assert ready.wait(30), "the ingestor did not start"
    assert "error" not in state, state.get("error")
    try:
        yield Cluster(f"http://127.0.0.1:{state['port']}", config, path)
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(30)
        assert "error" not in state, state.get("error")


def demo(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["demo", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def rows(config: Config, table: str) -> list[dict[str, Any]]:
    return open_catalog(config.catalog).load_table(table).scan().to_arrow().to_pylist()


def test_should_fill_the_tables_with_exactly_the_sent_events(cluster, capsys):
    code, out, err = demo(capsys, "--config", str(cluster.path), "--url", cluster.url,
                          "--streams", "pageviews,orders", "--events", "200", "--rate", "1000",
                          "--batch", "20", "--seed", "11", "--wait", "--wait-timeout", "30",
                          "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["sent"], summary["accepted"], summary["rejected"]) == (200, 200, 0)
    assert summary["committed"] == 200
    assert summary["seed"] == 11
    assert [(s["stream"], s["sent"], s["committed"]) for s in summary["streams"]] == [
        ("pageviews", 100, 100), ("orders", 100, 100)]
    assert err.startswith(f"icefloe demo: 200 events at ~1000 events/s to {cluster.url} "
                          "(streams pageviews, orders; seed 11)")
    assert "[####################] 100%" in err  # the progress bar reached the end
    assert TOKEN not in out + err

    views = rows(cluster.config, "web.pageviews")
    orders = rows(cluster.config, "shop.orders")
    assert len(views) == len({r["_event_id"] for r in views}) == 100
    assert len(orders) == len({r["order_id"] for r in orders}) == 100
    now = dt.datetime.now(dt.UTC)
    for row in views:
        assert row["user_id"].startswith("u_")
        assert row["url"].startswith("/")
        assert row["referrer"] is None or row["referrer"].startswith("https://")
        assert row["duration_ms"] is None or row["duration_ms"] >= 0
        assert row["ts"] is None or now - dt.timedelta(minutes=5) < row["ts"] <= now
    assert len({r["user_id"] for r in views}) < 60  # a small pool: users come back
    for row in orders:
        assert uuid.UUID(row["order_id"]).version == 4
        assert row["_event_id"] == row["order_id"]
        assert row["customer_id"].startswith("cus_")
        assert row["amount"] > 0
        assert round(row["amount"], 2) == row["amount"]
        assert row["currency"] in (None, "USD", "EUR", "GBP", "JPY", "CHF")
        assert row["items"] is None or 1 <= row["items"] <= 8
        assert row["attributes"] is None or isinstance(json.loads(row["attributes"]), dict)
        assert row["ship_by"] is None or (
            now.date() - dt.timedelta(days=31) <= row["ship_by"] <= now.date())
        assert row["discount_rate"] is None or 0 <= row["discount_rate"] <= 1
    assert {r["paid"] for r in orders} == {True, False, None}  # optional: sometimes left out


def test_should_print_a_summary_with_the_query_hint(cluster, capsys):
    code, out, _ = demo(capsys, "--config", str(cluster.path), "--url", cluster.url,
                        "--streams", "pageviews", "--events", "30", "--rate", "0",
                        "--seed", "12", "--wait")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("demo done: ")
    assert lines[0].endswith(f"s of sending to {cluster.url} (seed 12)")
    assert lines[2].split() == ["STREAM", "TABLE", "SENT", "ACCEPTED", "REJECTED", "COMMITTED"]
    assert lines[3].split() == ["pageviews", "web.pageviews", "30", "30", "0", "30"]
    assert lines[4].split() == ["total", "30", "30", "0", "30"]
    assert lines[-1] == 'Query it:  icefloe query "SELECT count(*) FROM web.pageviews"'


def test_should_stop_on_ctrl_c_with_a_summary(cluster, capsys):
    default = signal.getsignal(signal.SIGINT)

    def interrupt() -> None:
        deadline = time.monotonic() + 20
        while signal.getsignal(signal.SIGINT) is default and time.monotonic() < deadline:
            time.sleep(0.01)  # until the demo installed its handler
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    code, out, err = demo(capsys, "--config", str(cluster.path), "--url", cluster.url,
                          "--streams", "pageviews", "--duration", "0", "--rate", "200",
                          "--seed", "13", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["interrupted"] is True
    assert summary["sent"] > 0
    assert summary["accepted"] == summary["sent"]
    assert signal.getsignal(signal.SIGINT) is default


def test_should_exit_1_when_the_wait_times_out(cluster, capsys):
    code, out, err = demo(capsys, "--config", str(cluster.path), "--url", cluster.url,
                          "--streams", "ghost", "--events", "5", "--seed", "14", "--wait",
                          "--wait-timeout", "1")
    assert code == 1
    assert out.splitlines()[3].split() == ["ghost", "web.ghost", "5", "5", "0", "0"]
    line = err.strip().splitlines()[-1]
    assert line.startswith("icefloe: error: waited 1 s but the tables hold only web.ghost 0/5 "
                           "of the accepted events: is the collector running")


def test_should_stop_with_one_line_when_the_token_is_refused(cluster, capsys, monkeypatch):
    monkeypatch.setenv("ICEFLOE_TOKEN", "wrong-token")
    code, out, err = demo(capsys, "--config", str(cluster.path), "--url", cluster.url,
                          "--streams", "orders", "--events", "10", "--seed", "15")
    assert code == 1
    assert out.splitlines()[3].split()[:5] == ["orders", "shop.orders", "10", "0", "10"]
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"icefloe: error: the ingestor at {cluster.url} refused the token "
                           "for stream 'orders'")
    assert "wrong-token" not in err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_should_say_in_one_line_that_no_ingestor_answers(tmp_path, capsys):
    port = free_port()  # closed again: connections are refused
    started = time.monotonic()
    code, out, err = demo(capsys, "--config", str(write_config(tmp_path)), "--url",
                          f"http://127.0.0.1:{port}", "--events", "10")
    assert time.monotonic() - started < 10
    assert code == 1
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"icefloe: error: cannot reach the ingestor at "
                               f"http://127.0.0.1:{port} (")
    assert lines[0].endswith("start the cluster with `icefloe up`, or point --url at a "
                             "running ingestor")
    assert not (tmp_path / "catalog.db").exists()


def test_should_refuse_an_unknown_stream_with_exit_2(tmp_path, capsys):
    path = write_config(tmp_path)
    code, _, err = demo(capsys, "--config", str(path), "--streams", "pageviews,nope")
    assert code == 2
    assert err.strip() == (f"icefloe: error: unknown stream 'nope': {path} defines pageviews, "
                           "orders, ghost")


def test_should_generate_the_same_events_from_the_same_seed(tmp_path):
    import random

    config = load_config(write_config(tmp_path))
    orders = config.stream("orders")
    assert orders is not None

    def events(seed: int) -> list[dict[str, Any]]:
        factory = EventFactory(orders, random.Random(seed))
        made = [factory.make() for _ in range(50)]
        for event in made:
            event.pop("ordered_at", None)  # "near now": the only value that is not seeded
        return made

    assert events(1) == events(1)
    assert events(1) != events(2)
    assert all({"order_id", "customer_id", "amount"} <= set(e) for e in events(3))
    assert len({e["order_id"] for e in events(4)}) == 50


def test_should_ask_for_a_token_before_sending_to_a_stream_that_needs_one(
        tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ICEFLOE_TOKEN")
    code, _, err = demo(capsys, "--config", str(write_config(tmp_path)), "--streams",
                        "pageviews,orders", "--events", "10")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(
        "icefloe: error: stream(s) orders need a write token: set $ICEFLOE_TOKEN")
