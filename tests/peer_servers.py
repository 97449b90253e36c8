"""Real peers built with their official SDKs, run from ``.venv-peers`` (built by ``scripts/setup.sh``).

The SDKs' pins conflict with ours, so each peer is a separate process started
with that virtualenv's Python: ``peer("a2a_server.py")`` runs
``tests/peers/a2a_server.py PORT`` and yields its base URL once it answers.
Without the virtualenv a test is skipped (a failure under ``CI=true``).
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
from servers import _missing, free_port, startup_seconds, wait_until

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(__file__).resolve().parent / "peers"
PEER_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
MCP1_PYTHON = ROOT / ".venv-mcp1" / "bin" / "python"
A2A03_PYTHON = ROOT / ".venv-a2a03" / "bin" / "python"
"""a2a-sdk 0.3 and 1.x cannot share a virtualenv: the 0.3 peer has its own."""
"""langchain-mcp-adapters still requires mcp<2: it has a virtualenv of its own."""


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=0.5)
    except httpx.HTTPError:
        return False
    return True


@contextlib.contextmanager
def peer(script: str, probe: str = "/", port: int | None = None, python: Path = PEER_PYTHON) -> Iterator[str]:
    """Run ``tests/peers/<script> PORT`` with ``python`` (the peers' venv; a free port by default); yield its URL."""
    if not python.exists():
        _missing(f"the virtualenv {python.parent.parent} is missing (scripts/setup.sh builds it)")
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen([str(python), str(PEERS / script), str(port)], stdout=log, stderr=log)
        try:
            wait_until(
                lambda: process.poll() is not None or _answers(url + probe), startup_seconds(), f"{script} start"
            )
            if process.poll() is not None:
                log.seek(0)
                output = log.read()[-2000:].decode(errors="replace")
                raise AssertionError(f"{script} exited with {process.returncode}: {output}")
            yield url
        finally:
            _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
