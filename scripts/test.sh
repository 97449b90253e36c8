#!/usr/bin/env bash
# Set everything up from nothing, then lint, type-check and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check reach_plugins transports tests benchmarks examples
.venv/bin/mypy reach_plugins transports
.venv/bin/pytest "$@"
