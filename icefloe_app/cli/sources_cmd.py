"""``icefloe sources|sinks list|create|update|delete|disable|enable``: the admin API's client.

Why through the API and not straight into the store: the API is where changes are checked
against the newest registry and where tables are created before a sink appears; a second
writer path would have to repeat all of that. The admin token comes from
``$ICEFLOE_ADMIN_TOKEN`` (never a flag: flags end up in shell history and ``ps``).
Task answers (202) are followed until they finish, with progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from icefloe.errors import ConfigError, IcefloeError
from icefloe_app.cli.common import print_json, table
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

TOKEN_ENV = "ICEFLOE_ADMIN_TOKEN"
CACERT_ENV = "ICEFLOE_ADMIN_CACERT"
TASK_TIMEOUT_S = 300.0

SOURCES_EPILOG = """\
examples:
  export ICEFLOE_ADMIN_TOKEN=ifl_...          # a token whose hash is in [admin] tokens
  icefloe sources list
  icefloe sources create clicks --description "web clicks"
  icefloe sources create clicks --file clicks.json   # {"id": ..., "sinks": [...]}
  icefloe sources rotate-token clicks         # prints the new write token once
  icefloe sources delete clicks [--force]
"""

SINKS_EPILOG = """\
A sink file (JSON or TOML) has the keys of a stream plus conditions:
  name = "clicks_raw"
  table = "web.clicks_raw"
  columns = [{ name = "user_id", type = "string", required = true }]
  conditions = { max_age_s = 60, max_bytes = 100_000_000, max_events = 1_000_000 }

examples:
  icefloe sinks list clicks
  icefloe sinks create clicks --file sink.toml
  icefloe sinks update clicks clicks_raw --max-age-s 300
  icefloe sinks disable clicks clicks_raw
  icefloe sinks retry-parked                  # after fixing a parked table outside icefloe
"""


class Refused(IcefloeError):
    """The API refused the call: its status, code and message."""


def register(commands: Any) -> None:
    sources = commands.add_parser("sources", help="list and change sources (admin API)",
                                  description="Sources are ingest endpoints "
                                  "(/v1/streams/ID/events) with their write tokens.",
                                  epilog=SOURCES_EPILOG,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    what = sources.add_subparsers(dest="what", metavar="WHAT", required=True)
    _cmd(what, "list", "every source with its sinks", run_sources_list)
    show = _cmd(what, "show", "one source", run_source_show)
    show.add_argument("id")
    create = _cmd(what, "create", "a new source (with sinks from --file)", run_source_create)
    create.add_argument("id")
    create.add_argument("--description", default="")
    create.add_argument("--file", metavar="FILE", help="JSON/TOML source spec (with sinks)")
    update = _cmd(what, "update", "change a source's description", run_source_update)
    update.add_argument("id")
    update.add_argument("--description", required=True)
    delete = _cmd(what, "delete", "retire a source", run_source_delete)
    delete.add_argument("id")
    delete.add_argument("--force", action="store_true",
                        help="even with undelivered events (they are still delivered)")
    rotate = _cmd(what, "rotate-token", "make a new write token (printed once)",
                  run_source_rotate)
    rotate.add_argument("id")
    rotate.add_argument("--keep-previous", action="store_true",
                        help="keep the current tokens valid too")

    sinks = commands.add_parser("sinks", help="list and change the sinks of a source",
                                description="Sinks are the Iceberg tables a source's events "
                                "go to, each with its columns and import conditions.",
                                epilog=SINKS_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = sinks.add_subparsers(dest="what", metavar="WHAT", required=True)
    listing = _cmd(what, "list", "the sinks of a source", run_sinks_list)
    listing.add_argument("source")
    create = _cmd(what, "create", "a new sink (creates its table)", run_sink_create)
    create.add_argument("source")
    create.add_argument("--file", metavar="FILE", required=True, help="JSON/TOML sink spec")
    update = _cmd(what, "update", "change columns or import conditions", run_sink_update)
    update.add_argument("source")
    update.add_argument("sink")
    update.add_argument("--file", metavar="FILE", help="JSON/TOML patch (columns, ...)")
    update.add_argument("--max-age-s", type=float, metavar="S")
    update.add_argument("--max-bytes", type=int, metavar="N")
    update.add_argument("--max-events", type=int, metavar="N")
    for verb in ("delete", "disable", "enable"):
        one = _cmd(what, verb, f"{verb} a sink", run_sink_verb)
        one.add_argument("source")
        one.add_argument("sink")
    _cmd(what, "retry-parked", "make collectors retry their parked tables now (after a "
         "fix made outside icefloe)", run_retry_parked)


def _cmd(what: Any, name: str, help_text: str, run: Any) -> argparse.ArgumentParser:
    parser = what.add_parser(name, help=help_text, description=help_text)
    add_config_arguments(parser)
    parser.add_argument("--url", metavar="URL",
                        help="admin API (default http(s)://[admin] host:port)")
    parser.add_argument("--cacert", metavar="FILE",
                        help=f"CA bundle to verify the admin API's TLS certificate (default "
                             f"${CACERT_ENV}, else the system's)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    parser.set_defaults(run=run)
    return parser


# ------------------------------------------------------------------------- plumbing


def _client(args: argparse.Namespace) -> httpx.Client:
    if args.url:
        _check_url(args.url)
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise ConfigError(f"set {TOKEN_ENV} to an admin token (one whose hash is in [admin] "
                          "tokens; `icefloe token new` makes one)")
    url = args.url
    if not url:
        _, config = config_from_args(args)
        host = "127.0.0.1" if config.admin.host in ("0.0.0.0", "::") else config.admin.host
        scheme = "https" if config.admin.tls_cert_file else "http"
        url = f"{scheme}://{host}:{config.admin.port}"
    cacert = args.cacert or os.environ.get(CACERT_ENV)
    verify: Any = True
    if cacert:
        import ssl  # startup time

        try:
            verify = ssl.create_default_context(cafile=cacert)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--cacert {cacert}: cannot load it: {exc}") from None
    return httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"},
                        timeout=30.0, verify=verify)


def _check_url(url: str) -> None:
    """``--url``: an http(s) URL with a host (a bad one is a usage error, not an
    unreachable API)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a port that is not a number
    except ValueError as exc:
        raise ConfigError(f"--url {url!r}: not a valid URL ({exc}); give the admin API "
                          "as http(s)://HOST:PORT, e.g. http://127.0.0.1:8081") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--url {url!r}: not an http(s) URL; give the admin API as "
                          "http(s)://HOST:PORT, e.g. http://127.0.0.1:8081")


