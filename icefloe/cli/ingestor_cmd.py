"""``icefloe ingestor``: run one ingestor process (HTTP + gRPC) for real deployments."""

from __future__ import annotations

import argparse
import json
from typing import Any

from icefloe.config import load_config
from icefloe.logs import setup_logging


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "ingestor", help="run an ingestor (HTTP :8080 and gRPC :50051)",
        description="Accept events over HTTP and gRPC, buffer them, and acknowledge each "
                    "request once its events are in a batch file listed by the manifest. "
                    "Stateless: start as many as you need; SIGTERM drains and exits 0.")
    parser.add_argument("--config", metavar="FILE",
                        help="config file (default: $ICEFLOE_CONFIG, then ./icefloe.toml)")
    parser.add_argument("--host", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8080)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 50051)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="json", choices=["json", "text"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config, overrides={"ingestor": {
        "host": args.host, "http_port": args.http_port, "grpc_port": args.grpc_port}})
    setup_logging(args.log_level, args.log_format)
    from ingestor.server import run as serve

    def announce(ports: Any) -> None:
        print(json.dumps({"event": "ready", "http_port": ports.http, "grpc_port": ports.grpc}),
              flush=True)

    return serve(config, on_ready=announce)
