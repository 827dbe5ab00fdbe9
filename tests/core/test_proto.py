"""The checked-in gRPC modules are exactly what ``scripts/gen-proto.sh`` makes of the proto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("ingest_pb2.py", "ingest_pb2_grpc.py", "ingest_pb2.pyi")


def test_should_match_the_proto_byte_for_byte(tmp_path):
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen-proto.sh"), str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    produced = sorted(p.name for p in (tmp_path / "icefloe" / "v1").iterdir())
    assert produced == sorted(GENERATED)
    stale = [name for name in GENERATED
             if (tmp_path / "icefloe" / "v1" / name).read_bytes()
             != (ROOT / "icefloe" / "v1" / name).read_bytes()]
    assert not stale, (f"icefloe/v1/{', '.join(stale)} out of date with proto/: run "
                       "scripts/gen-proto.sh and commit the result")


def test_should_import_the_generated_modules_as_part_of_icefloe():
    from icefloe.v1 import ingest_pb2, ingest_pb2_grpc

    assert ingest_pb2.DESCRIPTOR.package == "icefloe.v1"
    assert ingest_pb2_grpc.IngestStub is not None
    assert set(ingest_pb2.DESCRIPTOR.services_by_name["Ingest"].methods_by_name) == {
        "Publish", "PublishStream"}


def test_should_keep_proto_sources_out_of_the_python_packages():
    assert not list((ROOT / "proto").rglob("*.py"))
    assert "icefloe/v1/*_pb2" not in (ROOT / ".gitignore").read_text()
