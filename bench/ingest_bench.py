"""Ingest benchmark: durable events/s and ack latency over HTTP and gRPC, with ceilings.

Runs, side by side in one run, on this machine:

* the bare stacks (``_bare_servers.py``): raw ASGI on uvicorn answering 202 without doing
  anything, and a grpc.aio Ingest service that decodes each event with msgspec into a
  list and answers (as the CEILINGS.md probe did) — the ceilings;
* a real ``icefloe ingestor`` on a local store, whose 202/ack means "in a batch file listed
  by the manifest" (validation, canonicalisation, zstd, fsync'd PUT, manifest CAS);
* diagnostics that split the gap to the bare stack: the same fronts answering without
  durability (``_nondurable_ingestor.py``); the durable ingestor with its store on tmpfs
  (``/dev/shm``: the same acks, no disk under the fsyncs); the bare HTTP stack at the durable
  row's 256 connections (what that many connections cost any stack); and the flush cadence
  behind the durable rows with targets, from the ingestor's own metrics (flushes per second,
  events per flush, mean flush time, the share of the run a flush was in flight); and, for
  HTTP single events, the event loop's CPU time per request and busy share, read from the
  main thread of the ingestor and of the bare stack (``/proc``, Linux only), beside the CPU
  per request at which the target would fit in the loop's measured busy share.

The rows with targets and their ceilings are measured in turns (bare, icefloe, bare, ...),
after one short unrecorded pass of each against both servers, three times in a full run
(once, without the warm-up pass and the tmpfs diagnostic rows, with ``--quick``),
and reported as medians (the durable rows' median also counts the pass that records their
latencies). A full run then measures those rows again in two more runs, each on new
servers and a new store (``RUNS``; every store is deleted only after the last run), and
the table lists every round of every run against its target. Load comes from separate
processes: ``wrk`` (HTTP; falls back to nothing if missing — install Debian's ``wrk``)
and ``_grpc_load.py`` (gRPC). Events are ~200-byte JSON objects.

Where the durable store lives (``--store-dir``, default ``bench/.work`` in this checkout):
not the system temp dir. On this VM the ``open()`` that creates a put's temp file cost up to
about 1 ms of kernel CPU in directories under ``/tmp`` (a third of the store helper's
samples in py-spy, HTTP single events at 256 connections 0.53-0.74 of the bare stack) and
about 12 µs under the checkout (under 2 % of the samples, 0.86-0.95 in the same alternating
rounds), and every flush created two files (the batch file and the manifest's
replacement): the durable rows measured /tmp, not icefloe. Why: this VM's ext4 has no
journal, and there a create skips every inode its block group freed in the last 60-300 s
(temp dirs come and go under /tmp); the local store now also keeps a replaced manifest's
inode for its next version instead of freeing it. The first diagnostic row reports
what that ``open()`` costs where the store is, against a fresh directory in the system temp
dir, so a run on a disk with the same trouble says so. A run's own cleanup is such trouble
for the next run: a full run waits until the previous run's store was deleted
``DELETIONS_AGE_S`` ago (a quick run only warns).

Usage: python bench/ingest_bench.py [--quick] [--json PATH]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Result, bench_parser, print_table, write_json
from _scale_processes import scrape, total

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
RUNS = 3
"""A full run measures the rows with targets in this many runs, each on new servers and a
new store (the first also measures every other row): issue #43 item 6 asks for three runs
in the table of record."""
FULL_ROUND_S = 10.0
"""Seconds per load in a full run (3 with ``--quick``)."""
ROUNDS = 3
"""Full runs measure the rows with targets (HTTP single events at 256 connections, gRPC
unary) and their bare ceilings in turns, this many times, and report medians: this VM
moves 10-15 % between runs, and a ratio of two single runs doubles that."""
PYTHON = sys.executable
ICEFLOE = str(Path(PYTHON).parent / "icefloe")
EVENT = ('{"user_id":"user-%05d","url":"https://example.com/products/%d?ref=campaign-7",'
         '"duration_ms":%d,"ts":"2026-11-23T01:02:03.456Z","ref":"newsletter-2026-11"}')
SINGLE = EVENT % (1, 2, 3)
"""The body of every single-event HTTP POST."""
CONFIG = """
[store]
url = "file://store"
[ingestor]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
[[streams]]
name = "pageviews"
table = "web.pageviews"
columns = [
  { name = "user_id", type = "string", required = true },
  { name = "url", type = "string" },
  { name = "duration_ms", type = "long" },
  { name = "ts", type = "timestamp" },
  { name = "ref", type = "string" },
]
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