def call(args: argparse.Namespace, method: str, path: str, body: Any = None,
         params: dict[str, str] | None = None) -> dict[str, Any]:
    """One API call; a 202 task is followed to its end. Refusals raise :class:`Refused`."""
    with _client(args) as client:
        try:
            response = client.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise IcefloeError(f"admin API at {client.base_url} is unreachable: {exc}; is "
                               "`icefloe admin` running?") from None
        data = _decode(response)
        if response.status_code == 202:
            data = _follow(client, data["task"])
        return data


def _decode(response: httpx.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        data = {"error": "http", "message": response.text[:200]}
    if response.status_code >= 400:
        details = "; ".join(f"{d.get('field')}: {d.get('reason')}"
                            for d in data.get("details", []) if d.get("field"))
        message = data.get("message", "")
        if details and details not in message:
            message += f" ({details})"
        raise Refused(f"{response.status_code} {data.get('error')}: {message}")
    return data


def _follow(client: httpx.Client, task: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + TASK_TIMEOUT_S
    shown = ""
    while task["state"] not in ("succeeded", "failed"):
        if task["progress"] != shown:
            shown = task["progress"]
            print(f"task {task['id']}: {shown}", file=sys.stderr, flush=True)
        if time.monotonic() > deadline:
            raise IcefloeError(f"task {task['id']} still {task['state']} after "
                               f"{TASK_TIMEOUT_S:.0f} s; check GET /v1/tasks/{task['id']}")
        time.sleep(0.2)
        task = _decode(client.get(f"/v1/tasks/{task['id']}"))["task"]
    if task["state"] == "failed":
        error = task["error"] or {}
        raise Refused(f"task {task['id']} failed: {error.get('error')}: "
                      f"{error.get('message')}")
    return dict(task["result"] or {})


def _load_file(path: str) -> Any:
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return tomllib.loads(text) if file.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {'TOML' if file.suffix == '.toml' else 'JSON'}:"
                          f" {exc}") from None


def _print(args: argparse.Namespace, data: dict[str, Any], text: str) -> int:
    if args.json:
        print_json(data)
    else:
        print(text)
    return 0


def _sink_rows(sinks: list[dict[str, Any]]) -> list[list[str]]:
    return [[s["source"], s["name"], s["table"], str(len(s["columns"])),
             "yes" if s["enabled"] else "no",
             f"{s['conditions']['max_age_s']:g} s / {s['conditions']['max_bytes']:,} B / "
             f"{s['conditions']['max_events']:,} ev", str(s["created_version"])]
            for s in sinks]


SINK_HEADERS = ["SOURCE", "SINK", "TABLE", "COLUMNS", "ENABLED", "COMMIT WHEN", "SINCE"]


# ------------------------------------------------------------------------- sources


def run_sources_list(args: argparse.Namespace) -> int:
    data = call(args, "GET", "/v1/sources")
    rows = [[s["id"], str(len(s["sinks"])), str(s["tokens"]),
             ", ".join(k["table"] for k in s["sinks"]) or "-", s["description"] or "-"]
            for s in data["sources"]]
    return _print(args, data, f"registry version {data['version']}\n" + table(
        ["SOURCE", "SINKS", "TOKENS", "TABLES", "DESCRIPTION"], rows))


def run_source_show(args: argparse.Namespace) -> int:
    data = call(args, "GET", f"/v1/sources/{args.id}")
    source = data["source"]
    text = (f"source {source['id']} (version {data['version']}, tokens {source['tokens']})\n"
            + table(SINK_HEADERS, _sink_rows(source["sinks"])))
    return _print(args, data, text)


def run_source_create(args: argparse.Namespace) -> int:
    body = _load_file(args.file) if args.file else {}
    body.setdefault("id", args.id)
    if args.description:
        body["description"] = args.description
    data = call(args, "POST", "/v1/sources", body)
    return _print(args, data, f"created source {args.id} (registry version {data['version']})")


def run_source_update(args: argparse.Namespace) -> int:
    data = call(args, "PATCH", f"/v1/sources/{args.id}", {"description": args.description})
    return _print(args, data, f"updated source {args.id} (registry version {data['version']})")


def run_source_delete(args: argparse.Namespace) -> int:
    data = call(args, "DELETE", f"/v1/sources/{args.id}",
                params={"force": "true"} if args.force else None)
    return _print(args, data, f"deleted source {args.id} (registry version {data['version']})")


def run_source_rotate(args: argparse.Namespace) -> int:
    data = call(args, "POST", f"/v1/sources/{args.id}/tokens",
                params={"keep_previous": "true"} if args.keep_previous else None)
    return _print(args, data, f"{data['token']}\n(new write token of {args.id}, shown once; "
                  f"{data['tokens']} valid token(s))")


# --------------------------------------------------------------------------- sinks


def run_sinks_list(args: argparse.Namespace) -> int:
    data = call(args, "GET", f"/v1/sources/{args.source}/sinks")
    return _print(args, data, table(SINK_HEADERS, _sink_rows(data["sinks"])))


def run_sink_create(args: argparse.Namespace) -> int:
    data = call(args, "POST", f"/v1/sources/{args.source}/sinks", _load_file(args.file))
    sink = data["sink"]
    return _print(args, data, f"created sink {args.source}/{sink['name']} → {sink['table']} "
                  f"(registry version {data['version']})")


def run_sink_update(args: argparse.Namespace) -> int:
    body: dict[str, Any] = _load_file(args.file) if args.file else {}
    limits = {k: v for k, v in (("max_age_s", args.max_age_s), ("max_bytes", args.max_bytes),
                                ("max_events", args.max_events)) if v is not None}
    if limits:  # only what changes: the API keeps the other conditions (at write time)
        body["conditions"] = {**body.get("conditions", {}), **limits}
    if not body:
        raise ConfigError("nothing to change: give --file or --max-age-s/--max-bytes/"
                          "--max-events")
    data = call(args, "PATCH", f"/v1/sources/{args.source}/sinks/{args.sink}", body)
    return _print(args, data, f"updated sink {args.source}/{args.sink} (registry version "
                  f"{data['version']})")


def run_retry_parked(args: argparse.Namespace) -> int:
    data = call(args, "POST", "/v1/parked:retry")
    return _print(args, data, f"collectors retry their parked tables at registry version "
                  f"{data['version']}")


def run_sink_verb(args: argparse.Namespace) -> int:
    path = f"/v1/sources/{args.source}/sinks/{args.sink}"
    if args.what == "delete":
        data = call(args, "DELETE", path)
    else:
        data = call(args, "POST", f"{path}:{args.what}")
    return _print(args, data, f"{args.what}d sink {args.source}/{args.sink} (registry "
                  f"version {data['version']})")
