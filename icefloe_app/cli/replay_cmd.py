"""``icefloe replay``: run kept batch files again into one sink, exactly once.

Why a command of its own and not a collector mode: a replay writes one sink's table and
nothing else, while the live collector keeps committing every other table; it needs no
lease, only the sink paused (see :mod:`collector.replay`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from icefloe_app.cli.config_args import add_config_arguments, config_from_args

EXIT_REFUSED = 2

DESCRIPTION = """\
Run the batch files the collector kept ([collector] keep_batches_s) between --from and
--to again through the pipeline, into one sink's table only: a new sink, a lost table
(re-created), or one emptied with --truncate. Exactly once: the table records how far the
replay got, so a replay interrupted anywhere and started again with the same arguments
goes on where it stopped."""

EPILOG = """\
--from/--to take a manifest sequence (an integer, inclusive) or an ISO 8601 time (UTC
when no zone; the batch files ingested in [from, to]).
Refused, changing nothing (exit 2, one line naming the reason): retention off, an unknown
sink, a range that is partly no longer kept (names the first missing sequence or time), a
sink that is live (a collector holds the lease and the sink is enabled: disable it with
`icefloe sinks disable SOURCE SINK`, or stop the collector for config-only streams), or a
target table that holds rows without --truncate.
Exit codes: 0 done; 1 store or catalog failure, or a collector committed to the table during
the replay (rerun with --truncate once the sink is paused); 2 refused or bad arguments.
Progress: one line per chunk on stderr (entries, bytes, rows, GB/s, events/s)."""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "replay", help="run kept batch files again into one sink (exactly once)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, example=True)
    parser.add_argument("--from", dest="start", required=True, metavar="SEQ|TIME",
                        help="first manifest sequence or ingest time")
    parser.add_argument("--to", dest="end", required=True, metavar="SEQ|TIME",
                        help="last manifest sequence or ingest time (inclusive)")
    parser.add_argument("--sink", required=True, metavar="NAME",
                        help="the sink: source/sink, a sink name, or its table")
    parser.add_argument("--truncate", action="store_true",
                        help="empty the sink's table first (in the replay's first commit)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from collector.replay_range import ReplayRefused, parse_bound  # why: startup time

    _, config = config_from_args(args, example=True)
    try:
        start, end = parse_bound(args.start, "--from"), parse_bound(args.end, "--to")
        planned = asyncio.run(_plan(config, args.sink, start, end))
    except ReplayRefused as exc:
        sys.stderr.write(f"replay refused: {exc}\n")
        return EXIT_REFUSED
    return _replay(config, planned, truncate=args.truncate)


async def _plan(config: Any, sink: str, start: Any, end: Any) -> Any:
    from collector.replay_plan import plan  # why: startup time (pyiceberg, pyarrow)
    from icefloe.store import open_async_store, options_for  # why: startup time

    store = open_async_store(config.store.url, options_for(
        config.store.endpoint_url, config.store.region), control_url=config.store.control_url)
    try:
        return await plan(config, store, sink, start, end)
    finally:
        await store.close()


def _replay(config: Any, planned: Any, *, truncate: bool) -> int:
    from collector.replay import Replay  # why: startup time (Spark, pyiceberg)
    from collector.replay_range import ReplayConflict, ReplayRefused  # why: startup time
    from collector.runner import spark_settings  # why: startup time
    from pipeline.iceberg.catalog import open_catalog  # why: startup time
    from pipeline.load.run import SparkEngine  # why: startup time
    from pipeline.spark import get_spark  # why: startup time (JVM)

    cfg = config.collector
    spark = get_spark(cfg.spark_master, "icefloe-replay", spark_settings(config))
    started = time.monotonic()
    replay = Replay(config, open_catalog(config.catalog), SparkEngine(spark, cfg.spark_partitions),
                    planned.target, planned.entries,
                    on_chunk=lambda p: _say(progress_line(p, started)))
    try:
        resumed = replay.start(truncate=truncate)
        done = replay.run()
    except ReplayRefused as exc:
        sys.stderr.write(f"replay refused: {exc}\n")
        return EXIT_REFUSED
    except ReplayConflict as exc:
        sys.stderr.write(f"replay stopped: {exc}\n")
        return 1
    first, last = planned.entries[0], planned.entries[-1]
    print(f"replayed sequences {first.sequence}..{last.sequence} ({done.entries_total} batch "
          f"files) into {planned.target.table}: {done.rows} rows committed"
          f"{', resumed' if resumed else ''}, {done.skipped_entries} files already there, "
          f"{done.duplicates} duplicates dropped{refused_note(done.refused)}, "
          f"{time.monotonic() - started:.1f} s")
    return 0


def refused_note(refused: dict[str, int]) -> str:
    """``, 3 events refused by the sink (payload_mismatch 2, where_error 1): ...``, or
    nothing: events the sink's pipeline refused are named, never left out silently."""
    if not refused:
        return ""
    reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(refused.items()))
    return (f", {sum(refused.values())} events refused by the sink ({reasons}): not in the "
            "table and not dead-lettered; fix the sink or its payloads and replay again with "
            "--truncate")


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def progress_line(progress: Any, started: float) -> str:
    """``replay 40/100 files (40%) 1.2 GB ... 0.05 GB/s, 120,000 events/s``."""
    elapsed = max(time.monotonic() - started, 1e-9)
    pct = 100 * progress.entries_done // max(progress.entries_total, 1)
    events = sum(c.rows for c in progress.chunks)
    return (f"replay {progress.entries_done}/{progress.entries_total} files ({pct}%) "
            f"{progress.bytes_done / 1e9:.3f}/{progress.bytes_total / 1e9:.3f} GB, "
            f"{progress.rows:,} rows, {progress.bytes_done / 1e9 / elapsed:.3f} GB/s, "
            f"{events / elapsed:,.0f} events/s"
            + (f", {sum(progress.refused.values()):,} refused" if progress.refused else ""))
