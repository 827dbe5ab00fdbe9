#!/usr/bin/env python3
"""Container health check: exit 0 when an icefloe process in this container answers.

Usage: icefloe-healthcheck [ingestor|collector|admin|any] [PATH]   (defaults: any /healthz)

``ingestor`` asks the HTTP port (ICEFLOE_INGESTOR_HTTP_PORT, default 8080), ``collector``
the metrics port (ICEFLOE_COLLECTOR_METRICS_PORT, default 9464), ``admin`` the admin API
(ICEFLOE_ADMIN_PORT, default 8081, plain HTTP), ``any`` tries them all, so the image's one
HEALTHCHECK fits whichever command the container runs. ``/healthz`` is
liveness (the process answers); ``/readyz`` also checks the object store (ingestor).
Standard library only: it runs in the image without loading icefloe.

A port that serves TLS (``tls_cert_file`` set) is asked over HTTPS when plain HTTP gets
no answer. The server's certificate is not verified: the check talks to 127.0.0.1 inside
its own container and asks only whether the process answers. With mutual TLS
(``tls_client_ca_file``) it presents ICEFLOE_HEALTHCHECK_CERT_FILE and
ICEFLOE_HEALTHCHECK_KEY_FILE (a client certificate that CA signed).
"""

import os
import ssl
import sys
import urllib.error
import urllib.request

PORTS = {
    "ingestor": ("ICEFLOE_INGESTOR_HTTP_PORT", 8080),
    "collector": ("ICEFLOE_COLLECTOR_METRICS_PORT", 9464),
    "admin": ("ICEFLOE_ADMIN_PORT", 8081),
}


def tls_context() -> ssl.SSLContext:
    """Loopback HTTPS without verifying the server; the client certificate if given."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    cert = os.environ.get("ICEFLOE_HEALTHCHECK_CERT_FILE")
    if cert:
        context.load_cert_chain(cert, os.environ.get("ICEFLOE_HEALTHCHECK_KEY_FILE") or None)
    return context


def answers(port: int, path: str) -> bool:
    for scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(
                    f"{scheme}://127.0.0.1:{port}{path}", timeout=3,
                    context=tls_context() if scheme == "https" else None) as response:
                return 200 <= response.status < 300
        except urllib.error.HTTPError:
            return False  # the process answered, and not with success
        except (urllib.error.URLError, OSError, ValueError):
            continue
    return False


def main(argv: list[str]) -> int:
    role = argv[0] if argv else "any"
    path = argv[1] if len(argv) > 1 else "/healthz"
    roles = list(PORTS) if role == "any" else [role]
    if any(r not in PORTS for r in roles):
        print(f"icefloe-healthcheck: unknown role {role!r} (ingestor, collector, admin or any)",
              file=sys.stderr)
        return 2
    for name in roles:
        env, default = PORTS[name]
        if answers(int(os.environ.get(env) or default), path):
            return 0
    print(f"icefloe-healthcheck: no {role} answered {path}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
