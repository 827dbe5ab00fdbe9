"""The container image, by execution: what its Dockerfile copies really builds and starts.

No Docker daemon runs here, so the build is replayed on the files it would see: the context
is this checkout filtered by ``deploy/docker/Dockerfile.dockerignore`` (the ``docker``
package's ``exclude_paths`` applies the rules as the Docker CLI does), and of that only what
the build stage's ``COPY`` instructions name is copied. The wheel is built from that copy.

- fast: the copy holds every package the wheel ships, and the wheel built from it imports
  each role's entry module (this caught the admin API's package missing from the image);
- slow: that wheel installed with constraints.txt into clean virtualenvs, one per image
  target (``[ingestor]``, ``[all]``), and every role the entrypoint runs started to
  readiness against a moto S3 server.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from docker.utils.build import exclude_paths
from packaging_support import (
    HEAVY,
    ROOT,
    Venv,
    build_wheel,
    make_venv,
    quiet_env,
)
from process_support import Child

DOCKER = ROOT / "deploy" / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
DOCKERIGNORE = DOCKER / "Dockerfile.dockerignore"

ROLE_MODULES = {
    "ingestor": "ingestor.server",
    "collector": "collector.service",
    "admin": "icefloe_app.api.server",
    "probe": "icefloe_app.cli.probe_cmd",
}
"""The commands the images run (compose, Kubernetes, ECS, the health check) and the module
each one starts from."""


@dataclass
class Stage:
    """One ``FROM ... AS name`` block: its working directory and its context COPYs."""

    name: str
    workdir: str = "/"
    copies: list[tuple[list[str], str]] = field(default_factory=list)


def stages() -> list[Stage]:
    """The Dockerfile's stages with the COPY instructions that read the build context."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out: list[Stage] = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        args = rest.split()
        if word == "FROM":
            out.append(Stage(args[-1] if "AS" in args else args[0]))
        elif word == "WORKDIR":
            out[-1].workdir = args[0]
        elif word == "COPY" and not any(a.startswith("--from") for a in args):
            paths = [a for a in args if not a.startswith("--")]
            out[-1].copies.append((paths[:-1], paths[-1]))
    return out


def admitted() -> set[str]:
    """Relative paths (files and folders) of this checkout that reach the builder."""
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    return set(exclude_paths(str(ROOT), patterns))


def build_stage_copy(dest: Path) -> None:
    """Lay out under ``dest`` what the ``build`` stage's COPYs put in its WORKDIR."""
    (stage,) = [s for s in stages() if s.name == "build"]
    context = admitted()
    for sources, target in stage.copies:
        for source in sources:
            source = source.rstrip("/")
            if source not in context:
                continue  # the builder would fail here; the file-set asserts say which
            inside = {p for p in context if p == source or p.startswith(source + "/")}
            base = _destination(stage.workdir, target, source, len(sources) > 1)
            for rel in inside:
                if (ROOT / rel).is_file():
                    tail = rel[len(source):].lstrip("/")
                    out = dest / base / tail if tail else dest / base
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes((ROOT / rel).read_bytes())


def _destination(workdir: str, target: str, source: str, many: bool) -> str:
    """Where COPY puts ``source`` relative to the work dir (Docker's rules: a target ending
    in ``/`` or a COPY of several sources is a folder; a file goes inside it)."""
    assert workdir.startswith("/"), workdir
    assert target.startswith("./"), f"COPY to {target}: the test reads ./-relative targets"
    rel = target[2:]
    if (target.endswith("/") or many) and (ROOT / source).is_file():
        return str(Path(rel) / Path(source).name)
    return rel.rstrip("/") or "."


