"""deploy/compose against the Compose specification and against the code it runs.

No Docker here, so the file is checked the way Docker would read it: the Compose
specification (the ``compose-spec`` package's validating parser, after YAML merge keys are
resolved as Compose resolves them), and every icefloe service's command, config file,
environment, ports and health check against icefloe itself — the health checks by running
``icefloe-healthcheck`` against real processes started with the service's settings.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from process_support import Child, child_env
from test_deploy import (
    COMPOSE_DIR,
    COMPOSE_FILE,
    COMPOSE_OTLP,
    KAFKA_PORT,
    OTLP_GRPC_PORT,
    OTLP_HTTP_PORT,
    compose,
    compose_env,
    icefloe_services,
    parse_cli,
    real_settings,
    write_toml,
)

from icefloe.config import load_config
from icefloe.tokens import hash_token

ROOT = Path(__file__).resolve().parents[2]
HEALTHCHECK = ROOT / "deploy" / "docker" / "healthcheck.py"
OTHER_ENV = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "HOME"}
"""Variables besides ICEFLOE_* the icefloe services set: the AWS SDK chain (boto3,
aiobotocore, pyarrow read them) and HOME (Spark's scratch space)."""
LOCAL_ONLY = {"minio", "collector", "admin"}
"""Services whose published ports must bind to this machine only."""


def test_should_follow_the_compose_specification():
    from compose_spec import PyCompose

    document = yaml.safe_load(COMPOSE_FILE.read_text())  # resolves merge keys (<<) as Compose
    parsed = PyCompose.from_json(json.dumps(document))
    assert set(parsed.service_names()) == set(document["services"])


def test_should_refuse_what_the_specification_refuses():
    """The validator is not a no-op: a wrong condition and an unknown key are refused."""
    from compose_spec import PyCompose

    for bad in ({"services": {"a": {"image": "x", "depends_on": {
                    "b": {"condition": "service_ready"}}}}},
                {"services": {"a": {"image": "x", "bogus": 1}}}):
        with pytest.raises(ValueError, match=r"service_ready|bogus"):
            PyCompose.from_json(json.dumps(bad))


def test_should_pull_minio_from_quay_pinned_to_a_release():
    services = compose()["services"]
    for name, repository in (("minio", "quay.io/minio/minio"), ("minio-init", "quay.io/minio/mc")):
        image = services[name]["image"]
        assert re.fullmatch(re.escape(repository) + r":RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ",
                            image), f"{name}: {image}"


def test_should_publish_minio_collector_and_admin_on_this_machine_only():
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            if name in LOCAL_ONLY:
                assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port}"


def test_should_start_the_admin_after_postgres_and_keep_the_catalog_from_ingestors():
    services = compose()["services"]
    assert services["admin"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["collector"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name, service in icefloe_services().items():
        env = compose_env(service)
        if name.startswith("ingestor"):
            assert not any("CATALOG" in key for key in env), f"{name} gets catalog settings"
            assert not any("POSTGRES" in str(v) or "postgresql" in str(v)
                           for v in env.values()), name
        else:
            assert env["ICEFLOE_CATALOG_URI"].startswith("postgresql://"), name


def test_should_build_each_service_from_a_dockerfile_target_that_exists():
    """Ingestors run the slim target (no JRE, Spark or pyarrow), the rest the collector
    target; each named target is a stage of the Dockerfile."""
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", (ROOT / "deploy" / "docker" / "Dockerfile")
                            .read_text(), re.MULTILINE))
    for name, service in icefloe_services().items():
        target = service["build"]["target"]
        assert target in stages, f"{name}: no stage {target!r} in {sorted(stages)}"
        assert target == ("ingestor" if name.startswith("ingestor") else "collector"), name


