"""``icefloe admin``: serve the admin API (sources, sinks, tokens, tasks) on port 8081.

Why a process of its own: it is an operator's tool, bound to this machine by default and
protected by its own bearer tokens, and it can run anywhere the store and catalog are
reachable — ingestors and the collector only read the registry it writes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from typing import Any

from icefloe.logs import setup_logging
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

log = logging.getLogger("icefloe.admin")

DESCRIPTION = """\
Serve the admin API: create, change and retire sources (ingest endpoints) and their sinks
(Iceberg tables with their own columns and import conditions) while icefloe runs. The
registry lives in the object store ([admin] registry_key); on first start the config's
[[streams]] seed it, afterwards the registry wins and differences are logged.

Every call but /healthz and /openapi.json needs 'Authorization: Bearer TOKEN' with a token
whose hash is in [admin] tokens:
  icefloe token new          # prints a token and its hash line
  [admin]
  tokens = ["scrypt$..."]
"""

EPILOG = """\
stdout gets one JSON line {"event": "ready", "port": P, "url": U, "registry_version": V}
when serving. Off this machine the API needs TLS ([admin] tls_cert_file, tls_key_file,
optional tls_client_ca_file for mutual TLS) or plaintext = true behind a TLS gateway.
exit codes: 0 stopped by SIGTERM/SIGINT, 1 store unreachable, 2 bad config or port in use.
"""


def register(commands: Any) -> None:
    parser = commands.add_parser("admin", help="serve the admin API (sources and sinks)",
                                 description=DESCRIPTION, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--host", metavar="ADDR", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, metavar="N", help="port (default 8081; 0: free)")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="json", choices=["json", "text"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from icefloe_app.api.server import AdminReady, serve_admin  # startup time
    from icefloe_app.cli.collector_cmd import install_stop_signals  # startup time

    _, config = config_from_args(args, {"admin": {"host": args.host, "port": args.port}})
    setup_logging(args.log_level, args.log_format)

    def ready(info: AdminReady) -> None:
        print(json.dumps({"event": "ready", "port": info.port, "url": info.url,
                          "registry_version": info.registry_version}), flush=True)

    async def main() -> int:
        stop = asyncio.Event()
        install_stop_signals(stop)
        return await serve_admin(config, stop=stop, on_ready=ready)

    return asyncio.run(main())