@contextlib.contextmanager
def process(args: list[str], port: int | None = None) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if port is not None:
            wait_port(port)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


CREATE_SAMPLES = 200


def file_create_us(directory: Path) -> float:
    """Median µs of the ``open(O_CREAT)`` in a put done the local store's way in
    ``directory`` (a new temp file, 4 KiB written and fsynced, renamed over one of a few
    keys): the part of a flush the kernel charges per new file, which costs a hundred
    times more in some directories of this VM than in others."""
    directory.mkdir(parents=True, exist_ok=True)
    samples, body = [], b"x" * 4096
    for i in range(CREATE_SAMPLES):
        path = directory / f".create-probe-{i}"
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        samples.append((time.perf_counter() - start) * 1e6)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(path, directory / f"probe-key-{i % 8}")
    return statistics.median(samples)


def create_cost_row(store_dir: Path) -> Result:
    """What a new file costs where the durable ingestor's store is made, against a fresh
    directory in the system temp dir (measured after the run's loads: its renames free
    inodes next to the store)."""
    with tempfile.TemporaryDirectory(prefix="icefloe-create-probe-") as tmp:
        in_tmp = file_create_us(Path(tmp) / "store")
    with tempfile.TemporaryDirectory(prefix="create-probe-", dir=store_dir) as tmp:
        in_store = file_create_us(Path(tmp))
    return Result(f"diagnostic: creating a file where the store is (baseline: in "
                  f"{tempfile.gettempdir()})", in_store, "us", in_tmp)


def wrk_seconds(seconds: float) -> int:
    """How long :func:`wrk` runs for ``seconds``: wrk takes whole seconds, at least one."""
    return max(1, int(seconds))


def wrk(url: str, body: str, seconds: float, connections: int, workdir: Path
        ) -> tuple[float, float, float]:
    """(requests/s, p50 ms, p99 ms) of POSTing ``body`` with wrk."""
    body_file = workdir / f"body-{len(body)}.json"
    body_file.write_text(body)
    script = workdir / f"post-{len(body)}.lua"
    script.write_text(textwrap.dedent(f"""
        wrk.method = "POST"
        wrk.body = io.open("{body_file}", "rb"):read("*a")
        wrk.headers["Content-Type"] = "application/json"
    """))
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{wrk_seconds(seconds)}s",
                          "--latency", "-s", str(script), url],
                         capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        print(f"  warning: {non2xx.group(1)} non-2xx responses from {url}", file=sys.stderr)
    return rate, _percentile(out, "50%"), _percentile(out, "99%")


def _percentile(wrk_output: str, label: str) -> float:
    match = re.search(rf"{re.escape(label)}\s+([\d.]+)(us|ms|s)", wrk_output)
    if not match:
        return float("nan")
    value, unit = float(match.group(1)), match.group(2)
    return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value


def grpc_load(port: int, mode: str, seconds: float, concurrency: int) -> dict[str, float]:
    out = subprocess.run([PYTHON, str(HERE / "_grpc_load.py"), f"127.0.0.1:{port}", mode,
                          str(seconds), "100", str(concurrency)],
                         capture_output=True, text=True, check=True).stdout
    data = json.loads(out.strip().splitlines()[-1])
    data["events_per_s"] = data["events"] / data["seconds"]
    return data


def loop_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) of the main thread of ``pid``: the event loop, in the
    ingestor and in the bare stacks alike. None where there is no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass
