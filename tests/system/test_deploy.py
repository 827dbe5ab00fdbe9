"""Static validation of ``deploy/``: compose, Dockerfile, Terraform and Kubernetes files.

Why static: no Docker engine, Terraform binary, MinIO or cluster runs on the development
machines or in CI, yet a deploy file that names a wrong flag, port or setting only fails
when someone runs it for real. So every file is parsed, every cross-reference is resolved
(kustomize resources, compose build context and mounts, Terraform ``var.X``), everything the
files say about icefloe is checked against icefloe itself (CLI sub-commands and flags through
``build_parser``, ``ICEFLOE_*`` settings through ``load_config``, ports against the config
defaults, the image tag against the package version), and checkov runs the security checks
listed in ``deploy/checkov-checks.txt``. Nothing here touches the network.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2
import msgspec
import pytest
import yaml
from tf_eval import Module

from icefloe import __version__, collector_address
from icefloe.catalog_version import VERSION_KEY
from icefloe.config import (
    CONFIG_ENV,
    AdminSection,
    CollectorSection,
    Config,
    IngestorSection,
    load_config,
)
from icefloe.retention import INDEX_PREFIX
from icefloe.schemas.store import schema_key
from icefloe.server_tls import section_tls
from icefloe_app.cli import build_parser
from icefloe_app.cli.config_args import DATA_DIR_ENV
from ingestor.kafka.producer_ids import producer_ids_key
from ingestor.tls import server_tls

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
TERRAFORM = DEPLOY / "terraform"
K8S_BASE = DEPLOY / "kubernetes" / "base"
K8S_STANDBY = DEPLOY / "kubernetes" / "overlays" / "standby"
K8S_EXTRA = (DEPLOY / "kubernetes" / "overlays" / "production",
             DEPLOY / "kubernetes" / "components" / "monitoring",
             DEPLOY / "kubernetes" / "components" / "ingress",
             DEPLOY / "kubernetes" / "components" / "otlp")
"""The opt-in components and the overlay that uses them (tests/system/test_observability.py)."""
K8S_OTLP = K8S_EXTRA[3]
COMPOSE_OTLP = COMPOSE_DIR / "otlp.yml"
CHECKS_FILE = DEPLOY / "checkov-checks.txt"
CHECKOV_FRAMEWORKS = ("terraform", "kubernetes", "dockerfile")

HTTP_PORT = IngestorSection().http_port
GRPC_PORT = IngestorSection().grpc_port
METRICS_PORT = CollectorSection().metrics_port
KAFKA_PORT = 9092
"""The Kafka port every deploy form serves (Kafka's own default, what ``icefloe up`` uses;
``[ingestor] kafka_port`` has no default: the listener is off unless a file sets it)."""
OTLP_HTTP_PORT, OTLP_GRPC_PORT = 4318, 4317
"""OpenTelemetry's own ports, which exporters use unless told otherwise and ``icefloe up``
serves; every deploy form wires them, off unless ``[otlp]`` is turned on (its opt-in)."""
IMAGE_NAME = "icefloe"
IMAGE = f"{IMAGE_NAME}:{__version__}"
INGESTOR_IMAGE = f"{IMAGE_NAME}-ingestor:{__version__}"
"""The slim ingestor target's image (no JRE, Spark or pyarrow)."""

TOOLING_ENV = frozenset({"ICEFLOE_CHECKOV", "ICEFLOE_ADMIN_TOKEN", "ICEFLOE_ADMIN_CACERT"})
"""Variables a deploy README may name that configure no icefloe process: test tooling and
the admin CLI's client credentials."""
HEALTHCHECK_ENV = frozenset({"ICEFLOE_HEALTHCHECK_CERT_FILE", "ICEFLOE_HEALTHCHECK_KEY_FILE"})
"""Variables the image's health check reads (its client certificate under mutual TLS)."""


# --- helpers ------------------------------------------------------------------------------

def deploy_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name.endswith(suffixes)
                  and "__pycache__" not in p.parts and ".terraform" not in p.parts)


def yaml_docs(path: Path) -> list[Any]:
    with path.open() as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def compose() -> dict[str, Any]:
    (doc,) = yaml_docs(COMPOSE_FILE)
    return doc


def icefloe_services() -> dict[str, dict[str, Any]]:
    """Compose services that run an icefloe image (the collector target's, or the slim
    ingestor target's)."""
    return {name: svc for name, svc in compose()["services"].items()
            if re.match(rf"{IMAGE_NAME}(-ingestor)?:", str(svc.get("image", "")))}


def compose_value(text: str) -> str:
    """Resolve compose interpolation the way `docker compose` does with nothing set:
    ``${VAR:-default}`` → default, ``$$`` → ``$``."""
    text = re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", text)
    return text.replace("$$", "$")


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: compose_value(str(value)) for key, value in env.items()}


def k8s_objects(folder: Path = K8S_BASE) -> list[dict[str, Any]]:
    (kustomization,) = yaml_docs(folder / "kustomization.yaml")
    objects = []
    for resource in kustomization["resources"]:
        path = folder / resource
        if path.is_file():
            objects.extend(yaml_docs(path))
    return objects


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in {K8S_BASE}, found {len(found)}"
    return found[0]


def k8s_deployments() -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in k8s_objects() if o["kind"] == "Deployment"}


def k8s_secret_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for obj in k8s_objects():
        if obj["kind"] == "Secret":
            env.update(obj.get("stringData") or {})
    return env


def unquote(value: Any) -> Any:
    """python-hcl2 8 keeps the quotes of string literals and block labels; 7 drops them."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def normalized(value: Any) -> Any:
    if isinstance(value, dict):
        # python-hcl2 8 adds __is_block__, __comments__, __inline_comments__
        return {unquote(k): normalized(v) for k, v in value.items() if not k.startswith("__")}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    return unquote(value)


_HCL: dict[Path, dict[str, Any]] = {}


def hcl(path: Path) -> dict[str, Any]:
    if path not in _HCL:
        with path.open() as handle:
            _HCL[path] = normalized(hcl2.load(handle))
    return _HCL[path]


def tf_files() -> list[Path]:
    return sorted(TERRAFORM.glob("*.tf"))


def tf_blocks(kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(label, body)`` of every one-label block (variable, output) in the module."""
    for path in tf_files():
        for entry in hcl(path).get(kind, []):
            yield from entry.items()


def tf_resources(kind: str = "resource") -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in tf_files():
        for entry in hcl(path).get(kind, []):
            for rtype, named in entry.items():
                for name, body in named.items():
                    found[(rtype, name)] = body
    return found


def tf_locals() -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for path in tf_files():
        for entry in hcl(path).get("locals", []):
            merged.update(entry)
    return merged


def tf_environment() -> list[dict[str, Any]]:
    """The containers' environment entries: ``local.environment_<role>`` lists."""
    found = [item for name, items in tf_locals().items() if name.startswith("environment_")
             for item in items]
    assert found
    assert all(isinstance(item, dict) and set(item) == {"name", "value"} for item in found)
    return found


def tf_environment_values(**overrides: Any) -> dict[str, dict[str, str]]:
    """Each ``local.environment_<role>`` list, evaluated (:mod:`tf_eval`, variable defaults
    unless overridden): ``{role: {name: value}}``, the values a task really gets."""
    module = Module(TERRAFORM, overrides)
    return {name.removeprefix("environment_"): {item["name"]: item["value"]
                                                for item in module.local(name)}
            for name in tf_locals() if name.startswith("environment_")}


