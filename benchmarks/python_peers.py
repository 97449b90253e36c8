"""The Python gateways a team would otherwise pick, started for ``bench_hops.py``: LiteLLM's proxy and ContextForge.

Each runs from its own venv (``scripts/setup.sh --bench-peers`` builds
``.venv-litellm`` and ``.venv-contextforge``; their dependency trees clash
with ours) as one process with one worker, in front of the echo agent of
``peer_agent.py`` on 127.0.0.1. Telemetry and phone-home are off, the model
cost map is the bundled one, ContextForge keeps its default sqlite database in
the run's temporary directory, and both authenticate callers with the
credential set through their environment (LiteLLM's master key, a
ContextForge JWT minted with its own tool), as a deployment would.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LITELLM_KEY = "sk-bench"
CONTEXTFORGE_SECRET = "bench-only-jwt-secret-of-at-least-32-bytes"
CONTEXTFORGE_USER = "admin@example.com"
STARTUP_S = 120.0
"""Both import large trees (LiteLLM ~20 s here, ContextForge ~30 s with its migrations)."""

QUIET = {"PYTHONUNBUFFERED": "1", "NO_PROXY": "127.0.0.1,localhost", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True, slots=True)
class Peer:
    """A started peer: its process, the URL to POST to, the headers and body of one call."""

    process: subprocess.Popen[str]
    url: str
    headers: dict[str, str]
    body: dict[str, object]


def venv_python(name: str) -> Path | None:
    """The interpreter of ``.venv-NAME`` in this checkout, or None when ``setup.sh --bench-peers`` has not built it."""
    python = ROOT / f".venv-{name}" / "bin" / "python"
    return python if python.exists() else None


def wait_http(url: str, process: subprocess.Popen[str], timeout: float = STARTUP_S) -> None:
    """Block until ``url`` answers 200, failing fast when the process dies."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


def launch(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("w") as out:
        return subprocess.Popen(
            command, env={**os.environ, **QUIET, **env}, stdout=out, stderr=subprocess.STDOUT, text=True
        )


def litellm(python: Path, directory: Path, agent_port: int, port: int) -> Peer:
    """LiteLLM's proxy with one model, ``echo``, served by the echo agent's chat completions."""
    config = directory / "litellm.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            model_list:
              - model_name: echo
                litellm_params: {{model: openai/echo, api_base: "http://127.0.0.1:{agent_port}/v1", api_key: bench}}
            litellm_settings: {{telemetry: false}}
            general_settings: {{master_key: os.environ/LITELLM_MASTER_KEY}}
            """
        )
    )
    env = {
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
    }
    binary = python.parent / "litellm"
    command = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    process = launch(command, env, directory / "litellm.log")
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", process)
    message = {"model": "echo", "messages": [{"role": "user", "content": "A1"}]}
    return Peer(
        process, f"http://127.0.0.1:{port}/v1/chat/completions", {"Authorization": f"Bearer {LITELLM_KEY}"}, message
    )


def contextforge(python: Path, directory: Path, agent_port: int, port: int) -> Peer:
    """ContextForge with the echo agent as a Streamable HTTP gateway; calls are ``tools/call`` on ``/rpc``."""
    env = {
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "DATABASE_URL": f"sqlite:///{directory / 'contextforge.db'}",
        "JWT_SECRET_KEY": CONTEXTFORGE_SECRET,
        "AUTH_REQUIRED": "true",
        "PLATFORM_ADMIN_EMAIL": CONTEXTFORGE_USER,
        "PLATFORM_ADMIN_PASSWORD": "bench-Passw0rd!",
        "BASIC_AUTH_PASSWORD": "bench-Passw0rd!",
        "MCPGATEWAY_UI_ENABLED": "false",
        "MCPGATEWAY_ADMIN_API_ENABLED": "true",
        "SSRF_ALLOW_LOCALHOST": "true",
        "CACHE_TYPE": "memory",
        "PLUGINS_ENABLED": "false",
        "OBSERVABILITY_ENABLED": "false",
        "LOG_LEVEL": "ERROR",
        "HEALTH_CHECK_INTERVAL": "3600",
        "RATE_LIMITING_ENABLED": "false",  # its 100 tools/call a minute would refuse a benchmark, not time it
    }
    binary = python.parent / "mcpgateway"
    process = launch([str(binary), "--host", "127.0.0.1", "--port", str(port)], env, directory / "contextforge.log")
    wait_http(f"http://127.0.0.1:{port}/health", process)
    mint = [str(python), "-m", "mcpgateway.utils.create_jwt_token", "--username", CONTEXTFORGE_USER, "--exp", "120"]
    minted = subprocess.run(
        [*mint, "--secret", CONTEXTFORGE_SECRET], env={**os.environ, **env}, capture_output=True, text=True, check=True
    )
    headers = {"Authorization": f"Bearer {minted.stdout.strip().splitlines()[-1]}", "Content-Type": "application/json"}
    gateway = {"name": "bench", "url": f"http://127.0.0.1:{agent_port}/mcp", "transport": "STREAMABLEHTTP"}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/gateways", data=json.dumps(gateway).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        if answer.status not in (200, 201):
            raise RuntimeError(f"ContextForge refused the gateway registration: {answer.status}")
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "bench-echo", "arguments": {"order_id": "A1"}},
    }
    return Peer(process, f"http://127.0.0.1:{port}/rpc", headers, call)
