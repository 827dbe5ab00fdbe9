"""``icefloe define MODULE:CLASS --stream NAME --table NS.TABLE``: a Python model class's
``[[streams]]`` block for ``icefloe.toml``.

Why a command: a project that keeps its streams in ``icefloe.toml`` (reviewed, versioned
with the deployment) can still declare the events once, as the producer's class, and
regenerate the block from it; registering at runtime is ``ModelStream.register`` in the
producer's own code (docs/python-models.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from icefloe.errors import ConfigError, ModelError

EPILOG = """\
examples:
  icefloe define shop.events:Order --stream orders --table shop.orders >> icefloe.toml
  icefloe define app/models.py:Click --stream clicks --table web.clicks --unknown-fields ignore
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "define", help="print the [[streams]] block of a Python model class (dataclass or "
                       "pydantic)",
        description="Import CLASS from MODULE (a dotted module name found from the current "
                    "folder, or a .py file) and print the [[streams]] block icefloe.define "
                    "makes of it: columns from the annotations, Key fields as primary_key, "
                    "docstrings as column docs. An annotation with no column type is an "
                    "error naming the field and the type (exit 2).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", metavar="MODULE:CLASS",
                        help="e.g. shop.events:Order or app/models.py:Order")
    parser.add_argument("--stream", required=True, help="the stream (ingest endpoint) name")
    parser.add_argument("--table", required=True, help="the Iceberg table, namespace.table")
    parser.add_argument("--unknown-fields", choices=("reject", "ignore", "evolve"),
                        default="reject", help="fields the stream does not declare "
                                               "(default reject: the class is the schema)")
    parser.set_defaults(run=run)


def load_class(target: str) -> type[Any]:
    """``module:Class`` or ``path/file.py:Class`` imported (the current folder first on the
    import path, as ``python -m`` would have it)."""
    module_name, sep, name = target.rpartition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"{target!r}: expected MODULE:CLASS (shop.events:Order)")
    if module_name.endswith(".py"):
        module_name = module_name[:-3].replace(os.sep, ".").replace("/", ".")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{target!r}: cannot import {module_name!r}: {exc}") from None
    except SyntaxError as exc:  # the user's file does not parse
        where = f"{exc.filename or module_name}, line {exc.lineno}"
        raise ConfigError(f"{target!r}: cannot import {module_name!r}: {where}: "
                          f"{type(exc).__name__}: {exc.msg}") from exc
    except (Exception, SystemExit) as exc:  # whatever the user's module-level code raised
        raise ConfigError(f"{target!r}: importing {module_name!r} failed at "
                          f"{_raised_at(exc)}: {type(exc).__name__}: {exc}") from exc
    found = getattr(module, name, None)
    if not isinstance(found, type):
        raise ConfigError(f"{target!r}: module {module_name!r} has no class {name!r}")
    return found


def _raised_at(exc: BaseException) -> str:
    """``file, line N``: the outermost module-level code (not importlib's functions) the
    exception passed through, i.e. the imported module's failing statement."""
    frame = exc.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if code.co_name == "<module>":
            return f"{code.co_filename}, line {frame.tb_lineno}"
        frame = frame.tb_next
    return "import"


def run(args: argparse.Namespace) -> int:
    from icefloe.pymodels import define  # lazy: only this command reads model classes

    model = load_class(args.target)
    try:
        stream = define(model, stream=args.stream, table=args.table,
                        unknown_fields=args.unknown_fields)
    except ModelError as exc:
        raise ConfigError(str(exc)) from None
    sys.stdout.write(stream.to_toml())
    return 0
