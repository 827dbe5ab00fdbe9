"""``icefloe up``: icefloe on one machine, on the embedded default.

Starts an ingestor (HTTP + gRPC) on a local directory object store under ``--data-dir``,
prints the endpoints and a curl example, and drains cleanly on Ctrl-C / SIGTERM. The
collector joins it when it is built (see the README's status table); until then events
are durable in batch files listed by the manifest (``icefloe inspect manifest``).
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from icefloe.config import find_config, load_config
from icefloe.logs import setup_logging

DEFAULT_DATA_DIR = "./icefloe-data"
# In a checkout the example lives in examples/; wheels carry it inside the package.
_EXAMPLES = (Path(__file__).resolve().parents[1] / "examples" / "icefloe.toml",
             Path(__file__).resolve().parents[2] / "examples" / "icefloe.toml")
EXAMPLE_CONFIG = next((p for p in _EXAMPLES if p.exists()), _EXAMPLES[-1])


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "up", help="run icefloe on this machine on the embedded default",
        description="Run an ingestor on a local object store under DATA_DIR. Without "
                    "--config it uses $ICEFLOE_CONFIG, ./icefloe.toml, then "
                    "examples/icefloe.toml.")
    parser.add_argument("--config", metavar="FILE", help="config file")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help="store, catalog and warehouse, where the config does not name "
                             "them (default: %(default)s)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8080)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 50051)")
    parser.set_defaults(run=run)


def _names_store(path: Path) -> bool:
    with path.open("rb") as handle:
        return "url" in tomllib.load(handle).get("store", {})


def run(args: argparse.Namespace) -> int:
    path = find_config(args.config) or EXAMPLE_CONFIG
    data_dir = Path(args.data_dir).absolute()
    overrides: dict[str, dict[str, Any]] = {"ingestor": {
        "http_port": args.http_port, "grpc_port": args.grpc_port}}
    if not _names_store(path):
        overrides["store"] = {"url": (data_dir / "store").as_uri()}
    config = load_config(path, overrides=overrides)
    setup_logging("warning", "text")
    from ingestor.server import BoundPorts
    from ingestor.server import run as serve

    def announce(ports: BoundPorts) -> None:
        host = config.ingestor.host if config.ingestor.host != "0.0.0.0" else "localhost"
        stream = config.streams[0].name if config.streams else "STREAM"
        print(f"icefloe up  (config {path})")
        print(f"  store    {config.store.url}")
        print(f"  HTTP     http://{host}:{ports.http}/v1/streams/{{stream}}/events")
        print(f"  gRPC     {host}:{ports.grpc}  (icefloe.v1.Ingest)")
        print(f"  metrics  http://{host}:{ports.http}/metrics")
        print(f"  streams  {', '.join(s.name for s in config.streams) or 'none'}")
        print(f"\n  curl -X POST http://{host}:{ports.http}/v1/streams/{stream}/events "
              "-H 'Content-Type: application/json' -d '{...}'")
        print(f"  icefloe inspect manifest --store {config.store.url}")
        print("\n  collector (Iceberg commits) not built yet: events stay durable in the "
              "store's batch files. Ctrl-C stops and drains.", flush=True)

    return serve(config, on_ready=announce)
