"""The sub-commands of ``icefloe``: name, aliases, one-line help and the module that runs it.

Why a table: importing every command module to build the parser cost ~0.45 s of every
``icefloe`` call (the admin API's and the demo's imports among them), which a one-second
``icefloe query`` cannot afford. ``main`` imports only the module of the command it runs;
the others get a stub parser carrying the help line kept here, so ``icefloe --help`` still
lists every command. ``tests/app/test_cli.py`` checks this table against the modules' own
``register`` functions.
"""

from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    """One sub-command as ``icefloe --help`` lists it."""

    name: str
    module: str  # under icefloe_app.cli; its ``register(commands)`` adds the full parser
    help: str
    aliases: tuple[str, ...] = ()


COMMANDS: tuple[Command, ...] = (
    Command("up", "up_cmd", "run the whole cluster on this machine (ingestors + collector)"),
    Command("ingestor", "ingestor_cmd", "run an ingestor (HTTP :8080 and gRPC :50051)"),
    Command("collector", "collector_cmd",
            "run the collector (manifest queue -> Spark -> Iceberg)"),
    Command("run", "run_cmd", "commit what is queued, then run the SQL models once"),
    Command("query", "query_cmd",
            "run a read-only SQL query over the Iceberg tables (query: Spark SQL; sql: "
            "DuckDB's dialect)", ("sql",)),
    Command("models", "models_cmd", "list, show and run SQL models"),
    Command("define", "define_cmd",
            "print the [[streams]] block of a Python model class (dataclass or pydantic)"),
    Command("streams", "streams_cmd",
            "the streams the config defines (columns, table, policies)"),
    Command("tables", "tables_cmd", "the Iceberg tables icefloe writes: rows, commits, history"),
    Command("deadletters", "deadletters_cmd", "list, show and redrive dead-lettered rows"),
    Command("replay", "replay_cmd", "run kept batch files again into one sink (exactly once)"),
    Command("demo", "demo_cmd",
            "send realistic events to a running cluster and watch the tables fill"),
    Command("token", "token_cmd", "make write tokens and their hashes for the config"),
    Command("inspect", "inspect_cmd", "show the manifest queue or a batch file"),
    Command("probe", "probe_cmd", "check that an object store enforces conditional writes"),
    Command("admin", "admin_cmd", "serve the admin API (sources and sinks)"),
    Command("sources", "sources_cmd", "list and change sources (admin API)"),
    Command("sinks", "sources_cmd", "list and change the sinks of a source"),
)


def command_named(word: str | None) -> Command | None:
    """The command ``word`` names (its name or an alias), if any."""
    return next((c for c in COMMANDS if word is not None and (word == c.name
                                                               or word in c.aliases)), None)
