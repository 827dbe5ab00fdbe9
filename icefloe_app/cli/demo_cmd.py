"""``icefloe demo``: send realistic traffic to a running cluster and watch the tables fill up.

Why this exists: the fastest way to believe in an ingest pipeline is to see events go in on
one side and rows appear on the other. The demo POSTs events through the public HTTP API
(:class:`icefloe.client.AsyncHttpClient`, which retries safely with idempotency keys) and,
about once a second, reads each target table's current snapshot (``total-records``, one
cheap catalog call with pyiceberg — no Spark) to show committed rows next to sent ones.

Events come from each stream's declared columns: user ids from a small pool (so there are
repeats to group by), URLs from a site map, referrers, log-normal durations and amounts
(2 decimals), currencies, timestamps just before now (RFC 3339), dates, small JSON objects.
Column *names* pick the flavour (``user_id``, ``url``, ``amount``, ...); the *type* always
decides what is sent, so any config gets valid events. Required columns are always present,
optional ones are sometimes left out, and the ``event_id_field`` gets a unique id.

``--seed`` makes a run reproducible: values, event ids and idempotency keys all come from
the seeded generator (timestamps stay "near now"). Sending the same seed again therefore
re-sends the same ids, which the collector drops as duplicates within its dedup window —
exactly once at work. Without ``--seed`` every run picks (and prints) a fresh seed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import math
import os
import random
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefloe.config import CatalogSection, Config, StreamConfig
from icefloe.config.security import needs_token
from icefloe.errors import ConfigError, IcefloeError
from icefloe_app.cli.common import print_json, table
from icefloe_app.cli.config_args import add_config_arguments, config_from_args
from icefloe_app.cli.demo_events import EventFactory
from icefloe_app.cli.streams_cmd import describe_source, find_stream
from icefloe_app.cli.tables_cmd import load_table, open_existing_catalog, total_records

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from icefloe.client import AsyncHttpClient, IngestRejected

DEFAULT_RATE = 100.0
DEFAULT_BATCH = 10
DEFAULT_DURATION_S = 30.0
DEFAULT_WAIT_TIMEOUT_S = 60.0
IN_FLIGHT = 8
"""Requests awaiting their acknowledgement at once: an ack waits for a durable flush
(~100 ms), so one request at a time would cap the rate at ~10 requests/s."""
POLL_S = 1.0
PLAIN_EVERY_S = 5.0
"""Progress line interval when stderr is not a terminal (logs, CI): one line per poll is
noise there."""
RATE_WINDOW_S = 0.9
TOKEN_ENV = "ICEFLOE_TOKEN"
"""The write token the demo sends to streams that need one (never a command-line flag)."""
FATAL_STATUSES = frozenset({401, 403, 404, 413, 415})
"""Refusals that every further request would get too: stop at once and say why."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "demo", help="send realistic events to a running cluster and watch the tables fill",
        description="Send realistic events, generated from each stream's columns in the "
                    "config, to a running ingestor over HTTP, and show sent / accepted / "
                    "rejected events, the rate, and the rows committed to each Iceberg "
                    "table (polled about once a second). Start the cluster first with "
                    "`icefloe up`. Ctrl-C stops and prints the summary. Streams that need "
                    f"a write token get the one in ${TOKEN_ENV} (the config holds only "
                    "hashes).")
    add_config_arguments(parser, example=True)
    parser.add_argument("--url", metavar="URL",
                        help="ingestor HTTP endpoint (default: from [ingestor] host and "
                             "http_port, i.e. http://127.0.0.1:8080)")
    parser.add_argument("--streams", metavar="A,B",
                        help="comma-separated streams to send to (default: all)")
    parser.add_argument("--rate", type=_non_negative, default=DEFAULT_RATE,
                        metavar="EVENTS_PER_S",
                        help="target events per second over all streams; 0 sends as fast as "
                             "the ingestor acknowledges (default: %(default)g)")
    amount = parser.add_mutually_exclusive_group()
    amount.add_argument("--duration", type=_non_negative, metavar="S",
                        help=f"seconds to send for; 0 sends until Ctrl-C (default: "
                             f"{DEFAULT_DURATION_S:g})")
    amount.add_argument("--events", type=_positive_int, metavar="N",
                        help="send exactly N events, then stop")
    parser.add_argument("--batch", type=_positive_int, default=DEFAULT_BATCH, metavar="N",
                        help="events per request, round-robin over the streams "
                             "(default: %(default)s)")
    parser.add_argument("--seed", type=int,
                        help="seed for reproducible events, ids included: the same seed "
                             "re-sends the same event ids, which the collector drops as "
                             "duplicates (default: a fresh seed, printed)")
    parser.add_argument("--wait", action="store_true",
                        help="after sending, wait until the tables hold every accepted event")
    parser.add_argument("--wait-timeout", type=_non_negative, default=DEFAULT_WAIT_TIMEOUT_S,
                        metavar="S", help="give up waiting after S seconds, exit 1 "
                                          "(default: %(default)g)")
    parser.add_argument("--json", action="store_true",
                        help="print the final summary as JSON (progress stays on stderr)")
    parser.set_defaults(run=run)