def ecs_load_balancers() -> dict[str, dict[str, Any]]:
    """The ingestor ECS service's optional ``load_balancer`` blocks (``dynamic``), by target
    group: the block's content and the ``for_each`` that switches it."""
    found = {}
    for dynamic in tf_resources()[("aws_ecs_service", "ingestor")]["dynamic"]:
        block = dynamic["load_balancer"]
        (content,) = block["content"]
        found[content["target_group_arn"]] = {**content, "for_each": block["for_each"]}
    return found


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """argparse accepts ``--stor`` for ``--store``; a deploy file must spell flags out."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                no_abbreviations(sub)


def parse_cli(argv: list[str], where: str) -> None:
    """Parse ``icefloe ARGV`` with the real parser; argparse exits on an unknown flag."""
    parser = build_parser()
    no_abbreviations(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{where}: `icefloe {' '.join(argv)}` is not a valid command line "
                    f"(argparse exit {exc.code})")
    assert args.command == argv[0], where


def write_toml(tmp_path: Path, text: str, name: str = "icefloe.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- every file parses; every reference resolves --------------------------------------------

def test_should_parse_every_yaml_file():
    files = deploy_files(".yml", ".yaml")
    assert len(files) >= 10, files
    for path in files:
        docs = yaml_docs(path)
        assert docs, f"{path.relative_to(ROOT)} holds no YAML document"
        assert all(isinstance(doc, dict) for doc in docs), path


def test_should_resolve_every_kustomization_reference():
    kustomizations = sorted(DEPLOY.rglob("kustomization.yaml"))
    assert {p.parent for p in kustomizations} == {K8S_BASE, K8S_STANDBY, *K8S_EXTRA}
    for path in kustomizations:
        (doc,) = yaml_docs(path)
        assert doc["kind"] in ("Kustomization", "Component"), path
        for resource in doc.get("resources", []) + doc.get("components", []):
            target = (path.parent / resource).resolve()
            assert target.is_file() or (target / "kustomization.yaml").is_file(), (
                f"{path.relative_to(ROOT)}: resource {resource!r} does not exist")
        for patch in doc.get("patches", []):
            if "path" in patch:
                assert (path.parent / patch["path"]).is_file(), (path, patch)
            else:
                assert yaml.safe_load(patch["patch"]), (path, patch)
        for generator in doc.get("configMapGenerator", []) + doc.get("secretGenerator", []):
            for item in generator.get("files", []) + generator.get("envs", []):
                assert (path.parent / item.split("=", 1)[-1]).is_file(), (path, item)


def test_should_list_every_base_manifest_in_the_kustomization():
    (doc,) = yaml_docs(K8S_BASE / "kustomization.yaml")
    manifests = {p.name for p in K8S_BASE.glob("*.yaml")} - {"kustomization.yaml"}
    assert manifests == set(doc["resources"]), "a manifest in base/ is not applied (or missing)"


def test_should_resolve_the_compose_build_and_mounts():
    services = compose()["services"]
    for name, svc in icefloe_services().items():
        build = svc["build"]
        context = (COMPOSE_DIR / build["context"]).resolve()
        assert context == ROOT, f"{name}: the build context must be the repository root"
        dockerfile = context / build["dockerfile"]
        assert dockerfile.resolve() == DOCKERFILE.resolve(), name
    for name, svc in services.items():
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (COMPOSE_DIR / source).exists(), (
                    f"{name}: mounted file {source} does not exist next to the compose file")
            else:
                assert source in (compose().get("volumes") or {}), (name, source)


def test_should_order_compose_start_up_with_healthchecks():
    services = compose()["services"]
    assert {"minio", "minio-init", "postgres", "collector", "gateway"} <= set(services)
    assert len([s for s in icefloe_services() if s.startswith("ingestor")]) == 2
    for name, svc in services.items():
        depends = svc.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on needs conditions"
        for target, spec in depends.items():
            assert target in services, (name, target)
            condition = spec["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{target} has no healthcheck"
            else:
                assert condition == "service_completed_successfully", (name, condition)
                assert services[target].get("restart") == "no", target
    assert "minio-init" in services["collector"]["depends_on"]
    assert services["collector"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("ingestor-1", "ingestor-2"):
        assert "minio-init" in services[name]["depends_on"]
        assert services["gateway"]["depends_on"][name]["condition"] == "service_healthy"
    for name, svc in icefloe_services().items():
        assert "healthcheck" in svc, name
        test = svc["healthcheck"]["test"]
        assert test[:2] == ["CMD", "icefloe-healthcheck"], (name, test)


NginxBlock = list[tuple[str, list[str], Any]]
"""nginx.conf as ``(directive, arguments, children)``; children is None for a simple
directive, the block's own list for a block."""


def nginx_blocks(text: str) -> NginxBlock:
    """Parse nginx.conf's structure (directives and nested blocks; comments dropped), so a
    directive is checked in the block where nginx reads it, not anywhere in the file."""
    tokens = re.findall(r"[{};]|[^\s{};]+", re.sub(r"#[^\n]*", "", text))
    stack: list[NginxBlock] = [[]]
    words: list[str] = []
    for token in tokens:
        if token == ";":
            stack[-1].append((words[0], words[1:], None))
            words = []
        elif token == "{":
            block: NginxBlock = []
            stack[-1].append((words[0], words[1:], block))
            stack.append(block)
            words = []
        elif token == "}":
            assert not words, f"nginx.conf: {words} before a closing brace"
            stack.pop()
            assert stack, "nginx.conf: a closing brace without its block"
        else:
            words.append(token)
    assert len(stack) == 1, "nginx.conf: a block is not closed"
    assert not words, f"nginx.conf: {words} at the end without a ';'"
    return stack[0]


def nginx_find(blocks: NginxBlock, name: str) -> list[tuple[list[str], Any]]:
    return [(args, children) for directive, args, children in blocks if directive == name]


def nginx_upstreams(block: NginxBlock) -> dict[str, list[str]]:
    """Each ``upstream NAME {}`` of a block → its servers (``host:port``)."""
    return {args[0]: [server[0] for server, _ in nginx_find(body, "server")]
            for args, body in nginx_find(block, "upstream")}


def test_should_route_the_gateway_to_both_ingestors_over_http_grpc_and_kafka():
    gateway = compose()["services"]["gateway"]
    mounts = {v.split(":")[1]: COMPOSE_DIR / v.split(":")[0] for v in gateway["volumes"]}
    conf = nginx_blocks(mounts["/etc/nginx/nginx.conf"].read_text())
    ingestors = sorted(s for s in icefloe_services() if s.startswith("ingestor"))
    (_, http), = nginx_find(conf, "http")
    (_, stream), = nginx_find(conf, "stream")  # top level, beside http {}: TCP proxying
    assert nginx_upstreams(http) == {
        "icefloe_http": [f"{name}:{HTTP_PORT}" for name in ingestors],
        "icefloe_grpc": [f"{name}:{GRPC_PORT}" for name in ingestors],
        "icefloe_otlp_http": [f"{name}:{OTLP_HTTP_PORT}" for name in ingestors],
        "icefloe_otlp_grpc": [f"{name}:{OTLP_GRPC_PORT}" for name in ingestors]}
    assert nginx_upstreams(stream) == {
        "icefloe_kafka": [f"{name}:{KAFKA_PORT}" for name in ingestors]}
    servers = {nginx_find(body, "listen")[0][0][0]: body
               for _, body in nginx_find(http, "server")}
    assert set(servers) == {str(HTTP_PORT), str(GRPC_PORT), str(OTLP_HTTP_PORT),
                            str(OTLP_GRPC_PORT)}
    for port, upstream in ((GRPC_PORT, "icefloe_grpc"), (OTLP_GRPC_PORT, "icefloe_otlp_grpc")):
        assert (["on"], None) in nginx_find(servers[str(port)], "http2")
        locations = {args[-1]: body for args, body in nginx_find(servers[str(port)],
                                                                "location")}
        assert nginx_find(locations["/"], "grpc_pass") == [([f"grpc://{upstream}"], None)]
    for port, upstream in ((HTTP_PORT, "icefloe_http"), (OTLP_HTTP_PORT, "icefloe_otlp_http")):
        locations = {args[-1]: body for args, body in nginx_find(servers[str(port)],
                                                                "location")}
        assert nginx_find(locations["/"], "proxy_pass") == [([f"http://{upstream}"], None)]
    (_, kafka), = nginx_find(stream, "server")
    assert nginx_find(kafka, "listen") == [([str(KAFKA_PORT)], None)]
    assert nginx_find(kafka, "proxy_pass") == [(["icefloe_kafka"], None)]
    assert sorted(gateway["ports"]) == sorted(
        [f"{HTTP_PORT}:{HTTP_PORT}", f"{GRPC_PORT}:{GRPC_PORT}", f"{KAFKA_PORT}:{KAFKA_PORT}"])


def test_should_serve_otlp_through_the_gateway_only_with_the_compose_override(tmp_path):
    """OTLP is off in docker-compose.yml ([otlp] off by default); otlp.yml turns it on for
    every icefloe service (the collector and the admin API must know the otel.* tables),
    has the ingestors serve OTLP's own ports and the gateway publish them, and the
    gateway's upstreams are those ports."""
    base = compose()["services"]
    (override,) = yaml_docs(COMPOSE_OTLP)
    assert set(override["services"]) == set(icefloe_services()) | {"gateway"}
    assert not any(port.startswith((f"{OTLP_HTTP_PORT}:", f"{OTLP_GRPC_PORT}:"))
                   for port in base["gateway"]["ports"]), "off without the override"
    assert sorted(override["services"]["gateway"]["ports"]) == sorted(
        [f"{OTLP_HTTP_PORT}:{OTLP_HTTP_PORT}", f"{OTLP_GRPC_PORT}:{OTLP_GRPC_PORT}"])
    text = (COMPOSE_DIR / "icefloe.toml").read_text()
    for name, svc in icefloe_services().items():
        env = compose_env(svc)
        env[CONFIG_ENV] = str(write_toml(tmp_path, text))
        assert not load_config(None, env=env).otlp.enabled, name
        env.update(compose_env(override["services"][name]))
        config = load_config(None, env=env)
        assert config.otlp.enabled, name
        assert any(stream.table.startswith("otel.") for stream in config.streams), name
        ports = (config.ingestor.otlp_http_port, config.ingestor.otlp_grpc_port)
        expected = (OTLP_HTTP_PORT, OTLP_GRPC_PORT) if name.startswith("ingestor") else (
            None, None)
        assert ports == expected, name
    gateway = base["gateway"]
    mounts = {v.split(":")[1]: COMPOSE_DIR / v.split(":")[0] for v in gateway["volumes"]}
    conf = nginx_blocks(mounts["/etc/nginx/nginx.conf"].read_text())
    (_, http), = nginx_find(conf, "http")
    upstreams = nginx_upstreams(http)
    ingestors = sorted(s for s in icefloe_services() if s.startswith("ingestor"))
    assert upstreams["icefloe_otlp_http"] == [f"{n}:{OTLP_HTTP_PORT}" for n in ingestors]
    assert upstreams["icefloe_otlp_grpc"] == [f"{n}:{OTLP_GRPC_PORT}" for n in ingestors]


