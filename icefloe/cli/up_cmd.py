"""``icefloe up``: the whole of icefloe on one machine, on the embedded default.

Starts an ingestor (HTTP + gRPC) and the collector (Spark ``local[2]`` by default → Iceberg) in one
process and one event loop, on a local directory object store, a SQLite catalog and a file
warehouse under ``--data-dir`` wherever the config does not name them. Why one process: it
is the "try it on a laptop" path — one command, one Ctrl-C — and both parts already run as
asyncio tasks (:func:`ingestor.server.serve`, :func:`collector.runner.run_collector`). The
ingestor starts first so events are accepted (durably, into the queue) while Spark boots.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefloe.cli.collector_cmd import (
    EXIT_FENCED,
    fenced_message,
    install_stop_signals,
    run_guarded,
)
from icefloe.config import Config, find_config, load_config
from icefloe.logs import setup_logging

if TYPE_CHECKING:
    from collector.runner import Ready
    from ingestor.server import BoundPorts

DEFAULT_DATA_DIR = "./icefloe-data"
# In a checkout the example lives in examples/; wheels carry it inside the package.
_EXAMPLES = (Path(__file__).resolve().parents[1] / "examples" / "icefloe.toml",
             Path(__file__).resolve().parents[2] / "examples" / "icefloe.toml")
EXAMPLE_CONFIG = next((p for p in _EXAMPLES if p.exists()), _EXAMPLES[-1])


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "up", help="run icefloe on this machine on the embedded default",
        description="Run an ingestor and the collector in one process: a local object store, "
                    "a SQLite Iceberg catalog and a file warehouse under DATA_DIR (where the "
                    "config does not name them), Spark per [collector] spark_master (default "
                    "local[2]). Without --config it uses "
                    "$ICEFLOE_CONFIG, ./icefloe.toml, then examples/icefloe.toml. Ctrl-C or "
                    "SIGTERM stops both cleanly (the ingestor drains, the collector finishes "
                    "its run); a second Ctrl-C exits at once.")
    parser.add_argument("--config", metavar="FILE", help="config file")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help="store, catalog and warehouse, where the config does not name "
                             "them (default: %(default)s)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8080)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 50051)")
    parser.add_argument("--metrics-port", type=int,
                        help="collector metrics port (default 9464)")
    parser.add_argument("--no-collector", action="store_true",
                        help="run only the ingestor (e.g. when `icefloe collector` runs "
                             "elsewhere); events then wait in the queue")
    parser.set_defaults(run=run)


def _names(path: Path, section: str, key: str, env: Mapping[str, str]) -> bool:
    """Whether the user chose ``section.key`` (file or ``ICEFLOE_*`` env), so --data-dir
    must not override it."""
    if f"ICEFLOE_{section.upper()}_{key.upper()}" in env:
        return True
    if not path.exists():
        return False  # load_config reports the missing file
    with path.open("rb") as handle:
        return key in tomllib.load(handle).get(section, {})


def up_config(args: argparse.Namespace, env: Mapping[str, str] = os.environ
              ) -> tuple[Path, Config]:
    """The config file used and the config with --data-dir defaults and flags applied."""
    path = find_config(args.config) or EXAMPLE_CONFIG
    data_dir = Path(args.data_dir).absolute()
    overrides: dict[str, dict[str, Any]] = {
        "ingestor": {"http_port": args.http_port, "grpc_port": args.grpc_port},
        "collector": {"metrics_port": args.metrics_port}}
    if not _names(path, "store", "url", env):
        overrides["store"] = {"url": (data_dir / "store").as_uri()}
    catalog: dict[str, Any] = {}
    if not _names(path, "catalog", "uri", env):
        catalog["uri"] = f"sqlite:///{data_dir / 'catalog.db'}"
    if not _names(path, "catalog", "warehouse", env):
        catalog["warehouse"] = (data_dir / "warehouse").as_uri()
    if catalog:
        overrides["catalog"] = catalog
    return path, load_config(path, env=env, overrides=overrides)


def run(args: argparse.Namespace) -> int:
    path, config = up_config(args)
    setup_logging("warning", "text")
    # The only fork in this process is Spark's launcher (fork + exec), which needs no gRPC
    # fork handlers; with them on, gRPC logs a warning on the terminal at every start.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from ingestor.server import tune_gc

    tune_gc()
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency of uvicorn[standard]
        runner = asyncio.run
    return run_guarded(lambda: _up(path, config, collector=not args.no_collector), config,
                       runner=runner)


async def _up(path: Path, config: Config, *, collector: bool) -> int:
    """Ingestor first; once it listens, the collector. Either one ending stops the other."""
    from collector.runner import run_collector
    from ingestor.server import serve

    stop = asyncio.Event()
    listening = asyncio.Event()
    epoch: list[int] = []

    def notice() -> None:
        print("icefloe up: stopping (Ctrl-C again to exit at once)", file=sys.stderr,
              flush=True)

    def ingestor_ready(ports: BoundPorts) -> None:
        # serve() installed its own handlers (a plain stop.set); ours add the second-signal exit.
        install_stop_signals(stop, notice)
        _print_endpoints(path, config, ports, collector=collector)
        listening.set()

    def collector_ready(ready: Ready) -> None:
        epoch.append(ready.epoch)
        _print_collector(config, ready)

    async def collect() -> int:
        await listening.wait()
        if stop.is_set():
            return 0  # the ingestor never came up (or we were stopped first): do not boot Spark
        return await run_collector(config, stop=stop, on_ready=collector_ready)

    install_stop_signals(stop, notice)
    ingest = asyncio.create_task(serve(config, on_ready=ingestor_ready, stop=stop),
                                 name="ingestor")
    tasks = [ingest]
    if collector:
        tasks.append(asyncio.create_task(collect(), name="collector"))
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    listening.set()  # release a collector still waiting for the ingestor
    await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:  # an error of either part is the process's error
        error = task.exception()
        if error is not None:
            raise error
    code = int(tasks[1].result()) if collector else 0
    if code == EXIT_FENCED:
        print(f"icefloe: error: {fenced_message(epoch[0] if epoch else None)}",
              file=sys.stderr, flush=True)
    if code:
        return code
    return 0 if ingest.result() else 1


def _host(host: str) -> str:
    return "localhost" if host in ("0.0.0.0", "::", "") else host


def _print_endpoints(path: Path, config: Config, ports: BoundPorts, *, collector: bool) -> None:
    from pipeline.catalog import catalog_label

    host = _host(config.ingestor.host)
    stream = config.streams[0].name if config.streams else "STREAM"
    print(f"icefloe up  (config {path})")
    print(f"  store    {config.store.url}")
    print(f"  catalog  {catalog_label(config.catalog)}")
    print(f"  HTTP     http://{host}:{ports.http}/v1/streams/{{stream}}/events")
    print(f"  gRPC     {host}:{ports.grpc}  (icefloe.v1.Ingest)")
    print(f"  metrics  http://{host}:{ports.http}/metrics  (ingestor)")
    print(f"  streams  {', '.join(s.name for s in config.streams) or 'none'}")
    print(f"\n  curl -X POST http://{host}:{ports.http}/v1/streams/{stream}/events "
          "-H 'Content-Type: application/json' -d '{...}'")
    print(f"  icefloe inspect manifest --store {config.store.url}")
    if collector:
        print("\n  collector starting Spark (the first start takes ~15 s; events are queued "
              "meanwhile). Ctrl-C stops both.", flush=True)
    else:
        print("\n  no collector (--no-collector): events wait in the queue for "
              "`icefloe collector`. Ctrl-C stops and drains.", flush=True)


def _print_collector(config: Config, ready: Ready) -> None:
    host = _host(config.collector.host)
    print(f"\n  collector active (epoch {ready.epoch})")
    if ready.metrics_port is not None:
        print(f"  metrics  http://{host}:{ready.metrics_port}/metrics  (collector)")
    for line in read_example(config):
        print(f"  {line}")
    print(flush=True)


def read_example(config: Config) -> list[str]:
    """How to read a stream's table back: a pyiceberg one-liner for the SQL catalog."""
    if not config.streams:
        return []
    table = config.streams[0].table
    cat = config.catalog
    if cat.type != "sql":
        from pipeline.catalog import catalog_label

        return [f"read {table} with any Iceberg engine through the {catalog_label(cat)}"]
    from pipeline.catalog import mask_uri

    code = (f"from pyiceberg.catalog.sql import SqlCatalog; "
            f"c = SqlCatalog({cat.name!r}, uri={mask_uri(cat.uri)!r}, "
            f"warehouse={cat.warehouse!r}); "
            f"print(c.load_table({table!r}).scan().to_arrow().to_pandas())")
    return [f"read {table} (committed every ~{config.collector.commit_interval_s:g} s):",
            f'{sys.executable} -c "{code}"']
