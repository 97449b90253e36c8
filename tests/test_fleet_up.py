"""``reach up FILE`` as an operator runs it (issue 28, deliverable 6): one command starts secured etcd, Redis, agent
instances, a gateway with workers and a node; calls go through both; Ctrl-C (SIGINT) stops every process."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from servers import startup_seconds

from reach_plugins import ReachClient
from transports.grpcnode import GrpcNodeTransport

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CLI = "from reach_plugins.cli import main; main()"
ROW = re.compile(r"│ (\S+)\s+│ (\S+)")


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` now (Linux ``/proc``)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except FileNotFoundError:
            continue
        for child in map(int, children):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def fleet_file(tmp_path: Path) -> Path:
    """The shipped example, with its state in the test's folder and paths made absolute."""
    doc = yaml.safe_load((EXAMPLES / "fleet.yaml").read_text())
    doc["config"] = str(EXAMPLES / doc["config"])
    doc["state"] = str(tmp_path / "state")
    doc["agents"] = {"orders": {"script": str(EXAMPLES / "agents/orders.py"), "instances": 2}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_reach_up_starts_a_secured_fleet_serves_calls_and_stops_it_all_on_ctrl_c(fleet_file: Path) -> None:
    state = Path(yaml.safe_load(fleet_file.read_text())["state"])
    env = {**os.environ, "COLUMNS": "200"}
    for name in ("DEMO_TOKEN", "BATCH_TOKEN", "DEMO_ORDERS_KEY", "DEMO_CLOUD_SALES_TOKEN"):
        env.pop(name, None)  # made by reach up, written to tokens.env
    up = subprocess.Popen(
        [sys.executable, "-c", CLI, "up", str(fleet_file)], env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    lines: list[str] = []
    assert up.stdout is not None
    stdout = up.stdout
    reader = threading.Thread(target=lambda: lines.extend(stdout), daemon=True)
    reader.start()
    try:
        end = time.monotonic() + startup_seconds(8) * 2
        while not any("Ctrl-C stops everything" in line for line in lines):
            assert up.poll() is None and time.monotonic() < end, "reach up did not start:\n" + "".join(lines)
            time.sleep(0.1)
        where = dict(match.groups() for line in lines if (match := ROW.search(line)))
        assert set(where) == {"etcd", "redis", "orders-0", "orders-1", "gateway", "node"}, lines
        assert all(re.match(r"\w+://127\.0\.0\.1:\d+", address) for address in where.values()), where
        children = _descendants(up.pid)
        tokens = dict(re.findall(r"^export (\w+)=(\S+)$", (state / "tokens.env").read_text(), flags=re.MULTILINE))
        assert oct((state / "tokens.env").stat().st_mode & 0o777) == "0o600"

        # etcd is secured: TLS with client certificates, and an agent's user writes only its own instances
        context = ssl.create_default_context(cafile=str(state / "tls/ca.pem"))
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{where['etcd']}/version", verify=context, timeout=5)
        tls = state / "tls"
        etcdctl = ["etcdctl", f"--endpoints={where['etcd']}", f"--cacert={tls}/ca.pem"]
        etcdctl += [f"--cert={tls}/reach-agent-orders.pem", f"--key={tls}/reach-agent-orders-key.pem"]
        denied = subprocess.run([*etcdctl, "put", "/reach/agents/orders", "{}"], capture_output=True, text=True)
        assert denied.returncode != 0 and "permission denied" in denied.stderr, denied

        auth = {"Authorization": f"Bearer {tokens['DEMO_TOKEN']}"}
        body = {"capability": "query_order", "payload": {"order_id": "A1001"}}
        answer = httpx.post(f"{where['gateway']}/v1/reach", json=body, headers=auth, timeout=15).json()
        assert answer["status"] == "success" and answer["data"]["order_id"] == "A1001", answer
        assert answer["instance"].startswith("orders-"), answer
        listed = httpx.get(f"{where['gateway']}/v1/agents", headers=auth, timeout=15).json()["agents"]
        instances = [instance for agent in listed if agent["name"] == "orders" for instance in agent["instances"]]
        assert len(instances) == 2 and answer["instance"] in {i["instance_id"] for i in instances}, listed

        target = where["node"].removeprefix("grpc://")
        transport = GrpcNodeTransport(target, token=tokens["DEMO_TOKEN"])
        environ = {**os.environ, **tokens}
        async with ReachClient(str(EXAMPLES / "agents.yaml"), transport, tenant="demo", environ=environ) as client:
            reply = await client.reach("query_order", {"order_id": "A1001"})
        assert reply.ok and reply.data["order_id"] == "A1001", reply
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(60)
        reader.join(5)
    assert code == 0, "".join(lines)
    assert "stopped" in lines[-1]
    assert len(children) >= 6
    assert [pid for pid in children if _alive(pid)] == [], "a process of the fleet outlived Ctrl-C"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"agents": {}}, "a fleet file has 'config: FILE'"),
        ({"config": "agents.yaml", "agents": {"orders": {"instances": 2}}}, "agents.orders needs 'script: PATH'"),
        ({"config": "agents.yaml", "agents": {"orders": {"script": "o.py", "instances": 0}}}, "at least 1"),
        ({"config": "agents.yaml", "agents": {}, "gateway": {"workers": 0}}, "gateway.workers must be"),
        ({"config": "agents.yaml", "agents": {}, "nodes": 2}, "unknown keys ['nodes']"),
    ],
)
def test_a_fleet_file_it_cannot_use_is_refused_naming_the_key(
    tmp_path: Path, doc: dict[str, object], message: str
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = subprocess.run(
        [sys.executable, "-c", CLI, "up", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert done.returncode == 2 and message in done.stdout, done.stdout


def test_a_fleet_agent_the_config_does_not_describe_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    doc = {"config": str(EXAMPLES / "agents.yaml"), "state": str(tmp_path / "state"), "node": False}
    doc["agents"] = {"nobody": {"script": str(EXAMPLES / "agents/orders.py")}}
    path.write_text(yaml.safe_dump(doc))
    done = subprocess.run(
        [sys.executable, "-c", CLI, "up", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert done.returncode == 2 and "agents ['nobody'] of the fleet file are not described" in done.stdout, done.stdout
    assert not [line for line in Path("/proc").glob("[0-9]*/cmdline") if str(tmp_path) in _cmdline(line)]


def _cmdline(path: Path) -> str:
    try:
        return path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
