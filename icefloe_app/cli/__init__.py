"""The ``icefloe`` command line: the one place that wires the parts together.

Why one entry point with sub-commands: operators learn one tool; every command shares the
same conventions (``--json`` for machines, readable tables for people, a one-line error and
a non-zero exit instead of a traceback; ``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from icefloe import __version__
from icefloe.errors import ConfigError, IcefloeError
from icefloe.redact import redact
from icefloe_app.cli.commands import COMMANDS, command_named
from icefloe_app.cli.extras import command_of, extra_for, needs_extra_line

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command.

    When ``words`` (the command line) name a command, only that command's module is
    imported and registers its full parser; every other command gets a stub with its help
    line from :data:`~icefloe_app.cli.commands.COMMANDS` (listed as before, and enough for
    argparse's "invalid choice"). Otherwise (no ``words``, or no command in them: a bare
    ``icefloe`` or ``icefloe --help``) every module registers, so a client-only install
    still hears which extra it lacks. The modules are imported here, not at the top, so
    that ``main`` can tell a client-only install which extra is missing."""
    parser = argparse.ArgumentParser(
        prog="icefloe",
        description="icefloe: object-store-native ingest into Apache Iceberg, exactly once.",
        epilog="Run `icefloe COMMAND --help` for the options of each command.",
    )
    parser.add_argument("--version", action="version", version=f"icefloe {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show full tracebacks instead of one-line errors")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = None if words is None else command_named(command_of(words))
    registered: set[str] = set()
    for command in COMMANDS:
        if command.module in registered:
            continue  # its module registered this command along with an earlier one
        if chosen is None or command.module == chosen.module:
            _command_module(command.module).register(commands)
            registered.add(command.module)
        else:
            commands.add_parser(command.name, aliases=list(command.aliases),
                                help=command.help)
    return parser


def _command_module(module: str) -> ModuleType:  # noqa: C901, PLR0912  (one case per command)
    """The command module ``module`` (a name in the command table), imported now. Each
    import is written out, not left to importlib, so the layer checks
    (tests/system/test_layers.py) see every edge."""
    match module:
        case "up_cmd":
            from icefloe_app.cli import up_cmd  # startup time
            return up_cmd
        case "ingestor_cmd":
            from icefloe_app.cli import ingestor_cmd  # startup time
            return ingestor_cmd
        case "collector_cmd":
            from icefloe_app.cli import collector_cmd  # startup time
            return collector_cmd
        case "run_cmd":
            from icefloe_app.cli import run_cmd  # startup time
            return run_cmd
        case "query_cmd":
            from icefloe_app.cli import query_cmd  # startup time
            return query_cmd
        case "models_cmd":
            from icefloe_app.cli import models_cmd  # startup time
            return models_cmd
        case "streams_cmd":
            from icefloe_app.cli import streams_cmd  # startup time
            return streams_cmd
        case "tables_cmd":
            from icefloe_app.cli import tables_cmd  # startup time
            return tables_cmd
        case "deadletters_cmd":
            from icefloe_app.cli import deadletters_cmd  # startup time
            return deadletters_cmd
        case "demo_cmd":
            from icefloe_app.cli import demo_cmd  # startup time
            return demo_cmd
        case "token_cmd":
            from icefloe_app.cli import token_cmd  # startup time
            return token_cmd
        case "inspect_cmd":
            from icefloe_app.cli import inspect_cmd  # startup time
            return inspect_cmd
        case "probe_cmd":
            from icefloe_app.cli import probe_cmd  # startup time
            return probe_cmd
        case "admin_cmd":
            from icefloe_app.cli import admin_cmd  # startup time
            return admin_cmd
        case "sources_cmd":
            from icefloe_app.cli import sources_cmd  # startup time
            return sources_cmd
        case "define_cmd":
            from icefloe_app.cli import define_cmd  # startup time
            return define_cmd
        case "replay_cmd":
            from icefloe_app.cli import replay_cmd  # startup time
            return replay_cmd
        case _:
            raise KeyError(f"no command module {module!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(words)
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

