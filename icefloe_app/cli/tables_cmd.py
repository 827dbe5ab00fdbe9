"""``icefloe tables list|history``: what the collector has committed, straight from Iceberg.

Why read the tables and not the collector: the Iceberg table is icefloe's only durable
offset store (every snapshot's summary carries the manifest sequence and collector epoch it
commits), so the catalog answers "how far has ingest got, how many rows, when was the last
commit" truthfully even when no collector runs. Only pyiceberg is used — no Spark — so both
commands answer in well under a second.

Name lookups follow one rule for exit codes: a name checked against the *config* (a stream
name) is a usage error (exit 2, like every :class:`ConfigError`); a table missing from the
*catalog* is an ordinary error (exit 1).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefloe.config import CatalogSection, Config
from icefloe.errors import CatalogError, ConfigError, IcefloeError
from icefloe_app.cli.common import iso, print_json, table
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from icefloe.registry import Registry

NOT_CREATED = "not created yet"
NO_COMMITS = "no commits yet"


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "tables", help="the Iceberg tables icefloe writes: rows, commits, history",
        description="Read the Iceberg catalog named by the config (pyiceberg only, no Spark) "
                    "and show what the collector has committed.")
    what = parser.add_subparsers(dest="what", metavar="WHAT", required=True)

    listing = what.add_parser(
        "list", help="every stream's table: snapshot, committed sequence, rows, files",
        description="One line per configured stream's table, then per table of a sink in "
                    "the stream registry (STREAM shows source/sink), and icefloe.dead_letters "
                    "when it exists: its current snapshot, the manifest sequence committed "
                    "through, total rows and data files, and the time of the last commit. "
                    "Tables the collector has not created yet say so.")
    add_config_arguments(listing, example=True)
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(run=run_list)

    history = what.add_parser(
        "history", help="a table's snapshots, newest first",
        description="The snapshots of one table, newest first: when each was committed, its "
                    "operation, the manifest sequence and collector epoch it recorded, and "
                    "rows and data files added and in total. NAME is a table "
                    "(web.pageviews, icefloe.dead_letters) or a stream name (pageviews).")
    history.add_argument("name", metavar="NAME", help="table (namespace.table) or stream")
    add_config_arguments(history, example=True)
    history.add_argument("--limit", type=int, default=20, metavar="N",
                         help="snapshots to show, newest first; 0 shows all "
                              "(default: %(default)s)")
    history.add_argument("--json", action="store_true", help="print JSON")
    history.set_defaults(run=run_history)


# --- catalog access shared with `icefloe demo` ----------------------------------------------

def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for other catalogs or ``:memory:``)."""
    if not uri.startswith("sqlite:") or ":///" not in uri:
        return None
    path = uri.split(":///", 1)[1].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def open_existing_catalog(section: CatalogSection) -> Catalog | None:
    """The catalog, or None when it is a SQLite file that does not exist yet.

    Why not just :func:`pipeline.iceberg.catalog.open_catalog`: opening a SQLite catalog creates the
    database file (and the warehouse folder). A read-only command run before ``icefloe up``
    — or in the wrong folder — must not leave an empty ``icefloe-data`` behind; "nothing
    created yet" is the true answer there. Every other failure is open_catalog's one-line
    :class:`CatalogError`.
    """
    from pipeline.iceberg.catalog import open_catalog  # lazy: pyiceberg

    path = sqlite_path(section.uri)
    if section.type == "sql" and path is not None and not path.exists():
        return None
    return open_catalog(section)


def load_table(catalog: Catalog, identifier: str) -> Table | None:
    """The table, or None when the catalog has no such table (or namespace)."""
    from pipeline.iceberg.errors import load_table_or_none  # lazy: pyiceberg

    try:
        return load_table_or_none(catalog, identifier)
    except Exception as exc:  # drivers raise their own trees: one line, cause chained
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise CatalogError(f"cannot load table {identifier} from catalog {catalog.name!r}: "
                           f"{text}") from exc


def total_records(snapshot: Snapshot | None) -> int:
    """Rows in the table as of ``snapshot`` (its summary's ``total-records``)."""
    return _summary_int(snapshot, "total-records") or 0


