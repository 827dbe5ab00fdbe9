"""``icefloe streams list|show``: the streams the config defines, as the ingestor sees them.

Why a command for what is in a file: the config merges file, ``ICEFLOE_*`` environment and
defaults, and a producer team needs "what do I POST where, which fields are required, do I
need a token" without reading TOML. Tokens are secrets: only whether one is required is
ever printed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from icefloe.config import Column, Config, StreamConfig
from icefloe.config.security import needs_token
from icefloe.errors import ConfigError
from icefloe.streams.layout import partition_fields
from icefloe_app.cli.common import print_json, table
from icefloe_app.cli.config_args import add_config_arguments, config_from_args


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "streams", help="the streams the config defines (columns, table, policies)",
        description="Show the streams of the configuration: where events go, their columns "
                    "and policies. Tokens are never printed, only whether one is required.")
    what = parser.add_subparsers(dest="what", metavar="WHAT", required=True)

    listing = what.add_parser(
        "list", help="one line per stream",
        description="One line per stream: its table, column count, event id field, unknown "
                    "field policy, partitioning and whether a token is required.")
    add_config_arguments(listing, example=True)
    listing.add_argument("--json", action="store_true", help="print JSON (every column)")
    listing.set_defaults(run=run_list)

    show = what.add_parser(
        "show", help="one stream in full: columns, types, required, docs",
        description="One stream in full: its ingest endpoint, table, policies and every "
                    "column with type, required and doc. Exit 2 if no stream has that name.")
    show.add_argument("name", metavar="NAME", help="stream name")
    add_config_arguments(show, example=True)
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(run=run_show)


def stream_json(stream: StreamConfig, tokens_required: bool) -> dict[str, Any]:
    """A stream as JSON, without its tokens (only whether one is required)."""
    return {
        "name": stream.name, "table": stream.table,
        "columns": [{"name": c.name, "type": c.type, "required": c.required, "doc": c.doc,
                     "mapping": mapping_text(c)} for c in stream.columns],
        "unknown_fields": stream.unknown_fields, "event_id_field": stream.event_id_field,
        "partition": stream.partition, "tokens_required": tokens_required,
        "partition_by": [f.text for f in partition_fields(stream)],
        "sort_by": list(stream.sort_by), "table_properties": dict(stream.table_properties),
        "endpoint": endpoint(stream),
    }


def partition_text(stream: StreamConfig) -> str:
    """``day(_received_at)``, ``day(_received_at), bucket(16, user_id)`` or ``none
    (unpartitioned)``."""
    return ", ".join(f.text for f in partition_fields(stream)) or "none (unpartitioned)"


def mapping_text(column: Column) -> str | None:
    """Where a column's value comes from, as written in the config (None: its own field)."""
    kind = column.mapping
    if kind is None:
        return None
    if kind == "path":
        return f"path {column.path}" + (f" (default {column.default!r})"
                                        if column.default is not None else "")
    if kind == "header":
        return f"header {column.header}"
    if kind == "sql":
        return f"sql {column.sql}" + ("" if column.dialect == "spark"
                                      else f" ({column.dialect})")
    return kind


def endpoint(stream: StreamConfig) -> str:
    return f"POST /v1/streams/{stream.name}/events"


def find_stream(config: Config, name: str, where: str) -> StreamConfig:
    """The stream called ``name``, else a :class:`ConfigError` naming the known ones."""
    stream = config.stream(name)
    if stream is not None:
        return stream
    if not config.streams:
        raise ConfigError(f"unknown stream {name!r}: {where} defines no streams (add "
                          "[[streams]] to the config or pass --config FILE)")
    known = ", ".join(s.name for s in config.streams)
    raise ConfigError(f"unknown stream {name!r}: {where} defines {known}")


def describe_source(path: Path | None) -> str:
    return str(path) if path is not None else "the defaults (no config file)"


def run_list(args: argparse.Namespace) -> int:
    path, config = config_from_args(args, example=True)
    if args.json:
        print_json({"config": str(path) if path else None,
                    "streams": [stream_json(s, needs_token(config, s.name))
                                for s in config.streams]})
        return 0
    print(f"config  {describe_source(path)}")
    if not config.streams:
        print("no streams are configured: add [[streams]] to the config or pass "
              "--config FILE")
        _registry_note(config)
        return 0
    rows = [[s.name, s.table, str(len(s.columns)), s.event_id_field or "-", s.unknown_fields,
             s.partition if s.partition_by is None else partition_text(s),
             "required" if needs_token(config, s.name) else "no"]
            for s in config.streams]
    print()
    print(table(["STREAM", "TABLE", "COLUMNS", "EVENT ID", "UNKNOWN FIELDS", "PARTITION",
                 "TOKEN"], rows))
    _registry_note(config)
    return 0


def _registry_note(config: Config) -> None:
    version = registry_version(config)
    if version:
        print(f"\nnote: the stream registry in the store (version {version}) defines the "
              "streams now; the config's are only its seed. See `icefloe sources list`.")


def registry_version(config: Config) -> int | None:
    """The registry's version if one exists in the store (0: none), None if unreadable."""
    import asyncio  # startup time

    from icefloe.registry import RegistryStore  # startup time
    from icefloe.store import open_async_store, options_for  # startup time

    async def read() -> int:
        store = open_async_store(config.store.url, options_for(config.store.endpoint_url,
                                                               config.store.region),
                                 control_url=config.store.control_url)
        try:
            return (await RegistryStore(store, config.admin.registry_key).read()).version
        finally:
            await store.close()
    try:
        return asyncio.run(asyncio.wait_for(read(), 3.0))
    except Exception:  # the listing is about the file: an unreachable store only loses the note
        return None


def run_show(args: argparse.Namespace) -> int:
    path, config = config_from_args(args, example=True)
    stream = find_stream(config, args.name, describe_source(path))
    if args.json:
        print_json(stream_json(stream, needs_token(config, stream.name)))
        return 0
    event_id = (f"{stream.event_id_field} (retries with the same value are dropped as "
                "duplicates)" if stream.event_id_field else
                "- (derived from the request's Idempotency-Key)")
    unknown = ("reject (an event with an undeclared field fails validation)"
               if stream.unknown_fields == "reject" else "ignore (undeclared fields dropped)")
    partition = partition_text(stream)
    token = ("required (Authorization: Bearer <token>; tokens are not shown)"
             if needs_token(config, stream.name) else "not required")
    print(f"stream          {stream.name}")
    print(f"endpoint        {endpoint(stream)}")
    print(f"table           {stream.table}")
    print(f"event id field  {event_id}")
    print(f"unknown fields  {unknown}")
    print(f"partition       {partition}")
    if stream.sort_by:
        print(f"sort order      {', '.join(stream.sort_by)}")
    print(f"token           {token}")
    print()
    print(table(["COLUMN", "TYPE", "REQUIRED", "FROM", "DOC"],
                [[c.name, c.type, "yes" if c.required else "no", mapping_text(c) or "-",
                  c.doc or "-"] for c in stream.columns]))
    return 0