def test_should_parse_nginx_structure_and_refuse_broken_braces():
    """The parser the gateway test relies on: nesting is kept, broken files are refused."""
    parsed = nginx_blocks("a 1; # c { ;\nb { c 2; d { e; } }\n")
    assert parsed == [("a", ["1"], None),
                      ("b", [], [("c", ["2"], None), ("d", [], [("e", [], None)])])]
    for broken in ("a { b;", "a; }", "a { b }", "a"):
        with pytest.raises(AssertionError):
            nginx_blocks(broken)


# --- the Dockerfile ----------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def test_should_build_a_non_root_image_with_java_a_healthcheck_and_the_ports():
    steps = dockerfile_instructions()
    stages = [rest.split() for word, rest in steps if word == "FROM"]
    names = {s[-1] for s in stages if "AS" in s}
    bases = [s[0] for s in stages if s[0] not in names]
    assert bases
    assert all(b.startswith("python:3.11-slim") for b in bases), bases
    runs = " ".join(rest for word, rest in steps if word == "RUN")
    assert "openjdk-17-jre-headless" in runs
    assert re.search(r"pip install -c \S*constraints.txt ", runs), "pinned by constraints.txt"
    users = [rest for word, rest in steps if word == "USER"]
    assert users
    assert users[-1].split(":")[0] not in ("root", "0"), users
    assert any(word == "HEALTHCHECK" for word, _ in steps)
    assert ("VOLUME", '["/tmp"]') in steps, "/tmp stays writable under a read-only root"
    exposed = {int(p) for word, rest in steps if word == "EXPOSE" for p in rest.split()}
    assert exposed == {HTTP_PORT, GRPC_PORT, KAFKA_PORT, OTLP_HTTP_PORT, OTLP_GRPC_PORT,
                       METRICS_PORT}
    ingestor_target = DOCKERFILE.read_text().split("AS ingestor", 1)[1].split("FROM", 1)[0]
    assert f"EXPOSE {HTTP_PORT} {GRPC_PORT} {KAFKA_PORT} {OTLP_HTTP_PORT} {OTLP_GRPC_PORT}\n" in (
        ingestor_target), "the slim ingestor image exposes OTLP's ports too"
    cmds = [json.loads(rest) for word, rest in steps if word == "CMD"]
    assert len(cmds) == 2, "one default command per role target (ingestor, collector)"
    for cmd in cmds:
        parse_cli(cmd, "Dockerfile CMD")


def test_should_copy_only_files_that_exist_and_the_dockerignore_lets_through():
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().splitlines()
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    assert "*" in ignore, "the dockerignore is an allow-list"
    copies = [rest for word, rest in dockerfile_instructions()
              if word == "COPY" and "--from=" not in rest]
    assert copies
    for rest in copies:
        sources = [a for a in rest.split() if not a.startswith("--")][:-1]
        for source in sources:
            source = source.rstrip("/")
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert source in allowed, f"COPY {source}: excluded by Dockerfile.dockerignore"


def healthcheck_module() -> types.ModuleType:
    """The image's health check script as a module (compiled here: no __pycache__ in deploy/)."""
    path = DEPLOY / "docker" / "healthcheck.py"
    module = types.ModuleType("icefloe_healthcheck")
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def test_should_run_icefloe_from_the_entrypoint_and_check_the_default_ports():
    entrypoint = (DEPLOY / "docker" / "entrypoint.sh").read_text()
    assert 'exec icefloe "$@"' in entrypoint
    assert os.access(DEPLOY / "docker" / "entrypoint.sh", os.X_OK)
    module = healthcheck_module()
    assert module.PORTS == {
        "ingestor": ("ICEFLOE_INGESTOR_HTTP_PORT", HTTP_PORT),
        "collector": ("ICEFLOE_COLLECTOR_METRICS_PORT", METRICS_PORT),
        "admin": ("ICEFLOE_ADMIN_PORT", 8081),
    }


def test_should_answer_unhealthy_when_nothing_listens(monkeypatch):
    module = healthcheck_module()
    monkeypatch.setattr(module, "answers", lambda port, path: port == METRICS_PORT)
    assert module.main(["ingestor", "/healthz"]) == 1
    assert module.main(["collector", "/readyz"]) == 0
    assert module.main([]) == 0  # any: the collector answered
    assert module.main(["bogus"]) == 2


# --- Terraform ----------------------------------------------------------------------------

def test_should_parse_every_terraform_file_without_external_modules():
    assert {p.name for p in tf_files()} >= {"variables.tf", "outputs.tf", "main.tf",
                                            "versions.tf"}
    for path in tf_files():
        parsed = hcl(path)
        assert parsed, path
        assert "module" not in parsed, f"{path.name}: no external modules (offline checks)"


def test_should_declare_and_describe_every_terraform_variable():
    declared = dict(tf_blocks("variable"))
    referenced: set[str] = set()
    for path in tf_files():
        for text in strings(hcl(path)):
            referenced.update(re.findall(r"\bvar\.([A-Za-z_][\w-]*)", text))
    assert referenced - declared.keys() == set(), "var.X used but not declared"
    assert declared.keys() - referenced == set(), "variable declared but never used"
    for name, body in declared.items():
        assert str(body.get("description", "")).strip(), f"variable {name}: no description"
        assert "type" in body, f"variable {name}: no type"


def test_should_describe_every_terraform_output():
    outputs = dict(tf_blocks("output"))
    assert outputs
    for name, body in outputs.items():
        assert str(body.get("description", "")).strip(), f"output {name}: no description"


def test_should_document_every_variable_and_output_in_the_readme_tables():
    readme = (TERRAFORM / "README.md").read_text()
    for kind in ("variable", "output"):
        for name, _ in tf_blocks(kind):
            assert re.search(rf"^\|\s*`{re.escape(name)}`\s*\|", readme, re.MULTILINE), (
                f"{kind} {name} is missing from the table in deploy/terraform/README.md")


def test_should_offer_glue_or_postgres_as_the_catalog():
    catalog = dict(tf_blocks("variable"))["catalog"]
    assert catalog["default"] in ("glue", "postgres")
    condition = str(catalog["validation"][0]["condition"])
    assert "glue" in condition
    assert "postgres" in condition
    db = tf_resources()[("aws_db_instance", "catalog")]
    assert db["storage_encrypted"] is True
    assert db["publicly_accessible"] is False
    assert "use_postgres" in str(db["count"])


def test_should_expire_only_noncurrent_versions_and_multipart_uploads():
    lifecycle = tf_resources()[("aws_s3_bucket_lifecycle_configuration", "data")]
    rules = lifecycle["rule"]
    assert rules
    for rule in rules:
        for expiration in rule.get("expiration", []):
            assert set(expiration) == {"expired_object_delete_marker"}, (
                f"rule {rule['id']}: current objects (batch files) must never expire; the "
                "collector's GC deletes them when no manifest entry points at them")
        assert set(rule) - {"id", "status", "filter", "expiration",
                            "noncurrent_version_expiration",
                            "abort_incomplete_multipart_upload"} == set(), rule
    kinds = {key for rule in rules for key in rule}
    assert {"noncurrent_version_expiration", "abort_incomplete_multipart_upload"} <= kinds


def test_should_keep_ingestors_from_deleting_batch_files():
    policy = tf_resources("data")[("aws_iam_policy_document", "ingestor")]
    local = tf_locals()
    for statement in policy["statement"]:
        actions = statement["actions"]
        assert all(not a.endswith("*") for a in actions), statement
        if any("Delete" in a for a in actions):
            assert statement["resources"] == ["${local.control_bucket_arn}/${local.probe_keys}"], (
                "ingestors may delete only their own start-up probe object")
    assert str(local["probe_keys"]).endswith("/_icefloe/probe/*")
    assert str(local["batch_keys"]).endswith("/batches/*")
    assert str(local["manifest_key"]).endswith("/" + Config().manifest.key)


def test_should_name_the_control_keys_the_code_uses():
    """The collector's and ingestors' statements name single control objects and prefixes;
    each must be the key the code really reads (a renamed key is an AccessDenied on AWS,
    which only the slow IAM run would show)."""
    from collector.journal import PREFIX  # why: imports pyarrow, only this test needs it

    local = tf_locals()
    assert local["catalog_version_key"] == "${var.batch_prefix}/" + VERSION_KEY
    assert local["collector_address_key"] == "${var.batch_prefix}/" + collector_address.KEY
    assert local["dedup_keys"] == "${var.batch_prefix}/" + PREFIX + "/*"
    assert local["kafka_producer_ids_key"] == (
        "${var.batch_prefix}/" + producer_ids_key(Config()))
    assert local["registry_key"] == "${var.batch_prefix}/" + Config().admin.registry_key
    assert local["schema_registry_key"] == (
        "${var.batch_prefix}/" + schema_key(Config().admin.registry_key))
    assert INDEX_PREFIX.endswith("/")
    assert local["retention_index_keys"] == "${var.batch_prefix}/" + INDEX_PREFIX + "*"


