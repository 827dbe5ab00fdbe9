"""``icefloe up`` end to end, ``icefloe query``, and the CLI's one-line error paths.

The end-to-end test is the one a new user lives through: ``icefloe up`` as a subprocess
(two ingestor processes sharing the ports, the collector with Spark) in a fresh folder,
events over HTTP *and* gRPC, ``icefloe query`` showing the exact count, SIGTERM and a clean
exit with no ingestor left behind, then a restart on the same data dir that still has
every row and takes more. Query semantics (name resolution, snapshot pinning, ``--as-of``,
formats, Spark errors) run against real Iceberg tables on the shared SparkSession.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from collector_support import CLICKS, collector_config
from process_support import Child, child_env, free_port, run_cli, wait_for

from icefloe.config import CatalogSection, Config, load_config
from icefloe.errors import CatalogError, ConfigError
from icefloe_app.cli import main
from icefloe_app.cli.config_args import config_from_args
from icefloe_app.cli.ingestor_group import reserve_port
from icefloe_app.cli.progress import Snapshot, render, show_progress
from icefloe_app.cli.query_cmd import write
from icefloe_app.cli.up_cmd import example_event
from pipeline.columns import table_arrow_schema
from pipeline.iceberg.catalog import open_catalog
from pipeline.iceberg.tables import ensure_stream_table
from pipeline.java import JavaMissingError, require_java
from pipeline.read.query import AsOf, QueryError, plan, run_query

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "icefloe.toml"
SPARK_S = 180.0  # one JVM start is ~15 s idle; several run in this test on 2 cores


# --- end to end ------------------------------------------------------------------------------

def _committed(data: Path, table: str) -> int:
    """Rows in the table's current snapshot (cheap: the summary, no data read)."""
    catalog = CatalogSection(uri=f"sqlite:///{data / 'catalog.db'}",
                             warehouse=(data / "warehouse").as_uri())
    try:
        snapshot = open_catalog(catalog).load_table(table).current_snapshot()
    except Exception:  # catalog or table not created yet
        return -1
    return int(snapshot.summary["total-records"]) if snapshot else 0


def _query_count(cwd: Path, data: Path, table: str) -> int:
    done = run_cli(["query", "--config", str(EXAMPLE), "--data-dir", str(data),
                    "--format", "json", f"SELECT count(*) AS n FROM {table}"], cwd, SPARK_S)
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)[0]["n"])


def _start_up(tmp_path: Path, data: Path, http: int, grpc: int, *extra: str) -> Child:
    child = Child(["up", "--data-dir", str(data), "--http-port", str(http), "--grpc-port",
                   str(grpc), "--metrics-port", "0", "--ingestors", "2",
                   "--kafka-port", "0", "--otlp-http-port", "0", "--otlp-grpc-port", "0",
                   *extra], tmp_path, tmp_path / "up.log")
    child.wait_line(lambda text: text.strip().startswith("gRPC"), 60)
    return child


