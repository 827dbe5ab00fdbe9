#!/usr/bin/env bash
# buf's lint and breaking-change checks of proto/, run as protoc plugins.
#
# Usage: scripts/buf-check.sh lint       # proto/buf.yaml's lint rules; exit 1 on a finding
#        scripts/buf-check.sh breaking   # compare with proto/baseline.binpb; exit 1 if broken
#        scripts/buf-check.sh baseline   # rewrite proto/baseline.binpb (after a release only)
#
# Why protoc plugins rather than `buf lint` on the folder: ingest.proto imports
# google/rpc/status.proto, which `buf` would fetch from the Buf Schema Registry. protoc
# finds it in the googleapis-common-protos package already in the venv, and buf's plugins
# (protoc-gen-buf-lint, protoc-gen-buf-breaking) apply the same rules to what protoc read.
# buf comes from npm (@bufbuild/buf, pinned below) into .venv/tools/buf on first use, or
# from $ICEFLOE_BUF_DIR (a folder holding node_modules/.bin/protoc-gen-buf-*).
set -euo pipefail
BUF_VERSION=1.75.0
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
bufdir="${ICEFLOE_BUF_DIR:-$root/.venv/tools/buf}"
plugins="$bufdir/node_modules/.bin"
mode="${1:-}"

if [ ! -x "$plugins/protoc-gen-buf-lint" ] || [ ! -x "$plugins/protoc-gen-buf-breaking" ]; then
  command -v npm >/dev/null || { echo "buf-check: npm is needed to install buf" >&2; exit 3; }
  npm install --silent --no-audit --no-fund --prefix "$bufdir" "@bufbuild/buf@$BUF_VERSION" >&2 \
    || { echo "buf-check: npm could not install @bufbuild/buf@$BUF_VERSION" >&2; exit 3; }
fi

common="$("$python" -c 'import os, google.rpc.status_pb2 as m; print(os.path.dirname(os.path.dirname(os.path.dirname(m.__file__))))')"
config="$root/proto/buf.yaml"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
cd "$root"
protos=(proto/icefloe/v1/*.proto)
protoc=("$python" -m grpc_tools.protoc -Iproto -I"$common")

case "$mode" in
  lint)
    "${protoc[@]}" --plugin=protoc-gen-buf-lint="$plugins/protoc-gen-buf-lint" \
      --buf-lint_out="$out" --buf-lint_opt="{\"input_config\":\"$config\"}" "${protos[@]}"
    ;;
  breaking)
    "${protoc[@]}" --plugin=protoc-gen-buf-breaking="$plugins/protoc-gen-buf-breaking" \
      --buf-breaking_out="$out" \
      --buf-breaking_opt="{\"input_config\":\"$config\",\"against_input\":\"$root/proto/baseline.binpb\"}" \
      "${protos[@]}"
    ;;
  baseline)
    "${protoc[@]}" --include_imports --descriptor_set_out=proto/baseline.binpb "${protos[@]}"
    echo "wrote proto/baseline.binpb"
    ;;
  *)
    echo "usage: scripts/buf-check.sh lint|breaking|baseline" >&2
    exit 2
    ;;
esac
