"""buf lint is clean and buf breaking finds nothing against the committed baseline image.

Why in the suite: a renamed service or a renumbered field compiles and passes every Python
test (client and server are regenerated together) while every deployed client breaks. The
checks run ``scripts/buf-check.sh`` (buf's protoc plugins; buf itself comes from npm into
``.venv/tools/buf``, or ``$ICEFLOE_BUF_DIR``). Each check is also shown to fail on a copy of
the proto with a defect, so a config that disabled the rules could not pass silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "buf-check.sh"
PROTO = ROOT / "proto" / "icefloe" / "v1" / "ingest.proto"


def buf_dir() -> Path:
    return Path(os.environ.get("ICEFLOE_BUF_DIR") or ROOT / ".venv" / "tools" / "buf")


@pytest.fixture(scope="module")
def buf_env() -> dict[str, str]:
    """The environment the script runs in, with buf installed (once) from npm."""
    env = {**os.environ, "PYTHON": sys.executable, "ICEFLOE_BUF_DIR": str(buf_dir())}
    plugin = buf_dir() / "node_modules" / ".bin" / "protoc-gen-buf-lint"
    if not plugin.exists():
        if shutil.which("npm") is None:
            pytest.skip("buf is not installed and npm is not on PATH to install it")
        result = run(["lint"], env, ROOT)
        if result.returncode == 3:
            pytest.skip(f"npm could not install buf: {result.stderr.strip()[-300:]}")
    return env


def run(args: list[str], env: dict[str, str], root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(root / "scripts" / "buf-check.sh"), *args],
                          capture_output=True, text=True, timeout=300, check=False, env=env)


def copy_of_repo(tmp_path: Path) -> Path:
    """The proto folder and the script in a scratch tree, to break on purpose."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    return tmp_path


def test_should_pass_buf_lint(buf_env):
    result = run(["lint"], buf_env, ROOT)
    assert result.returncode == 0, result.stderr + result.stdout


def test_should_not_break_the_baseline(buf_env):
    result = run(["breaking"], buf_env, ROOT)
    assert result.returncode == 0, result.stderr + result.stdout


def test_should_catch_a_breaking_change_against_the_baseline(buf_env, tmp_path):
    root = copy_of_repo(tmp_path)
    proto = root / "proto" / "icefloe" / "v1" / "ingest.proto"
    text = proto.read_text()
    proto.write_text(text.replace("uint32 accepted = 1;", "uint64 accepted = 1;")
                     .replace("string request_id = 2;", "string request_id = 5;"))
    result = run(["breaking"], buf_env, root)
    assert result.returncode == 1, result.stderr
    assert 'changed type from "uint32" to "uint64"' in result.stderr
    assert "request_id" in result.stderr


def test_should_catch_a_lint_violation_outside_the_v1_exceptions(buf_env, tmp_path):
    root = copy_of_repo(tmp_path)
    proto = root / "proto" / "icefloe" / "v1" / "ingest.proto"
    proto.write_text(proto.read_text() + "\nmessage badName {\n  string SomeField = 1;\n}\n")
    result = run(["lint"], buf_env, root)
    assert result.returncode == 1, result.stderr
    assert "badName" in result.stderr
    assert "SomeField" in result.stderr


def test_should_declare_go_and_java_packages():
    from icefloe.v1 import ingest_pb2

    options = ingest_pb2.DESCRIPTOR.GetOptions()
    assert options.go_package.endswith("/icefloe/v1;icefloev1")
    assert options.java_package.endswith(".v1")
    assert options.java_multiple_files is True
    assert options.java_outer_classname == "IngestProto"


def test_should_keep_a_baseline_image_of_every_proto_file():
    from google.protobuf import descriptor_pb2

    image = descriptor_pb2.FileDescriptorSet.FromString(
        (ROOT / "proto" / "baseline.binpb").read_bytes())
    files = {f.name for f in image.file}
    sources = {str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto")}
    assert sources <= files, "a proto file has no baseline: scripts/buf-check.sh baseline"
    assert "google/rpc/status.proto" in files  # imports inside: the image stands alone
    (ingest,) = [f for f in image.file if f.name == "icefloe/v1/ingest.proto"]
    assert [s.name for s in ingest.service] == ["Ingest"]
