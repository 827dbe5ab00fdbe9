"""The ``icefloe`` command line: the one place that wires the parts together.

Why one entry point with sub-commands: operators learn one tool; every command shares the
same conventions (``--json`` for machines, readable tables for people, a one-line error and
a non-zero exit instead of a traceback; ``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from icefloe import __version__
from icefloe.errors import ConfigError, IcefloeError
from icefloe.redact import redact
from icefloe_app.cli.extras import command_of, extra_for, needs_extra_line

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command. The command modules are imported here, not at the
    top, so that ``main`` can tell a client-only install which extra is missing."""
    from icefloe_app.cli import (
        admin_cmd,
        collector_cmd,
        deadletters_cmd,
        demo_cmd,
        ingestor_cmd,
        inspect_cmd,
        models_cmd,
        probe_cmd,
        query_cmd,
        run_cmd,
        sources_cmd,
        streams_cmd,
        tables_cmd,
        token_cmd,
        up_cmd,
    )

    parser = argparse.ArgumentParser(
        prog="icefloe",
        description="icefloe: object-store-native ingest into Apache Iceberg, exactly once.",
        epilog="Run `icefloe COMMAND --help` for the options of each command.",
    )
    parser.add_argument("--version", action="version", version=f"icefloe {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show full tracebacks instead of one-line errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in (up_cmd, ingestor_cmd, collector_cmd, run_cmd, query_cmd, models_cmd,
                   streams_cmd, tables_cmd, deadletters_cmd, demo_cmd, token_cmd, inspect_cmd,
                   probe_cmd, admin_cmd, sources_cmd):
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
    except ModuleNotFoundError as exc:
        return _missing_extra(exc, words)
    args = parser.parse_args(words)
    try:
        return int(args.run(args) or 0)
    except ModuleNotFoundError as exc:
        if args.debug:
            raise
        return _missing_extra(exc, words)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (IcefloeError, ValueError, OSError) as exc:
        if args.debug:
            raise
        print(f"icefloe: error: {_describe(exc)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_ERROR


def _missing_extra(exc: ModuleNotFoundError, words: Sequence[str]) -> int:
    """Exit 2 with one line naming the extra when an extra's module is missing (a light
    install); re-raise any other missing module, which is a bug."""
    if "--version" in words:
        print(f"icefloe {__version__}")
        return 0
    command = command_of(words)
    extra = extra_for(command, exc.name)
    if extra is None:
        raise exc
    print(needs_extra_line(command, extra), file=sys.stderr)
    return EXIT_USAGE


def _describe(exc: BaseException) -> str:
    """One line: the error's own first line, or its type when it has no message; secrets
    (a connection string quoted by a driver, say) masked as in log lines."""
    text = str(exc).strip() or type(exc).__name__
    return redact(text.splitlines()[0])