def test_should_grant_each_role_what_the_code_does_with_the_schema_and_retention_objects():
    """The schema registry document: ingestors read it at start and add writer schemas by
    compare-and-swap (ingestor.writer_schemas), the collector reads it each run, the admin
    API rewrites it (get and put each; nobody deletes it). The retention index: the
    collector creates segments (conditional put, HEAD), lists and reads them (GC) and
    deletes merged ones (compaction); nobody else touches it."""
    module = Module(TERRAFORM, {})
    local = {name: module.local(name) for name in ("control_bucket_arn", "schema_registry_key",
                                                   "retention_index_keys")}
    schemas = f"{local['control_bucket_arn']}/{local['schema_registry_key']}"
    index = f"{local['control_bucket_arn']}/{local['retention_index_keys']}"
    policies = module.role_policies(("ingestor", "collector", "admin"))

    def granted(role: str, resource: str) -> set[str]:
        return {action for statement in policies[role]["Statement"]
                if resource in statement["Resource"] for action in statement["Action"]}

    assert granted("ingestor", schemas) == {"s3:GetObject", "s3:PutObject"}
    assert granted("collector", schemas) == {"s3:GetObject"}
    assert granted("admin", schemas) == {"s3:GetObject", "s3:PutObject"}
    assert granted("collector", index) == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject"}
    assert granted("ingestor", index) == granted("admin", index) == set()
    # listing the index: the collector's ListBucket on the control bucket's store prefix
    (listing,) = [s for s in policies["collector"]["Statement"]
                  if s["Action"] == ["s3:ListBucket"]
                  and s["Resource"] == [local["control_bucket_arn"]]]
    assert listing["Condition"]["StringLike"]["s3:prefix"] == [
        local["retention_index_keys"].split("/", 1)[0] + "/*"]


def test_should_let_the_admin_drop_the_empty_glue_table_it_made():
    """A failed table task drops the empty table it created
    (pipeline.iceberg.tables: ``catalog.drop_table``, Glue's DeleteTable), in the tables the
    other catalog calls reach; the collector drops no table."""
    module = Module(TERRAFORM, {"catalog": "glue"})
    policies = module.role_policies(("collector", "admin"))
    tables = module.local("glue_catalog_resources")
    drop = [s for s in policies["admin"]["Statement"] if "glue:DeleteTable" in s["Action"]]
    assert drop, "the admin role cannot drop a table (glue:DeleteTable)"
    assert all(sorted(s["Resource"]) == sorted(tables) for s in drop), drop
    assert not any("glue:DeleteTable" in s["Action"] for s in policies["collector"]["Statement"])
    postgres = Module(TERRAFORM, {"catalog": "postgres"}).role_policies(("admin",))
    assert not any(a.startswith("glue:") for s in postgres["admin"]["Statement"]
                   for a in s["Action"])


def test_should_start_the_ingestor_service_after_every_listener_of_its_target_groups():
    """ECS refuses to register targets in a target group no listener forwards to yet; the
    ingestor service attaches its groups (static and ``dynamic`` load_balancer blocks), so
    each group's listeners (default action or listener rule) must be in its depends_on."""
    resources = tf_resources()
    service = resources[("aws_ecs_service", "ingestor")]

    def group(arn: str) -> str:
        found = re.search(r"aws_lb_target_group\.(\w+)", arn)
        assert found, arn
        return found.group(1)

    attached = {group(block["target_group_arn"]) for block in service["load_balancer"]}
    attached |= {group(arn) for arn in ecs_load_balancers()}
    assert attached == {"http", "grpc", "kafka", "otlp_http", "otlp_grpc"}
    listeners: dict[str, set[str]] = {}
    for (rtype, name), body in resources.items():
        if rtype == "aws_lb_listener":
            actions, listener = body["default_action"], name
        elif rtype == "aws_lb_listener_rule":
            found = re.search(r"aws_lb_listener\.(\w+)", body["listener_arn"])
            assert found, body["listener_arn"]
            actions, listener = body["action"], found.group(1)
        else:
            continue
        for action in actions:
            if "target_group_arn" in action:
                listeners.setdefault(group(action["target_group_arn"]), set()).add(listener)
    depends = set()
    for reference in service["depends_on"]:
        found = re.fullmatch(r"\$\{aws_lb_listener\.(\w+)\}", reference)
        if found:
            depends.add(found.group(1))
    for name in sorted(attached):
        assert listeners.get(name), f"no listener forwards to target group {name}"
        missing = listeners[name] - depends
        assert not missing, (f"the ingestor service attaches target group {name} but does "
                             f"not depend on its listener(s) {sorted(missing)}")


def test_should_run_exactly_one_collector_and_autoscale_the_ingestors():
    resources = tf_resources()
    assert resources[("aws_ecs_service", "collector")]["desired_count"] == 1
    scaling = [body for (rtype, _), body in resources.items()
               if rtype == "aws_appautoscaling_target"]
    assert len(scaling) == 1
    assert "aws_ecs_service.ingestor.name" in scaling[0]["resource_id"]
    assert any(rtype == "aws_appautoscaling_policy" for rtype, _ in resources)
    grpc = resources[("aws_lb_target_group", "grpc")]
    assert grpc["protocol_version"] == "GRPC"


def test_should_run_the_ecs_containers_as_the_image_user_with_a_writable_tmp():
    resources = tf_resources()
    for role in ("ingestor", "collector", "admin"):
        task = resources[("aws_ecs_task_definition", role)]
        assert task["requires_compatibilities"] == ["FARGATE"]
        assert task["volume"] == [{"name": "tmp"}]
        # the jsonencode(...) expression as text; python-hcl2 7 and 8 render it differently
        text = re.sub(r'["{}$]', "", " ".join(task["container_definitions"].split()))
        containers = re.sub(r"\s*=\s*|:\s+", "=", text)
        for expected in (f"command=local.{role}_command", "user=10001:10001",
                         "readonlyRootFilesystem=true", "containerPath=/tmp",
                         f"icefloe-healthcheck, {role}, /healthz",
                         f"local.environment_{role}", "secrets="):
            assert expected in containers, f"{role} task definition: {expected!r} missing"


def test_should_use_icefloe_ports_commands_and_image_tag_in_terraform():
    local = tf_locals()
    assert (local["http_port"], local["grpc_port"], local["metrics_port"]) == (
        HTTP_PORT, GRPC_PORT, METRICS_PORT)
    commands = {k: v for k, v in local.items() if k.endswith("_command")}
    assert set(commands) == {"ingestor_command", "collector_command", "admin_command"}
    for name, argv in commands.items():
        parse_cli(argv, f"terraform local.{name}")
    variables = dict(tf_blocks("variable"))
    assert variables["image_tag"]["default"] == __version__
    assert variables["name"]["default"] == IMAGE_NAME
    toml = TERRAFORM / "icefloe.toml"
    assert toml.is_file()


def start_up_transport_check(config: Config, role: str) -> None:
    """What each server applies to its section before it binds (a ConfigError for a
    non-loopback address with neither TLS files nor ``plaintext = true``): the ingestor's
    :func:`ingestor.tls.server_tls` (:func:`icefloe.server_tls.section_tls` on
    ``[ingestor]`` with its extra ports), ``section_tls`` on ``[collector]`` and ``[admin]``
    as the collector runner and the admin server call it."""
    if role == "ingestor":
        server_tls(config)
    else:
        section_tls(config, role, what=f"the {role} port", secrets="test")


def test_should_load_the_terraform_config_with_the_module_environment(tmp_path):
    """Each task's environment (as ecs.tf concatenates it, with enable_kafka and
    enable_otlp on) loads with the module's config file and passes its server's start-up
    transport check on the address the task binds."""
    envs = tf_environment_values(enable_otlp=True)
    path = write_toml(tmp_path, (TERRAFORM / "icefloe.toml").read_text())
    for role in ("ingestor", "collector", "admin"):
        env = {**envs["common"], **envs[role], **envs["otlp"],
               **({**envs["kafka"], **envs["otlp_ports"]} if role == "ingestor" else {})}
        config = load_config(path, env=env)
        assert config.streams
        assert config.ingestor.host == "0.0.0.0"
        assert getattr(config, role).host == "0.0.0.0", f"{role}: binds every address"
        start_up_transport_check(config, role)  # raises ConfigError when it would refuse
        if role != "ingestor":  # the ingestors never reach the catalog
            assert config.catalog.type == "glue"
        assert config.store.url.startswith("s3://icefloe-")
        assert str(config.store.control_url).endswith("-control/ingest")
    assert config.ingestor.kafka_port is None, "only the ingestor's environment turns it on"