def wheel_packages() -> list[str]:
    """The top-level packages pyproject ships (``[tool.hatch.build.targets.wheel]``)."""
    hatch = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]
    return list(hatch["build"]["targets"]["wheel"]["packages"])


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the image's build stage makes, from exactly the files it gets (the compiled
    loops left out: the image compiles its own; the slow test does too)."""
    src = tmp_path_factory.mktemp("image-src")
    build_stage_copy(src)
    return build_wheel(src, tmp_path_factory.mktemp("image-wheel"))


def test_should_copy_every_package_and_build_input_the_wheel_needs(tmp_path):
    build_stage_copy(tmp_path)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    hatch = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = [*wheel_packages(), *hatch.get("force-include", {}), project["project"]["readme"],
              *project["project"].get("license-files", []), "constraints.txt",
              *[hook["path"] for hook in hatch.get("hooks", {}).values()]]
    missing = [path for path in needed if not (tmp_path / path).exists()]
    assert not missing, f"the image's build stage does not get {missing}"
    for package in wheel_packages():
        sources = {p.relative_to(ROOT / package) for p in (ROOT / package).rglob("*.py")
                   if "__pycache__" not in p.parts}
        copied = {p.relative_to(tmp_path / package) for p in (tmp_path / package).rglob("*.py")}
        assert sources == copied, f"{package}/: not copied: {sorted(map(str, sources - copied))}"


def test_should_leave_build_outputs_of_the_checkout_out_of_the_image():
    context = admitted()
    assert not [p for p in context if "__pycache__" in p or p.endswith((".so", ".pyc"))]
    assert not [p for p in context if p.split("/")[0] in ("tests", "testing", "bench", ".venv")]


def test_should_import_every_role_from_the_wheel_the_image_builds(image_wheel, tmp_path):
    with zipfile.ZipFile(image_wheel) as archive:
        archive.extractall(tmp_path / "site")
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert set(wheel_packages()) <= tops, f"the wheel lacks {set(wheel_packages()) - tops}"
    code = ("import importlib, json, sys; print(json.dumps({m: importlib.import_module(m)"
            ".__file__ for m in sys.argv[1:]}))")
    result = subprocess.run([sys.executable, "-c", code, *ROLE_MODULES.values()],
                            cwd=tmp_path, capture_output=True, text=True, check=False,
                            env=quiet_env(PYTHONPATH=str(tmp_path / "site")))
    assert result.returncode == 0, result.stderr[-2000:]
    for module, path in json.loads(result.stdout).items():
        assert Path(path).is_relative_to(tmp_path / "site"), (module, path)


def test_should_offer_the_roles_the_entrypoint_runs():
    """Every command the image's CMDs and health check name is one the tests start."""
    cmds = re.findall(r'^CMD \["(\w+)"\]', DOCKERFILE.read_text(), re.MULTILINE)
    assert set(cmds) == {"ingestor", "collector"}
    health = (DOCKER / "healthcheck.py").read_text()
    roles = set(re.findall(r'^    "(\w+)": \(', health, re.MULTILINE))
    assert roles | set(cmds) <= set(ROLE_MODULES)
    assert 'exec icefloe "$@"' in (DOCKER / "entrypoint.sh").read_text()


def test_should_keep_java_and_spark_out_of_the_ingestor_image():
    code = "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    blocks = re.split(r"^FROM ", code, flags=re.MULTILINE)
    by_name = {block.split()[2]: block for block in blocks[1:]}
    slim = by_name["ingestor"] + by_name["runtime"] + by_name["env-ingestor"]
    for heavy in ("openjdk", "[all]", "[collector]", "pyspark", "pyarrow"):
        assert heavy not in slim, f"the ingestor image gets {heavy}"
    assert "[ingestor]" in by_name["env-ingestor"]
    assert "openjdk-17-jre-headless" in by_name["collector"]
    assert "-c /wheels/constraints.txt" in by_name["env-ingestor"]
    assert "-c /wheels/constraints.txt" in by_name["env-all"]
    assert "FROM runtime AS ingestor" in DOCKERFILE.read_text()


# --- slow: the wheel installed as each image installs it, every role started -------------

def _s3_config(root: Path, endpoint: str, bucket: str, token_hash: str) -> Path:
    """One config for every role: S3 (moto) store, SQLite catalog, free ports."""
    path = root / "icefloe.toml"
    path.write_text(f"""
[store]
url = "s3://{bucket}/data/"
endpoint_url = "{endpoint}"
region = "us-east-1"
[catalog]
uri = "sqlite:///{root / 'catalog.db'}"
warehouse = "{(root / 'warehouse').as_uri()}"
[ingestor]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
kafka_port = 0
[collector]
host = "127.0.0.1"
metrics_port = 0
commit_interval_s = 0.5
spark_driver_memory = "1g"
[admin]
port = 0
tokens = ["{token_hash}"]
[[streams]]
name = "clicks"
table = "web.clicks"
columns = [{{ name = "id", type = "string", required = true }}]
""")
    return path


