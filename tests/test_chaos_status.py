"""Status that tells the truth (issue 28): a ``kill -9``-ed instance reads unavailable, with the reason, in the
gateway's ``GET /v1/agents`` and in ``reach agents`` — while its etcd lease is still alive.

The lease is 30 s here, so a view that only reads the registry (main before issue 28) keeps saying ``ready`` and
``alive: true``; only the probes of the process that routes know better.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from chaos_support import TOKEN, Cluster
from servers import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

LEASE = 30
PROBE_BOUND = 5.0 * 1.2 * 2 + 3.0
"""Two liveness probes (5 s apart, jitter at most +20 %) plus a round's tick and the first probe's start."""


def _instances(port: int) -> dict[str, dict[str, Any]]:
    answer = httpx.get(f"http://127.0.0.1:{port}/v1/agents", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
    answer.raise_for_status()
    return {inst["instance_id"]: inst for agent in answer.json()["agents"] for inst in agent["instances"]}


def _reach_agents(registry: str, *extra: str) -> str:
    """``reach agents`` run as its own process; its standard output."""
    done = subprocess.run(
        [sys.executable, "-m", "reach_plugins.cli", "agents", "--registry", registry, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    return done.stdout


def _cli(registry: str) -> dict[str, dict[str, Any]]:
    """``reach agents --json``, by instance."""
    listed = json.loads(_reach_agents(registry, "--json"))
    return {inst["instance_id"]: inst for agent in listed for inst in agent["instances"]}


def test_killed_instance_reads_unavailable_with_a_reason(etcd_url: str, tmp_path: Path) -> None:
    """SIGKILL one of two instances: within the probe bound the gateway's view and the CLI's say unavailable, why,
    and that the lease is still alive; the survivor stays available and its JSON has every field of the view."""
    prefix = uuid.uuid4().hex[:8]
    c = Cluster(tmp_path, f"{etcd_url}/status-{prefix}?lease_ttl={LEASE}", f"status-{prefix}")
    try:
        c.add_agents(2, "memory://", 0.01)
        _, port = c.hop("gateway", "memory://")
        dead, alive = (agent.instance_id for agent in c.agents)
        wait_until(lambda: len(_instances(port)) == 2, 10, "both instances listed")
        before = _instances(port)
        assert before[dead]["available"] and before[dead]["reason"] is None, before[dead]
        assert set(before[alive]) >= {"lease", "probe", "breaker", "ejected_for", "load", "pins", "reason"}
        assert "endpoint" not in before[alive]

        c.agents[0].kill()
        killed = time.monotonic()
        wait_until(lambda: not _instances(port)[dead]["available"], PROBE_BOUND, "gateway sees the instance down")
        took = time.monotonic() - killed
        seen = _instances(port)
        print(f"gateway view: unavailable {took:.1f}s after SIGKILL (bound {PROBE_BOUND:g}s): {seen[dead]['reason']}")
        assert seen[dead]["reason"].startswith("liveness probe failed"), seen[dead]
        assert seen[dead]["alive"] is False and seen[dead]["probe"]["ok"] is False
        assert seen[dead]["lease"]["alive"] is True, "the lease (30 s) must still be alive: the probe told"
        assert seen[alive]["available"] and seen[alive]["probe"]["ok"], seen[alive]

        listed = _cli(c.registry)
        assert listed[dead]["lease"]["alive"] is True
        assert listed[dead]["available"] is False, listed[dead]
        assert listed[dead]["reason"].startswith("liveness probe failed 2 time(s) in a row"), listed[dead]
        assert listed[alive]["available"] is True and listed[alive]["reason"] is None, listed[alive]
        rows = {line.split("│")[3].strip(): line for line in _reach_agents(c.registry).splitlines() if "│" in line}
        assert "unavailable: liveness probe failed 2 time(s) in a row" in rows[dead], rows
        assert "expired" not in rows[dead] and "unavailable" not in rows[alive], rows
    finally:
        c.stop()