def test_should_put_kafka_behind_a_tls_network_load_balancer_that_it_advertises(tmp_path):
    """An ALB cannot carry Kafka (TCP): an NLB terminates TLS on 9092 and forwards TCP to
    the ingestors' Kafka port; the ingestors serve plaintext behind it, as behind the ALB,
    and advertise the NLB (or kafka_hostname), since Kafka clients connect to what
    Metadata advertises. enable_kafka = false removes all of it."""
    resources, local = tf_resources(), tf_locals()
    assert local["kafka_port"] == KAFKA_PORT
    kafka = {key: body for key, body in resources.items() if "kafka" in key[1]}
    assert {("aws_lb", "kafka"), ("aws_lb_target_group", "kafka"), ("aws_lb_listener", "kafka"),
            ("aws_security_group", "kafka_lb")} <= set(kafka)
    for (rtype, name), body in kafka.items():
        gate = str(body.get("count", body.get("for_each", "")))
        assert "var.enable_kafka" in gate, f"{rtype}.{name} is not switched by enable_kafka"
    nlb, group = kafka[("aws_lb", "kafka")], kafka[("aws_lb_target_group", "kafka")]
    listener = kafka[("aws_lb_listener", "kafka")]
    assert nlb["load_balancer_type"] == "network"
    assert nlb["access_logs"][0]["enabled"] is True
    assert (listener["protocol"], listener["port"]) == ("TLS", "${local.kafka_port}")
    assert listener["certificate_arn"] == "${var.certificate_arn}"
    assert listener["ssl_policy"] == "${var.ssl_policy}"
    assert (group["protocol"], group["target_type"], group["port"]) == (
        "TCP", "ip", "${local.kafka_port}")
    (check,) = group["health_check"]
    assert (check["protocol"], check["path"], check["port"]) == (
        "HTTP", "/readyz", "${local.http_port}")
    # clients -> NLB on 9092 (the allowed blocks); NLB -> ingestors on 9092 and the health port
    clients = kafka[("aws_vpc_security_group_ingress_rule", "kafka_lb_clients")]
    assert "var.allowed_cidr_blocks" in clients["for_each"]
    assert clients["from_port"] == clients["to_port"] == "${local.kafka_port}"
    into = {(b["from_port"], b["referenced_security_group_id"]) for (t, _), b in kafka.items()
            if t == "aws_vpc_security_group_ingress_rule"
            and b["security_group_id"] == "${aws_security_group.ingestor.id}"}
    assert into == {("${local.kafka_port}", "${aws_security_group.kafka_lb[0].id}"),
                    ("${local.http_port}", "${aws_security_group.kafka_lb[0].id}")}
    # the task maps 9092, the service registers it in the target group, the env turns it on
    text = resources[("aws_ecs_task_definition", "ingestor")]["container_definitions"]
    text = re.sub(r'["{}$]', "", " ".join(text.split()))  # as the ECS test above reads it
    task = re.sub(r"\s*=\s*|:\s+", "=", text)
    assert "var.enable_kafka ? [name=kafka, containerPort=local.kafka_port, protocol=tcp]" in task
    assert "var.enable_kafka ? local.environment_kafka" in task
    content = ecs_load_balancers()["${aws_lb_target_group.kafka[0].arn}"]
    assert content["container_port"] == "${local.kafka_port}"
    assert content["for_each"] == "${var.enable_kafka ? [1] : []}"

    path = write_toml(tmp_path, (TERRAFORM / "icefloe.toml").read_text())
    outputs = dict(tf_blocks("output"))
    for overrides, host in (({}, "ifkafk-0123456789abcdef.elb.us-east-1.amazonaws.com"),
                            ({"kafka_hostname": "kafka.example.com"}, "kafka.example.com")):
        envs = tf_environment_values(**overrides)
        config = load_config(path, env={**envs["common"], **envs["ingestor"], **envs["kafka"]})
        assert config.ingestor.plaintext is True  # TLS ends at the NLB
        assert config.ingestor.kafka_port == KAFKA_PORT
        assert (config.ingestor.kafka_advertised_host,
                config.ingestor.kafka_advertised_port) == (host, KAFKA_PORT)
        assert config.ingestor.kafka_idle_s < 350, "the NLB drops idle TCP flows at 350 s"
        bootstrap = Module(TERRAFORM, overrides).value(outputs["kafka_bootstrap"]["value"])
        assert bootstrap == f"{host}:{KAFKA_PORT}"
    off = Module(TERRAFORM, {"enable_kafka": False})
    assert off.value(outputs["kafka_bootstrap"]["value"]) is None


def test_should_serve_otlp_on_its_own_alb_listeners_only_with_enable_otlp(tmp_path):
    """enable_otlp (off by default) adds TLS listeners on 4318 and 4317 of the ingest ALB,
    forwarding only OTLP's paths and Export services to the ingestors' OTLP ports, with
    the security group rules, port mappings and target group registrations; every role
    gets [otlp] on, the ingestors also the two ports."""
    resources, local = tf_resources(), tf_locals()
    assert (local["otlp_http_port"], local["otlp_grpc_port"]) == (OTLP_HTTP_PORT,
                                                                  OTLP_GRPC_PORT)
    otlp = {key: body for key, body in resources.items() if "otlp" in key[1]}
    assert {("aws_lb_target_group", "otlp_http"), ("aws_lb_target_group", "otlp_grpc"),
            ("aws_lb_listener", "otlp_http"), ("aws_lb_listener", "otlp_grpc"),
            ("aws_lb_listener_rule", "otlp_http"), ("aws_lb_listener_rule", "otlp_grpc"),
            ("aws_vpc_security_group_ingress_rule", "lb_otlp_http"),
            ("aws_vpc_security_group_ingress_rule", "lb_otlp_grpc"),
            ("aws_vpc_security_group_egress_rule", "lb_to_ingestor_otlp"),
            ("aws_vpc_security_group_ingress_rule", "ingestor_otlp")} == set(otlp)
    for (rtype, name), body in otlp.items():
        gate = str(body.get("count", body.get("for_each", "")))
        assert "var.enable_otlp" in gate, f"{rtype}.{name} is not switched by enable_otlp"
    for kind, port in (("http", "${local.otlp_http_port}"), ("grpc", "${local.otlp_grpc_port}")):
        listener = otlp[("aws_lb_listener", f"otlp_{kind}")]
        assert (listener["protocol"], listener["port"]) == ("HTTPS", port)
        assert listener["certificate_arn"] == "${var.certificate_arn}"
        assert listener["load_balancer_arn"] == "${aws_lb.ingest.arn}"
        group = otlp[("aws_lb_target_group", f"otlp_{kind}")]
        assert (group["protocol"], group["target_type"], group["port"]) == ("HTTP", "ip", port)
        (rule,) = otlp[("aws_lb_listener_rule", f"otlp_{kind}")]["action"]
        assert rule["target_group_arn"] == f"${{aws_lb_target_group.otlp_{kind}[0].arn}}"
        content = ecs_load_balancers()[f"${{aws_lb_target_group.otlp_{kind}[0].arn}}"]
        assert content["container_port"] == port
        assert content["for_each"] == "${var.enable_otlp ? [1] : []}"
    assert otlp[("aws_lb_target_group", "otlp_grpc")]["protocol_version"] == "GRPC"
    on = Module(TERRAFORM, {"enable_otlp": True})
    assert on.local("otlp_http_paths") == ["/v1/logs", "/v1/traces", "/v1/metrics"]
    assert {p.split("/")[1].rsplit(".", 1)[-1] for p in on.local("otlp_grpc_paths")} == {
        "LogsService", "TraceService", "MetricsService"}
    # clients -> ALB on 4318/4317; ALB -> ingestors on the range 4317-4318 (the two ports)
    for kind, port in (("http", "${local.otlp_http_port}"), ("grpc", "${local.otlp_grpc_port}")):
        clients = otlp[("aws_vpc_security_group_ingress_rule", f"lb_otlp_{kind}")]
        assert "var.allowed_cidr_blocks" in clients["for_each"]
        assert clients["from_port"] == clients["to_port"] == port
    for name in ("lb_to_ingestor_otlp", "ingestor_otlp"):
        rule = next(b for (t, n), b in otlp.items() if n == name)
        assert (rule["from_port"], rule["to_port"]) == ("${local.otlp_grpc_port}",
                                                        "${local.otlp_http_port}")
        assert OTLP_HTTP_PORT - OTLP_GRPC_PORT == 1, "the range holds exactly the two ports"
    text = resources[("aws_ecs_task_definition", "ingestor")]["container_definitions"]
    task = re.sub(r"\s*=\s*|:\s+", "=", re.sub(r'["{}$]', "", " ".join(text.split())))
    assert ("var.enable_otlp ? [name=otlp-http, containerPort=local.otlp_http_port, "
            "protocol=tcp, name=otlp-grpc, containerPort=local.otlp_grpc_port, protocol=tcp, "
            "appProtocol=grpc]" in task)
    assert "var.enable_otlp ? concat(local.environment_otlp, local.environment_otlp_ports)" in (
        task)
    for role in ("collector", "admin"):
        text = resources[("aws_ecs_task_definition", role)]["container_definitions"]
        assert "var.enable_otlp ? local.environment_otlp" in " ".join(text.split()), role

    path = write_toml(tmp_path, (TERRAFORM / "icefloe.toml").read_text())
    envs = tf_environment_values(enable_otlp=True)
    for role in ("ingestor", "collector", "admin"):
        env = {**envs["common"], **envs[role], **envs["otlp"],
               **(envs["otlp_ports"] if role == "ingestor" else {})}
        config = load_config(path, env=env)
        assert config.otlp.enabled, role
        assert any(stream.table.startswith("otel.") for stream in config.streams), role
    assert (config.ingestor.otlp_http_port, config.ingestor.otlp_grpc_port) == (None, None)
    config = load_config(path, env={**envs["common"], **envs["ingestor"], **envs["otlp"],
                                    **envs["otlp_ports"]})
    assert (config.ingestor.otlp_http_port, config.ingestor.otlp_grpc_port) == (
        OTLP_HTTP_PORT, OTLP_GRPC_PORT)
    outputs = dict(tf_blocks("output"))
    assert on.value(outputs["otlp_grpc_endpoint"]["value"]).endswith(f":{OTLP_GRPC_PORT}")
    assert on.value(outputs["otlp_http_endpoint"]["value"]).startswith("https://")
    variables = dict(tf_blocks("variable"))
    assert variables["enable_otlp"]["default"] is False, "off unless asked for"
    off = Module(TERRAFORM, {})
    assert off.value(outputs["otlp_http_endpoint"]["value"]) is None


