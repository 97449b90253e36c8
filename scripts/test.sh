#!/usr/bin/env bash
# Set everything up from nothing (venv, packages, a local etcd and Redis), then lint, type-check and test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/services.sh start
trap 'scripts/services.sh stop' EXIT
.venv/bin/ruff check reach_plugins transports tests benchmarks examples
.venv/bin/mypy reach_plugins transports
.venv/bin/pytest "$@"