def _summary_int(snapshot: Snapshot | None, key: str) -> int | None:
    if snapshot is None or snapshot.summary is None:
        return None
    value = snapshot.summary.additional_properties.get(key)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _catalog_label(section: CatalogSection) -> str:
    from pipeline.iceberg.catalog import catalog_label  # lazy: pyiceberg

    return catalog_label(section)


# --- list ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TableStatus:
    """One table's state as ``tables list`` reports it (None: unknown / not applicable)."""

    table: str
    stream: str | None
    exists: bool
    snapshot_id: int | None = None
    sequence: int | None = None
    epoch: int | None = None
    rows: int | None = None
    data_files: int | None = None
    last_commit_ms: int | None = None

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["last_commit"] = iso(self.last_commit_ms / 1000) if self.last_commit_ms else None
        return out


def table_status(catalog: Catalog | None, identifier: str, stream: str | None) -> TableStatus:
    """What the catalog says about one table."""
    from pipeline.iceberg.commit import NO_SEQUENCE, committed_state  # lazy: pyiceberg

    loaded = load_table(catalog, identifier) if catalog is not None else None
    if loaded is None:
        return TableStatus(identifier, stream, exists=False)
    snapshot = loaded.current_snapshot()
    if snapshot is None:
        return TableStatus(identifier, stream, exists=True)
    state = committed_state(loaded)
    return TableStatus(
        identifier, stream, exists=True, snapshot_id=snapshot.snapshot_id,
        sequence=state.sequence if state.sequence != NO_SEQUENCE else None,
        epoch=state.epoch if state.sequence != NO_SEQUENCE else None,
        rows=total_records(snapshot), data_files=_summary_int(snapshot, "total-data-files"),
        last_commit_ms=snapshot.timestamp_ms)


def read_registry(config: Config) -> Registry | None:
    """The stream registry in the store, or None when there is none or the store cannot be
    read within 3 s (the listing is about the catalog: it only loses the sink tables)."""
    import asyncio  # startup time

    from icefloe.registry import RegistryStore  # startup time
    from icefloe.store import open_async_store, options_for  # startup time

    async def read() -> Registry:
        store = open_async_store(config.store.url, options_for(config.store.endpoint_url,
                                                               config.store.region),
                                 control_url=config.store.control_url)
        try:
            return await RegistryStore(store, config.admin.registry_key).read()
        finally:
            await store.close()
    try:
        registry = asyncio.run(asyncio.wait_for(read(), 3.0))
    except Exception:
        return None
    return registry if registry.version else None


def sink_tables(registry: Registry | None) -> list[tuple[str, str]]:
    """``(table, label)`` of every live sink: the label is the source id, or
    ``source/sink`` when the sink is named otherwise."""
    if registry is None:
        return []
    return [(sink.table, source.id if sink.name == source.id else f"{source.id}/{sink.name}")
            for source in registry.live_sources() for sink in source.live_sinks()]


def stream_tables(catalog: Catalog | None, table: str) -> list[str]:
    """A stream's table, or a table template's tables (those of its namespace that match
    it: docs/streams.md, Tables named by the data; the template itself while none)."""
    from icefloe.streams.dynamic_tables import is_template, split_template  # startup time

    if not is_template(table) or catalog is None:
        return [table]
    template = split_template(table)
    try:
        listed = catalog.list_tables(template.namespace)
    except Exception:  # no namespace yet (or unreadable): shown as not made
        return [table]
    names = sorted(".".join(i) for i in listed
                   if template.pattern().fullmatch(".".join(i).split(".", 1)[1]))
    return names or [table]


def list_statuses(config: Config, catalog: Catalog | None,
                  registry: Registry | None = None) -> list[TableStatus]:
    """Every configured stream's table, then the registry's sink tables not listed yet
    (sources and sinks made with the admin API), then the dead-letter table if it exists."""
    from pipeline.columns import DEAD_LETTER_TABLE  # startup time

    statuses = [table_status(catalog, name, s.name) for s in config.streams
                for name in stream_tables(catalog, s.table)]
    listed = {s.table for s in statuses}
    for identifier, label in sink_tables(registry):
        if identifier not in listed:
            listed.add(identifier)
            statuses.append(table_status(catalog, identifier, label))
    dead = table_status(catalog, DEAD_LETTER_TABLE, None)
    if dead.exists:
        statuses.append(dead)
    return statuses


