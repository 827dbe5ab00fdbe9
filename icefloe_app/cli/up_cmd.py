"""``icefloe up``: the whole of icefloe on one machine, on the embedded default.

Starts N ingestor processes sharing the HTTP and gRPC ports (see
:mod:`icefloe_app.cli.ingestor_group`) and the collector (Spark ``local[2]`` by default →
Iceberg) in this process, then a warm standby collector process beside it (see
:mod:`icefloe_app.cli.standby_child`; ``--no-standby``: none), on a local directory object
store, a SQLite catalog and a file
warehouse under ``--data-dir`` wherever the config does not name them. Why this shape: it
is the "try it on a laptop" path — one command, one Ctrl-C — yet it runs the very processes
a deployment runs. The ingestors start first, so events are accepted (durably, into the
queue) while Spark boots; a live progress line shows accepted, committed, queue and lag.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icefloe.config import Config, StreamConfig
from icefloe.config.validate import check_port_clashes
from icefloe.errors import ConfigError
from icefloe.logs import setup_logging
from icefloe.metric_total import metric_total
from icefloe.streams.mappings import place_value
from icefloe_app.cli.collector_cmd import (
    EXIT_FENCED,
    fenced_message,
    install_stop_signals,
    run_guarded,
)
from icefloe_app.cli.config_args import (
    add_config_arguments,
    config_from_args,
    config_path,
    data_dir_of,
    user_named,
)
from icefloe_app.cli.ingestor_group import IngestorGroup, reserve_port
from icefloe_app.cli.progress import Snapshot, show_progress
from icefloe_app.cli.standby_child import StandbyCollector

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from collector.metrics import CollectorMetrics
    from collector.runner import Ready

DESCRIPTION = """\
Run icefloe on this machine: N ingestor processes sharing the HTTP and gRPC ports, and the
collector (Spark, per [collector] spark_master, default local[2]) committing into Iceberg.
The object store, the SQLite catalog and the warehouse go under DATA_DIR wherever the config
does not name them. Without --config: $ICEFLOE_CONFIG, ./icefloe.toml, then the bundled
examples/icefloe.toml (streams "pageviews" and "orders").

The collector commits from the start: while its Spark boots, runs are decoded in this
process (where the config allows: no sql mapping columns), then handed to Spark. Once it
has committed and its Spark is up (or 30 s after it became active), a warm standby
collector starts beside it (a second `icefloe collector` process with its own Spark,
waiting on the lease): if the active one
stops renewing its lease, the standby takes over within about [manifest] lease_s and
commits at once, without Spark's start. --no-standby runs none (one JVM less).

