#!/usr/bin/env bash
# The main job: set everything up, then run the demo on the embedded default (no servers, no API key).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/reach demo "$@"