# --- ingestor drain and request size, every deploy form -------------------------------------

GRACE_MARGIN_S = 5.0
"""What a grace period keeps beyond the ingestor's longest drain (process exit, scheduling)."""


def ingestor_drain_s() -> float:
    """The longest SIGTERM drain of an ingestor with the config defaults
    (ingestor/server.py ``shut_down``): the HTTP and gRPC servers finish requests in flight
    for up to ``shutdown_timeout_s`` (gRPC's stop grace, uvicorn's graceful timeout), then
    ``runtime.close`` waits up to ``shutdown_timeout_s`` for the buffer, and the manifest
    producer's appends in flight, which a flush gives up on after ``flush_timeout_s``."""
    ing = Config().ingestor
    return ing.shutdown_timeout_s + max(ing.shutdown_timeout_s, ing.flush_timeout_s)


def duration_s(text: str) -> float:
    """A compose duration (``60s``, ``1m30s``, ``1h``) in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)", text)
    assert parts, f"not a duration: {text!r}"
    assert "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def test_should_give_the_ingestors_a_grace_period_longer_than_their_drain():
    drain = ingestor_drain_s()
    assert drain >= Config().ingestor.flush_timeout_s
    # Kubernetes: the preStop sleep runs first, inside the grace period
    pod = k8s_deployments()["icefloe-ingestor"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    assert len(command) == 2, command
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= float(command[1]) + drain + GRACE_MARGIN_S, (
        f"Kubernetes: {grace} s < preStop {command[1]} s + drain {drain:g} s + margin")
    # ECS: the container's stopTimeout (Fargate allows at most 120 s)
    text = tf_resources()[("aws_ecs_task_definition", "ingestor")]["container_definitions"]
    (stop,) = re.findall(r"stopTimeout\s*[=:]\s*(\d+)", text)
    assert drain + GRACE_MARGIN_S <= int(stop) <= 120, (
        f"ECS: stopTimeout {stop} s < drain {drain:g} s + margin")
    # Compose: every ingestor service
    ingestors = {n: s for n, s in icefloe_services().items() if n.startswith("ingestor")}
    assert ingestors
    for name, svc in ingestors.items():
        period = duration_s(str(svc.get("stop_grace_period", "10s")))  # compose's default
        assert period >= drain + GRACE_MARGIN_S, (
            f"compose {name}: stop_grace_period {period:g} s < drain {drain:g} s + margin")


def nginx_size(text: str) -> int:
    """An nginx size (``16m``, ``512k``, ``1g`` or bytes) in bytes."""
    found = re.fullmatch(r"(\d+)([kKmMgG]?)", text.strip())
    assert found, f"not an nginx size: {text!r}"
    return int(found.group(1)) * 1024 ** " kmg".index(found.group(2).lower() or " ")


def test_should_let_the_ingress_pass_every_body_the_ingestor_accepts():
    """The ingestor's max_body_bytes decides (its own 413); the controller's limit is above
    it, and the comment states the real default."""
    path = K8S_EXTRA[2] / "ingress.yaml"
    (ingress,) = [o for o in yaml_docs(path) if o["kind"] == "Ingress"]
    limit = ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"]
    default = Config().ingestor.max_body_bytes
    assert nginx_size(str(limit)) > default, (
        f"proxy-body-size {limit} does not exceed [ingestor] max_body_bytes ({default})")
    assert nginx_size("16m") == 16 * 1024 * 1024
    assert f"max_body_bytes ({default // 2 ** 20} MiB by default)" in path.read_text()


# --- Kubernetes ---------------------------------------------------------------------------

def test_should_harden_every_pod():
    deployments = k8s_deployments()
    assert set(deployments) == {"icefloe-ingestor", "icefloe-collector", "icefloe-admin"}
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod["automountServiceAccountToken"] is False, name
        (container,) = pod["containers"]  # no sidecar: the manifest lease elects, not k8s
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["runAsNonRoot"] is True, name
        assert sc["capabilities"]["drop"] == ["ALL"], name
        assert sc["seccompProfile"]["type"] == "RuntimeDefault", name
        for kind in ("requests", "limits"):
            assert set(container["resources"][kind]) == {"cpu", "memory"}, (name, kind)
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], f"{name}: /tmp must be an emptyDir"
        assert volumes[mounts["/etc/icefloe"]]["configMap"]["name"] == "icefloe-config"
        assert container["image"]
        assert not container["image"].endswith(":latest")


def test_should_probe_healthz_and_readyz_on_the_icefloe_ports():
    expected = {"icefloe-ingestor": {"http": HTTP_PORT, "grpc": GRPC_PORT, "kafka": KAFKA_PORT},
                "icefloe-collector": {"metrics": METRICS_PORT},
                "icefloe-admin": {"admin": AdminSection().port}}
    probe_port = {"icefloe-ingestor": "http", "icefloe-collector": "metrics",
                  "icefloe-admin": "admin"}
    scrape_port = {"icefloe-ingestor": HTTP_PORT, "icefloe-collector": METRICS_PORT}
    for name, deployment in k8s_deployments().items():
        template = deployment["spec"]["template"]
        (container,) = template["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == expected[name], name
        ready = "/healthz" if name == "icefloe-admin" else "/readyz"  # admin has no /readyz
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", ready),
                            ("startupProbe", "/healthz")):
            get = container[probe]["httpGet"]
            assert (get["path"], get["port"]) == (path, probe_port[name]), (name, probe)
        if name not in scrape_port:  # admin /metrics needs a token: not scraped
            continue
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == str(scrape_port[name])
        assert annotations["prometheus.io/path"] == "/metrics"


def test_should_point_services_hpa_and_pdb_at_the_right_pods():
    deployments = k8s_deployments()
    for obj in k8s_objects():
        kind = obj["kind"]
        if kind == "Service":
            target = deployments[obj["metadata"]["name"]]
            (container,) = target["spec"]["template"]["spec"]["containers"]
            names = {p["name"]: p["containerPort"] for p in container["ports"]}
            for port in obj["spec"]["ports"]:
                assert names[port["targetPort"]] == port["port"], (obj["metadata"], port)
        if kind in ("Service", "PodDisruptionBudget", "NetworkPolicy"):
            spec = obj["spec"]
            selector = spec.get("selector") or spec.get("podSelector")
            labels = selector.get("matchLabels", selector)
            matched = [d for d in deployments.values()
                       if labels.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
            assert len(matched) == 1, (kind, obj["metadata"]["name"])
    assert "replicas" not in deployments["icefloe-ingestor"]["spec"], "the HPA owns it"
    hpa = k8s_object("HorizontalPodAutoscaler", "icefloe-ingestor")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "icefloe-ingestor"
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    k8s_object("PodDisruptionBudget", "icefloe-ingestor")


def json_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """Apply the JSON-patch ``add``/``replace`` operations kustomize patches use here (RFC
    6902 paths; ``-`` appends), so a test reads the object the patch produces."""
    document = json.loads(json.dumps(document))
    for operation in operations:
        assert operation["op"] in ("add", "replace"), operation
        *parents, last = [part.replace("~1", "/").replace("~0", "~")
                          for part in operation["path"].split("/")[1:]]
        target = document
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list) and last == "-":
            target.append(operation["value"])
        elif isinstance(target, list):
            target[int(last)] = operation["value"]
        else:
            target[last] = operation["value"]
    return document


def container_config(tmp_path: Path, container: dict[str, Any]) -> Config:
    """The config an icefloe container loads: the ConfigMap's toml and its environment."""
    toml = k8s_object("ConfigMap", "icefloe-config")["data"]["icefloe.toml"]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env[CONFIG_ENV] = str(write_toml(tmp_path, toml))
    return load_config(None, env=env)