def _ingestor_pids(parent: int, role: bytes = b"ingestor") -> list[int]:
    """Live `icefloe ingestor` (or ``role``) processes started by ``parent`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[1]) == parent and role in cmdline and stat[0] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.timeout(900)
def test_should_run_the_cluster_take_http_and_grpc_and_keep_data_across_restarts(tmp_path):
    from icefloe.client import GrpcClient, HttpClient

    data = tmp_path / "data"
    http, grpc = free_port(), free_port()
    child = _start_up(tmp_path, data, http, grpc)
    try:
        assert len(_ingestor_pids(child.proc.pid)) == 2
        with HttpClient(f"http://127.0.0.1:{http}") as client:
            sent = sum(client.send("pageviews", [{"user_id": f"u{i}", "url": f"/p/{i}",
                                                  "duration_ms": i}
                                                 for i in range(k, k + 20)])
                       for k in range(0, 60, 20))
        with GrpcClient(f"127.0.0.1:{grpc}") as client:
            orders = [{"order_id": f"o{i}", "customer_id": "c1", "amount": i + 0.5}
                      for i in range(15)]
            sent_grpc = client.publish("orders", orders)
        assert (sent, sent_grpc) == (60, 15)
        child.wait_line(lambda text: "collector active" in text, SPARK_S)
        wait_for(lambda: _committed(data, "web.pageviews") == 60
                 and _committed(data, "shop.orders") == 15, SPARK_S, "75 committed rows")
        # the warm standby (on by default): a second collector process, started once the
        # first one is active, that has started Spark and waits on the lease
        warm = child.wait_line(lambda text: "standby  collector pid" in text, SPARK_S)
        killed = int(warm.split("pid", 1)[1].split()[0])
        assert _ingestor_pids(child.proc.pid, b"collector") == [killed]
        os.kill(killed, signal.SIGKILL)  # up starts another one, as it restarts ingestors
        warm = child.wait_line(lambda text: "standby  collector pid" in text, SPARK_S)
        standby_pid = int(warm.split("pid", 1)[1].split()[0])
        assert standby_pid != killed
        assert _ingestor_pids(child.proc.pid, b"collector") == [standby_pid]
        assert _query_count(tmp_path, data, "pageviews") == 60  # a stream name works too
        assert child.stop(signal.SIGTERM, timeout=90) == 0
    finally:
        child.close()
    output = child.stdout()
    assert "accepted 75" in output  # the last progress line
    assert "committed 75" in output
    assert not _ingestor_pids(child.proc.pid)
    assert not Path(f"/proc/{standby_pid}").exists() or \
        Path(f"/proc/{standby_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert "took over" not in output  # stopped first: it never took the released lease
    assert "Traceback" not in (tmp_path / "up.log").read_text(errors="replace")

    # the same data dir and ports, without the standby this time
    again = _start_up(tmp_path, data, http, grpc, "--no-standby")
    try:
        with HttpClient(f"http://127.0.0.1:{http}") as client:
            assert client.send("pageviews", [{"user_id": "late", "url": "/late"}]) == 1
        wait_for(lambda: _committed(data, "web.pageviews") == 61, SPARK_S, "the 61st row")
        assert not _ingestor_pids(again.proc.pid, b"collector")
        assert again.stop(signal.SIGTERM, timeout=90) == 0
    finally:
        again.close()
    assert _query_count(tmp_path, data, "web.pageviews") == 61
    assert "standby" not in again.stdout().replace("--no-standby", "")


# --- error paths: one line, the right exit code ------------------------------------------------

def test_should_refuse_a_port_in_use_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(["up", "--data-dir", str(tmp_path), "--http-port", str(port),
                        "--grpc-port", "0", "--kafka-port", "0", "--otlp-http-port", "0",
                        "--otlp-grpc-port", "0", "--no-collector"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"icefloe: error: HTTP port {port} on 127.0.0.1 is already in use: stop the other "
        "process or choose another port (--http-port, ICEFLOE_INGESTOR_HTTP_PORT)")


def test_should_name_file_and_key_of_a_bad_config_in_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[ingestor]\nhttp_port = "eighty"\n')
    for command in (["up"], ["query", "SELECT 1"], ["ingestor"], ["streams", "list"]):
        done = run_cli([*command, "--config", str(bad)], tmp_path)
        assert done.returncode == 2, (command, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (command, done.stderr)
        assert lines[0].startswith(f"icefloe: error: {bad}: ingestor.http_port: Expected `int`")


@pytest.mark.parametrize("command", [["up", "--http-port", "0", "--grpc-port", "0"],
                                     ["query", "--engine", "spark",
                                      "SELECT count(*) FROM web.pageviews"]])
def test_should_say_how_to_get_java_when_it_is_missing(tmp_path, command):
    env = {**child_env(), "PATH": str(tmp_path / "empty-bin")}
    env.pop("JAVA_HOME", None)
    import subprocess

    if command[0] == "query":  # the table must exist, or that error would come first
        config = load_config(EXAMPLE, env={}, overrides={
            "catalog": {"uri": f"sqlite:///{tmp_path / 'catalog.db'}",
                        "warehouse": (tmp_path / "warehouse").as_uri()}})
        ensure_stream_table(open_catalog(config.catalog), config.streams[0])
    done = subprocess.run([sys.executable, "-m", "icefloe", *command, "--config", str(EXAMPLE),
                           "--data-dir", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if not line.startswith("icefloe query:")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("icefloe: error: Java not found (no `java` on PATH and "
                               "JAVA_HOME is not set)")
    assert "openjdk-17-jre-headless" in lines[0]


def test_should_check_the_java_version_and_java_home(tmp_path):
    assert require_java().name == "java"  # this machine has one
    with pytest.raises(JavaMissingError, match="has no bin/java"):
        require_java({"JAVA_HOME": str(tmp_path)})
    fake = tmp_path / "old" / "bin" / "java"
    fake.parent.mkdir(parents=True)
    fake.write_text('#!/bin/sh\necho \'java version "1.8.0_392"\' >&2\n')
    fake.chmod(0o755)
    with pytest.raises(JavaMissingError, match="is Java 8; Spark 4 needs Java 17"):
        require_java({"JAVA_HOME": str(tmp_path / "old")})


def test_should_start_a_warm_standby_collector_unless_told_not_to(tmp_path):
    """``icefloe up``'s standby: ``icefloe collector`` on up's config and data dir, its
    metrics on a free port (up's collector has the configured one); off with
    ``--no-standby`` or ``--no-collector``. (The process itself: the end-to-end test.)"""
    from icefloe_app.cli import build_parser
    from icefloe_app.cli.up_cmd import standby_argv

    config = tmp_path / "icefloe.toml"
    args = build_parser(["up"]).parse_args(["up", "--data-dir", str(tmp_path / "d")])
    assert not args.no_standby
    argv = standby_argv(config, args)
    assert argv[1:4] == ["-m", "icefloe", "collector"]
    assert argv[argv.index("--config") + 1] == str(config)
    assert argv[argv.index("--data-dir") + 1] == str(tmp_path / "d")
    assert argv[argv.index("--metrics-port") + 1] == "0"
    assert "--takeover" not in argv  # it waits on the lease, never fences the active one
    assert build_parser(["up"]).parse_args(["up", "--no-standby"]).no_standby


def test_should_refuse_zero_ingestors(tmp_path, capsys):
    assert main(["up", "--ingestors", "0", "--data-dir", str(tmp_path)]) == 2
    assert "--ingestors 0: at least one ingestor is needed" in capsys.readouterr().err


# --- pieces of `up` ----------------------------------------------------------------------------

def test_should_reserve_a_port_that_children_can_share_but_strangers_cannot(tmp_path):
    holder = reserve_port("127.0.0.1", 0, "HTTP", "--http-port", "ICEFLOE_INGESTOR_HTTP_PORT")
    port = holder.getsockname()[1]
    try:
        with socket.socket() as child:  # what an ingestor started with --reuse-port does
            child.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            child.bind(("127.0.0.1", port))
            child.listen()
            with pytest.raises(ConfigError, match=f"HTTP port {port} on 127.0.0.1 is already"):
                reserve_port("127.0.0.1", port, "HTTP", "--http-port", "X")
    finally:
        holder.close()


def test_should_redraw_progress_on_a_terminal_and_print_changes_in_a_log():
    import asyncio

    values = iter([Snapshot(10, 0, 5, 1, 0.5), Snapshot(1200, 3, 1100, 0, 0.0)])
    last = Snapshot(1200, 3, 1100, 0, 0.0)

    def read() -> Snapshot:
        return next(values, last)

    async def drive(tty: bool) -> str:
        out = io.StringIO()
        stop = asyncio.Event()
        task = asyncio.create_task(show_progress(read, stop, out=out, tty=tty,
                                                 interval_s=0.01, quiet_every_s=3600))
        await asyncio.sleep(0.1)
        stop.set()
        await task
        return out.getvalue()

    tty = asyncio.run(drive(True))
    assert "\r\x1b[2K  accepted 10 · committed 5 · queue 1 files · lag 0.5 s" in tty
    values = iter([Snapshot(10, 0, 5, 1, 0.5)])
    log = asyncio.run(drive(False))
    # not every redraw: the first line, then the final state when stopping
    assert log.splitlines() == ["  accepted 1,200 · rejected 3 · committed 1,100 · queue 0 "
                                "files · lag 0.0 s"]
    assert render(Snapshot(1, 0, None, None, None)) == "  accepted 1"


def test_should_print_a_curl_example_that_the_stream_accepts():
    from ingestor.validate import CompiledStream

    config = load_config(EXAMPLE, env={})
    for stream in config.streams:
        event = example_event(stream)
        assert {c.name for c in stream.columns if c.required} <= set(event)
        CompiledStream(stream).from_json(json.dumps(event).encode())  # raises if invalid


def test_should_resolve_data_dir_from_flag_then_env_then_default(tmp_path, monkeypatch):
    import argparse

    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(config=None, data_dir=None)
    _, default = config_from_args(args, env={})
    assert default.store.url == (tmp_path / "icefloe-data" / "store").as_uri()
    _, from_env = config_from_args(args, env={"ICEFLOE_DATA_DIR": str(tmp_path / "env")})
    assert from_env.catalog.uri == f"sqlite:///{tmp_path / 'env' / 'catalog.db'}"
    args.data_dir = str(tmp_path / "flag")
    _, from_flag = config_from_args(args, env={"ICEFLOE_DATA_DIR": str(tmp_path / "env")})
    assert from_flag.catalog.warehouse == (tmp_path / "flag" / "warehouse").as_uri()
    (tmp_path / "icefloe.toml").write_text('[store]\nurl = "file://lake"\n')
    args.data_dir = None
    _, local = config_from_args(args, env={})  # ./icefloe.toml, its own relative store
    assert local.source == "icefloe.toml"
    assert local.store.url == (tmp_path / "lake").as_uri()


# --- icefloe query -----------------------------------------------------------------------------

T0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)


def _clicks(start: int, count: int) -> pa.Table:
    rows = [{"user_id": f"u{i % 3}", "url": f"/p/{i % 4}", "n": i, "ts": T0,
             "_event_id": f"e{i}", "_received_at": T0, "_sequence": i}
            for i in range(start, start + count)]
    return pa.Table.from_pylist(rows, schema=table_arrow_schema(CLICKS))


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config: Config = collector_config(tmp_path_factory.mktemp("query"))
    table = ensure_stream_table(open_catalog(config.catalog), CLICKS)
    table.append(_clicks(0, 10))
    first = table.current_snapshot()
    time.sleep(0.01)  # distinct commit timestamps for --as-of
    table.append(_clicks(10, 5))
    return {"config": config, "first": first}


def test_should_rewrite_table_names_to_pinned_views(lake):
    config = lake["config"]
    pinned = plan("WITH t AS (SELECT * FROM web.clicks) SELECT c.n FROM t JOIN clicks c "
                  "ON t.n = c.n", config)
    assert list(pinned.tables) == ["web.clicks"]  # both names, one view, one snapshot
    view = pinned.tables["web.clicks"]
    assert f"FROM {view} AS clicks" in pinned.sql
    assert f"JOIN {view} AS c" in pinned.sql
    assert "FROM t JOIN" in pinned.sql  # the CTE is not a table


@pytest.mark.parametrize(("sql", "message"), [
    ("SELEC 1", "SQL does not parse"),
    ("SELECT 1; SELECT 2", "exactly one SQL statement (got 2)"),
    ("INSERT INTO web.clicks VALUES (1)", "read-only queries"),
    ("SELECT * FROM nothing", "unknown table 'nothing'"),
    ("SELECT * FROM cat.web.clicks", "without a catalog name"),
])
def test_should_refuse_bad_queries_before_spark_starts(lake, sql, message):
    with pytest.raises(QueryError, match=re.escape(message)):
        plan(sql, lake["config"])


def test_should_name_existing_tables_for_a_missing_one(lake):
    with pytest.raises(CatalogError, match=r"table 'web\.nope' does not exist.*web\.clicks"):
        plan("SELECT * FROM web.nope", lake["config"])


def test_should_query_current_and_earlier_snapshots(spark, lake):
    config, first = lake["config"], lake["first"]
    now, _, _ = run_query(spark, config, "SELECT count(*) AS n, sum(n) AS s FROM clicks")
    assert now.to_pylist() == [{"n": 15, "s": sum(range(15))}]
    by_id, _, pinned = run_query(spark, config, "SELECT count(*) AS n FROM web.clicks",
                                 as_of=AsOf(snapshot_id=first.snapshot_id))
    assert by_id.to_pylist() == [{"n": 10}]
    assert pinned.snapshots == {"web.clicks": first.snapshot_id}
    at = dt.datetime.fromtimestamp(first.timestamp_ms / 1000, dt.UTC).isoformat()
    by_time, _, _ = run_query(spark, config, "SELECT count(*) AS n FROM web.clicks",
                              as_of=AsOf.parse(at))
    assert by_time.to_pylist() == [{"n": 10}]
    with pytest.raises(QueryError, match="had no snapshot at 2000-01-01T00:00:00"):
        run_query(spark, config, "SELECT 1 FROM web.clicks",
                  as_of=AsOf.parse("2000-01-01T00:00:00Z"))
    with pytest.raises(CatalogError, match="has no snapshot 42"):
        run_query(spark, config, "SELECT 1 FROM web.clicks", as_of=AsOf(snapshot_id=42))


def test_should_cut_at_the_limit_and_say_so(spark, lake):
    rows, truncated, _ = run_query(spark, lake["config"], "SELECT n FROM clicks ORDER BY n",
                                   limit=4)
    assert truncated
    assert rows.column("n").to_pylist() == [0, 1, 2, 3]
    rows, truncated, _ = run_query(spark, lake["config"], "SELECT n FROM clicks", limit=100)
    assert not truncated
    assert rows.num_rows == 15


def test_should_report_spark_errors_in_table_terms(spark, lake):
    with pytest.raises(QueryError) as caught:
        run_query(spark, lake["config"], "SELECT no_such_column FROM web.clicks")
    message = str(caught.value)
    assert "no_such_column" in message
    assert "__icefloe_" not in message
    assert "\n" not in message


def test_should_print_table_json_and_csv(spark, lake):
    result, _, _ = run_query(spark, lake["config"],
                             "SELECT url, count(*) AS views, min(ts) AS first FROM clicks "
                             "GROUP BY url ORDER BY url LIMIT 2")
    out = io.StringIO()
    write(result, "table", out)
    lines = out.getvalue().splitlines()
    assert lines[1] == "| url  | views | first                     |"
    assert lines[3] == "| /p/0 |     4 | 2026-11-20 08:00:00+00:00 |"
    out = io.StringIO()
    write(result, "json", out)
    assert json.loads(out.getvalue())[0] == {"url": "/p/0", "views": 4,
                                             "first": "2026-11-20T08:00:00+00:00"}
    out = io.StringIO()
    write(result, "csv", out)
    assert out.getvalue().splitlines()[:2] == ["url,views,first",
                                               "/p/0,4,2026-11-20 08:00:00+00:00"]


def test_should_fail_in_one_line_on_an_as_of_that_is_neither(capsys, tmp_path):
    assert main(["query", "SELECT 1", "--as-of", "yesterday", "--data-dir",
                 str(tmp_path)]) == 2  # a mistyped flag: bad usage
    assert "--as-of 'yesterday': give a snapshot id" in capsys.readouterr().err


@pytest.fixture(autouse=True)
def _no_icefloe_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ICEFLOE_"):
            monkeypatch.delenv(name)


def test_should_serve_probes_and_metrics_on_the_collector_port():
    from collector.http import FAILING_AFTER, Health, HttpServer
    from collector.metrics import CollectorMetrics

    metrics = CollectorMetrics()
    server = HttpServer("127.0.0.1", 0, metrics.registry, metrics.health)
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert httpx.get(f"{base}/healthz").status_code == 200
        starting = httpx.get(f"{base}/readyz")
        assert starting.status_code == 503
        assert starting.json()["role"] == "starting"
        metrics.health.set_role("active")
        assert httpx.get(f"{base}/readyz").status_code == 200
        for _ in range(FAILING_AFTER):
            metrics.health.run_failed("StoreUnavailable: connection refused")
        failing = httpx.get(f"{base}/readyz")
        assert failing.status_code == 503
        assert "last: StoreUnavailable: connection refused" in failing.json()["reason"]
        assert httpx.get(f"{base}/healthz").status_code == 200  # liveness stays up
        assert "icefloe_collector_active" in httpx.get(f"{base}/metrics").text
        assert httpx.get(f"{base}/nope").status_code == 404
    finally:
        server.shutdown()
    assert Health().ready() == (False, "starting: opening the catalog and starting Spark")


def test_should_show_the_token_header_only_for_streams_that_need_one():
    import msgspec

    from icefloe.config import TokenConfig
    from icefloe_app.cli.up_cmd import _needs_token

    config = load_config(EXAMPLE, env={})
    pageviews, orders = config.streams
    assert not _needs_token(config, pageviews)
    scoped = msgspec.structs.replace(config, tokens=(
        TokenConfig(name="shop", hash="scrypt$x$y", streams=("orders",)),))
    assert _needs_token(scoped, orders)
    assert not _needs_token(scoped, pageviews)


def test_should_restart_a_crashed_ingestor_and_keep_serving(tmp_path):
    """`up` supervises its ingestor processes: a kill -9 of one is noticed and it is
    restarted on the shared ports, while the other keeps answering."""
    import subprocess

    http = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "icefloe", "up", "--data-dir", str(tmp_path / "data"),
         "--http-port", str(http), "--grpc-port", "0", "--ingestors", "2",
         "--kafka-port", "0", "--otlp-http-port", "0", "--otlp-grpc-port", "0",
         "--no-collector"], cwd=tmp_path, env=child_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        while "gRPC" not in (line := proc.stdout.readline()):
            assert line, proc.stderr.read() if proc.stderr else ""
        first = _ingestor_pids(proc.pid)
        assert len(first) == 2
        assert proc.stderr is not None
        log: list[str] = []
        reader = threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True)
        reader.start()
        os.kill(first[0], signal.SIGKILL)
        # a loaded machine takes seconds to start the replacement: wait for `up` to say it
        # serves (a request sent earlier would sit in its backlog until it does)
        wait_for(lambda: any("is serving again" in line for line in log), 90,
                 "the replacement ingestor to serve")
        assert first[0] not in _ingestor_pids(proc.pid)
        assert len(_ingestor_pids(proc.pid)) == 2
        for i in range(20):  # both the survivor and the replacement answer on the port
            response = httpx.post(f"http://127.0.0.1:{http}/v1/streams/pageviews/events",
                                  json={"user_id": f"u{i}", "url": "/"}, timeout=10)
            assert response.status_code == 202
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    reader.join(10)
    assert code == 0
    assert any("stopped (exit code -9); restarting in 1 s" in line for line in log), log


@pytest.mark.timeout(300)
def test_should_serve_the_admin_api_and_apply_its_changes_while_running(tmp_path):
    """`up` with [admin] tokens serves the admin API; a source created there is accepted by
    the running ingestors within the registry poll interval, without a restart."""
    import subprocess

    from icefloe.tokens import hash_token

    config = tmp_path / "icefloe.toml"
    config.write_text(EXAMPLE.read_text() + '\n[admin]\ntokens = ["'
                      + hash_token("admin-token", log2_n=10) + '"]\nregistry_poll_s = 0.2\n')
    http = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "icefloe", "up", "--config", str(config), "--data-dir",
         str(tmp_path / "data"), "--http-port", str(http), "--grpc-port", "0",
         "--admin-port", "0", "--kafka-port", "0", "--no-otlp", "--no-collector"],
        cwd=tmp_path,
        env=child_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        while "admin" not in (line := proc.stdout.readline()) or "http" not in line:
            assert line, proc.stderr.read() if proc.stderr else ""
        admin = re.search(r"http://[\d.]+:(\d+)/v1/sources", line)
        assert admin is not None, line
        api = httpx.Client(base_url=f"http://127.0.0.1:{admin.group(1)}", timeout=30,
                           headers={"authorization": "Bearer admin-token"})
        listed = api.get("/v1/sources").json()
        assert [s["id"] for s in listed["sources"]] == ["pageviews", "orders"]
        task = api.post("/v1/sources", json={"id": "signups", "sinks": [{
            "name": "signups", "table": "web.signups",
            "columns": [{"name": "email", "type": "string", "required": True}]}]}).json()
        wait_for(lambda: api.get(f"/v1/tasks/{task['task']['id']}").json()["task"]["state"]
                 == "succeeded", 60, "the create task")
        url = f"http://127.0.0.1:{http}/v1/streams/signups/events"
        wait_for(lambda: httpx.post(url, json={"email": "a@b.c"}, timeout=10).status_code
                 == 202, 30, "the ingestor to serve the new source")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0


async def test_should_count_a_child_stopped_while_still_starting_as_clean():
    """`up` stopped right after restarting an ingestor: the replacement, still starting
    (no handlers, nothing accepted), dies of the SIGTERM — that is a clean stop, while a
    ready child's exit code counts as it is."""
    from icefloe_app.cli.ingestor_group import IngestorGroup

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    group = IngestorGroup(1, sleeper, stop_timeout_s=10)
    group.children = [await group._spawn(0)]
    assert await group.stop() == [0]
    ready = IngestorGroup(1, sleeper, stop_timeout_s=10)
    ready.children = [await ready._spawn(0)]
    ready.children[0].ready.set_result({"event": "ready"})
    assert await ready.stop() == [-signal.SIGTERM]


async def test_should_give_each_child_its_own_shard_index():
    """`up --ingestors N` spreads its children over the manifest shards exactly: child i
    gets ``ingestor.shard_index`` = base + i through the environment (hashed picks put
    several children on one shard)."""
    from icefloe_app.cli.ingestor_group import IngestorGroup

    child = [sys.executable, "-c",
             "import json, os, sys, time; print(json.dumps({'event': 'ready', 'index': "
             "os.environ.get('ICEFLOE_INGESTOR_SHARD_INDEX')}), flush=True); time.sleep(60)"]
    group = IngestorGroup(3, child, stop_timeout_s=10, shard_base=2)
    await group.start()
    try:
        assert sorted(c.ready.result()["index"] for c in group.children) == ["2", "3", "4"]
    finally:
        await group.stop()
