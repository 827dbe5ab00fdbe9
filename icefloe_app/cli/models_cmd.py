"""``icefloe models list|show|run``: SQL models over the Iceberg tables.

Why ``list`` and ``show`` never start Spark: they answer from the model files and the
catalog (the last run is in the target's snapshot summary) in well under a second; only
``run`` pays the JVM start. Every model is parsed, resolved and ordered before Spark
starts, so a typo or a cycle costs a one-line error and nothing runs.

The models folder is ``--models DIR`` (relative to the working directory), else
``[collector] models_dir`` (``$ICEFLOE_COLLECTOR_MODELS_DIR``; default ``models``, relative
to the config file in use), the same folder ``icefloe run`` and the collector read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefloe.errors import ConfigError
from icefloe_app.cli.common import iso, print_json, table
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

if TYPE_CHECKING:
    from icefloe.config import Config
    from pipeline.models import Project, RunState

DESCRIPTION = """\
SQL models: each models/NAME.sql (or models/SCHEMA/NAME.sql, writing SCHEMA.NAME) file is
one SELECT over icefloe tables and other models, with a header such as
`-- materialized: merge` (or `-- @kind: merge`), `-- unique_key: day, url`,
`-- target: mart.daily_traffic`, `-- dialect: duckdb`. Runs on Spark, writes with pyiceberg.

examples:
  icefloe models list
  icefloe models show mart_daily_traffic
  icefloe models run
  icefloe models run mart_daily_traffic --full-refresh