def run_list(args: argparse.Namespace) -> int:
    path, config = config_from_args(args, example=True)
    catalog = open_existing_catalog(config.catalog)
    statuses = list_statuses(config, catalog, read_registry(config))
    label = _catalog_label(config.catalog)
    if args.json:
        print_json({"config": str(path) if path else None, "catalog": label,
                    "catalog_exists": catalog is not None,
                    "tables": [s.as_json() for s in statuses]})
        return 0
    print(f"catalog  {label}")
    if catalog is None:
        print("         (does not exist yet: nothing has been committed; `icefloe up` "
              "creates it)")
    if not statuses:
        print(f"no streams are configured in {path or 'the defaults'}: add [[streams]] to "
              "the config or pass --config FILE")
        return 0
    print()
    print(table(["TABLE", "STREAM", "SNAPSHOT", "SEQUENCE", "ROWS", "FILES", "LAST COMMIT"],
                [_list_row(s) for s in statuses]))
    return 0


def _list_row(status: TableStatus) -> list[str]:
    stream = status.stream or "-"
    if not status.exists:
        return [status.table, stream, NOT_CREATED, "", "", "", ""]
    if status.snapshot_id is None:
        return [status.table, stream, NO_COMMITS, "", "0", "0", ""]
    return [status.table, stream, str(status.snapshot_id), _opt(status.sequence),
            _count(status.rows), _count(status.data_files),
            iso(status.last_commit_ms / 1000) if status.last_commit_ms else "-"]


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


# --- history -------------------------------------------------------------------------------

def resolve_table(config: Config, name: str) -> tuple[str, str | None]:
    """``(table identifier, stream name or None)`` for a table or stream NAME.

    A bare name must be a configured stream (else a :class:`ConfigError` listing them); a
    dotted name is taken as a table, whether the config knows it or not (the dead-letter
    table, tables other tools write).
    """
    stream = config.stream(name)
    if stream is not None:
        return stream.table, stream.name
    owner = next((s.name for s in config.streams if s.table == name), None)
    if owner is not None or "." in name:
        return name, owner
    known = ", ".join(s.name for s in config.streams) or "none configured"
    raise ConfigError(f"{name!r} is neither a stream nor a table: name a stream ({known}) "
                      "or a table as namespace.table (e.g. web.pageviews)")


def run_history(args: argparse.Namespace) -> int:
    _, config = config_from_args(args, example=True)
    identifier, stream = resolve_table(config, args.name)
    catalog = open_existing_catalog(config.catalog)
    loaded = load_table(catalog, identifier) if catalog is not None else None
    if loaded is None:
        raise _missing(config, catalog, identifier, stream)
    snapshots = sorted(loaded.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number
                                                          or 0), reverse=True)
    shown = snapshots if args.limit <= 0 else snapshots[: args.limit]
    current = loaded.current_snapshot()
    from pipeline.read.versions import introduced_versions, snapshot_versions  # startup time

    numbers = introduced_versions(loaded)
    whole = {s.snapshot_id for s in snapshot_versions(loaded).values()}
    rows = [{"version": numbers.get(s.snapshot_id), **_history_entry(s, current)}
            for s in shown]
    if args.json:
        print_json({"table": identifier, "stream": stream,
                    "current_snapshot_id": current.snapshot_id if current else None,
                    "snapshot_count": len(snapshots), "snapshots": rows})
        return 0
    print(f"table     {identifier}" + (f"  (stream {stream})" if stream else ""))
    if not snapshots:
        print(f"snapshots none: {NO_COMMITS}")
        return 0
    print(f"snapshots {len(snapshots)}, current {current.snapshot_id if current else '-'}")
    print()
    print(table(["VERSION", "SNAPSHOT", "COMMITTED AT", "OPERATION", "SEQUENCE", "EPOCH",
                 "+ROWS", "ROWS", "+FILES", "FILES"],
                [[_opt(r["version"]), str(r["snapshot_id"]) + ("*" if r["current"] else ""),
                  r["committed_at"],
                  r["operation"], _opt(r["sequence"]), _opt(r["epoch"]),
                  _count(r["added_rows"]), _count(r["total_rows"]), _count(r["added_files"]),
                  _count(r["total_files"])] for r in rows]))
    if len(snapshots) > len(shown):
        print(f"... {len(snapshots) - len(shown)} older (use --limit 0 to show all)")
    _print_model_commits(rows, whole)
    print("* current snapshot. VERSION: the catalog version of the run that committed it "
          "(`AT (VERSION => n)` reads each table's newest state at or before n); "
          "`FOR VERSION AS OF <snapshot>` reads one snapshot. SEQUENCE, EPOCH: the manifest "
          "sequence and collector epoch it recorded")
    if any(r["version"] is None and r["snapshot_id"] in whole for r in rows):
        print("VERSION -: no version of its own: it carries the one before it (a fence on "
              "takeover or a compaction changes no rows), or it records none (written by "
              "another engine or an older icefloe: a table without any version is read "
              "at version n by commit time)")
    if any(r["snapshot_id"] not in whole for r in rows):
        print("VERSION -: the middle of one commit an older icefloe wrote as several "
              "snapshots, a state no reader saw (time travel never lands there)")
    return 0