class LoopLoad:
    """The event loop's share of load runs (wrk's HTTP, or gRPC calls): CPU seconds,
    requests and wall seconds, added over the rounds of one server."""

    cpu_s: float = 0.0
    requests: float = 0.0
    seconds: float = 0.0

    def run(self, pid: int, seconds: float, load: Callable[[], tuple[float, float, float]]
            ) -> tuple[float, float, float]:
        """Run a wrk ``load`` of ``seconds`` against the server ``pid`` and add what its loop
        spent. The CPU is read around wrk's start and exit, so it also holds accepting and
        closing the connections (the same for both servers); the busy share divides it by
        that whole wall time, the CPU per request by wrk's requests."""
        before, started = loop_cpu_s(pid), time.monotonic()
        answer = load()
        after, elapsed = loop_cpu_s(pid), time.monotonic() - started
        if before is not None and after is not None:
            self.cpu_s += after - before
            self.requests += answer[0] * seconds
            self.seconds += elapsed
        return answer

    def run_grpc(self, pid: int, seconds: float, load: Callable[[], dict[str, float]]
                 ) -> dict[str, float]:
        """:meth:`run` for a :func:`grpc_load` of 100-event calls: a request is a call."""
        answer: dict[str, float] = {}

        def calls() -> tuple[float, float, float]:
            answer.update(load())
            return answer["events_per_s"] / 100, 0.0, 0.0

        self.run(pid, seconds, calls)
        return answer

    def per_request_us(self) -> float:
        """Event-loop CPU microseconds per request over the runs added so far."""
        return self.cpu_s / self.requests * 1e6

    def busy_share(self) -> float:
        """The event loop's CPU over the wall time of the runs added so far (0-1)."""
        return self.cpu_s / self.seconds


def grpc_loop_rows(ours: LoopLoad, bare: LoopLoad, cadence: list[Result]) -> list[Result]:
    """Why durable gRPC unary trails its bare stack: the event loop's CPU per call and busy
    share against the bare stack's (a loop that is not busy all the time waits), and how
    many flush periods a call's round trip spans. 32 calls each wait for their flush, so a
    call that misses one seal waits for the next: at two periods per round trip the rate is
    32 calls per two periods, whatever the loop could do."""
    if not (ours.requests and bare.requests):
        return []
    label = "diagnostic: gRPC unary 100-event batch, durable"
    rows = [Result(f"{label}: event-loop CPU per call (baseline: the bare stack's)",
                   ours.per_request_us(), "us", bare.per_request_us()),
            Result(f"{label}: event-loop busy share", ours.busy_share() * 100, "%"),
            Result("diagnostic: bare gRPC stack, unary 100-event, 32 calls: event-loop busy "
                   "share", bare.busy_share() * 100, "%")]
    per_flush = next((r.value for r in cadence if r.name.endswith(": events per flush")), 0)
    if per_flush:
        rows.append(Result(f"{label}: flush periods per call round trip (32 calls over "
                           "calls per flush)", 32 / (per_flush / 100), "periods"))
    return rows


def loop_rows(ours: LoopLoad, bare: LoopLoad, bare_rate: float) -> list[Result]:
    """Event-loop CPU per request and busy share of the durable HTTP row against the bare
    stack's, and the CPU per request at which 0.8 of the bare stack fits in the share of
    the loop this run measured (what the target asks of the loop)."""
    if not (ours.requests and bare.requests):
        return []
    label = "diagnostic: HTTP single-event POST, durable, 256 conns"
    busy = ours.busy_share()
    bare_per_request = bare.per_request_us()
    return [
        Result(f"{label}: event-loop CPU per request (baseline: the bare stack's at 32 conns)",
               ours.per_request_us(), "us", bare_per_request),
        Result(f"{label}: event-loop busy share", busy * 100, "%"),
        Result("diagnostic: bare HTTP stack, single-event POST, 32 conns: event-loop busy share",
               bare.busy_share() * 100, "%"),
        Result(f"{label}: event-loop CPU per request at which 0.8 of the bare stack fits in "
               "that busy share", busy / (0.8 * bare_rate) * 1e6, "us", bare_per_request)]