# --- watching the tables -------------------------------------------------------------------

class CommitWatch:
    """Committed rows per table since the demo started, from each table's current snapshot.

    Why ``total-records`` minus a baseline: the summary carries the table's row count, so
    one metadata read per table answers "how many of ours are committed" without scanning
    data. The baseline is taken before the first event is sent; a table that does not exist
    yet (the collector creates it when Spark is up) starts at 0. Failures (catalog busy or
    unreachable) keep the last answer and are shown, never fatal: the demo is about sending.
    """

    def __init__(self, section: CatalogSection, tables: Sequence[str]) -> None:
        self.section = section
        self.tables = list(tables)
        self.catalog: Catalog | None = None
        self.loaded: dict[str, Table] = {}
        self.rows: dict[str, int] = {}
        self.baseline: dict[str, int] = {}
        self.error: str | None = None

    def poll(self) -> None:
        """Refresh every table's row count (blocking: run it in a thread)."""
        try:
            if self.catalog is None:
                self.catalog = open_existing_catalog(self.section)
            for name in self.tables:
                self.rows[name] = self._rows(name)
                self.baseline.setdefault(name, self.rows[name])
            self.error = None
        except Exception as exc:  # shown next to the counts; the next poll tries again
            self.error = " ".join(str(exc).split())[:160] or type(exc).__name__

    def _rows(self, name: str) -> int:
        if self.catalog is None:
            return 0  # the catalog is not created yet: nothing committed
        loaded = self.loaded.get(name)
        if loaded is None:
            loaded = load_table(self.catalog, name)
            if loaded is None:
                return 0
            self.loaded[name] = loaded
        else:
            loaded.refresh()
        return total_records(loaded.current_snapshot())

    def committed(self, name: str) -> int | None:
        """Rows committed since the baseline; None while the table could not be read."""
        if name not in self.rows:
            return None
        return max(0, self.rows[name] - self.baseline.get(name, 0))


# --- sending -------------------------------------------------------------------------------

@dataclass(slots=True)
class Lane:
    """One stream's generator, client and counters."""

    stream: StreamConfig
    factory: EventFactory
    keys: random.Random
    client: AsyncHttpClient
    sent: int = 0
    accepted: int = 0
    rejected: int = 0
    last_error: str | None = None


@dataclass(slots=True)
class Plan:
    """What to send, decided from the flags before anything is sent."""

    url: str
    rate: float
    batch: int
    events: int | None
    duration: float | None
    seed: int
    wait: bool
    wait_timeout: float