"""


def register(commands: Any) -> None:
    parser = commands.add_parser("models", help="list, show and run SQL models",
                                 description=DESCRIPTION,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_subparsers(dest="what", metavar="WHAT", required=True)
    listing = what.add_parser("list", help="every model: materialization, target, "
                              "dependencies, last run")
    _common(listing)
    listing.set_defaults(run=run_list)
    show = what.add_parser("show", help="one model: header, dependencies, Spark SQL, "
                           "last run")
    show.add_argument("name", metavar="NAME", help="model name (the file stem)")
    _common(show)
    show.set_defaults(run=run_show)
    run = what.add_parser("run", help="run models in dependency order",
                          description="Run the named models (default: all) in dependency "
                          "order. Models whose SQL and source snapshots did not change since "
                          "their last run are reported as up to date and not run.")
    run.add_argument("names", nargs="*", metavar="NAME", help="models to run (default: all)")
    _common(run)
    run.add_argument("--full-refresh", action="store_true",
                     help="recompute incremental models from all rows and replace them")
    run.add_argument("--spark-master", default="local[2]", metavar="URL",
                     help="Spark master (default local[2])")
    run.set_defaults(run=run_models)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", metavar="DIR",
                        help="models folder (default: [collector] models_dir, relative to "
                             "the config file; models/ beside it unless set)")
    add_config_arguments(parser, example=True)
    parser.add_argument("--json", action="store_true", help="print JSON")


def models_folder(args: argparse.Namespace, config: Config) -> Path:
    """``--models``, else ``[collector] models_dir`` (the loader resolved it against the
    config file's folder, as for ``icefloe run`` and the collector); a folder that is not
    there is a usage error (exit 2)."""
    if args.models:
        folder, given = Path(args.models), "--models"
    elif config.collector.models_dir:
        folder, given = Path(config.collector.models_dir), "[collector] models_dir"
    else:
        raise ConfigError("[collector] models_dir is empty: set it to the models folder, or "
                          "give --models DIR")
    if not folder.is_dir():
        raise ConfigError(f"models folder {folder} ({given}) does not exist: give --models "
                          "DIR or set [collector] models_dir")
    return folder


def _project(args: argparse.Namespace) -> tuple[Config, Project]:
    from pipeline.models import plan_project  # startup time
    from pipeline.models.spec import load_models  # startup time

    _, config = config_from_args(args, example=True)
    return config, plan_project(load_models(models_folder(args, config)), config)


def _depends(project: Project, name: str) -> list[str]:
    return [ref.name for ref in project.refs[name]]


def _last(model_stored: bool, state: RunState | None) -> str:
    if not model_stored:
        return "not stored (view)"
    if state is None:
        return "never"
    when = iso(state.timestamp_ms / 1000) if state.timestamp_ms else "?"
    return f"{when}, {state.rows} rows"


def run_list(args: argparse.Namespace) -> int:
    from pipeline.models import last_runs  # startup time

    config, project = _project(args)
    states = last_runs(config, list(project.models.values()))
    rows: list[dict[str, Any]] = [
        {"name": m.name, "materialized": m.materialized, "target": m.target,
         "depends_on": _depends(project, m.name),
         "last_run": _last(m.stored, states[m.name])} for m in project.models.values()]
    if args.json:
        print_json(rows)
        return 0
    print(table(["MODEL", "MATERIALIZED", "TARGET", "DEPENDS ON", "LAST RUN"],
                [[r["name"], r["materialized"], r["target"], ", ".join(r["depends_on"]) or "-",
                  r["last_run"]] for r in rows]))
    return 0


def run_show(args: argparse.Namespace) -> int:
    from pipeline.models import last_runs, model_hash  # startup time

    config, project = _project(args)
    model = project.select([args.name])[0]
    state = last_runs(config, [model])[model.name]
    info = {
        "name": model.name, "path": str(model.path), "materialized": model.materialized,
        "target": model.target, "unique_key": list(model.unique_key),
        "dialect": model.dialect, "depends_on": _depends(project, model.name),
        "audits": [audit.sql for audit in model.audits],
        "used_by": [n for n in project.models if model.name in project.upstream(n)],
        "sql_hash": model_hash(project, model), "spark_sql": model.tree.sql(
            dialect="spark", pretty=True),
        "last_run": None if state is None else {
            "at": iso(state.timestamp_ms / 1000) if state.timestamp_ms else None,
            "rows": state.rows, "run_id": state.run_id, "sql_hash": state.sql_hash,
            "kind": state.kind or None, "sql_sha256": state.sql_sha256 or None,
            "duration_ms": state.duration_ms, "columns": list(state.columns),
            "snapshot_id": state.snapshot_id, "sources": state.sources,
            "watermarks": state.watermarks},
    }
    if args.json:
        print_json(info)
        return 0
    for key in ("name", "path", "materialized", "target", "unique_key", "dialect",
                "depends_on", "used_by", "sql_hash"):
        value = info[key]
        text = ", ".join(value) if isinstance(value, list) else str(value)
        print(f"{key + ':':<14}{text or '-'}")
    for audit in model.audits:
        print(f"{'audit:':<14}{audit.sql}")
    print(f"{'last run:':<14}{_last(model.stored, state)}")
    if state is not None:
        print(f"{'  run id:':<14}{state.run_id} (sql hash {state.sql_hash})")
        took = "-" if state.duration_ms is None else f"{state.duration_ms} ms"
        print(f"{'  commit:':<14}kind {state.kind or '-'}, took {took}, sql sha256 "
              f"{state.sql_sha256 or '-'}")
        print(f"{'  columns:':<14}{', '.join(state.columns) or '-'}")
        for source, snapshot in state.sources.items():
            mark = state.watermarks.get(source.split("@")[0])
            extra = f", watermark _sequence {mark}" if mark is not None else ""
            print(f"{'  source:':<14}{source} @ snapshot {snapshot}{extra}")
    print("\nSpark SQL:\n" + str(info["spark_sql"]))
    return 0


def run_models(args: argparse.Namespace) -> int:
    from pipeline.models import prepare  # startup time
    from pipeline.models import run_models as run  # startup time

    _, config = config_from_args(args, example=True)
    project = prepare(models_folder(args, config), config)
    project.select(args.names)  # unknown names fail before Spark starts
    print("icefloe models: starting Spark ...", file=sys.stderr, flush=True)
    from pipeline.spark import get_spark  # lazy: pyspark

    spark = get_spark(args.spark_master, "icefloe-models")
    outcomes = run(spark, project, config, args.names, full_refresh=args.full_refresh)
    return report_outcomes(outcomes, as_json=args.json)


def report_outcomes(outcomes: list[Any], *, as_json: bool) -> int:
    """Print what each model run did (a table, or JSON) and return the exit code: 1 when
    any model failed or was skipped. Shared by ``models run`` and ``icefloe run``."""
    if as_json:
        print_json([{"name": o.name, "state": o.state, "rows": o.rows,
                     "seconds": round(o.seconds, 3), "reason": o.reason} for o in outcomes])
    else:
        print(table(["MODEL", "STATE", "ROWS", "SECONDS"],
                    [[o.name, o.state + (f": {o.reason}" if o.reason else ""),
                      "-" if o.rows is None else str(o.rows), f"{o.seconds:.2f}"]
                     for o in outcomes]))
    return 1 if any(o.state in ("failed", "skipped") for o in outcomes) else 0