def _start(venv: Venv, role: str, config: Path, tmp: Path) -> tuple[Child, dict]:
    """``icefloe ROLE`` from the venv's console script (as the entrypoint runs it)."""
    child = Child([role, "--config", str(config), "--log-format", "text"], tmp,
                  tmp / f"{role}.log", command=[venv.icefloe],
                  env=quiet_env(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=venv.python))
    return child, child.ready()


@pytest.fixture(scope="module")
def compiled_image_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As the build stage does: compile the loops in the copy, then build the wheel."""
    src = tmp_path_factory.mktemp("image-src-compiled")
    build_stage_copy(src)
    subprocess.run([sys.executable, "scripts/build_speedups.py"], cwd=src, check=True)
    return build_wheel(src, tmp_path_factory.mktemp("image-wheel-compiled"))


@pytest.mark.slow
def test_should_start_the_ingestor_image_env_without_spark(compiled_image_wheel, tmp_path,
                                                           s3_bucket):
    venv = make_venv(tmp_path / "venv", f"{compiled_image_wheel}[ingestor]")
    assert not set(HEAVY) & venv.installed(), "the ingestor image installs no Spark/pyarrow"
    config = _s3_config(tmp_path, s3_bucket.endpoint_url, s3_bucket.bucket, _token_hash())
    child, ready = _start(venv, "ingestor", config, tmp_path)
    try:
        r = httpx.get(f"http://127.0.0.1:{ready['http_port']}/readyz", timeout=10)
        assert r.status_code == 200, r.text
        # the Kafka listener with only [ingestor]'s packages: every codec a producer may use
        for codec in KAFKA_CODECS:
            assert _produce(ready["kafka_port"], codec) == [None] * 3, codec
    finally:
        child.close()
    refused = subprocess.run([venv.icefloe, "collector", "--config", str(config)],
                             capture_output=True, text=True, env=quiet_env(), check=False)
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("icefloe collector needs the [collector] extra: "
                                      "pip install 'icefloe[collector]'")
    print(f"\ningestor env: {venv.size_mib():.0f} MiB, install {venv.install_s:.0f} s")


@pytest.mark.slow
def test_should_start_every_role_of_the_collector_image_env(compiled_image_wheel, tmp_path,
                                                            s3_bucket):
    venv = make_venv(tmp_path / "venv", f"{compiled_image_wheel}[all]")
    compiled = subprocess.run([venv.python, "-c", "from icefloe.formats.speedups import compiled; "
                               "assert compiled; from icefloe.otlp.wire import compiled; "
                               "assert compiled"], cwd=tmp_path, check=False)
    assert compiled.returncode == 0, "the image's wheel carries the compiled loops"
    config = _s3_config(tmp_path, s3_bucket.endpoint_url, s3_bucket.bucket, _token_hash())
    probe = subprocess.run([venv.icefloe, "probe", "--store", s3_bucket.url, "--endpoint-url",
                            s3_bucket.endpoint_url, "--region", "us-east-1"], cwd=tmp_path,
                           capture_output=True, text=True, env=quiet_env(), check=False)
    assert probe.returncode == 0, probe.stderr
    children = []
    try:
        for role in ("ingestor", "admin", "collector"):
            child, ready = _start(venv, role, config, tmp_path)
            children.append(child)
            port = ready.get("http_port") or ready.get("port") or ready.get("metrics_port")
            path = "/readyz" if role == "ingestor" else "/healthz"
            r = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=30)
            assert r.status_code == 200, (role, r.status_code, r.text)
    finally:
        for child in children:
            child.close()
    print(f"\nall env: {venv.size_mib():.0f} MiB, install {venv.install_s:.0f} s")


KAFKA_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
"""librdkafka's compression.type values: the record batch codecs the listener decodes."""


def _produce(port: int, codec: str) -> list[str | None]:
    """Three records in one compressed batch from an idempotent producer: each record's
    delivery error, None once acknowledged."""
    from confluent_kafka import Producer  # why: only the Kafka check needs the client

    errors: list[str | None] = []
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True,
                         "compression.type": codec, "linger.ms": 20,
                         "message.timeout.ms": 30000})
    for i in range(3):
        producer.produce("clicks", json.dumps({"id": f"{codec}-{i}"}).encode(),
                         on_delivery=lambda err, _msg: errors.append(str(err) if err else None))
    assert producer.flush(40) == 0, f"{codec}: records left undelivered"
    return errors


def _token_hash() -> str:
    from icefloe.tokens import hash_token, new_token

    return hash_token(new_token(), log2_n=10)