It prints the endpoints and a curl example, then a live progress line (events accepted,
rows committed, files queued, lag). Ctrl-C or SIGTERM stops everything cleanly: the
ingestors drain their buffers and the collector finishes its run; a second Ctrl-C exits at
once (safe: nothing is acknowledged before it is durable). Start it again on the same
DATA_DIR and it carries on where it stopped.
"""

STANDBY_AFTER_S = 30.0
"""The standby starts once the collector has committed rows, or this long after it became
active (an idle queue)."""

EPILOG = """\
exit codes: 0 clean stop; 1 error (Spark failed to start, store unreachable, ...);
2 bad configuration or a port in use; 3 another collector took over the queue (with the
standby on, up keeps running instead and its collector waits as a standby).
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "up", help="run the whole cluster on this machine (ingestors + collector)",
        description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, example=True)
    parser.add_argument("--http-port", type=int, metavar="N",
                        help="HTTP port shared by the ingestors (default 8080; 0 = any free)")
    parser.add_argument("--grpc-port", type=int, metavar="N",
                        help="gRPC port shared by the ingestors (default 50051; 0 = any free)")
    parser.add_argument("--metrics-port", type=int, metavar="N",
                        help="collector /metrics, /healthz, /readyz port (default 9464)")
    parser.add_argument("--ingestors", type=int, default=1, metavar="N",
                        help="ingestor processes (default 1; each uses about one core)")
    parser.add_argument("--admin-port", type=int, metavar="N",
                        help="admin API port (default 8081; served when [admin] tokens is "
                             "set; 0 = any free)")
    parser.add_argument("--kafka-port", type=int, metavar="N",
                        help="Kafka produce-protocol port (default 9092; 0 = any free; "
                             "docs/kafka.md)")
    parser.add_argument("--no-kafka", action="store_true",
                        help="serve no Kafka listener")
    parser.add_argument("--otlp-http-port", type=int, metavar="N",
                        help="OTLP/HTTP port (default 4318; 0 = any free; "
                             "docs/otlp-receivers.md)")
    parser.add_argument("--otlp-grpc-port", type=int, metavar="N",
                        help="OTLP/gRPC port (default 4317; 0 = any free)")
    parser.add_argument("--no-otlp", action="store_true",
                        help="receive no OpenTelemetry data ([otlp] off, no OTLP ports)")
    parser.add_argument("--no-standby", action="store_true",
                        help="start no warm standby collector beside the active one (it "
                             "takes over within about lease_s if the active one stops, "
                             "without Spark's start; costs a second JVM)")
    parser.add_argument("--no-collector", action="store_true",
                        help="run only the ingestors (e.g. when `icefloe collector` runs "
                             "elsewhere); events then wait in the queue")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    path, config = config_from_args(args, {
        "ingestor": {"http_port": args.http_port, "grpc_port": args.grpc_port},
        "collector": {"metrics_port": args.metrics_port},
        "admin": {"port": args.admin_port},
        "otlp": {"enabled": _otlp_enabled(args)}}, example=True)
    if args.ingestors < 1:
        raise ConfigError(f"--ingestors {args.ingestors}: at least one ingestor is needed")
    otlp_ports = _otlp_ports(args, config)
    kafka_port = None if args.no_kafka else args.kafka_port if args.kafka_port is not None \
        else config.ingestor.kafka_port if config.ingestor.kafka_port is not None else 9092
    # every listener up starts on this host on a port of its own: two on one port fail
    # late (one role's bind), or share its traffic under the ingestors' reuse_port
    check_port_clashes("icefloe up", {
        "--http-port": config.ingestor.http_port, "--grpc-port": config.ingestor.grpc_port,
        "--kafka-port": kafka_port,
        "--otlp-http-port": otlp_ports[0] if otlp_ports else None,
        "--otlp-grpc-port": otlp_ports[1] if otlp_ports else None,
        "--metrics-port (the collector's HTTP port)":
            None if args.no_collector else config.collector.metrics_port,
        "--admin-port": config.admin.port if config.admin.tokens else None})
    if not args.no_collector:
        from pipeline.java import require_java  # startup time

        require_java()  # fail in a second, not after the ingestors started
    setup_logging("warning", "text")
    # The only fork in this process is Spark's launcher (fork + exec), which needs no gRPC
    # fork handlers; with them on, gRPC logs a warning on the terminal at every start.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    # the ingestors load the config file themselves: they learn up's [otlp] decision here
    os.environ["ICEFLOE_OTLP_ENABLED"] = "true" if config.otlp.enabled else "false"
    argv = [sys.executable, "-m", "icefloe", "ingestor", "--config", str(path),
            "--data-dir", str(data_dir_of(args)), "--reuse-port", "--stats-interval", "1",
            "--log-level", "warning", "--log-format", "text"]
    runner: Callable[[Coroutine[Any, Any, int]], int]
    try:
        import uvloop  # optional dep

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency of uvicorn[standard]
        runner = asyncio.run
    standby = None if args.no_collector or args.no_standby else standby_argv(path, args)
    up = _Up(path, config, args.ingestors, argv, collector=not args.no_collector,
             kafka_port=kafka_port, otlp_ports=otlp_ports,
             standby_argv=standby)
    return run_guarded(up.main, config, runner=runner)