def flush_cadence(metrics_url: str, label: str, seconds: float, load: Callable[[], T]
                  ) -> tuple[T, list[Result]]:
    """Run ``load`` (its answer is returned) and read, from the ingestor's metrics before and
    after, how its flushes went meanwhile: flushes per second, events per flush, the mean
    flush time (batch file + manifest append, as the ingestor waits for it) and the share of
    the run a flush was in flight (flush seconds over the run; near 100 %: the flusher is
    the critical path)."""
    before = scrape(metrics_url)
    answer = load()
    after = scrape(metrics_url)

    def delta(name: str) -> float:
        return total(after, name) - total(before, name)

    flushes = delta("icefloe_ingest_flush_seconds_count")
    if not flushes:
        return answer, []
    busy = delta("icefloe_ingest_flush_seconds_sum")
    name = f"diagnostic: {label}"
    return answer, [
        Result(f"{name}: flushes per second", flushes / seconds, "flushes/s"),
        Result(f"{name}: events per flush",
               delta("icefloe_ingest_batch_events_sum") / flushes, "events"),
        Result(f"{name}: mean flush time", busy / flushes * 1000, "ms"),
        Result(f"{name}: share of the run a flush was in flight", busy / seconds * 100, "%")]


def light_latency(url: str, seconds: float) -> tuple[float, float]:
    """Ack latency of single-event POSTs sent one at a time (~light load)."""
    samples: list[float] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=10) as client:
        i = 0
        while time.monotonic() < deadline:
            body = EVENT % (i, i, i)
            started = time.perf_counter()
            client.post(url, content=body, headers={"content-type": "application/json"})
            samples.append((time.perf_counter() - started) * 1000)
            i += 1
            time.sleep(0.005)
    samples.sort()
    return samples[len(samples) // 2], samples[int(len(samples) * 0.99)]


WARM_UP_S = 2.0


def warm_up(servers: Fronts, workdir: Path, have_wrk: bool) -> None:
    """One short, unrecorded pass of each loaded row against both servers before the rounds
    of record: a first round otherwise also measured each process's warm-up (its first
    heavy load, gRPC's channel and the store's first files) and ran lowest on both sides."""
    if have_wrk:
        wrk(servers.bare_url, SINGLE, WARM_UP_S, 32, workdir)
        wrk(servers.url, SINGLE, WARM_UP_S, 256, workdir)
    grpc_load(servers.bare_grpc, "unary", WARM_UP_S, 32)
    grpc_load(servers.grpc_port, "unary", WARM_UP_S, 32)


def batch_body(n: int) -> str:
    return "[" + ",".join(EVENT % (i, i % 997, i * 37 % 60000) for i in range(n)) + "]"


def start_ingestor(workdir: Path, *, durable: bool = True
                   ) -> tuple[subprocess.Popen[str], int, int]:
    """A real ``icefloe ingestor``; ``durable=False``: the diagnostic one that answers
    without writing (``_nondurable_ingestor.py``)."""
    config = workdir / "icefloe.toml"
    config.write_text(CONFIG)
    command = [ICEFLOE, "ingestor", "--config", str(config), "--log-level", "warning"] \
        if durable else [PYTHON, str(HERE / "_nondurable_ingestor.py"), str(config)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    ready = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
    return proc, ready["http_port"], ready["grpc_port"]


def start_drain(workdir: Path) -> subprocess.Popen[str]:
    """A consumer that acks and dequeues every second, as the collector does."""
    proc = subprocess.Popen([PYTHON, str(HERE / "_drain.py"), (workdir / "store").as_uri()],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    proc.stdout.readline()  # type: ignore[union-attr]
    return proc


DELETIONS_AGE_S = 360.0
"""A full run starts at least this long after the previous run's store was deleted (the
``DELETED_MARKER`` file in the store's parent says when). Why: on ext4 without a journal a
create skips every inode its block group freed in the last 60-300 s (see above), and a
run's cleanup frees tens of thousands; full runs started four and five minutes after one
measured HTTP single events at 0.64-0.67 of the bare stack in their first rounds, against
0.92-0.95 in a run started thirteen minutes after."""
DELETED_MARKER = ".last-store-deleted"


def wait_for_deletions_to_age(store_parent: Path, quick: bool) -> None:
    """Wait (a full run) or warn (``--quick``) while the previous run's deletions are recent
    enough to slow this run's creates."""
    try:
        deleted = (store_parent / DELETED_MARKER).stat().st_mtime
    except FileNotFoundError:
        return
    age = time.time() - deleted
    if age >= DELETIONS_AGE_S:
        return
    if quick:
        print(f"note: the previous run's store was deleted {age:.0f} s ago; on a file system "
              "that delays reusing freed inodes the durable rows may read low", file=sys.stderr)
        return
    while (left := DELETIONS_AGE_S - age) > 0:
        print(f"waiting {left:.0f} s more: the previous run's store was deleted {age:.0f} s "
              "ago, and creates right after many deletions cost more on this kind of file "
              "system", file=sys.stderr, flush=True)
        time.sleep(min(30.0, left))
        age = time.time() - deleted


def run(quick: bool, store_parent: Path) -> list[Result]:
    store_parent.mkdir(parents=True, exist_ok=True)
    wait_for_deletions_to_age(store_parent, quick)
    have_wrk = shutil.which("wrk") is not None
    try:
        # every run's store is kept until the last run is over: a run's deletions would
        # slow the next run's creates (see above)
        with tempfile.TemporaryDirectory(prefix="icefloe-ingest-bench-",
                                         dir=store_parent) as tmp:
            results, first = measure(quick, Path(tmp) / "run-1", have_wrk)
            runs = [first]
            for number in range(2, 1 if quick else RUNS + 1):
                print(f"run {number} of {RUNS}: the rows with targets again, on new servers "
                      "and a new store", file=sys.stderr, flush=True)
                runs.append(record_run(Path(tmp) / f"run-{number}", have_wrk))
            return results + rounds_of_record(runs)
    finally:  # the next invocation waits for these deletions to age
        (store_parent / DELETED_MARKER).touch()


@dataclasses.dataclass
class Fronts:
    """One run's servers: the bare stacks and a durable ingestor (its drain beside it)."""

    bare_pid: int
    """The bare HTTP stack's pid (0 without ``wrk``: then it is not started)."""
    bare_url: str
    bare_grpc_pid: int
    bare_grpc: int
    proc: subprocess.Popen[str]
    http_port: int
    grpc_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/streams/pageviews/events"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metrics"


@contextlib.contextmanager
def fronts(workdir: Path, have_wrk: bool) -> Iterator[Fronts]:
    """Start the bare stacks and a durable ingestor with its store in ``workdir``; stop
    them all on exit."""
    with contextlib.ExitStack() as servers:
        bare_http, bare_pid = free_port(), 0
        if have_wrk:
            bare_pid = servers.enter_context(process(
                [PYTHON, str(HERE / "_bare_servers.py"), "http", str(bare_http)],
                bare_http)).pid
        bare_grpc = free_port()
        bare_grpc_pid = servers.enter_context(process(
            [PYTHON, str(HERE / "_bare_servers.py"), "grpc", str(bare_grpc)], bare_grpc)).pid
        workdir.mkdir(parents=True, exist_ok=True)
        proc, http_port, grpc_port = start_ingestor(workdir)
        drain = start_drain(workdir)
        try:
            yield Fronts(bare_pid, f"http://127.0.0.1:{bare_http}/", bare_grpc_pid, bare_grpc,
                         proc, http_port, grpc_port)
        finally:
            for child in (proc, drain):
                child.send_signal(signal.SIGTERM)
                child.wait(60)


def rounds_with_targets(servers: Fronts, rounds: int, seconds: float, workdir: Path,
                        have_wrk: bool, loops: tuple[LoopLoad, LoopLoad],
                        grpc_loops: tuple[LoopLoad, LoopLoad]) -> dict[str, list[float]]:
    """The rows with targets and their bare ceilings in turns (bare, icefloe, bare, ...),
    ``rounds`` times: each row's rates by round. ``loops``/``grpc_loops`` (ours, the bare
    stack's) add up what each event loop spent."""
    paired: dict[str, list[float]] = {}

    def ours(row: str, load: Callable[[], T]) -> T:
        # the mean flush time of each round too: a round that falls says whether its
        # flushes slowed (the disk) or not
        answer, cadence = flush_cadence(servers.metrics_url, row, seconds, load)
        paired.setdefault(f"{row} flush ms", []).extend(
            r.value for r in cadence if r.name.endswith(": mean flush time"))
        return answer

    span = wrk_seconds(seconds)
    for _ in range(rounds):
        if have_wrk:
            paired.setdefault("bare single", []).append(loops[1].run(
                servers.bare_pid, span,
                lambda: wrk(servers.bare_url, SINGLE, seconds, 32, workdir))[0])
            paired.setdefault("single 256", []).append(ours("single 256", lambda: (
                loops[0].run(servers.proc.pid, span,
                             lambda: wrk(servers.url, SINGLE, seconds, 256, workdir))))[0])
        paired.setdefault("bare unary", []).append(grpc_loops[1].run_grpc(
            servers.bare_grpc_pid, seconds,
            lambda: grpc_load(servers.bare_grpc, "unary", seconds, 32))["events_per_s"])
        paired.setdefault("unary", []).append(ours("unary", lambda: grpc_loops[0].run_grpc(
            servers.proc.pid, seconds,
            lambda: grpc_load(servers.grpc_port, "unary", seconds, 32)))["events_per_s"])
    return paired


def record_run(workdir: Path, have_wrk: bool) -> dict[str, list[float]]:
    """Another full run's rows with targets only: new bare stacks, a new ingestor and a new
    store, the warm-up pass, then the rounds in turns (issue #43 item 6 asks for three
    runs in the table of record; the diagnostics are measured once, in the first)."""
    with fronts(workdir, have_wrk) as servers:
        warm_up(servers, workdir, have_wrk)
        return rounds_with_targets(servers, ROUNDS, FULL_ROUND_S, workdir, have_wrk,
                                   (LoopLoad(), LoopLoad()), (LoopLoad(), LoopLoad()))


def measure(quick: bool, workdir: Path, have_wrk: bool
            ) -> tuple[list[Result], dict[str, list[float]]]:
    """One run of every row, its store in ``workdir``: the results (without the rounds of
    record) and the rows with targets' rates by round."""
    seconds = 3.0 if quick else FULL_ROUND_S
    rounds = 1 if quick else ROUNDS
    results: list[Result] = []
    single, batch = SINGLE, batch_body(100)
    workdir.mkdir(parents=True, exist_ok=True)
    diagnostics: list[Result] = []
    loops = LoopLoad(), LoopLoad()  # ours, the bare stack's
    grpc_loops = LoopLoad(), LoopLoad()
    with fronts(workdir, have_wrk) as servers:
        url, bare_url, metrics_url = servers.url, servers.bare_url, servers.metrics_url
        p50, p99 = light_latency(url, seconds / 2)
        results += [Result("ack latency p50, light load (1 client, HTTP single)", p50, "ms"),
                    Result("ack latency p99, light load (1 client, HTTP single)", p99, "ms")]
        if not quick:  # a quick run records nothing of record and must stay short
            warm_up(servers, workdir, have_wrk)
        # the rows with targets: bare and icefloe in turns, the median of each
        paired = rounds_with_targets(servers, rounds, seconds, workdir, have_wrk, loops,
                                     grpc_loops)
        bare = {"unary": statistics.median(paired["bare unary"]),
                "stream": grpc_load(servers.bare_grpc, "stream", seconds, 4)["events_per_s"]}
        if have_wrk:
            bare["single"] = statistics.median(paired["bare single"])
            diagnostics += loop_rows(*loops, bare["single"])
            bare["batch"] = wrk(bare_url, batch, seconds, 32, workdir)[0] * 100
            for connections in (32, 256, 512):  # durable acks: rate = clients / ack time
                label = f"HTTP single-event POST, durable, {connections} conns"
                if connections == 256:
                    (rate, p50, p99), cadence = flush_cadence(
                        metrics_url, label, wrk_seconds(seconds),
                        lambda: wrk(url, single, seconds, 256, workdir))
                    diagnostics += cadence
                    rate = statistics.median([*paired["single 256"], rate])
                    bare["single 256"] = wrk(bare_url, single, seconds, 256, workdir)[0]
                    diagnostics += [
                        Result("diagnostic: bare HTTP stack, single-event POST, 256 conns "
                               "(the durable row's load; baseline: its ceiling)",
                               bare["single 256"], "req/s", bare["single"]),
                        Result("diagnostic: HTTP single-event POST, durable, 256 conns, "
                               "against the bare stack at 256 conns", rate, "events/s",
                               bare["single 256"])]
                else:
                    rate, p50, p99 = wrk(url, single, seconds, connections, workdir)
                results += [Result(label, rate, "events/s", bare["single"]),
                            Result(f"{label}: ack p50", p50, "ms"),
                            Result(f"{label}: ack p99", p99, "ms")]
            for connections in (32, 128):
                rate, p50, p99 = wrk(url, batch, seconds, connections, workdir)
                label = f"HTTP 100-event batch, durable, {connections} conns"
                results += [Result(label, rate * 100, "events/s", bare["batch"]),
                            Result(f"{label}: ack p50", p50, "ms"),
                            Result(f"{label}: ack p99", p99, "ms")]
        unary, cadence = flush_cadence(
            metrics_url, "gRPC unary 100-event batch, durable", seconds,
            lambda: grpc_load(servers.grpc_port, "unary", seconds, 32))
        diagnostics += cadence + grpc_loop_rows(*grpc_loops, cadence)
        stream = grpc_load(servers.grpc_port, "stream", seconds, 4)
        results += [
            Result("gRPC unary 100-event batch, durable",
                   statistics.median([*paired["unary"], unary["events_per_s"]]),
                   "events/s", bare["unary"]),
            Result("gRPC unary ack p50", unary["p50_ms"], "ms"),
            Result("gRPC unary ack p99", unary["p99_ms"], "ms"),
            Result("gRPC client-streaming 100-event msgs, durable", stream["events_per_s"],
                   "events/s", bare["stream"]),
            Result("gRPC streaming ack p50", stream["p50_ms"], "ms"),
            Result("gRPC streaming ack p99", stream["p99_ms"], "ms")]
    results += diagnostics
    bare_loop_us = loops[1].per_request_us() if loops[1].requests else None
    results += nondurable(workdir, seconds, single, bare, bare_loop_us, have_wrk)
    if not quick:  # diagnostics only; a quick run must stay under a minute
        results += on_tmpfs(seconds, single, bare, bare_loop_us, have_wrk)
    if have_wrk:
        results += [Result("bare HTTP stack, single-event POST (ceiling)", bare["single"],
                           "req/s"),
                    Result("bare HTTP stack, 100-event POST (ceiling)", bare["batch"],
                           "events/s")]
    results += [Result("bare gRPC unary 100-event (ceiling)", bare["unary"], "events/s"),
                Result("bare gRPC streaming 100-event (ceiling)", bare["stream"],
                       "events/s")]
    if not have_wrk:
        print("note: wrk not found; HTTP throughput rows skipped (apt-get install wrk)",
              file=sys.stderr)
    # measured last, listed first: the probe's own files are replaced and deleted, and a
    # create right after deletions nearby costs more (see above), so it must not run just
    # before the rounds
    return [create_cost_row(workdir), *results], paired


def rounds_of_record(runs: list[dict[str, list[float]]]) -> list[Result]:
    """Each round of each run of the rows with targets, against the bare stack measured
    beside it (issue #43 item 6 asks for three runs in the table, not only medians)."""
    results: list[Result] = []
    for ours, bare, label in (("single 256", "bare single",
                               "HTTP single-event POST, durable, 256 conns"),
                              ("unary", "bare unary", "gRPC unary 100-event batch, durable")):
        for run_number, paired in enumerate(runs, 1):
            for number, (value, ceiling) in enumerate(zip(paired.get(ours, []),
                                                          paired.get(bare, []), strict=True),
                                                      1):
                results.append(Result(f"{label}, run {run_number}, round {number} "
                                      "(target >= 0.8)", value, "events/s", ceiling))
                flush_ms = paired.get(f"{ours} flush ms", [])
                if len(flush_ms) >= number:
                    results.append(Result(f"diagnostic: {label}, run {run_number}, round "
                                          f"{number}: mean flush time", flush_ms[number - 1],
                                          "ms"))
    return results


def nondurable(workdir: Path, seconds: float, single: str, bare: dict[str, float],
               bare_loop_us: float | None, have_wrk: bool) -> list[Result]:
    """The same fronts without durability: how much of the gap to the bare stack is
    icefloe's per-request work (validation, ids, framing, metrics) rather than the wait
    for the batch file and manifest append."""
    return diagnostic_rows(workdir, "not durable", seconds, single, bare, bare_loop_us,
                           have_wrk, durable=False)


def on_tmpfs(seconds: float, single: str, bare: dict[str, float],
             bare_loop_us: float | None, have_wrk: bool) -> list[Result]:
    """The durable rows again with the store in memory (``/dev/shm``): every ack still waits
    for the batch file and the manifest append, but an fsync costs nothing. What separates
    these rows from the durable ones is the local disk's fsync path; what separates them
    from the bare stack is the ingestor's own work. Skipped where there is no tmpfs."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        print("note: no /dev/shm; the tmpfs diagnostic rows are skipped", file=sys.stderr)
        return []
    with tempfile.TemporaryDirectory(prefix="icefloe-ingest-bench-", dir=shm) as tmp:
        return diagnostic_rows(Path(tmp), "durable, store on tmpfs", seconds, single, bare,
                               bare_loop_us, have_wrk, durable=True)


def diagnostic_rows(workdir: Path, what: str, seconds: float, single: str,
                    bare: dict[str, float], bare_loop_us: float | None, have_wrk: bool, *,
                    durable: bool) -> list[Result]:
    """The rows with targets (HTTP single events at 256 connections, gRPC unary at 32
    calls) once, against an ingestor started in ``workdir`` (``durable``: the real one,
    with the drain acking its queue; else the diagnostic that answers without writing).
    ``bare``: the bare stacks' rates; ``bare_loop_us``: the bare HTTP stack's event-loop CPU
    per request (None where it was not measured)."""
    results: list[Result] = []
    proc, http_port, grpc_port = start_ingestor(workdir, durable=durable)
    children = [proc, start_drain(workdir)] if durable else [proc]
    try:
        if have_wrk:
            url = f"http://127.0.0.1:{http_port}/v1/streams/pageviews/events"
            loop = LoopLoad()
            rate = loop.run(proc.pid, wrk_seconds(seconds),
                            lambda: wrk(url, single, seconds, 256, workdir))[0]
            label = f"diagnostic: HTTP single-event POST, {what}, 256 conns"
            results.append(Result(label, rate, "events/s", bare["single"]))
            if loop.requests and bare_loop_us is not None:
                results.append(Result(f"{label}: event-loop CPU per request (baseline: the "
                                      "bare stack's at 32 conns)", loop.per_request_us(),
                                      "us", bare_loop_us))
        unary = grpc_load(grpc_port, "unary", seconds, 32)
        results.append(Result(f"diagnostic: gRPC unary 100-event batch, {what}",
                              unary["events_per_s"], "events/s", bare["unary"]))
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
            child.wait(60)
    return results


def main() -> None:
    parser = bench_parser(__doc__, "3 s per run (under a minute)")
    parser.add_argument("--store-dir", metavar="DIR", type=Path, default=HERE / ".work",
                        help="where the durable ingestors' stores are made (default: "
                             "bench/.work; see above for why not the system temp dir)")
    args = parser.parse_args()
    results = run(args.quick, args.store_dir.resolve())
    print_table("ingest (durable acks on a local store; baseline = bare stack, same run)",
                results)
    write_json(args.json, results)


if __name__ == "__main__":
    main()
