"""Packaging: the light client, the extras, the slim ingestor, the wheel's contents, the lock.

- ``pip install icefloe`` is the client: ``import icefloe.client`` loads no Spark, pyarrow,
  pyiceberg, pandas or numpy, and a clean venv with only that wheel publishes to a running
  ingestor over HTTP and gRPC; its ``icefloe`` command exits 2 naming the extra to install.
- the ingestor imports none of the collector's heavy modules: it is started to readiness
  (and takes events) with them made unimportable.
- the wheel ships LICENSE and ``py.typed``, and carries a platform tag exactly when the
  compiled loops are inside; constraints.txt pins everything ``icefloe[all]`` installs.
"""

from __future__ import annotations

import asyncio
import configparser
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import httpx
import pytest
from ingest_support import stored_events
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging_support import (
    BLOCKER,
    CONSTRAINTS,
    HEAVY,
    ROOT,
    build_wheel,
    make_venv,
    quiet_env,
)
from process_support import Child

from icefloe_app.cli.extras import COLLECTOR_MODULES, INGESTOR_MODULES

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

INGESTOR_CONFIG = """\
[store]
url = "{store}"
{store_extra}
[ingestor]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
[[streams]]
name = "clicks"
table = "web.clicks"
event_id_field = "id"
columns = [{{ name = "id", type = "string", required = true }}]
"""