def standby_argv(path: Path | None, args: argparse.Namespace) -> list[str]:
    """The warm standby's command line: ``icefloe collector`` on up's config and data dir,
    its metrics on a free port (up's collector has the configured one), logging at info
    level so its ``standby: warm`` line can be seen (only warnings are shown)."""
    config = ["--config", str(path)] if path is not None else []
    return [sys.executable, "-m", "icefloe", "collector", *config, "--data-dir",
            str(data_dir_of(args)), "--metrics-port", "0", "--log-level", "info",
            "--log-format", "text"]


def _otlp_enabled(args: argparse.Namespace) -> bool | None:
    """``[otlp] enabled`` for up: off with ``--no-otlp``; else what the environment
    (``ICEFLOE_OTLP_ENABLED``) or the file says, when either says it (None: no override);
    else on, up's own default."""
    if args.no_otlp:
        return False
    path = config_path(args, example=True)
    return None if user_named(path, "otlp", "enabled", os.environ) else True


def _otlp_ports(args: argparse.Namespace, config: Config) -> tuple[int, int] | None:
    """The OTLP/HTTP and OTLP/gRPC ports to serve (flag > config > OTLP's defaults 4318
    and 4317), or None with OTLP off (``--no-otlp``, or ``[otlp] enabled = false``); an
    OTLP port flag with OTLP off is refused."""
    if args.no_otlp or not config.otlp.enabled:
        for flag, value in (("--otlp-http-port", args.otlp_http_port),
                            ("--otlp-grpc-port", args.otlp_grpc_port)):
            if value is not None:
                why = "--no-otlp" if args.no_otlp else "[otlp] enabled is false"
                raise ConfigError(f"{flag} {value}: OTLP is off ({why}); drop the flag or "
                                  "turn OTLP on")
        return None
    ing = config.ingestor
    http = args.otlp_http_port if args.otlp_http_port is not None else \
        ing.otlp_http_port if ing.otlp_http_port is not None else 4318
    grpc = args.otlp_grpc_port if args.otlp_grpc_port is not None else \
        ing.otlp_grpc_port if ing.otlp_grpc_port is not None else 4317
    return http, grpc


