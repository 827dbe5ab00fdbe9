#!/bin/sh
# Container entrypoint: run `icefloe "$@"` (e.g. `ingestor`, `collector`), as PID 1's child
# under tini so Spark's Python workers are reaped and SIGTERM reaches icefloe.
#
# Where the config comes from:
#   - a mounted file named by ICEFLOE_CONFIG (docker compose, Kubernetes ConfigMap), or
#   - the whole file in CONFIG_TOML (AWS ECS, where task definitions cannot mount files):
#     it is written to $ICEFLOE_CONFIG (default /tmp/icefloe.toml, mode 0600) first.
set -eu

if [ -n "${CONFIG_TOML:-}" ]; then
  ICEFLOE_CONFIG="${ICEFLOE_CONFIG:-/tmp/icefloe.toml}"
  umask 077
  printf '%s\n' "$CONFIG_TOML" > "$ICEFLOE_CONFIG"
  export ICEFLOE_CONFIG
  unset CONFIG_TOML
fi

exec icefloe "$@"
