#!/usr/bin/env bash
# Regenerate the Python modules of proto/icefloe/v1/*.proto into icefloe/v1/.
#
# Usage: scripts/gen-proto.sh [OUT_DIR]   (default: the repository root)
# Needs grpcio-tools and googleapis-common-protos (for google/rpc/status.proto), both in
# the `dev` extra. The generated files are checked in; tests/core/test_proto.py regenerates them
# into a temporary directory and fails if they differ.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
# The site-packages directory that holds google/rpc/status.proto (googleapis-common-protos).
common="$("$python" -c 'import os, google.rpc.status_pb2 as m; print(os.path.dirname(os.path.dirname(os.path.dirname(m.__file__))))')"
cd "$root"
"$python" -m grpc_tools.protoc -Iproto -I"$common" \
  --python_out="$out" --grpc_python_out="$out" --pyi_out="$out" \
  proto/icefloe/v1/*.proto