class _Up:
    """One ``icefloe up``: reserve ports, start the ingestors, then the collector."""

    def __init__(self, path: Path | None, config: Config, ingestors: int, argv: list[str], *,
                 collector: bool, kafka_port: int | None = None,
                 otlp_ports: tuple[int, int] | None = None,
                 standby_argv: list[str] | None = None) -> None:
        self.path = path
        self.kafka_port = kafka_port
        self.otlp_ports = otlp_ports
        self.config = config
        self.ingestors = ingestors
        self.argv = argv
        self.collector = collector
        self.metrics: CollectorMetrics | None = None
        self.group: IngestorGroup | None = None
        self.standby = StandbyCollector(standby_argv) if standby_argv and collector else None
        """The warm standby collector process, started once the collector has run."""
        self._standby_soon: asyncio.Task[None] | None = None

    async def main(self) -> int:
        stop = asyncio.Event()
        ing = self.config.ingestor
        holders = [reserve_port(ing.host, ing.http_port, "HTTP", "--http-port",
                                "ICEFLOE_INGESTOR_HTTP_PORT"),
                   reserve_port(ing.host, ing.grpc_port, "gRPC", "--grpc-port",
                                "ICEFLOE_INGESTOR_GRPC_PORT")]
        http_port, grpc_port = (h.getsockname()[1] for h in holders)
        kafka: list[str] = []
        kafka_port = None
        if self.kafka_port is not None:
            holders.append(reserve_port(ing.host, self.kafka_port, "Kafka", "--kafka-port",
                                        "ICEFLOE_INGESTOR_KAFKA_PORT"))
            kafka_port = holders[-1].getsockname()[1]
            kafka = ["--kafka-port", str(kafka_port)]
        otlp, otlp_ports = self._reserve_otlp(holders)
        group = self.group = IngestorGroup(
            self.ingestors, [*self.argv, "--http-port", str(http_port),
                             "--grpc-port", str(grpc_port), *kafka, *otlp],
            stop_timeout_s=ing.shutdown_timeout_s + 10, shard_base=max(ing.shard_index, 0))

        def notice() -> None:
            print("\nicefloe up: stopping (Ctrl-C again to exit at once)", file=sys.stderr,
                  flush=True)

        install_stop_signals(stop, notice, hard_exit=self._kill)
        try:
            started = await _first(group.start(), stop)
        finally:
            for holder in holders:
                holder.close()
        if not started:
            await group.stop()
            return 0
        self._print_endpoints(http_port, grpc_port, kafka_port, otlp_ports)
        tasks: list[asyncio.Task[Any]] = [
            asyncio.create_task(show_progress(self._snapshot, stop), name="progress")]
        if self.config.admin.tokens:
            tasks.append(asyncio.create_task(self._admin(stop), name="admin"))
        else:
            print("  admin    off: put a token hash (`icefloe token new`) into [admin] tokens "
                  "to manage sources and sinks at runtime", flush=True)
        collect = None
        if self.collector:
            collect = asyncio.create_task(self._collect(stop), name="collector")
            tasks.append(collect)
        if collect is not None:
            await _first(collect, stop, cancel=False)
        else:
            await stop.wait()
        stop.set()
        # the standby first: the active collector releases its lease as it stops, which a
        # standby still waiting would take at once, only to be stopped in turn
        codes = (await asyncio.gather(self._stop_standby(), group.stop()))[1]
        await asyncio.gather(*tasks, return_exceptions=True)
        return self._exit_code(collect, codes)

    async def _start_standby(self, stop: asyncio.Event) -> None:
        """Start the standby once the collector has committed and its own Spark is up, or
        :data:`STANDBY_AFTER_S` after it became active: its JVM start beside the first run
        (or beside the collector's own JVM start) would slow down the first answer, which
        on a laptop's two cores is what a user waits for."""
        assert self.standby is not None
        assert self.metrics is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STANDBY_AFTER_S
        while loop.time() < deadline and not (metric_total(self.metrics.rows)
                                              and metric_total(self.metrics.spark_ready)):
            if stop.is_set():
                return
            await asyncio.sleep(0.5)
        if not stop.is_set():
            self.standby.start()

    async def _stop_standby(self) -> None:
        if self._standby_soon is not None:
            self._standby_soon.cancel()
        if self.standby is not None:
            await self.standby.stop()

    def _kill(self) -> None:
        """A second Ctrl-C: every child at once (safe: acked events are durable)."""
        assert self.group is not None
        self.group.kill()
        if self.standby is not None:
            self.standby.kill()

    def _reserve_otlp(self, holders: list[Any]) -> tuple[list[str], tuple[int, int] | None]:
        """Hold the OTLP ports for the ingestors (appended to ``holders``); their flags and
        the ports held (None: OTLP is off)."""
        if self.otlp_ports is None:
            return [], None
        ing = self.config.ingestor
        http, grpc = self.otlp_ports
        holders.append(reserve_port(ing.host, http, "OTLP/HTTP", "--otlp-http-port",
                                    "ICEFLOE_INGESTOR_OTLP_HTTP_PORT"))
        holders.append(reserve_port(ing.host, grpc, "OTLP/gRPC", "--otlp-grpc-port",
                                    "ICEFLOE_INGESTOR_OTLP_GRPC_PORT"))
        ports = (holders[-2].getsockname()[1], holders[-1].getsockname()[1])
        return ["--otlp-http-port", str(ports[0]), "--otlp-grpc-port", str(ports[1])], ports

    def _print_otlp(self, ports: tuple[int, int] | None) -> None:
        if ports is None:
            return
        host = _host(self.config.ingestor.host)
        scheme = "https" if self.config.ingestor.tls_cert_file is not None else "http"
        print(f"  OTLP     {scheme}://{host}:{ports[0]} (HTTP), {host}:{ports[1]} (gRPC)  "
              f"(OTEL_EXPORTER_OTLP_ENDPOINT={scheme}://{host}:{ports[0]}; "
              "docs/otlp-receivers.md)", flush=True)

    async def _admin(self, stop: asyncio.Event) -> None:
        """The admin API next to the cluster; if it cannot start, the cluster keeps running."""
        from icefloe_app.api.server import AdminReady, serve_admin  # startup time

        def ready(info: AdminReady) -> None:
            print(f"  admin    {info.url}/v1/sources  (registry version "
                  f"{info.registry_version}; ICEFLOE_ADMIN_TOKEN=... icefloe sources list "
                  f"--url {info.url})", flush=True)
        try:
            await serve_admin(self.config, stop=stop, on_ready=ready)
        except Exception as exc:
            print(f"icefloe up: admin API not started: {exc}", file=sys.stderr, flush=True)

    async def _collect(self, stop: asyncio.Event) -> int:
        from collector.metrics import CollectorMetrics  # lazy: pyspark
        from collector.runner import run_collector  # lazy: pyspark

        self.metrics = CollectorMetrics()
        epoch: list[int] = []

        def ready(info: Ready) -> None:
            epoch.append(info.epoch)
            self._print_collector(info)
            if self.standby is not None and self._standby_soon is None:
                self._standby_soon = asyncio.create_task(self._start_standby(stop))

        while True:
            # its own stop event, set by up's: being fenced sets it (ends that collector),
            # and must not stop the whole of up while the standby carries on
            own = asyncio.Event()
            relay = asyncio.create_task(_relay(stop, own))
            try:
                code = await run_collector(self.config, stop=own, on_ready=ready,
                                           metrics=self.metrics, bridge=True)
            finally:
                relay.cancel()
            if code != EXIT_FENCED or stop.is_set() or self.standby is None \
                    or not self.standby.alive():
                break
            # fenced (e.g. the standby took the lease after this process stalled longer than
            # lease_s): wait as the standby now, on the same warm SparkSession
            print(f"\n  collector fenced at epoch {epoch[-1] if epoch else '?'}: another "
                  "collector holds the queue; this one waits as the standby now", flush=True)
        if code == EXIT_FENCED:
            print(f"\nicefloe: error: {fenced_message(epoch[0] if epoch else None)}",
                  file=sys.stderr, flush=True)
        return code

    @staticmethod
    def _exit_code(collect: asyncio.Task[int] | None, ingestor_codes: list[int]) -> int:
        if collect is not None:
            error = collect.exception()
            if error is not None:
                raise error  # run_guarded turns it into one line
            if collect.result():
                return int(collect.result())
        return 0 if all(code == 0 for code in ingestor_codes) else 1

    def _snapshot(self) -> Snapshot:
        assert self.group is not None
        totals = self.group.totals()
        m = self.metrics
        active = m is not None and m.health.role == "active"
        return Snapshot(
            accepted=totals["accepted"], rejected=totals["rejected"],
            committed=metric_total(m.rows) if m is not None else None,
            queue_entries=metric_total(m.queue_length) if active and m else None,
            lag_s=metric_total(m.lag_seconds) if active and m else None)

    def _print_endpoints(self, http_port: int, grpc_port: int, kafka_port: int | None,
                         otlp_ports: tuple[int, int] | None = None) -> None:
        from pipeline.iceberg.catalog import catalog_label  # lazy: pyiceberg

        config = self.config
        host = _host(config.ingestor.host)
        tls = config.ingestor.tls_cert_file is not None
        scheme = "https" if tls else "http"
        shared = f"  ({self.ingestors} ingestors share it)" if self.ingestors > 1 else ""
        print(f"icefloe up  (config {self.path})")
        print(f"  store    {config.store.url}")
        print(f"  catalog  {catalog_label(config.catalog)}")
        print(f"  HTTP     {scheme}://{host}:{http_port}/v1/streams/{{stream}}/events{shared}")
        print(f"  gRPC     {host}:{grpc_port}  (icefloe.v1.Ingest{', TLS' if tls else ''})"
              f"{shared}")
        if kafka_port is not None:
            print(f"  Kafka    {host}:{kafka_port}  (produce only: bootstrap.servers="
                  f"{host}:{kafka_port}{', TLS' if tls else ''}){shared}")
        self._print_otlp(otlp_ports)
        print(f"  metrics  {scheme}://{host}:{http_port}/metrics  (ingestor)")
        print(f"  streams  {', '.join(s.name for s in config.streams) or 'none'}")
        if config.streams:
            stream = config.streams[0]
            body = json.dumps(example_event(stream), separators=(",", ":"))
            auth = " -H 'Authorization: Bearer $TOKEN'" if _needs_token(config, stream) else ""
            ca = " --cacert SERVER-CA.pem" if tls else ""
            print(f"\n  curl{ca} -X POST {scheme}://{host}:{http_port}/v1/streams/{stream.name}"
                  f"/events -H 'Content-Type: application/json'{auth} -d '{body}'")
        if self.collector:
            standby = " then a warm standby collector" if self.standby is not None else ""
            print(f"\n  collector starting Spark (the first start takes ~15 s; events are "
                  f"queued meanwhile){standby}. Ctrl-C stops everything.", flush=True)
        else:
            print("\n  no collector (--no-collector): events wait in the queue for "
                  "`icefloe collector`. Ctrl-C stops and drains.", flush=True)

    def _print_collector(self, ready: Ready) -> None:
        host = _host(self.config.collector.host)
        print(f"\n  collector active (epoch {ready.epoch}); commits every "
              f"~{self.config.collector.commit_interval_s:g} s")
        if ready.metrics_port is not None:
            print(f"  metrics  http://{host}:{ready.metrics_port}/metrics  (collector)")
            print(f"  run now  ICEFLOE_ADMIN_TOKEN=... icefloe run --collector-url "
                  f"http://{host}:{ready.metrics_port}  (commit the queue, run the models)")
        if self.config.streams:
            config = f" --config {self.path}" if self.path is not None else ""
            print(f"  query    icefloe query{config} "
                  f"\"SELECT count(*) FROM {self.config.streams[0].table}\"")
        print(flush=True)


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    """Set ``target`` once ``source`` is set."""
    await source.wait()
    target.set()