def test_should_run_real_commands_with_real_settings_and_ports(tmp_path):
    settings = real_settings()
    text = (COMPOSE_DIR / "icefloe.toml").read_text()
    for name, service in icefloe_services().items():
        argv = service["command"]
        parse_cli(argv, f"compose service {name}")
        env = compose_env(service)
        unknown = {k for k in env if k not in settings and k not in OTHER_ENV}
        assert unknown == set(), f"{name}: variables no code reads: {unknown}"
        env["ICEFLOE_CONFIG"] = str(write_toml(tmp_path, text))
        config = load_config(None, env=env)
        role = argv[0]
        kafka = [p for p in (config.ingestor.kafka_port,) if p is not None]  # None: off
        by_role: dict[str, set[int]] = {
            "ingestor": {config.ingestor.http_port, config.ingestor.grpc_port, *kafka},
            "collector": {config.collector.metrics_port},
            "admin": {config.admin.port}}
        served = by_role[role]
        for port in service.get("ports", []):
            assert int(str(port).rsplit(":", 1)[1]) in served, f"{name} publishes {port}"
        test = service["healthcheck"]["test"]
        assert test[:3] == ["CMD", "icefloe-healthcheck", role], f"{name}: {test}"


def _local_config(tmp_path: Path) -> Path:
    """The compose toml with its stores made local (no MinIO or PostgreSQL here)."""
    text = (COMPOSE_DIR / "icefloe.toml").read_text()
    text = re.sub(r"(?ms)^\[store\].*?(?=^\[)", "", text)
    text = re.sub(r"(?ms)^\[catalog\].*?(?=^\[)", "", text)
    return write_toml(tmp_path, text)


def _healthcheck(role: str, path: str, port: int) -> int:
    variable = {"ingestor": "ICEFLOE_INGESTOR_HTTP_PORT", "admin": "ICEFLOE_ADMIN_PORT"}[role]
    return subprocess.run([sys.executable, str(HEALTHCHECK), role, path],
                          env={**os.environ, variable: str(port)}, timeout=30,
                          check=False).returncode


@pytest.mark.parametrize("service", ["ingestor-1", "admin"])
def test_should_answer_the_service_health_check_on_a_real_process(tmp_path, service):
    """Each health check the compose file runs, run against the process it would probe."""
    svc: dict[str, Any] = compose()["services"][service]
    role = svc["command"][0]
    path = svc["healthcheck"]["test"][3]
    config = _local_config(tmp_path)
    if role == "admin":  # what --profile admin asks for: a token hash
        config.write_text(config.read_text() + "\n[admin]\ntokens = [\""
                          + hash_token("ifl_compose-check", log2_n=10) + "\"]\n")
    args = [role, "--config", str(config), "--log-format", "text", "--host", "127.0.0.1"]
    args += (["--http-port", "0", "--grpc-port", "0", "--kafka-port", "0"] if role == "ingestor"
             else ["--port", "0"])
    env = {**child_env(), "ICEFLOE_DATA_DIR": str(tmp_path / "data"),
           "PYTHONPATH": str(ROOT)}
    child = Child(args, tmp_path, tmp_path / f"{service}.log", env)
    try:
        ready = child.ready()
        port = ready["http_port"] if role == "ingestor" else ready["port"]
        assert _healthcheck(role, path, port) == 0, (service, path, child.tail())
        assert _healthcheck(role, "/no-such-endpoint", port) != 0
    finally:
        child.close()


# --- Kafka through the gateway: what a producer sees first ----------------------------------

def _kafka_call(port: int, api_key: int, body: bytes, correlation: int) -> bytes:
    """One request (header v1, version 0) on a fresh connection; the response body after
    the correlation id. Raw bytes on purpose: this is what any Kafka client sends first,
    with no client library deciding anything."""
    client = b"compose-check"
    request = struct.pack(">hhih", api_key, 0, correlation, len(client)) + client + body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read_exactly(sock, 4))[0]
        answer = _read_exactly(sock, size)
    assert struct.unpack(">i", answer[:4])[0] == correlation
    return answer[4:]


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, f"connection closed after {len(data)} of {size} bytes"
        data += chunk
    return data


def _api_versions(port: int) -> tuple[int, dict[int, tuple[int, int]]]:
    """ApiVersions v0: error code and {api key: (min, max)}."""
    body = _kafka_call(port, 18, b"", correlation=7)
    error, count = struct.unpack(">hi", body[:6])
    keys = [struct.unpack(">hhh", body[6 + 6 * i:12 + 6 * i]) for i in range(count)]
    return error, {key: (low, high) for key, low, high in keys}


