"""Seconds to the first answer from a cold start (issue #43 item 4): ``icefloe up`` on an
empty data directory, the bundled example config (what ``make up`` runs), then the curl
example it prints sent as soon as the ingestor answers, then the time until that event is
committed (visible to every reader) — target ≤ 20 s on a quiet machine.

Broken out, from the same run: the ingestor ready (``/readyz``), the collector active (its
"collector active" line: catalog, lease; ``icefloe up``'s collector commits in-process while
its SparkSession starts, :mod:`collector.spark_bridge`), the first commit after it, the
collector's Spark up (``icefloe_collector_spark_ready``: from then on runs go to Spark);
and, in a process of its own, a bare ``SparkSession`` start on ``local[2]`` (the JVM
start alone, what no icefloe code can cut). The event's visibility is then checked with a
cold ``icefloe query`` process (DuckDB engine; its time is reported, not counted).

Usage: python bench/cold_start_bench.py [--quick] [--json PATH]
(``--quick``: one start instead of three.)
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import Result, bench_parser, print_table, write_json
from _scale_processes import scrape, spark_lock, total

from testing.chaos.cluster import free_port

ICEFLOE = str(Path(sys.executable).with_name("icefloe"))
TIMEOUT_S = 300.0
CURL = re.compile(r"curl -X POST (\S+) .*-d '(.*)'$")


@dataclass
class Start:
    ingestor_ready_s: float = 0.0
    collector_active_s: float = 0.0
    spark_ready_s: float = 0.0
    committed_s: float = 0.0
    query_s: float = 0.0
    lines: list[tuple[float, str]] = field(default_factory=list)


def _pump(stream, began: float, out: queue.Queue[tuple[float, str]]) -> None:
    for line in stream:
        out.put((time.monotonic() - began, line.rstrip("\n")))


def _wait(what: str, check, began: float) -> float:
    while time.monotonic() - began < TIMEOUT_S:
        if check():
            return time.monotonic() - began
        time.sleep(0.05)
    raise RuntimeError(f"{what}: not within {TIMEOUT_S:.0f} s")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _curl_example(lines: queue.Queue[tuple[float, str]], seen: list[tuple[float, str]]
                  ) -> tuple[str, bytes]:
    """The URL and body of the curl example ``icefloe up`` prints."""
    while True:
        at, line = lines.get(timeout=TIMEOUT_S)
        seen.append((at, line))
        match = CURL.search(line.strip())
        if match:
            return match.group(1), match.group(2).encode()


def one_start(root: Path) -> Start:
    http, metrics = free_port(), free_port()
    args = [ICEFLOE, "up", "--data-dir", str(root / "data"), "--http-port", str(http),
            "--grpc-port", str(free_port()), "--metrics-port", str(metrics),
            "--kafka-port", "0", "--otlp-http-port", "0", "--otlp-grpc-port", "0",
            "--admin-port", "0"]
    began = time.monotonic()
    proc = subprocess.Popen(args, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)
    lines: queue.Queue[tuple[float, str]] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, began, lines), daemon=True).start()
    start = Start()
    try:
        url, body = _curl_example(lines, start.lines)
        start.ingestor_ready_s = _wait("the ingestor's /readyz",
                                       lambda: _answers(f"http://127.0.0.1:{http}/readyz"), began)
        request = urllib.request.Request(url.replace("0.0.0.0", "127.0.0.1"), data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status in (200, 202), response.status
        collector = f"http://127.0.0.1:{metrics}/metrics"
        start.committed_s = _wait(
            "the event's commit",
            lambda: _answers(collector) and total(
                scrape(collector), "icefloe_collector_rows_committed") >= 1, began)
        start.spark_ready_s = _wait(  # the collector commits in-process until then
            "the collector's SparkSession",
            lambda: total(scrape(collector), "icefloe_collector_spark_ready") >= 1, began)
        while not lines.empty():
            start.lines.append(lines.get())
        active = [at for at, line in start.lines if "collector active" in line]
        start.collector_active_s = active[0] if active else float("nan")
        started = time.monotonic()
        stream = url.rsplit("/streams/", 1)[1].split("/")[0]
        query = subprocess.run([ICEFLOE, "query", "--data-dir", str(root / "data"),
                                "--engine", "duckdb", "--format", "json",
                                f"SELECT count(*) AS n FROM {stream}"],
                               cwd=root, capture_output=True, text=True, timeout=120)
        start.query_s = time.monotonic() - started
        if query.returncode or not re.search(r'"n":\s*1\b', query.stdout):
            raise RuntimeError(f"icefloe query did not see the event: {query.stdout} "
                               f"{query.stderr[-500:]}")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return start


def bare_spark_start() -> float:
    """Seconds for a bare local[2] SparkSession in a fresh process (the JVM start)."""
    code = ("import time; t=time.monotonic(); from pyspark.sql import SparkSession; "
            "s=SparkSession.builder.master('local[2]').getOrCreate(); s.range(1).count(); "
            "print(time.monotonic()-t); s.stop()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = bench_parser(__doc__, "one start instead of three")
    args = parser.parse_args()
    starts: list[Start] = []
    with spark_lock():
        for i in range(1 if args.quick else 3):
            with tempfile.TemporaryDirectory(prefix="cold-start-") as tmp:
                start = one_start(Path(tmp))
            print(f"start {i + 1}: ingestor ready {start.ingestor_ready_s:.1f} s, collector "
                  f"active {start.collector_active_s:.1f} s, event committed "
                  f"{start.committed_s:.1f} s", flush=True)
            starts.append(start)
        spark_s = bare_spark_start()
    rows = []
    for i, s in enumerate(starts, 1):
        rows += [
            Result(f"start {i}: icefloe up -> first event committed (target <= 20 s)",
                   s.committed_s, "s", 20.0),
            Result(f"start {i}:   ingestor answering /readyz", s.ingestor_ready_s, "s"),
            Result(f"start {i}:   collector active (catalog, lease; its Spark starts beside)",
                   s.collector_active_s, "s"),
            Result(f"start {i}:   first commit after the collector is active",
                   s.committed_s - s.collector_active_s, "s"),
            Result(f"start {i}: the collector's Spark up (JVM, session; runs go to it)",
                   s.spark_ready_s, "s"),
            Result(f"start {i}: then a cold icefloe query (DuckDB) seeing the event",
                   s.query_s, "s"),
        ]
    rows.append(Result("bare SparkSession start on local[2], fresh process (JVM start)",
                       spark_s, "s"))
    print_table("cold start: icefloe up on an empty data directory (the bundled example)", rows)
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
