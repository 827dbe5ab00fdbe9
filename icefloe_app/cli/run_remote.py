"""``icefloe run`` while a collector holds the lease: ask that collector to do it.

Why over the collector's HTTP port and not a Spark of our own: the lease holder already has
a warm SparkSession and the only right to commit; starting a second Spark would cost a JVM
start (seconds to minutes) and could only commit by fencing the collector. So the command
sends ``POST /v1/run`` (:mod:`collector.run_now`) with an admin token and prints what the
collector ran. This module never imports pyspark, nor anything that does.

Where the collector answers: ``--collector-url``, else ``$ICEFLOE_COLLECTOR_URL``, else the
address the lease holder published when it took the lease (:mod:`icefloe.collector_address`:
its configured host and the port it bound, so ``icefloe up``'s warm standby is found on its
own port once it took over), else ``[collector] host`` and ``metrics_port`` of the config in
use (a wildcard host is asked on 127.0.0.1; ``https`` when ``[collector] tls_cert_file`` is
set). The collector's answer names the holder that ran the request.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace
from typing import Any

import httpx

from icefloe.collector_address import local_url
from icefloe.config import Config
from icefloe_app.cli.common import print_json
from icefloe_app.cli.models_cmd import report_outcomes
from icefloe_app.cli.sources_cmd import CACERT_ENV, TOKEN_ENV

URL_ENV = "ICEFLOE_COLLECTOR_URL"
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_REFUSED = 4
EXIT_RETRY = 75
"""``EX_TEMPFAIL``: the collector was fenced, is stepping down or did not finish in time;
the same command may succeed when run again."""
GRACE_S = 10.0
"""Extra client wait beyond the request's ``timeout_s``, so the collector's 504 (naming
what still runs) arrives before the client gives up."""


def collector_url(config: Config, given: str | None = None,
                  published: str | None = None) -> str:
    """Where the lease holder's HTTP port is (see the module docstring)."""
    url = given or os.environ.get(URL_ENV, "").strip() or published
    if url:
        return url.rstrip("/")
    cfg = config.collector
    return local_url("https" if cfg.tls_cert_file else "http", cfg.host, cfg.metrics_port)


def _fail(code: int, message: str) -> int:
    print(f"icefloe: error: {message}", file=sys.stderr, flush=True)
    return code


def ask_collector(config: Config, args: argparse.Namespace, holder: str,
                  remaining_s: float, published: str | None = None) -> int:
    """``POST /v1/run`` to the lease holder (at ``published``, the address it published,
    unless one is given); print what ran; the exit code."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        return _fail(EXIT_USAGE, f"collector {holder} holds the queue's lease, so `icefloe "
                     f"run` asks it over its HTTP port: set {TOKEN_ENV} to an admin token "
                     "(one whose hash is in [admin] tokens; `icefloe token new` makes one)")
    url = collector_url(config, args.collector_url, published)
    cacert = args.cacert or os.environ.get(CACERT_ENV) or True
    print(f"icefloe run: asking collector {holder} at {url} to commit the queue and run "
          "the models ...", file=sys.stderr, flush=True)
    try:
        response = httpx.post(f"{url}/v1/run", json={"full_refresh": args.full_refresh,
                                                    "timeout_s": args.timeout},
                              headers={"Authorization": f"Bearer {token}"},
                              timeout=args.timeout + GRACE_S, verify=cacert)
    except httpx.TimeoutException:
        return _fail(EXIT_RETRY, f"collector {holder} at {url} did not answer within "
                     f"{args.timeout + GRACE_S:g} s; run again (it goes on with the run)")
    except httpx.TransportError as exc:
        return _fail(EXIT_UNREACHABLE, f"collector {holder} holds the queue's lease "
                     f"({remaining_s:.1f} s more) but does not answer at {url} ({exc}): "
                     f"point --collector-url or {URL_ENV} at its HTTP port ([collector] "
                     "metrics_port), or wait for the lease to lapse, or use --takeover to "
                     "fence it")
    return _answer(response, url, as_json=args.json)


def _answer(response: httpx.Response, url: str, *, as_json: bool) -> int:
    """The exit code (and output) for the collector's answer."""
    try:
        body: dict[str, Any] = response.json()
    except ValueError:
        body = {}
    status = response.status_code
    if status == 200:
        return _report(body, url, as_json=as_json)
    what = f"the collector at {url} answered {status} {body.get('error', '')}".rstrip()
    message = body.get("message") or response.text[:200]
    if status in (401, 403, 429):
        return _fail(EXIT_REFUSED, f"{what}: {message}")
    if status == 422:  # bad model files in the collector's models_dir
        return _fail(EXIT_USAGE, f"{what}: {message}")
    if body.get("retriable") or status in (502, 503, 504):
        running = f" (still running: {body['running']})" if body.get("running") else ""
        return _fail(EXIT_RETRY, f"{what}: {message}{running}")
    if status == 404:
        return _fail(1, f"{what}: no POST /v1/run there (not an icefloe collector, or one "
                     f"older than this command): check --collector-url / {URL_ENV}")
    return _fail(1, f"{what}: {message}")


def _report(body: dict[str, Any], url: str, *, as_json: bool) -> int:
    """Print the runs (rows per table, sequences, catalog versions) and the models."""
    runs: list[dict[str, Any]] = body.get("runs", [])
    models = [SimpleNamespace(**m) for m in body.get("models", [])]
    parked: dict[str, str] = body.get("parked") or {}
    if as_json:
        print_json(body)
        return 1 if body.get("failed") or parked else 0
    rows: dict[str, int] = {}
    for run in runs:
        for table, count in run.get("rows", {}).items():
            rows[table] = rows.get(table, 0) + count
    entries = sum(r.get("entries", 0) for r in runs)
    print(f"collector {body.get('holder')} (epoch {body.get('epoch')}) at {url}: "
          f"{len(runs)} run(s), {entries} queued batch(es) committed in "
          f"{body.get('seconds', 0):.2f} s")
    for table, count in sorted(rows.items()):
        print(f"  {table}: {count} rows")
    for run in runs:
        through = ", ".join(f"shard {s} through {q}" for s, q in run.get("through", {}).items())
        print(f"  run: catalog version {run.get('catalog_version')}, {through}")
    for table, reason in sorted(parked.items()):
        print(f"icefloe: warning: table {table} is parked ({reason}): its rows are staged, "
              "not in the table, until it commits again (see docs/operations.md, parked "
              "tables)", file=sys.stderr, flush=True)
    if not models:
        print("no models ([collector] models_dir has none)")
        return 1 if parked else 0
    code = report_outcomes(models, as_json=False)
    return code or (1 if parked else 0)
