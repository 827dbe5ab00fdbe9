"""``icefloe run``: commit what is queued, then run the SQL models once, and exit.

Why a command of its own (OndatraSQL's ``ondatrasql run``): a project without a long-running
collector — a laptop, a cron job, a test — wants one step that turns accepted events into
fresh tables and marts. It is the collector's own loop (:func:`collector.runner.
run_collector` with ``once``: same lease, fencing and exactly-once commits) stopped when the
queue is empty, followed by the model runner of ``icefloe models run``. It never waits as a
standby, and never starts a Spark of its own while a collector holds the lease: it asks that
collector over its HTTP port (``POST /v1/run``, :mod:`icefloe_app.cli.run_remote`) to commit
what is queued and run the models now; ``--takeover`` fences it instead.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any, NamedTuple

from icefloe.config import Config
from icefloe.errors import LeaseHeldError
from icefloe.logs import setup_logging
from icefloe_app.cli.collector_cmd import EXIT_FENCED, fenced_message, run_guarded
from icefloe_app.cli.config_args import add_config_arguments, config_from_args
from icefloe_app.cli.models_cmd import report_outcomes

DESCRIPTION = """\
Commit every queued batch into its Iceberg tables (exactly once, as the collector does),
then run every SQL model of the models folder ([collector] models_dir, default models/
beside the config file) once, in dependency order, and exit.

Without a running collector it takes the queue's lease itself and starts Spark. While a
collector holds the lease, it starts no Spark: it asks that collector, over its HTTP port
(POST /v1/run where the holder said it listens when it took the lease, else on [collector]
metrics_port; --collector-url / $ICEFLOE_COLLECTOR_URL override both), to commit what is
queued and run the models now, and prints what ran. That needs an admin
token in $ICEFLOE_ADMIN_TOKEN (one whose hash is in [admin] tokens of the collector's
config; never a flag). --takeover fences that collector instead (it exits 3 itself).

examples:
  curl -X POST localhost:8080/collect/raw/events -d '{"event_name":"pageview"}'
  icefloe run && icefloe sql "SELECT * FROM mart.daily_traffic"
  ICEFLOE_ADMIN_TOKEN=ifl_... icefloe run     # while `icefloe up` or a collector runs
"""

EPILOG = """\
exit codes: 0 ok; 1 a model failed or was skipped, a table is parked (its rows staged,
not in it), or an error (catalog, store, Spark, the collector's run); 2 bad
configuration or model files (also the collector's), or no
$ICEFLOE_ADMIN_TOKEN while a collector holds the lease; 3 the lease holder does not
answer at its address (or a collector took the lease over); 4 the collector refused the
admin token (401/403/429); 75 retriable: the collector was fenced, is stepping down or
did not finish in time.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "run", help="commit what is queued, then run the SQL models once",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--takeover", action="store_true",
                        help="fence a collector that holds the lease instead of exiting 3")
    parser.add_argument("--full-refresh", action="store_true",
                        help="recompute incremental models from all rows and replace them")
    parser.add_argument("--collector-url", metavar="URL",
                        help="the lease holder's HTTP port (default $ICEFLOE_COLLECTOR_URL, "
                             "else the address the holder published, else "
                             "http(s)://[collector] host:metrics_port)")
    parser.add_argument("--cacert", metavar="FILE",
                        help="CA bundle for the collector's TLS certificate (default "
                             "$ICEFLOE_ADMIN_CACERT, else the system's)")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S",
                        help="seconds the collector may take before answering 504 "
                             "(default 300)")
    parser.add_argument("--json", action="store_true", help="print the model outcomes as JSON")
    parser.add_argument("--log-level", default="warning",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="text", choices=["json", "text"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    _, config = config_from_args(args)
    setup_logging(args.log_level, args.log_format)
    if not args.takeover:  # a live collector does it: no Spark here
        held = asyncio.run(live_lease(config))
        if held is not None:
            from icefloe_app.cli.run_remote import ask_collector  # why: httpx import cost

            return ask_collector(config, args, held.holder, held.remaining_s, held.url)
    from pipeline.models import plan_project  # startup time
    from pipeline.models.spec import load_models  # startup time

    folder = Path(config.collector.models_dir) if config.collector.models_dir else None
    has_models = folder is not None and folder.is_dir()
    if has_models:  # bad model files fail before the queue is touched
        assert folder is not None
        plan_project(load_models(folder), config)
    print("icefloe run: starting Spark and committing the queue ...", file=sys.stderr,
          flush=True)
    code = commit_queue(config, takeover=args.takeover)
    if code != 0 or not has_models:
        return code
    assert folder is not None
    return run_models_once(config, folder, full_refresh=args.full_refresh, as_json=args.json)


def commit_queue(config: Config, *, takeover: bool = False) -> int:
    """Drain the queue as the active collector; 3 (and a line naming the holder) while
    another collector holds the lease."""
    from collector.runner import run_collector  # lazy: pyspark

    async def main() -> int:
        if not takeover:  # refuse before Spark starts; acquire() re-checks inside its CAS
            held = await live_lease(config)
            if held is not None:
                raise LeaseHeldError(held.holder, held.remaining_s)
        return await run_collector(config, takeover=takeover, serve_metrics=False, once=True)

    try:
        code = run_guarded(main, config)
    except LeaseHeldError as exc:
        print(f"icefloe: error: collector {exc.holder} took the queue's lease "
              f"({exc.remaining_s:.1f} s more) while this command started Spark; run "
              "`icefloe run` again to ask it, or use --takeover to fence it",
              file=sys.stderr, flush=True)
        return EXIT_FENCED
    if code == EXIT_FENCED:
        print(f"icefloe: error: {fenced_message(None)}", file=sys.stderr, flush=True)
    return code


class LiveLease(NamedTuple):
    """A live collector lease on the queue, and where its holder said it answers."""

    holder: str
    remaining_s: float
    url: str | None
    """The holder's published HTTP address (:mod:`icefloe.collector_address`); None if it
    published none (or the record is another collector's)."""


async def live_lease(config: Config) -> LiveLease | None:
    """The live collector lease on the queue, else None."""
    from icefloe.collector_address import read as read_address  # startup time
    from icefloe.manifest import ManifestConsumer  # startup time
    from icefloe.store import open_async_store, options_for  # startup time

    store = open_async_store(config.store.url, options_for(
        config.store.endpoint_url, config.store.region), control_url=config.store.control_url)
    try:  # a missing manifest reads as empty: no holder
        holder, expires, now = await ManifestConsumer(store, config.manifest.build()).lease()
        if not holder or expires <= now:
            return None
        address = await read_address(store)
    finally:
        await store.close()
    url = address.url() if address is not None and address.holder == holder else None
    return LiveLease(holder, expires - now, url)


def run_models_once(config: Config, folder: Path, *, full_refresh: bool = False,
                    as_json: bool = False) -> int:
    """Every model of ``folder``, once, in DAG order (as ``icefloe models run``)."""
    from pipeline.models import prepare  # startup time
    from pipeline.models import run_models as run_all  # startup time
    from pipeline.spark import get_spark  # lazy: pyspark

    project = prepare(folder, config)  # after the commit: the tables the models read exist
    if not project.models:
        return 0
    cfg = config.collector
    spark = get_spark(cfg.spark_master, "icefloe-run",
                      {"spark.driver.memory": cfg.spark_driver_memory})
    outcomes = run_all(spark, project, config, [], full_refresh=full_refresh)
    return report_outcomes(outcomes, as_json=as_json)