def loaded_after(code: str) -> set[str]:
    """Top-level modules a fresh interpreter has loaded after running ``code``."""
    probe = code + ("\nimport sys, json\n"
                    "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, check=True, env=quiet_env())
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_should_import_the_client_without_spark_pyarrow_or_pyiceberg():
    loaded = loaded_after("import icefloe.client")
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    # nor anything else only an extra installs; aside: modules that grpc and httpx load
    # whenever they are installed (grpc_health, grpc_reflection, zstandard, grpc_tools)
    optional = {"zstandard", "grpc_health", "grpc_reflection", "grpc_tools"}
    assert not loaded & ((INGESTOR_MODULES | COLLECTOR_MODULES) - optional)


def _extra_distributions(extra: str) -> set[str]:
    """The distributions an extra names directly (self-references expanded)."""
    out: set[str] = set()
    for text in PROJECT["optional-dependencies"][extra]:
        req = Requirement(text)
        if canonicalize_name(req.name) == "icefloe":
            for inner in req.extras:
                out |= _extra_distributions(inner)
        else:
            out.add(canonicalize_name(req.name))
    return out


@pytest.mark.parametrize(("extra", "modules"), [("ingestor", INGESTOR_MODULES),
                                                ("collector", COLLECTOR_MODULES)])
def test_should_know_the_import_names_each_extra_brings(extra, modules):
    """The CLI names an extra only for modules it lists: every distribution an extra adds
    must be found there, or a light install would print a traceback instead."""
    by_dist: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        for dist in dists:
            by_dist.setdefault(canonicalize_name(dist), set()).add(module)
    base = {canonicalize_name(Requirement(t).name) for t in PROJECT["dependencies"]}
    own = _extra_distributions(extra) - base
    if extra == "collector":
        own -= _extra_distributions("ingestor")
    for dist in own:
        assert by_dist.get(dist, set()) & (INGESTOR_MODULES | COLLECTOR_MODULES), (
            f"{dist} ([{extra}]) imports as {sorted(by_dist.get(dist, ()))}: add one of them "
            "to icefloe_app/cli/extras.py")
    assert {"pyspark", "pyarrow", "pyiceberg", "pandas", "numpy"} <= COLLECTOR_MODULES


@pytest.mark.parametrize(("blocked", "argv", "line"), [
    ("sqlglot,zstandard", ["ingestor"],
     "icefloe ingestor needs the [ingestor] extra: pip install 'icefloe[ingestor]'"),
    ("pyspark", ["collector", "--config", "{config}"],
     "icefloe collector needs the [collector] extra: pip install 'icefloe[collector]'"),
    ("sqlglot", [], "the icefloe command needs the [all] extra: pip install 'icefloe[all]'"),
])
def test_should_name_the_extra_to_install_when_a_command_lacks_it(blocked, argv, line,
                                                                  tmp_path):
    config = tmp_path / "icefloe.toml"
    config.write_text(f'[store]\nurl = "{(tmp_path / "store").as_uri()}"\n')
    argv = [word.format(config=config) for word in argv]
    result = subprocess.run([sys.executable, "-c", BLOCKER, blocked, *argv], cwd=ROOT,
                            capture_output=True, text=True, env=quiet_env(), check=False,
                            timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == line


def test_should_start_the_ingestor_with_spark_pyarrow_and_pyiceberg_unimportable(tmp_path,
                                                                                s3_bucket):
    """Against S3 (moto), so the store's client libraries are loaded too; an event is
    acknowledged, so the flush path ran."""
    config = tmp_path / "icefloe.toml"
    config.write_text(INGESTOR_CONFIG.format(
        store=s3_bucket.url,
        store_extra=f'endpoint_url = "{s3_bucket.endpoint_url}"\nregion = "us-east-1"'))
    log = tmp_path / "ingestor.log"
    proc = subprocess.Popen([sys.executable, "-c", BLOCKER, ",".join(HEAVY), "ingestor",
                             "--config", str(config), "--log-format", "text"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=log.open("ab"), text=True,
                            env=quiet_env())
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "{}")
        assert ready.get("event") == "ready", log.read_text()[-3000:]
        url = f"http://127.0.0.1:{ready['http_port']}"
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        r = httpx.post(f"{url}/v1/streams/clicks/events", json=[{"id": "a"}], timeout=10)
        assert (r.status_code, r.json()) == (202, {"accepted": 1}), r.text
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log.read_text()[-3000:]


# --- the wheel -----------------------------------------------------------------------------

def _wheel_tag(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/WHEEL")]
        return next(line.split(": ", 1)[1] for line in archive.read(name).decode().splitlines()
                    if line.startswith("Tag: "))


def _source_copy(dest: Path, *, compiled: bool) -> Path:
    """What the wheel is built from, with or without the compiled loops."""
    dest.mkdir(parents=True)
    names = ["pyproject.toml", "README.md", "LICENSE", "hatch_build.py", "examples",
             *tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"][
                 "targets"]["wheel"]["packages"]]
    for name in names:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.c"))
        else:
            shutil.copy2(src, dest / name)
    if compiled:
        for so in [*(ROOT / "icefloe" / "formats").glob("_speedups*.so"),
                   *(ROOT / "icefloe" / "otlp").glob("_wire*.so")]:
            shutil.copy2(so, dest / so.relative_to(ROOT))
    return dest


def test_should_ship_license_and_py_typed_and_tag_the_wheel_for_its_contents(tmp_path):
    pure = build_wheel(_source_copy(tmp_path / "pure", compiled=False), tmp_path / "w1")
    assert _wheel_tag(pure) == "py3-none-any"
    with zipfile.ZipFile(pure) as archive:
        names = archive.namelist()
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert "Apache License" in archive.read(license_name).decode()
        metadata = archive.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert {"icefloe/py.typed", "icefloe_app/py.typed"} <= set(names)
    assert "License-Expression: Apache-2.0" in metadata
    if not list((ROOT / "icefloe" / "formats").glob("_speedups*.so")):
        pytest.skip("the compiled loops are not built here (scripts/build_speedups.py)")
    compiled = build_wheel(_source_copy(tmp_path / "compiled", compiled=True), tmp_path / "w2")
    with zipfile.ZipFile(compiled) as archive:
        shipped = archive.namelist()
    assert any(n.startswith("icefloe/otlp/_wire") and n.endswith(".so") for n in shipped)
    tag = _wheel_tag(compiled)
    assert tag.startswith(f"cp{sys.version_info.major}{sys.version_info.minor}-"), tag
    assert not tag.endswith("-any"), tag


def test_should_not_ship_the_chaos_harness_or_other_test_tooling(tmp_path):
    """The chaos harness and the simulator are test tooling (``testing/``): the wheel
    carries neither, nor a console script for them; ``icefloe`` is its only command."""
    source = _source_copy(tmp_path / "src", compiled=False)
    # built from a tree that has testing/ beside the packages, as a checkout does
    shutil.copytree(ROOT / "testing", source / "testing",
                    ignore=shutil.ignore_patterns("__pycache__"))
    wheel = build_wheel(source, tmp_path / "wheel")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        parser = configparser.ConfigParser()
        parser.read_string(archive.read(entry_points).decode())
    shipped = [n for n in names if n.startswith("testing/") or "/chaos/" in n or "/sim/" in n]
    assert shipped == [], shipped
    assert list(parser["console_scripts"]) == ["icefloe"], dict(parser["console_scripts"])


def test_should_pin_everything_icefloe_all_installs_within_pyproject_ranges():
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import constraints
    finally:
        sys.path.pop(0)
    wanted = constraints.closure()
    assert set(wanted) == set(pins), ("constraints.txt is stale (run scripts/constraints.py): "
                                      f"{sorted(set(wanted) ^ set(pins))}")
    for req in constraints.project_requirements():
        name = canonicalize_name(req.name)
        assert req.specifier.contains(pins[name], prereleases=True), (name, pins[name])
    # the lock is what this environment runs (make installs .venv with -c constraints.txt)
    drift = {n: (pins[n], v) for n, v in wanted.items() if pins[n] != v}
    assert not drift, f"constraints.txt differs from .venv: {drift}"


# --- the client-only install, in a clean virtualenv -----------------------------------------

CLIENT_SCRIPT = """\
import sys
from icefloe.client import GrpcClient, HttpClient
http_url, grpc_target = sys.argv[1], sys.argv[2]
with HttpClient(http_url) as client:
    assert client.send("clicks", [{"id": "h1"}, {"id": "h2"}]) == 2
grpc_client = GrpcClient(grpc_target)
assert grpc_client.publish("clicks", [{"id": "g1"}]) == 1
grpc_client.close()
print("sent")
"""


def test_should_publish_over_http_and_grpc_from_a_client_only_install(tmp_path):
    wheel = build_wheel(_source_copy(tmp_path / "src", compiled=False), tmp_path / "wheel")
    venv = make_venv(tmp_path / "venv", str(wheel))
    installed = venv.installed()
    assert not installed & {"pyspark", "pyarrow", "pyiceberg", "pandas", "numpy", "sqlglot",
                            "boto3", "uvicorn"}, sorted(installed)
    refused = subprocess.run([venv.icefloe, "ingestor"], capture_output=True, text=True,
                             cwd=tmp_path, env=quiet_env(), check=False, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.strip() == ("icefloe ingestor needs the [ingestor] extra: "
                                      "pip install 'icefloe[ingestor]'")
    store = (tmp_path / "store").as_uri()
    (tmp_path / "icefloe.toml").write_text(INGESTOR_CONFIG.format(store=store, store_extra=""))
    ingestor = Child(["ingestor", "--config", str(tmp_path / "icefloe.toml"), "--log-format",
                      "text"], ROOT, tmp_path / "ingestor.log")
    try:
        ready = ingestor.ready()
        sent = subprocess.run([venv.python, "-c", CLIENT_SCRIPT,
                               f"http://127.0.0.1:{ready['http_port']}",
                               f"127.0.0.1:{ready['grpc_port']}"],
                              cwd=tmp_path, capture_output=True, text=True, env=quiet_env(),
                              check=False, timeout=60)
        assert sent.returncode == 0, sent.stderr[-3000:]
    finally:
        assert ingestor.stop() == 0, ingestor.tail()
    ids = sorted(e.event_id for e in asyncio.run(stored_events(store)))
    assert ids == ["g1", "h1", "h2"]
    print(f"\nclient-only venv: {venv.size_mib():.0f} MiB, wheel "
          f"{wheel.stat().st_size / 1024:.0f} KiB, install {venv.install_s:.1f} s")
