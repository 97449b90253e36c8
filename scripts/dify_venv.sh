#!/usr/bin/env bash
# The dify-plugin SDK's own venv, .venv-dify (Python 3.12): its pins conflict with ours (DESIGN.md section 11).
# reach-plugins goes in as a wheel built with `python -m build`, the route examples/dify_plugin/README.md documents.
# Idempotent: the venv is made once; the wheel is rebuilt and reinstalled on every run, so it matches the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
DIFY_PLUGIN=dify-plugin==0.10.2

python312() {
  local candidate
  for candidate in "${DIFY_PYTHON:-}" python3.12 "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12*/bin/python3.12; do
    if [[ -n "$candidate" ]] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  if command -v uv >/dev/null; then
    uv python find 3.12 2>/dev/null && return 0
  fi
  return 1
}

if [[ ! -x .venv-dify/bin/python ]]; then
  if ! PYTHON312=$(python312); then
    echo "dify_venv.sh: no Python 3.12 found (set DIFY_PYTHON); the real dify-plugin tests cannot run" >&2
    exit 0
  fi
  "$PYTHON312" -m venv .venv-dify
fi
pip_install() { .venv-dify/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install "$DIFY_PLUGIN" build
rm -rf .venv-dify/dist build  # a stale build/lib would put deleted modules into the wheel
if ! .venv-dify/bin/python -m build --wheel --outdir .venv-dify/dist . >.venv-dify/build.log 2>&1; then
  cat .venv-dify/build.log >&2
  exit 1
fi
wheel=$(ls .venv-dify/dist/reach_plugins-*.whl)
pip_install "$DIFY_PLUGIN" "${wheel}[dify]"
pip_install --force-reinstall --no-deps "$wheel"
