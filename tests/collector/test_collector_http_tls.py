"""The collector's /metrics, /healthz and /readyz under the same TLS, mutual TLS and
plaintext policy as the ingestor and the admin API, with real TLS clients.

No Spark here: the probes server and the policy are exercised directly, and one
``run_collector`` on the in-process LocalEngine shows the runner applies them.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from collector_support import CLICKS, collector_config
from security_support import Authority

from collector.http import HttpServer
from collector.metrics import CollectorMetrics
from icefloe.config import Config, load_config
from icefloe.errors import ConfigError
from icefloe.server_tls import section_tls


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Authority]:
    return {name: Authority.create(tmp_path, name) for name in ("main", "other")}


def with_tls(config: Config, pki: dict[str, Authority], *, mutual: bool = False,
             **collector: Any) -> Config:
    cert, key = pki["main"].write("server", server=True)
    return msgspec.structs.replace(config, collector=msgspec.structs.replace(
        config.collector, tls_cert_file=str(cert), tls_key_file=str(key),
        tls_client_ca_file=str(pki["main"].ca_file) if mutual else None, **collector))


def client_context(pki: dict[str, Authority], signer: str | None = None) -> ssl.SSLContext:
    """Trusts the main CA; presents a client certificate ``signer`` issued, if given."""
    context = ssl.create_default_context(cafile=str(pki["main"].ca_file))
    if signer is not None:
        cert, key = pki[signer].write(f"scraper-{signer}", server=False)
        context.load_cert_chain(str(cert), str(key))
    return context


def serve(config: Config) -> HttpServer:
    tls = section_tls(config, "collector", what="probes", secrets="metrics")
    metrics = CollectorMetrics()
    return HttpServer("127.0.0.1", 0, metrics.registry, metrics.health,
                      tls.http_context if tls is not None else None)


def test_should_serve_the_probes_over_tls_only(tmp_path, pki):
    server = serve(with_tls(collector_config(tmp_path, (CLICKS,)), pki))
    try:
        base = f"https://localhost:{server.port}"
        with httpx.Client(verify=client_context(pki), timeout=5) as client:
            assert client.get(f"{base}/healthz").json()["status"] == "ok"
            assert client.get(f"{base}/health").json() == client.get(f"{base}/healthz").json()
            assert client.get(f"{base}/readyz").status_code == 503  # still starting
            assert b"icefloe_collector" in client.get(f"{base}/metrics").content
        with pytest.raises(httpx.HTTPError):  # plaintext on the TLS port
            httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
        with pytest.raises(httpx.ConnectError):  # a certificate nobody here trusts
            httpx.get(f"{base}/healthz", verify=ssl.create_default_context(
                cafile=str(pki["other"].ca_file)), timeout=5)
        with httpx.Client(verify=client_context(pki), timeout=5) as client:  # still serving
            assert client.get(f"{base}/healthz").status_code == 200
    finally:
        server.shutdown()


def test_should_require_a_client_certificate_the_ca_signed_with_mutual_tls(tmp_path, pki):
    server = serve(with_tls(collector_config(tmp_path, (CLICKS,)), pki, mutual=True))
    try:
        url = f"https://localhost:{server.port}/healthz"
        assert httpx.get(url, verify=client_context(pki, "main"), timeout=5).status_code == 200
        for stranger in (client_context(pki), client_context(pki, "other")):
            with pytest.raises(httpx.HTTPError):  # no certificate / one another CA signed
                httpx.get(url, verify=stranger, timeout=5)
    finally:
        server.shutdown()


def test_a_silent_peer_does_not_hold_up_other_scrapes(tmp_path, pki):
    server = serve(with_tls(collector_config(tmp_path, (CLICKS,)), pki))
    silent = socket.create_connection(("127.0.0.1", server.port))  # never says hello
    try:
        started = time.monotonic()
        response = httpx.get(f"https://localhost:{server.port}/healthz",
                             verify=client_context(pki), timeout=5)
        assert response.status_code == 200
        assert time.monotonic() - started < 2
    finally:
        silent.close()
        server.shutdown()


def test_should_refuse_plaintext_off_loopback_unless_said(tmp_path):
    base = collector_config(tmp_path, (CLICKS,))
    exposed = msgspec.structs.replace(base, collector=msgspec.structs.replace(
        base.collector, host="0.0.0.0"))
    with pytest.raises(ConfigError, match=r"collector\.plaintext: refusing to serve 0\.0\.0\.0"):
        section_tls(exposed, "collector", what="probes", secrets="metrics")
    allowed = msgspec.structs.replace(exposed, collector=msgspec.structs.replace(
        exposed.collector, plaintext=True))
    assert section_tls(allowed, "collector", what="probes", secrets="metrics") is None
    assert section_tls(base, "collector", what="probes", secrets="metrics") is None  # loopback


def test_run_collector_refuses_an_exposed_plaintext_port_before_opening_anything(tmp_path):
    from collector.runner import run_collector
    from pipeline.load.run import LocalEngine

    base = collector_config(tmp_path, (CLICKS,))
    exposed = msgspec.structs.replace(base, collector=msgspec.structs.replace(
        base.collector, host="0.0.0.0"))
    with pytest.raises(ConfigError, match=r"collector\.plaintext"):
        asyncio.run(run_collector(exposed, engine=LocalEngine()))
    assert not (tmp_path / "store").exists()


def test_run_collector_serves_its_probes_over_tls(tmp_path, pki):
    from collector.runner import Ready, run_collector
    from pipeline.load.run import LocalEngine

    config = with_tls(collector_config(tmp_path, (CLICKS,)), pki, mutual=True)

    async def main() -> None:
        stop = asyncio.Event()
        ready: asyncio.Future[Ready] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(run_collector(config, stop=stop, engine=LocalEngine(),
                                                 on_ready=ready.set_result))
        info = await asyncio.wait_for(ready, 60)
        async with httpx.AsyncClient(verify=client_context(pki, "main"), timeout=5) as client:
            answer = await client.get(f"https://localhost:{info.metrics_port}/readyz")
            assert answer.status_code == 200
            assert answer.json()["role"] == "active"
        async with httpx.AsyncClient(timeout=5) as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get(f"http://127.0.0.1:{info.metrics_port}/healthz")
        stop.set()
        assert await asyncio.wait_for(task, 60) == 0

    asyncio.run(main())


@pytest.mark.parametrize(("lines", "message"), [
    ('tls_cert_file = "a.pem"', "collector.tls_cert_file and collector.tls_key_file"),
    ('tls_client_ca_file = "ca.pem"', "collector.tls_client_ca_file needs "
                                      "collector.tls_cert_file"),
    ('plaintext = true\ntls_cert_file = "a.pem"\ntls_key_file = "a.key"',
     "collector.plaintext: true contradicts collector.tls_cert_file"),
])
def test_config_should_refuse_collector_tls_settings_that_contradict(tmp_path, lines, message):
    (tmp_path / "icefloe.toml").write_text(f"[collector]\n{lines}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path / "icefloe.toml", env={})


def test_config_should_resolve_collector_tls_files_against_the_config_folder(tmp_path):
    (tmp_path / "icefloe.toml").write_text(
        '[collector]\ntls_cert_file = "tls/c.pem"\ntls_key_file = "tls/c.key"\n')
    col = load_config(tmp_path / "icefloe.toml", env={}).collector
    assert (col.tls_cert_file, col.tls_key_file) == (
        str(tmp_path / "tls" / "c.pem"), str(tmp_path / "tls" / "c.key"))


@pytest.mark.parametrize("mutual", [False, True])
def test_container_health_check_should_speak_tls_to_a_tls_port(tmp_path, pki, mutual):
    """The image's health check answers for a collector whose probes serve (mutual) TLS:
    it falls back to HTTPS and presents the configured client certificate."""
    import os
    import subprocess
    import sys

    healthcheck = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "healthcheck.py"
    server = serve(with_tls(collector_config(tmp_path, (CLICKS,)), pki, mutual=mutual))
    try:
        env = {**os.environ, "ICEFLOE_COLLECTOR_METRICS_PORT": str(server.port)}

        def check(path: str, **extra: str) -> int:
            return subprocess.run([sys.executable, str(healthcheck), "collector", path],
                                  env={**env, **extra}, timeout=30, capture_output=True,
                                  check=False).returncode

        cert, key = pki["main"].write("probe", server=False)
        client = {"ICEFLOE_HEALTHCHECK_CERT_FILE": str(cert),
                  "ICEFLOE_HEALTHCHECK_KEY_FILE": str(key)}
        assert check("/healthz", **client) == 0
        assert check("/no-such-path", **client) != 0
        if mutual:
            assert check("/healthz") != 0  # no client certificate: refused
    finally:
        server.shutdown()