def test_should_serve_kafka_in_the_cluster_and_advertise_what_clients_reach(tmp_path):
    """Kafka clients connect to the address Metadata advertises: inside the cluster the
    ingestor Service's DNS name and port; with components/ingress the external load
    balancer's hostname, which the component's own patch sets on the ingestors."""
    deployment = k8s_deployments()["icefloe-ingestor"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = container_config(tmp_path, container)
    assert config.ingestor.kafka_port == ports["kafka"] == KAFKA_PORT
    assert config.ingestor.plaintext is True  # TLS ends at the load balancer, as for HTTP
    service = k8s_object("Service", "icefloe-ingestor")
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert by_name["kafka"]["targetPort"] == "kafka"
    meta = service["metadata"]
    assert config.ingestor.kafka_advertised_host == f"{meta['name']}.{meta['namespace']}.svc"
    assert config.ingestor.kafka_advertised_port == by_name["kafka"]["port"]
    policy = k8s_object("NetworkPolicy", "icefloe-ingestor")
    admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert admitted == set(ports.values())

    ingress = K8S_EXTRA[2]
    (component,) = yaml_docs(ingress / "kustomization.yaml")
    (external,) = yaml_docs(ingress / "kafka-service.yaml")
    assert external["spec"]["type"] == "LoadBalancer"  # an Ingress carries HTTP only
    assert external["spec"]["selector"] == service["spec"]["selector"]
    (port,) = external["spec"]["ports"]
    assert (port["port"], port["targetPort"], port["protocol"]) == (KAFKA_PORT, "kafka", "TCP")
    notes = external["metadata"]["annotations"]
    prefix = "service.beta.kubernetes.io/aws-load-balancer-"
    assert notes[prefix + "ssl-ports"] == port["name"], "TLS terminates at the load balancer"
    assert notes[prefix + "backend-protocol"] == "tcp"
    (patch,) = [p for p in component["patches"] if p["target"]["name"] == "icefloe-ingestor"]
    assert patch["target"]["kind"] == "Deployment"
    patched = json_patch(deployment, yaml.safe_load(patch["patch"]))
    (outside,) = patched["spec"]["template"]["spec"]["containers"]
    config = container_config(tmp_path, outside)
    assert config.ingestor.kafka_advertised_host == (
        notes["external-dns.alpha.kubernetes.io/hostname"])
    assert config.ingestor.kafka_advertised_port == port["port"]


def test_should_serve_otlp_in_the_cluster_only_with_the_otlp_component(tmp_path):
    """The base serves no OTLP; components/otlp turns [otlp] on in every Deployment, has the
    ingestors serve OTLP's own ports and admits them in the Service and NetworkPolicy, so
    the Service/port consistency the base keeps holds for the patched objects too."""
    (component,) = yaml_docs(K8S_OTLP / "kustomization.yaml")
    assert component["kind"] == "Component"
    patches = {(p["target"]["kind"], p["target"]["name"]): yaml.safe_load(p["patch"])
               for p in component["patches"]}
    deployments = k8s_deployments()
    assert set(patches) == {("Deployment", name) for name in deployments} | {
        ("Service", "icefloe-ingestor"), ("NetworkPolicy", "icefloe-ingestor")}
    for name, deployment in deployments.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert not container_config(tmp_path, container).otlp.enabled, name
        patched = json_patch(deployment, patches[("Deployment", name)])
        (container,) = patched["spec"]["template"]["spec"]["containers"]
        config = container_config(tmp_path, container)
        assert config.otlp.enabled, name
        assert any(stream.table.startswith("otel.") for stream in config.streams), name
        if name != "icefloe-ingestor":
            assert config.ingestor.otlp_http_port is None, name
            continue
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert (config.ingestor.otlp_http_port, config.ingestor.otlp_grpc_port) == (
            ports["otlp-http"], ports["otlp-grpc"]) == (OTLP_HTTP_PORT, OTLP_GRPC_PORT)
        service = json_patch(k8s_object("Service", "icefloe-ingestor"),
                             patches[("Service", "icefloe-ingestor")])
        for port in service["spec"]["ports"]:
            assert ports[port["targetPort"]] == port["port"], port
        by_name = {p["name"]: p for p in service["spec"]["ports"]}
        assert by_name["otlp-grpc"]["appProtocol"] == "kubernetes.io/h2c"
        policy = json_patch(k8s_object("NetworkPolicy", "icefloe-ingestor"),
                            patches[("NetworkPolicy", "icefloe-ingestor")])
        admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert admitted == set(ports.values())


def test_should_apply_json_patches_as_kustomize_does():
    doc = {"a": [{"b": 1}], "c": {"d/e": 0}}
    assert json_patch(doc, [{"op": "add", "path": "/a/-", "value": 2},
                            {"op": "replace", "path": "/a/0/b", "value": 3},
                            {"op": "add", "path": "/c/d~1e", "value": 4}]) == (
        {"a": [{"b": 3}, 2], "c": {"d/e": 4}})
    assert doc == {"a": [{"b": 1}], "c": {"d/e": 0}}, "the input stays as it was"


def test_should_run_one_collector_and_a_standby_only_in_the_overlay():
    collector = k8s_deployments()["icefloe-collector"]
    assert collector["spec"]["replicas"] == 1
    (overlay,) = yaml_docs(K8S_STANDBY / "kustomization.yaml")
    assert overlay["resources"] == ["../../base"]
    patches = {p["target"]["name"]: yaml.safe_load(p["patch"]) for p in overlay["patches"]}
    assert {"op": "replace", "path": "/spec/replicas", "value": 2} in (
        patches["icefloe-collector"])


def test_should_load_the_configmap_toml_with_the_secret_environment(tmp_path):
    configmap = k8s_object("ConfigMap", "icefloe-config")
    path = write_toml(tmp_path, configmap["data"]["icefloe.toml"])
    for name, deployment in k8s_deployments().items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        assert env[CONFIG_ENV] == "/etc/icefloe/icefloe.toml", name
        for source in container.get("envFrom", []):
            secret = k8s_object("Secret", source["secretRef"]["name"])
            env.update(secret["stringData"])
        env[CONFIG_ENV] = str(path)
        config = load_config(None, env=env)
        assert config.source == str(path)
        assert config.streams, name
        assert config.ingestor.host == "0.0.0.0"
        assert config.collector.host == "0.0.0.0"
        assert config.store.url.startswith("s3://")
        if name == "icefloe-collector":
            assert config.catalog.uri.startswith("postgresql://")
    ingestor_secret = k8s_object("Secret", "icefloe-ingestor")["stringData"]
    assert not any(key.startswith("ICEFLOE_CATALOG") for key in ingestor_secret), (
        "ingestors do not use the catalog: keep its password away from them")


def test_should_load_the_compose_toml_with_each_service_environment(tmp_path):
    text = (COMPOSE_DIR / "icefloe.toml").read_text()
    for name, svc in icefloe_services().items():
        mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
        env = compose_env(svc)
        assert mounts[env[CONFIG_ENV]] == "./icefloe.toml", name
        env[CONFIG_ENV] = str(write_toml(tmp_path, text))
        config = load_config(None, env=env)
        assert config.store.url == "s3://icefloe/ingest"
        assert config.store.endpoint_url == "http://minio:9000"
        assert config.catalog.type == "sql"
        if name.startswith("ingestor"):  # the ingestors never reach the catalog
            assert "ICEFLOE_CATALOG_URI" not in env, f"{name} gets the catalog password"
        else:
            assert config.catalog.uri.startswith("postgresql://icefloe:")
            assert "@postgres:5432/icefloe" in config.catalog.uri
        assert config.catalog.properties["s3.endpoint"] == config.store.endpoint_url
        assert config.ingestor.host == "0.0.0.0"
        assert (config.ingestor.http_port, config.ingestor.grpc_port) == (HTTP_PORT, GRPC_PORT)
        # Kafka clients connect to the address Metadata advertises: the gateway, as
        # published on this machine
        assert config.ingestor.kafka_port == KAFKA_PORT
        assert (config.ingestor.kafka_advertised_host, config.ingestor.kafka_advertised_port) \
            == ("localhost", KAFKA_PORT)
        assert config.collector.metrics_port == METRICS_PORT
    collector = compose()["services"]["collector"]
    assert collector["ports"] == [f"127.0.0.1:{METRICS_PORT}:{METRICS_PORT}"]
    assert not any("ports" in svc for name, svc in icefloe_services().items()
                   if name.startswith("ingestor")), "ingest goes through the gateway"
    init = compose()["services"]["minio-init"]
    assert "local/icefloe" in " ".join(init["command"]), "minio-init creates the store bucket"


# --- what the deploy files say about icefloe -------------------------------------------------

def real_settings() -> set[str]:
    names = {CONFIG_ENV, DATA_DIR_ENV}
    for field in msgspec.structs.fields(Config):
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            for key in field.type.__struct_fields__:
                names.add(f"ICEFLOE_{field.name.upper()}_{key.upper()}")
    return names


def test_should_name_only_real_icefloe_settings():
    known = real_settings()
    used: dict[str, set[str]] = {}
    for path in deploy_files(""):
        text = path.read_text(errors="replace")
        for match in re.finditer(r"ICEFLOE_[A-Z0-9_]*[A-Z0-9]", text):
            if text[match.end():match.end() + 1] in ("<", "*"):
                continue  # a pattern in prose, like ICEFLOE_<SECTION>_<KEY>
            used.setdefault(match.group(), set()).add(str(path.relative_to(ROOT)))
    assert used, "the deploy files configure icefloe through ICEFLOE_* variables"
    for name, where in used.items():
        if name in TOOLING_ENV:
            assert all(w.endswith(".md") for w in where), (name, where)
            continue
        if name in HEALTHCHECK_ENV:
            assert "deploy/docker/healthcheck.py" in where, (name, where)  # it reads them
            continue
        assert name in known, f"{name} (in {sorted(where)}) is not an icefloe setting"


def test_should_apply_every_icefloe_variable_the_deploy_files_set(tmp_path):
    """Each ICEFLOE_<SECTION>_<KEY> a file sets really changes that key (load_config reads it).

    Every environment is checked on its own (each compose service, Secret, container,
    Terraform environment list and OTLP patch), so a variable several roles set is checked
    with each role's value, not only the last one seen."""
    envs: list[tuple[str, dict[str, str]]] = []
    for name, svc in icefloe_services().items():
        envs.append((f"compose {name}", compose_env(svc)))
    for obj in k8s_objects():
        if obj["kind"] == "Secret":
            envs.append((f"Secret {obj['metadata']['name']}", obj.get("stringData") or {}))
    for name, deployment in k8s_deployments().items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            envs.append((f"Deployment {name}", {e["name"]: e["value"] for e in
                                                container.get("env", []) if "value" in e}))
    tf_envs = tf_environment_values(enable_otlp=True)
    for name, env in tf_envs.items():
        envs.append((f"terraform local.environment_{name}", env))
    (override,) = yaml_docs(COMPOSE_OTLP)  # the opt-in OTLP forms' settings too
    for name, svc in override["services"].items():
        envs.append((f"compose (otlp.yml) {name}", compose_env(svc)))
    (component,) = yaml_docs(K8S_OTLP / "kustomization.yaml")
    for patch in component["patches"]:
        envs.append((f"otlp component patch of {patch['target']['name']}",
                     {op["value"]["name"]: op["value"]["value"]
                      for op in yaml.safe_load(patch["patch"])
                      if op["path"].endswith("/env/-")}))
    # a role's task gets its lists concatenated (ecs.tf): one name once, or one value hides
    for role, extra in (("ingestor", ("kafka", "otlp", "otlp_ports")),
                        ("collector", ("otlp",)), ("admin", ("otlp",))):
        names = [n for part in ("common", role, *extra) for n in tf_envs[part]]
        assert len(names) == len(set(names)), f"terraform {role}: a variable set twice"
    settings = [(where, k, v) for where, env in envs for k, v in env.items()
                if k.startswith("ICEFLOE_") and k not in (CONFIG_ENV, DATA_DIR_ENV)]
    assert settings
    assert {k for _, k, _ in settings} >= {"ICEFLOE_INGESTOR_PLAINTEXT",
                                           "ICEFLOE_COLLECTOR_PLAINTEXT"}
    empty = write_toml(tmp_path, "")
    sections = [f.name for f in msgspec.structs.fields(Config)
                if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct)]
    for where, name, value in settings:
        section, key = next((s, name[len(f"ICEFLOE_{s.upper()}_"):].lower())
                            for s in sections if name.startswith(f"ICEFLOE_{s.upper()}_"))
        what = f"{where}: {name}={value!r}"
        assert "${" not in value, f"{what} (Terraform values are evaluated)"
        # an OTLP port is refused with [otlp] off: it comes with ICEFLOE_OTLP_ENABLED
        companion = {"ICEFLOE_OTLP_ENABLED": "true"} if "_OTLP_" in name else {}
        config = load_config(empty, env={**companion, name: value})
        actual = getattr(getattr(config, section), key)
        if isinstance(actual, tuple):  # lists come comma-separated from the environment
            actual = ",".join(actual)
        if isinstance(actual, float):  # "300" sets 300.0
            assert actual == float(value), what
            continue
        assert (str(actual).lower() if isinstance(actual, bool) else str(actual)) == value, what