def _history_entry(snapshot: Snapshot, current: Snapshot | None) -> dict[str, Any]:
    from pipeline.iceberg.commit import EPOCH_PROP, SEQUENCE_PROP  # lazy: pyiceberg

    summary = snapshot.summary
    props = summary.additional_properties if summary is not None else {}
    return {
        "snapshot_id": snapshot.snapshot_id,
        "parent_snapshot_id": snapshot.parent_snapshot_id,
        "current": current is not None and snapshot.snapshot_id == current.snapshot_id,
        "committed_at": iso(snapshot.timestamp_ms / 1000),
        "timestamp_ms": snapshot.timestamp_ms,
        "operation": summary.operation.value if summary is not None else "-",
        "sequence": _int(props.get(SEQUENCE_PROP)),
        "epoch": _int(props.get(EPOCH_PROP)),
        "added_rows": _summary_int(snapshot, "added-records"),
        "total_rows": _summary_int(snapshot, "total-records"),
        "added_files": _summary_int(snapshot, "added-data-files"),
        "total_files": _summary_int(snapshot, "total-data-files"),
        "model": _model_commit(props),
        "summary": dict(props),
    }


def _model_commit(props: dict[str, str]) -> dict[str, Any] | None:
    """What a model run recorded on this snapshot (None for other commits)."""
    from pipeline.models.state import RunState, last_run_properties  # startup time

    state: RunState | None = last_run_properties(props)
    if state is None:
        return None
    return {"name": state.name, "kind": state.kind or None, "run_id": state.run_id,
            "rows": state.rows, "duration_ms": state.duration_ms,
            "sql_sha256": state.sql_sha256 or None, "columns": list(state.columns)}


def _print_model_commits(rows: list[dict[str, Any]], whole: set[int]) -> None:
    """One line per shown commit (``whole``: the snapshot ids that end one) a model run
    made: its commit metadata."""
    models = [(r["version"], r["model"]) for r in rows
              if r["model"] is not None and r["snapshot_id"] in whole]
    if not models:
        return
    print("\nmodel commits (VERSION: model, kind, run id, rows, duration, SQL sha256, "
          "columns):")
    for version, model in models:
        took = "-" if model["duration_ms"] is None else f"{model['duration_ms']} ms"
        print(f"  {_opt(version)}: {model['name']}  {model['kind'] or '-'}  run "
              f"{model['run_id']}  {model['rows']:,} rows  {took}  sql "
              f"{(model['sql_sha256'] or '-')[:12]}  {', '.join(model['columns']) or '-'}")


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _missing(config: Config, catalog: Catalog | None, identifier: str,
             stream: str | None) -> IcefloeError:
    """The one-line error for a table the catalog does not hold."""
    if stream is not None or any(s.table == identifier for s in config.streams):
        owner = f" (stream {stream})" if stream else ""
        return IcefloeError(f"table {identifier}{owner} is {NOT_CREATED}: the collector "
                            "creates it when it starts (`icefloe up`)")
    existing = _existing_tables(catalog) if catalog is not None else []
    known = ", ".join(existing[:10]) + (", ..." if len(existing) > 10 else "") or "none"
    return IcefloeError(f"no table {identifier} in {_catalog_label(config.catalog)}; "
                        f"tables there: {known} (see `icefloe tables list`)")


def _existing_tables(catalog: Catalog) -> list[str]:
    try:
        return sorted(".".join(ident) for ns in catalog.list_namespaces()
                      for ident in catalog.list_tables(ns))
    except Exception:  # only decorates an error message: never replace the real error
        return []