@dataclass
class Demo:
    """One demo run: a sender task, a monitor loop, and the summary they produce."""

    plan: Plan
    lanes: list[Lane]
    watch: CommitWatch
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    fatal: IcefloeError | None = None
    interrupted: bool = False
    timed_out: bool = False
    started: float = 0.0
    send_seconds: float = 0.0
    _tty: bool = field(default_factory=lambda: sys.stderr.isatty())
    _last_line: float = 0.0
    _rate_mark: tuple[float, int] = (0.0, 0)
    _rate: float = 0.0

    # -- counters --------------------------------------------------------------------------

    @property
    def sent(self) -> int:
        return sum(lane.sent for lane in self.lanes)

    @property
    def accepted(self) -> int:
        return sum(lane.accepted for lane in self.lanes)

    @property
    def rejected(self) -> int:
        return sum(lane.rejected for lane in self.lanes)

    def caught_up(self) -> bool:
        """Every table holds at least the events it accepted (since the baseline)."""
        return all((self.watch.committed(lane.stream.table) or 0) >= lane.accepted
                   for lane in self.lanes)

    # -- the run -------------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._install_interrupt(loop)
        await check_ingestor(self.plan.url)
        await asyncio.to_thread(self.watch.poll)  # the baseline
        self.started = loop.time()
        self._rate_mark = (self.started, 0)
        self._banner()
        sender = asyncio.create_task(self._send_all(), name="demo-sender")
        wait_deadline: float | None = None
        try:
            while True:
                sending = not sender.done()
                await asyncio.to_thread(self.watch.poll)
                if not sending and wait_deadline is None:
                    self.send_seconds = loop.time() - self.started
                    wait_deadline = loop.time() + self.plan.wait_timeout
                waiting = not sending and self.plan.wait
                self._progress(loop.time(), waiting=waiting)
                if not sending:
                    if not waiting or self.stop.is_set() or self.fatal or self.caught_up():
                        break
                    if wait_deadline is not None and loop.time() >= wait_deadline:
                        self.timed_out = True
                        break
                    await _wait_event(self.stop, min(POLL_S / 2, self.plan.wait_timeout))
                else:
                    await asyncio.wait([sender], timeout=POLL_S)
        finally:
            if not sender.done():
                self.stop.set()
            await asyncio.gather(sender, return_exceptions=True)
            self._progress(loop.time(), waiting=False, final=True)  # the state at the end
            self._end_progress()
        sender.result()  # a bug in the sender must not pass silently

    def _install_interrupt(self, loop: asyncio.AbstractEventLoop) -> None:
        """First Ctrl-C (or SIGTERM): stop sending and summarize; a second one exits."""
        def interrupted() -> None:
            self.interrupted = True
            self.stop.set()
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signal.SIGINT)  # the default: KeyboardInterrupt

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, interrupted)

    async def _send_all(self) -> None:
        """Paced requests, round-robin over the streams, at most IN_FLIGHT unanswered."""
        plan, loop = self.plan, asyncio.get_running_loop()
        slots = asyncio.Semaphore(IN_FLIGHT)
        pending: set[asyncio.Task[None]] = set()
        planned = 0
        try:
            for turn in itertools.count():
                if self.stop.is_set() or (plan.events is not None and planned >= plan.events):
                    break
                if self._past_duration(loop):
                    break
                if plan.rate > 0:
                    delay = self.started + planned / plan.rate - loop.time()
                    if delay > 0 and await _wait_event(self.stop, delay):
                        break
                    if self._past_duration(loop):
                        break
                lane = self.lanes[turn % len(self.lanes)]
                count = plan.batch if plan.events is None else min(plan.batch,
                                                                   plan.events - planned)
                events = [lane.factory.make() for _ in range(count)]
                key = f"{lane.keys.getrandbits(128):032x}"
                await slots.acquire()
                if self.stop.is_set():
                    slots.release()
                    break
                lane.sent += count
                planned += count
                task = asyncio.create_task(self._send(lane, events, key))
                pending.add(task)
                task.add_done_callback(pending.discard)
                task.add_done_callback(lambda _: slots.release())
        finally:
            # Requests already sent are finished, not abandoned: their outcome is the count.
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    def _past_duration(self, loop: asyncio.AbstractEventLoop) -> bool:
        duration = self.plan.duration
        return duration is not None and duration > 0 and loop.time() - self.started >= duration

    async def _send(self, lane: Lane, events: list[dict[str, Any]], key: str) -> None:
        from icefloe.client import IngestRejected  # startup time

        try:
            # Not ``lane.accepted += await ...``: that reads the counter before the await
            # and loses the other requests' updates made meanwhile.
            accepted = await lane.client.send(lane.stream.name, events, idempotency_key=key)
        except IngestRejected as exc:
            lane.rejected += len(events)
            lane.last_error = f"{exc.status or 'no answer'} {exc.code}: {exc.message}"
            if exc.status is None or exc.status in FATAL_STATUSES:
                self.fatal = self.fatal or _fatal(self.plan.url, lane.stream, exc)
                self.stop.set()
        else:
            lane.accepted += accepted

    # -- display -------------------------------------------------------------------------------

    def _banner(self) -> None:
        plan = self.plan
        rate = f"~{plan.rate:g} events/s" if plan.rate > 0 else "as fast as acknowledged"
        if plan.events is not None:
            amount = f"{plan.events:,} events at {rate}"
        elif plan.duration:
            amount = f"{rate} for {plan.duration:g} s"
        else:
            amount = f"{rate} until Ctrl-C"
        streams = ", ".join(lane.stream.name for lane in self.lanes)
        print(f"icefloe demo: {amount} to {plan.url} (streams {streams}; seed {plan.seed}); "
              "Ctrl-C stops", file=sys.stderr, flush=True)

    def _progress(self, now: float, *, waiting: bool, final: bool = False) -> None:
        if not final and not self._tty and now - self._last_line < PLAIN_EVERY_S \
                and not waiting:
            return
        if not final and not self._tty and waiting and now - self._last_line < POLL_S:
            return
        self._last_line = now
        mark_time, mark_accepted = self._rate_mark
        accepted = self.accepted
        if now - mark_time >= RATE_WINDOW_S:  # shorter spans (the last poll) would jitter
            self._rate = (accepted - mark_accepted) / (now - mark_time)
            self._rate_mark = (now, accepted)
        rate = self._rate
        tables = "  ".join(f"{lane.stream.table} {_num(self.watch.committed(lane.stream.table))}"
                           f"/{lane.accepted:,}" for lane in self.lanes)
        line = (f"{self._bar(now)}{now - self.started:6.1f}s  sent {self.sent:,}  "
                f"accepted {accepted:,}  rejected {self.rejected:,}  {rate:,.0f} ev/s  "
                f"committed {tables}")
        if waiting:
            line += "  (waiting for the collector)"
        if self.watch.error:
            line += f"  [catalog: {self.watch.error[:60]}]"
        if self._tty:
            sys.stderr.write("\r" + line + "\x1b[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def _bar(self, now: float, width: int = 20) -> str:
        """``[#####.....]  45% `` when the run has a known size (``--events`` or
        ``--duration``); nothing for an open-ended run."""
        plan = self.plan
        if plan.events:
            done = self.sent / plan.events
        elif plan.duration:
            done = (now - self.started) / plan.duration
        else:
            return ""
        done = min(max(done, 0.0), 1.0)
        filled = int(done * width)
        return f"[{'#' * filled}{'.' * (width - filled)}] {done:4.0%}  "

    def _end_progress(self) -> None:
        if self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def summary(self) -> dict[str, Any]:
        streams = [{"stream": lane.stream.name, "table": lane.stream.table, "sent": lane.sent,
                    "accepted": lane.accepted, "rejected": lane.rejected,
                    "committed": self.watch.committed(lane.stream.table),
                    "last_error": lane.last_error} for lane in self.lanes]
        committed = [s["committed"] for s in streams]
        return {
            "url": self.plan.url, "seed": self.plan.seed,
            "seconds": round(self.send_seconds, 3),
            "sent": self.sent, "accepted": self.accepted, "rejected": self.rejected,
            "committed": None if None in committed else sum(committed),
            "interrupted": self.interrupted, "waited": self.plan.wait,
            "timed_out": self.timed_out, "streams": streams,
        }


async def _wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; True if it is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
    return event.is_set()


def _num(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _fatal(url: str, stream: StreamConfig, exc: IngestRejected) -> IcefloeError:
    """Why every further request would fail too, and what to do about it."""
    if exc.status is None:
        return IcefloeError(f"lost the ingestor at {url} after {exc.attempts} attempts "
                            f"({exc.code}: {exc.message}): is `icefloe up` still running?")
    if exc.status == 404:
        return IcefloeError(f"the ingestor at {url} has no stream {stream.name!r} "
                            f"({exc.message}): run the demo with the config the cluster runs "
                            "with (--config FILE) or choose --streams")
    if exc.status in (401, 403):
        return IcefloeError(f"the ingestor at {url} refused the token for stream "
                            f"{stream.name!r} ({exc.code}): the demo sends ${TOKEN_ENV}; set "
                            "it to a token valid for that stream, or leave the stream out "
                            "(--streams)")
    if exc.status == 413:
        return IcefloeError(f"the ingestor at {url} refused a request of --batch events as "
                            f"too large ({exc.message}): lower --batch")
    return IcefloeError(f"the ingestor at {url} refused stream {stream.name!r}: "
                        f"{exc.status} {exc.code}: {exc.message}")


async def check_ingestor(url: str) -> None:
    """Fail fast, in one line, when nothing answers at ``url`` — the usual first mistake.

    Without it the client would retry the first request with backoff for many seconds
    before saying the same thing.
    """
    import httpx  # startup time

    try:
        async with httpx.AsyncClient(timeout=5) as http:
            response = await http.get(f"{url}/healthz")
    except httpx.TransportError as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise IcefloeError(f"cannot reach the ingestor at {url} ({reason}): start the "
                           "cluster with `icefloe up`, or point --url at a running "
                           "ingestor") from None
    if response.status_code != 200:
        raise IcefloeError(f"{url} does not look like an icefloe ingestor (GET /healthz "
                           f"answered {response.status_code}): check --url")


# --- the command ---------------------------------------------------------------------------

def default_url(config: Config) -> str:
    """Where ``icefloe up`` with this config listens for HTTP, as seen from this machine."""
    host = config.ingestor.host
    scheme = "https" if config.ingestor.tls_cert_file else "http"
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    port = config.ingestor.http_port or 8080
    return f"{scheme}://{host}:{port}"


def select_streams(config: Config, names: str | None, where: str) -> list[StreamConfig]:
    if not config.streams:
        raise ConfigError(f"{where} defines no streams to send to: add [[streams]] to the "
                          "config or pass --config FILE")
    if names is None:
        return list(config.streams)
    chosen = [find_stream(config, name.strip(), where)
              for name in names.split(",") if name.strip()]
    if not chosen:
        raise ConfigError("--streams: name at least one stream")
    return list({stream.name: stream for stream in chosen}.values())  # (not hashable)


def build_demo(args: argparse.Namespace, config: Config, path: Path | None) -> Demo:
    """Plan, lanes (one seeded generator and client per stream) and the table watch."""
    from icefloe.client import AsyncHttpClient  # startup time

    streams = select_streams(config, args.streams, describe_source(path))
    token = os.environ.get(TOKEN_ENV) or None
    locked = [s.name for s in streams if needs_token(config, s.name)]
    if locked and token is None:
        raise ConfigError(f"stream(s) {', '.join(locked)} need a write token: set "
                          f"${TOKEN_ENV} to one (`icefloe token new` makes a token and the "
                          "hash for the config), or leave them out (--streams)")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    duration = args.duration if args.duration is not None else (
        None if args.events is not None else DEFAULT_DURATION_S)
    plan = Plan(url=(args.url or default_url(config)).rstrip("/"), rate=args.rate,
                batch=args.batch, events=args.events, duration=duration, seed=seed,
                wait=args.wait, wait_timeout=args.wait_timeout)
    lanes = [Lane(stream=s,
                  factory=EventFactory(s, random.Random(f"{seed}:events:{s.name}")),
                  keys=random.Random(f"{seed}:keys:{s.name}"),
                  client=AsyncHttpClient(plan.url, token=token if needs_token(config, s.name)
                                         else None))
             for s in streams]
    return Demo(plan, lanes, CommitWatch(config.catalog, [s.table for s in streams]))


def run(args: argparse.Namespace) -> int:
    path, config = config_from_args(args, example=True)
    demo = build_demo(args, config, path)

    async def main() -> None:
        try:
            await demo.run()
        finally:
            for lane in demo.lanes:
                await lane.client.aclose()

    asyncio.run(main())
    summary = demo.summary()
    if args.json:
        print_json(summary)
    else:
        print_summary(demo, summary)
    if demo.fatal is not None:
        raise demo.fatal
    if demo.timed_out:
        behind = [f"{s['table']} {_num(s['committed'])}/{s['accepted']:,}"
                  for s in summary["streams"] if (s["committed"] or 0) < s["accepted"]]
        raise IcefloeError(f"waited {demo.plan.wait_timeout:g} s but the tables hold only "
                           f"{', '.join(behind)} of the accepted events: is the collector "
                           "running (`icefloe up`)? Events re-sent with an earlier --seed "
                           "are dropped as duplicates")
    if demo.rejected:
        error = next(lane.last_error for lane in demo.lanes if lane.last_error)
        raise IcefloeError(f"{demo.rejected:,} events were not accepted; last refusal: "
                           f"{error}")
    return 0


def print_summary(demo: Demo, summary: dict[str, Any]) -> None:
    """The table a person reads at the end, and what to try next."""
    how = ("stopped (Ctrl-C)" if demo.interrupted else
           "stopped on an error" if demo.fatal else "done")
    print(f"demo {how}: {summary['seconds']:.1f} s of sending to {summary['url']} "
          f"(seed {summary['seed']})")
    rows = [[s["stream"], s["table"], f"{s['sent']:,}", f"{s['accepted']:,}",
             f"{s['rejected']:,}", _num(s["committed"])] for s in summary["streams"]]
    rows.append(["total", "", f"{summary['sent']:,}", f"{summary['accepted']:,}",
                 f"{summary['rejected']:,}", _num(summary["committed"])])
    print()
    print(table(["STREAM", "TABLE", "SENT", "ACCEPTED", "REJECTED", "COMMITTED"], rows))
    print()
    if summary["committed"] is not None and summary["committed"] < summary["accepted"]:
        print("The collector commits about once a second; `icefloe tables list` shows the "
              "rows as they land.")
    first = summary["streams"][0]["table"]
    print(f'Query it:  icefloe query "SELECT count(*) FROM {first}"')
