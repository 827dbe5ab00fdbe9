"""``icefloe collector``: run the single, fenced manifest consumer that commits into Iceberg.

Why a thin wrapper around :func:`collector.runner.run_collector`: the runner owns the lease,
the run loop and the exit codes; this module adds only what belongs to a process — config
precedence for the flags, signal handling (SIGTERM/SIGINT stop cleanly, a second one exits
at once), a machine-readable ``ready`` line on stdout for supervisors and tests, and
one-line errors for what an operator must fix (a bad config, an unreachable catalog, a
metrics port in use, being fenced by another collector).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from icefloe.config import Config
from icefloe.errors import ConfigError, IcefloeError
from icefloe.logs import setup_logging
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

if TYPE_CHECKING:
    from collector.runner import Ready
    from collector.service import Engine

log = logging.getLogger("icefloe.collector")

EXIT_OK = 0
EXIT_FENCED = 3
"""Mirrors :data:`collector.runner.EXIT_FENCED`; kept here so ``--help`` needs no Spark import."""

DESCRIPTION = """\
Consume the manifest queue in order and commit each run of batch files into the streams'
Iceberg tables, exactly once per table (every commit records the manifest sequence it holds).

Lease, standby and takeover:
  Exactly one collector is active at a time. The active one holds a lease in the manifest
  ([manifest] lease_s, default 15 s) and renews it every lease_s/3. A collector started while
  another holds a live lease waits as a hot standby (logged as "standby") and becomes active
  when that lease lapses, e.g. after the active one crashed or its machine died. Becoming
  active bumps the manifest epoch, which fences the previous collector: its reads, acks and
  Iceberg commits are refused, so two collectors never both write.
  --takeover skips the wait and takes the queue at once; use it when you know the holder is
  gone (a kill -9, a lost node) and do not want to wait out its lease. The replaced collector,
  if it still runs, exits with code 3. Nothing is lost or duplicated either way.

Output:
  stdout gets one JSON line {"event": "ready", "epoch": N, "metrics_port": P} once this
  collector is active; logs (JSON lines by default) go to stderr. Prometheus metrics are
  served on [collector] host:metrics_port (default 0.0.0.0:9464) from the start, so a standby
  reports icefloe_collector_active 0.
"""

EPILOG = """\
exit codes:
  0  stopped cleanly by SIGTERM/SIGINT (a second signal exits at once; safe, like kill -9)
  1  error: catalog or store unreachable, Spark failed to start, ...
  2  bad configuration (the message names the file and key), or the metrics port is in use
  3  fenced: another collector took over; this one stopped without committing anything more

environment: ICEFLOE_CONFIG, ICEFLOE_COLLECTOR_<KEY> (e.g. ICEFLOE_COLLECTOR_METRICS_PORT);
precedence: flag > environment > config file > default.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "collector", help="run the collector (manifest queue -> Spark -> Iceberg)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--takeover", action="store_true",
                        help="take the queue now instead of waiting as a standby for the "
                             "current holder's lease to lapse (fences that holder)")
    parser.add_argument("--metrics-port", type=int, metavar="N",
                        help="Prometheus metrics port (default 9464; 0 picks a free port)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="json", choices=["json", "text"])
    parser.set_defaults(run=run)


def build_config(args: argparse.Namespace) -> Config:
    """The config with this command's flags applied on top of env and file."""
    return config_from_args(args, {"collector": {"metrics_port": args.metrics_port}})[1]


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    setup_logging(args.log_level, args.log_format)
    return serve_collector(config, takeover=args.takeover)


def announce_ready(ready: Ready) -> None:
    """The machine-readable line supervisors and tests wait for."""
    print(json.dumps({"event": "ready", "epoch": ready.epoch,
                      "metrics_port": ready.metrics_port}), flush=True)


def serve_collector(config: Config, *, takeover: bool = False, engine: Engine | None = None,
                    on_ready: Callable[[Ready], None] = announce_ready) -> int:
    """Run one collector until stopped or fenced; the process exit code.

    ``engine`` replaces Spark (tests use :class:`pipeline.load.run.LocalEngine`).
    """
    from collector.runner import run_collector  # lazy: pyspark

    epoch: list[int] = []

    def ready(info: Ready) -> None:
        epoch.append(info.epoch)
        on_ready(info)

    async def main() -> int:
        stop = asyncio.Event()
        install_stop_signals(stop, lambda: log.info(
            "stopping: finishing the current run (signal again to exit at once)"))
        return await run_collector(config, takeover=takeover, stop=stop, engine=engine,
                                   on_ready=ready)

    code = run_guarded(main, config)
    if code == EXIT_FENCED:
        print(f"icefloe: error: {fenced_message(epoch[0] if epoch else None)}",
              file=sys.stderr, flush=True)
    return code


def fenced_message(epoch: int | None) -> str:
    """What happened when a collector is fenced, and what the operator should do."""
    which = f"this collector (epoch {epoch})" if epoch is not None else "this collector"
    return (f"fenced: another collector took over the queue, so {which} stopped; nothing is "
            "lost, the new one continues from the last commit. If that was not intended, "
            "stop the other collector and start this one again (it waits as a standby "
            "while the other holds the lease, or use --takeover)")


def run_guarded(main: Callable[[], Coroutine[Any, Any, int]], config: Config,
                runner: Callable[[Coroutine[Any, Any, int]], int] = asyncio.run) -> int:
    """Run ``main`` and turn what escapes it into one-line, actionable errors.

    icefloe's own errors pass through (the CLI prints them in one line); a metrics port in
    use is a configuration problem (exit 2, naming the key and its env variable); anything
    else — typically Spark failing to start — becomes an :class:`IcefloeError` so the CLI
    prints one line instead of a traceback (``icefloe --debug`` shows the chain).
    """
    try:
        return runner(main())
    except IcefloeError:
        raise
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            col = config.collector
            raise ConfigError(
                f"collector metrics port {col.metrics_port} on {col.host} is in use already: "
                "stop the other process or choose another port (--metrics-port, "
                "ICEFLOE_COLLECTOR_METRICS_PORT, [collector] metrics_port)") from None
        raise
    except Exception as exc:
        text = " ".join(str(exc).split()) or "no message"
        raise IcefloeError(f"collector failed: {type(exc).__name__}: {text[:400]}") from exc


def install_stop_signals(stop: asyncio.Event, notice: Callable[[], None] | None = None,
                         hard_exit: Callable[[], None] | None = None) -> None:
    """SIGTERM/SIGINT set ``stop``; a second one exits at once.

    Why the second one is a hard exit: a stop waits for the current run (or Spark's start-up)
    to finish. Exiting mid-way is safe by design — nothing is acknowledged before it is
    durable, and an unfinished run is redone by the next collector — so an impatient
    operator should not have to reach for ``kill -9``.
    """
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            print("icefloe: second signal: exiting now", file=sys.stderr, flush=True)
            if hard_exit is not None:
                hard_exit()
            os._exit(128 + signum)
        stop.set()
        if notice is not None:
            notice()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, on_signal, sig)