async def _first(work: Any, stop: asyncio.Event, *, cancel: bool = True) -> bool:
    """Await ``work`` unless ``stop`` comes first: True if ``work`` finished (its errors
    propagate), False if stopped first (``work`` is cancelled unless ``cancel`` is off —
    the collector is left to finish its run on its own)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if task.done():
        task.result()
        return True
    if cancel:
        task.cancel()
    return False


def _needs_token(config: Config, stream: StreamConfig) -> bool:
    """Whether writes to ``stream`` need a bearer token (per-stream or scoped tokens)."""
    return bool(stream.tokens) or any(
        "*" in t.streams or stream.name in t.streams for t in config.tokens)


def _host(host: str) -> str:
    return "localhost" if host in ("0.0.0.0", "::", "") else host


_SAMPLES: dict[str, Any] = {
    "long": 1200, "int": 3, "float": 1.5, "double": 19.99, "boolean": True,
    "timestamp": "2026-01-01T12:00:00Z", "date": "2026-01-01", "json": {"source": "curl"}}


def example_event(stream: StreamConfig) -> dict[str, Any]:
    """A valid event for the curl example: every required column, then a few more."""
    columns = [c for c in stream.columns if c.mapping in (None, "path")]
    chosen = [c for c in columns if c.required]
    chosen += [c for c in columns if not c.required][:max(0, 4 - len(chosen))]
    event: dict[str, Any] = {}
    for column in chosen:
        place_value(event, column,
                    _SAMPLES.get(column.type, f"{column.name.removesuffix('_id')}-1"))
    return event
