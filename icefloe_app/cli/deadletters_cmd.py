"""``icefloe deadletters list|show|redrive``: see what was dead-lettered, and bring it back.

Why a command and not a SQL recipe: a redrive must decode rows with the *current* stream
config and land each exactly once across crashes and reruns, which
:mod:`pipeline.redrive` guarantees; the dry run shows what would land before anything does.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections import Counter
from typing import Any

from icefloe.errors import ConfigError
from icefloe_app.cli.common import print_json, table
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

EPILOG = """\
Only payload_mismatch and unknown_stream rows can be redriven (they keep the payload);
bad_envelope and corrupt_batch rows cannot (see the quarantined batch file instead).
redrive --overflow moves the fields an evolving table kept in its _overflow column (no room
under collector.evolve_max_columns or a client's evolve_quota) into columns, once the limit
allows it.
Exit codes: 0 ok; 1 catalog unreachable or a commit kept conflicting (safe to rerun);
2 bad arguments or config.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "deadletters", help="list, show and redrive dead-lettered rows",
        description="Rows that could not be decoded or mapped go to icefloe.dead_letters. "
                    "After fixing the stream config (a new column type, a newly configured "
                    "stream), redrive replays them into their tables, exactly once.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, helptext in (("list", "counts by stream and reason (pending and redriven)"),
                           ("show", "the pending rows themselves, payload included"),
                           ("redrive", "decode pending rows again and land those that fit")):
        p = sub.add_parser(name, help=helptext, description=helptext)
        add_config_arguments(p, example=True)
        p.add_argument("--stream", help="only this stream")
        p.add_argument("--reason", help="only this reason (e.g. payload_mismatch)")
        p.add_argument("--since", metavar="TIME",
                       help="only rows received at or after this ISO 8601 time (UTC default)")
        p.add_argument("--json", action="store_true", help="print JSON")
        if name == "show":
            p.add_argument("--limit", type=int, default=20, help="rows to print (default 20)")
        if name == "redrive":
            p.add_argument("--dry-run", action="store_true",
                           help="decode and count, but write nothing")
            p.add_argument("--overflow", action="store_true",
                           help="instead: move evolving tables' _overflow fields into columns")
        p.set_defaults(run=run)


def _filters(args: argparse.Namespace) -> Any:
    from pipeline.redrive import Filters  # startup time

    since = None
    if args.since:
        try:
            since = dt.datetime.fromisoformat(args.since.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"--since {args.since!r}: not an ISO 8601 time such as "
                              "2026-11-23T10:00:00Z") from None
        if since.tzinfo is None:
            since = since.replace(tzinfo=dt.UTC)
    return Filters(stream=args.stream, reason=args.reason, since=since)


def run(args: argparse.Namespace) -> int:
    from pipeline.iceberg.catalog import open_catalog  # lazy: pyiceberg
    from pipeline.redrive import pending, read_dead_letters, redrive, redriven_keys  # startup

    filters = _filters(args)
    _, config = config_from_args(args, example=True)
    catalog = open_catalog(config.catalog)
    if args.action == "redrive" and args.overflow:
        return _redrive_overflow(args, config, catalog)
    if args.action == "redrive":
        report = redrive(config, catalog, filters, dry_run=args.dry_run)
        if args.json:
            print_json(report.as_dict())
        else:
            print(_describe(report))
        return 0
    if args.action == "show":
        rows = pending(catalog, filters).to_pylist()[: max(args.limit, 0)]
        if args.json:
            print_json([{**r, "raw": (r["raw"] or b"").decode(errors="replace"),
                         "received_at": r["received_at"].isoformat()
                         if r["received_at"] else None} for r in rows])
            return 0
        if not rows:
            print("no pending dead letters match")
            return 0
        print(table(["STREAM", "SEQ", "EVENT ID", "REASON", "MESSAGE", "PAYLOAD"], [[
            r["stream"] or "-", str(r["sequence"]), r["event_id"] or "-", r["reason"],
            (r["message"] or "")[:60], (r["raw"] or b"").decode(errors="replace")[:60]]
            for r in rows]))
        return 0
    rows = read_dead_letters(catalog, filters)
    done = redriven_keys(catalog)
    counts: Counter[tuple[str, str, bool]] = Counter()
    if rows.num_rows:
        for stream, reason, loc, idx in zip(*(rows.column(c).to_pylist() for c in (
                "stream", "reason", "location", "record_index")), strict=True):
            counts[(stream or "-", reason, (loc, idx) in done)] += 1
    summary: list[dict[str, Any]] = [{"stream": s, "reason": r, "redriven": d, "rows": n}
               for (s, r, d), n in sorted(counts.items())]
    if args.json:
        print_json(summary)
    elif not summary:
        print("no dead letters")
    else:
        print(table(["STREAM", "REASON", "STATE", "ROWS"], [
            [x["stream"], x["reason"], "redriven" if x["redriven"] else "pending",
             f"{x['rows']:,}"] for x in summary]))
    return 0


def _redrive_overflow(args: argparse.Namespace, config: Any, catalog: Any) -> int:
    """``redrive --overflow``: each evolving stream's table (``--stream``: that one)."""
    from collector.evolve import redrive_overflow  # lazy: pyspark
    from icefloe.streams.evolution import EvolveLimits  # startup time

    col = config.collector
    limits = EvolveLimits(col.evolve_max_columns, col.evolve_max_name_length,
                          col.evolve_max_depth)
    streams = [s for s in config.streams if s.unknown_fields == "evolve"
               and (args.stream is None or s.name == args.stream)]
    if args.stream is not None and not streams:
        raise ConfigError(f"--stream {args.stream!r}: no evolving stream of that name "
                          "(unknown_fields = \"evolve\")")
    reports = [redrive_overflow(catalog, s.table, s, limits, dry_run=args.dry_run)
               for s in streams]
    if args.json:
        print_json([r.as_dict() for r in reports])
        return 0
    verb = "would move" if args.dry_run else "moved"
    for r in reports:
        added = ", ".join(r.added) or "no new column"
        print(f"{r.table}: {r.rows:,} rows with overflow; {verb} all fields of {r.moved:,} "
              f"({added}); {r.left:,} still hold fields with no room or that do not fit")
    return 0


def _describe(report: Any) -> str:
    verb = "would land" if report.dry_run else "landed"
    lines = [f"redrive {report.redrive_id}{' (dry run)' if report.dry_run else ''}: "
             f"{report.selected:,} pending dead letters matched"]
    for name, count in sorted(report.landed.items()):
        lines.append(f"  {verb} {count:,} rows in {name}")
    for name, count in sorted(report.recovered.items()):
        if count:
            lines.append(f"  {count:,} rows were already in {name} (an interrupted redrive): "
                         "recorded, not appended again")
    for name, count in sorted(report.still_bad.items()):
        if count:
            lines.append(f"  {count:,} rows of {name} still do not fit its columns "
                         "(they stay pending)")
    for name, count in sorted(report.unknown_stream.items()):
        lines.append(f"  {count:,} rows of stream {name!r}, which is still not configured")
    for name, count in sorted(report.not_redrivable.items()):
        lines.append(f"  {count:,} {name} rows cannot be redriven (no payload)")
    for sample in report.samples[:3]:
        lines.append(f"    e.g. {sample['event_id']}: {sample['reason']}")
    return "\n".join(lines)