def icefloe_argv() -> Iterator[tuple[str, list[str]]]:
    """Every icefloe command line the deploy files run."""
    for name, svc in icefloe_services().items():
        yield f"compose service {name}", svc["command"]
    for name, deployment in k8s_deployments().items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert "command" not in container, "keep the image's entrypoint (tini, icefloe)"
            yield f"kubernetes {name}", container["args"]
    for name, argv in tf_locals().items():
        if name.endswith("_command"):
            yield f"terraform local.{name}", argv
    for path in deploy_files(".md"):
        for lang, block in re.findall(r"```(\w*)\n(.*?)```", path.read_text(), re.S):
            if lang not in ("", "sh", "bash", "console"):
                continue  # a toml or yaml example
            for line in block.replace("\\\n", " ").splitlines():
                tokens = shlex.split(line, comments=True)
                for i, token in enumerate(tokens):
                    after_flag = i > 0 and tokens[i - 1].startswith("-")  # kubectl -n icefloe
                    if (token == "icefloe" or token.endswith("/icefloe")) and not after_flag:
                        rest = tokens[i + 1:]
                        stop = next((j for j, t in enumerate(rest)
                                     if t in ("|", "||", "&&", ";", ">")), len(rest))
                        if rest[:stop]:
                            yield f"{path.relative_to(ROOT)}: {line.strip()}", rest[:stop]


def test_should_run_only_real_icefloe_commands_and_flags():
    seen = list(icefloe_argv())
    assert {argv[0] for _, argv in seen} >= {"ingestor", "collector"}
    for where, argv in seen:
        parse_cli(argv, where)
    roles = {argv[0] for where, argv in seen if not where.startswith("deploy/")}
    assert {"ingestor", "collector"} <= roles <= {"ingestor", "collector", "admin"}


def test_should_use_one_icefloe_image_everywhere():
    """One version everywhere: the collector target's image, and in Compose the slim
    ingestor target's for the ingestors."""
    for name, svc in icefloe_services().items():
        assert svc["image"] == (INGESTOR_IMAGE if name.startswith("ingestor") else IMAGE), name
    assert f"-t {INGESTOR_IMAGE} " in DOCKERFILE.read_text()
    images = {c["image"] for d in k8s_deployments().values()
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {IMAGE}
    (kustomization,) = yaml_docs(K8S_BASE / "kustomization.yaml")
    assert kustomization["images"] == [{"name": IMAGE_NAME, "newTag": __version__}]
    variables = dict(tf_blocks("variable"))
    assert f"{variables['name']['default']}:{variables['image_tag']['default']}" == IMAGE
    assert f"-t {IMAGE} " in DOCKERFILE.read_text()


def test_should_pin_every_third_party_image_by_tag():
    for name, svc in compose()["services"].items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo, f"{name}: {image}"
        assert tag not in ("", "latest"), f"{name}: pin {image} by tag"


# --- checkov -----------------------------------------------------------------------------

def listed_checks() -> dict[str, str]:
    checks: dict[str, str] = {}
    for line in CHECKS_FILE.read_text().splitlines():
        check, _, comment = line.partition("#")
        check = check.strip()
        if check:
            assert re.fullmatch(r"CKV2?_[A-Z0-9]+_\d+", check), line
            assert comment.strip(), f"{check}: say what it guards"
            assert check not in checks, f"{check} is listed twice"
            checks[check] = comment.strip()
    return checks


def checkov_binary() -> Path:
    path = Path(os.environ.get("ICEFLOE_CHECKOV")
                or ROOT / ".venv" / "tools" / "checkov" / "bin" / "checkov")
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"checkov is not installed at {path}: run `make test` (it installs "
                    "checkov into .venv/tools/checkov, apart from the project's venv), or "
                    "point ICEFLOE_CHECKOV at a checkov binary", pytrace=False)
    return path


@pytest.fixture(scope="module")
def checkov_report() -> dict[str, dict[str, Any]]:
    """One offline checkov run over deploy/ with exactly the listed checks, per framework."""
    binary = checkov_binary()
    env = {**os.environ,
           "BC_SKIP_MAPPING": "TRUE",  # no download of the guideline/ID mapping
           "CKV_SKIP_PACKAGE_UPDATE_CHECK": "TRUE"}  # no PyPI version check
    for secret in ("BC_API_KEY", "PRISMA_API_URL"):
        env.pop(secret, None)
    command = [str(binary), "--directory", str(DEPLOY),
               "--framework", *CHECKOV_FRAMEWORKS,
               "--check", ",".join(listed_checks()),
               "--skip-download", "--download-external-modules", "false",
               "--output", "json"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300, check=False)
    try:
        parsed = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov exited {result.returncode} without a JSON report:\n"
                    f"{result.stderr[-3000:]}\n{result.stdout[-2000:]}")
    reports = parsed if isinstance(parsed, list) else [parsed]
    return {r["check_type"]: r for r in reports}


def test_should_list_25_to_45_checks_across_the_frameworks():
    checks = listed_checks()
    assert 25 <= len(checks) <= 45
    prefixes = {c.split("_")[1] for c in checks}
    assert prefixes == {"AWS", "K8S", "DOCKER"}


def test_should_pass_every_listed_checkov_check(checkov_report):
    assert set(checkov_report) == set(CHECKOV_FRAMEWORKS), set(checkov_report)
    passed: dict[str, int] = {}
    failed: list[str] = []
    for framework, report in checkov_report.items():
        summary = report["summary"]
        assert summary["parsing_errors"] == 0, (framework, report["results"])
        results = report["results"]
        for check in results["passed_checks"]:
            passed[check["check_id"]] = passed.get(check["check_id"], 0) + 1
        failed += [f"{c['check_id']} ({c['check_name']}) on {c['resource']} in "
                   f"{c['file_path']}" for c in results["failed_checks"]]
    assert failed == [], "checkov checks failed:\n" + "\n".join(failed)
    never = sorted(set(listed_checks()) - set(passed))
    assert never == [], f"listed checks that never ran or passed on any resource: {never}"


def test_should_justify_every_checkov_skip(checkov_report):
    for report in checkov_report.values():
        for check in report["results"]["skipped_checks"]:
            reason = check.get("check_result", {}).get("suppress_comment", "")
            assert len(reason) > 20, f"{check['check_id']} on {check['resource']}: say why"


def test_should_scan_all_the_deploy_files(checkov_report):
    assert checkov_report["dockerfile"]["summary"]["resource_count"] >= 1
    kinds = {c["resource"].split(".")[0]
             for c in checkov_report["kubernetes"]["results"]["passed_checks"]}
    assert "Deployment" in kinds
    files = {Path(c["file_path"]).name
             for c in checkov_report["terraform"]["results"]["passed_checks"]}
    assert {"s3.tf", "iam.tf", "ecs.tf", "lb.tf", "catalog.tf"} <= files
