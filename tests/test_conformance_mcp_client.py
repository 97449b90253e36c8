"""The MCP conformance harness's client scenarios, run against our mcp client and against the official SDK's.

The harness is npm ``@modelcontextprotocol/conformance`` 0.2.0-alpha.11 (commit c321dd3), installed by
``scripts/setup.sh`` into ``.mcp-conformance/`` with a Node 22 from npm. Every client scenario the harness
lists is run once per client, a few at a time; a scenario counts as green when it reported checks and none failed
or warned. Both rows are printed; the test fails when ours passes fewer scenarios than the official client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from peer_servers import PEER_PYTHON, PEERS, ROOT
from servers import _missing

HARNESS = ROOT / ".mcp-conformance" / "node_modules" / ".bin"
CLIENTS = PEERS / "mcp_conformance"
OURS = f"{sys.executable} {CLIENTS / 'reach_client.py'}"
OFFICIAL = f"{PEER_PYTHON} {CLIENTS / 'python_sdk_client.py'}"
WORKERS = 4
SCENARIO_MS = 60_000


@dataclass(frozen=True, slots=True)
class Row:
    """One client's result: scenarios green of those that reported checks, and checks passed / failed."""

    green: int
    run: int
    passed: int
    failed: int
    red: tuple[str, ...]


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{HARNESS}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}


def scenarios() -> list[str]:
    listed = subprocess.run(
        ["conformance", "list", "--client"], env=_env(), capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [line.split()[1] for line in listed.splitlines() if line.startswith("  - ")]


def _checks(command: str, scenario: str, out: Path) -> list[dict[str, object]]:
    subprocess.run(
        [
            "conformance",
            "client",
            "--command",
            command,
            "--scenario",
            scenario,
            "--timeout",
            str(SCENARIO_MS),
            "-o",
            str(out),
        ],
        env=_env(),
        capture_output=True,
        timeout=SCENARIO_MS / 1000 + 60,
        check=False,
    )
    found = sorted(out.rglob("checks.json"))
    return json.loads(found[-1].read_text()) if found else []


def run_suite(command: str, names: list[str]) -> Row:
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda pair: _checks(command, pair[1], Path(tmp) / str(pair[0])), enumerate(names)))
    green, run, passed, failed, red = 0, 0, 0, 0, []
    for name, checks in zip(names, results, strict=True):
        statuses = [check.get("status") for check in checks]
        if not statuses:
            continue
        run += 1
        passed += statuses.count("SUCCESS")
        failed += statuses.count("FAILURE")
        if "FAILURE" in statuses or "WARNING" in statuses:
            red.append(name)
        else:
            green += 1
    return Row(green, run, passed, failed, tuple(red))


def test_our_mcp_client_passes_as_many_scenarios_as_the_official_client() -> None:
    """Every client scenario of the pinned harness: ours green on at least as many as python-sdk's client."""
    if not (HARNESS / "conformance").exists() or not PEER_PYTHON.exists():
        _missing("the MCP conformance harness or .venv-peers is missing (scripts/setup.sh installs them)")
    names = scenarios()
    assert len(names) >= 40
    ours, official = run_suite(OURS, names), run_suite(OFFICIAL, names)
    for label, row in (("reach mcp client", ours), ("python-sdk client", official)):
        print(f"{label:18} scenarios {row.green}/{row.run}  checks {row.passed} passed / {row.failed} failed")
        print(f"{'':18} red: {', '.join(row.red) or '-'}")
    assert official.run > 0
    assert ours.green >= official.green, f"ours {ours.green} < official {official.green}: {ours.red}"