def _metadata_brokers(port: int) -> list[tuple[int, str, int]]:
    """Metadata v0 for no topic in particular: the brokers it advertises (node, host, port)."""
    body = _kafka_call(port, 3, struct.pack(">i", 0), correlation=8)
    (count,), at, brokers = struct.unpack(">i", body[:4]), 4, []
    for _ in range(count):
        node, length = struct.unpack(">ih", body[at:at + 6])
        host = body[at + 6:at + 6 + length].decode()
        (broker_port,) = struct.unpack(">i", body[at + 6 + length:at + 10 + length])
        brokers.append((node, host, broker_port))
        at += 10 + length
    return brokers


def test_should_serve_kafka_and_advertise_the_gateway_with_the_service_settings(tmp_path):
    """ingestor-1 as compose configures it (its toml, its environment; stores made local)
    listens for Kafka, answers ApiVersions, and its Metadata sends producers to the
    gateway's published port, not to the ingestor itself: behind nginx, a client that
    connected to an ingestor's own address would bypass the gateway (and fail: the
    ingestors publish no ports)."""
    service: dict[str, Any] = compose()["services"]["ingestor-1"]
    config = _local_config(tmp_path)
    env = {**child_env(), **compose_env(service), "ICEFLOE_CONFIG": str(config),
           "ICEFLOE_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    # the service's own command, its ports free ones (9092 may be taken on this machine)
    args = [*service["command"], "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
            "--kafka-port", "0"]
    child = Child(args, tmp_path, tmp_path / "ingestor-1.log", env)
    try:
        ready = child.ready()
        assert ready["kafka_port"], ready
        error, apis = _api_versions(ready["kafka_port"])
        assert error == 0, error
        assert apis[18][0] == 0, apis  # ApiVersions v0 is served
        assert apis[0][1] >= 3, apis  # Produce: record batches (v3+)
        gateway = compose()["services"]["gateway"]
        assert f"{KAFKA_PORT}:{KAFKA_PORT}" in gateway["ports"]
        assert _metadata_brokers(ready["kafka_port"]) == [(0, "localhost", KAFKA_PORT)]
    finally:
        child.close()


# --- OTLP with the override: what an exporter meets -------------------------------------------

def test_should_serve_otlp_on_its_own_ports_with_the_override_settings(tmp_path):
    """ingestor-1 as compose configures it plus otlp.yml (its toml, both environments;
    stores made local) serves OTLP on its dedicated ports: an (empty) export gets OTLP/HTTP's
    answer, not the 404 of a port without OTLP's routes; and with the base settings alone
    there is no OTLP port at all."""
    service: dict[str, Any] = compose()["services"]["ingestor-1"]
    (override,) = yaml.safe_load_all(COMPOSE_OTLP.read_text())
    config = _local_config(tmp_path)
    env = {**child_env(), **compose_env(service),
           **compose_env(override["services"]["ingestor-1"]), "ICEFLOE_CONFIG": str(config),
           "ICEFLOE_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    assert (env["ICEFLOE_INGESTOR_OTLP_HTTP_PORT"], env["ICEFLOE_INGESTOR_OTLP_GRPC_PORT"]) == (
        str(OTLP_HTTP_PORT), str(OTLP_GRPC_PORT))
    # the service's own command, its ports free ones (4318/4317 may be taken on this machine)
    args = [*service["command"], "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0",
            "--kafka-port", "0", "--otlp-http-port", "0", "--otlp-grpc-port", "0"]
    child = Child(args, tmp_path, tmp_path / "ingestor-1.log", env)
    try:
        ready = child.ready()
        assert ready["otlp_http_port"], ready
        assert ready["otlp_grpc_port"], ready
        request = urllib.request.Request(
            f"http://127.0.0.1:{ready['otlp_http_port']}/v1/traces", data=b"",
            headers={"Content-Type": "application/x-protobuf"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200, child.tail()
            assert answer.headers["Content-Type"] == "application/x-protobuf"
    finally:
        child.close()
    base_only = load_config(None, env={**compose_env(service), "ICEFLOE_CONFIG": str(config)})
    assert not base_only.otlp.enabled
    assert base_only.ingestor.otlp_http_port is None
