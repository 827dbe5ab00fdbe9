"""``icefloe ingestor``: run one ingestor process (HTTP + gRPC) for real deployments."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any

from icefloe.logs import setup_logging
from icefloe_app.cli.arg_types import positive_seconds
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

if TYPE_CHECKING:
    from ingestor.runtime import IngestorRuntime
    from ingestor.server import BoundPorts

EPILOG = """\
stdout gets one JSON line {"event": "ready", "http_port": H, "grpc_port": G,
"kafka_port": K, "otlp_http_port": OH, "otlp_grpc_port": OG} once the servers listen (K,
OH, OG null without --kafka-port, --otlp-http-port, --otlp-grpc-port), and with
--stats-interval S one {"event": "stats", "accepted": N, "rejected": M, "buffered_bytes": B}
line every S seconds (totals since start; `icefloe up`
reads them for its progress line). Logs go to stderr.

exit codes: 0 drained cleanly after SIGTERM/SIGINT; 1 some buffered events could not be
flushed before shutdown_timeout_s (they were never acknowledged); 2 bad configuration, a
port in use, or a non-loopback --host without TLS (set [ingestor] tls_cert_file and
tls_key_file, or plaintext = true behind a TLS-terminating gateway).

environment: ICEFLOE_CONFIG, ICEFLOE_INGESTOR_<KEY> (e.g. ICEFLOE_INGESTOR_HTTP_PORT);
precedence: flag > environment > config file > default.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "ingestor", help="run an ingestor (HTTP :8080 and gRPC :50051)",
        description="Accept events over HTTP and gRPC, buffer them, and acknowledge each "
                    "request once its events are in a batch file listed by the manifest. "
                    "Stateless: start as many as you need; SIGTERM drains and exits 0.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--host", help="address to bind (default 0.0.0.0)")
    parser.add_argument("--http-port", type=int, help="HTTP port (default 8080)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default 50051)")
    parser.add_argument("--kafka-port", type=int,
                        help="serve Kafka's produce protocol on this port (default: off; "
                             "docs/kafka.md)")
    parser.add_argument("--otlp-http-port", type=int,
                        help="serve OTLP/HTTP on this port too (default: off; it is always "
                             "on the HTTP port when [otlp] is enabled; docs/otlp-receivers.md)")
    parser.add_argument("--otlp-grpc-port", type=int,
                        help="serve OTLP/gRPC on this port too (default: off; it is always "
                             "on the gRPC port when [otlp] is enabled)")
    parser.add_argument("--reuse-port", action="store_true", default=None,
                        help="share the ports with other ingestors on this host "
                             "(SO_REUSEPORT; [ingestor] reuse_port)")
    parser.add_argument("--stats-interval", type=positive_seconds("--stats-interval"), metavar="S",
                        help="print a JSON stats line on stdout every S seconds (S > 0; "
                             "default: none)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="json", choices=["json", "text"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    _, config = config_from_args(args, {"ingestor": {
        "host": args.host, "http_port": args.http_port, "grpc_port": args.grpc_port,
        "kafka_port": args.kafka_port, "otlp_http_port": args.otlp_http_port,
        "otlp_grpc_port": args.otlp_grpc_port, "reuse_port": args.reuse_port}})
    setup_logging(args.log_level, args.log_format)
    from ingestor.server import run as serve  # startup time

    def announce(ports: BoundPorts) -> None:
        print(json.dumps({"event": "ready", "http_port": ports.http, "grpc_port": ports.grpc,
                          "kafka_port": ports.kafka, "otlp_http_port": ports.otlp_http,
                          "otlp_grpc_port": ports.otlp_grpc}), flush=True)

    tasks: list[asyncio.Task[None]] = []

    def report(runtime: IngestorRuntime) -> None:
        if args.stats_interval is not None:
            tasks.append(asyncio.get_running_loop().create_task(
                _report_stats(runtime, args.stats_interval)))

    return serve(config, on_ready=announce, on_runtime=report)


async def _report_stats(runtime: IngestorRuntime, interval: float) -> None:
    """Totals since start, so a missed line loses nothing."""
    while True:
        await asyncio.sleep(interval)
        print(json.dumps({"event": "stats", **runtime.metrics.totals()}), flush=True)
