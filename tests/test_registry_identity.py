"""An instance is who its key says, never who its value says (issue 24, "identity from authority").

The secured etcd's role layout lets an agent's user write only under
``/reach/instances/<its name>/``. A rogue agent writing there a value that
claims ``agent: echo`` must not receive echo's calls: the key names the agent
and the id, a value that disagrees with it is refused and logged. The same
rule holds for the backends that file records by name (memory, file).
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hop_support import until
from servers import _missing

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor, Instance
from reach_plugins.registry import Registry, open_registry
from reach_plugins.registry.etcd_access import EtcdAccess
from reach_plugins.registry.file import FileRegistry
from reach_plugins.registry.memory import MemoryRegistry

TLS_DIR = Path(os.environ.get("REACH_TEST_ETCD_TLS_DIR", Path(__file__).parent.parent / ".ci-state/etcd-secure/tls"))
CALLS = 40


def certificate(cert: str) -> dict[str, str]:
    return {"ca": f"{TLS_DIR}/ca.pem", "cert": f"{TLS_DIR}/{cert}.pem", "key": f"{TLS_DIR}/{cert}-key.pem"}


def url_for(address: str, cert: str) -> str:
    return f"etcd://{address}/reach/?" + "&".join(f"{k}={v}" for k, v in certificate(cert).items()) + "&timeout=3"


@pytest.fixture
async def secured() -> AsyncIterator[tuple[str, list[Registry]]]:
    """The secured etcd's address and a list of registries to close; echo and rogue start with no keys."""
    address = os.environ.get("REACH_TEST_ETCD_TLS", "127.0.0.1:23791")
    if not (TLS_DIR / "ca.pem").is_file():
        _missing(f"no secured etcd certificates in {TLS_DIR}")
    operator = open_registry(url_for(address, "reach-operator"))
    opened: list[Registry] = [operator]
    for name in ("echo", "rogue"):
        await operator.deregister_agent(name)
    yield address, opened
    for name in ("echo", "rogue"):
        await operator.deregister_agent(name)
    for registry in opened:
        await registry.aclose()


def labelled(label: str, served: list[str]) -> ReachAgent:
    agent = ReachAgent("echo")

    @agent.capability("echo")
    def echo(text: str) -> str:
        served.append(label)
        return text

    return agent


async def test_rogue_value_claiming_another_agent_is_not_routed(
    secured: tuple[str, list[Registry]], caplog: pytest.LogCaptureFixture
) -> None:
    """rogue writes under its own prefix values saying agent echo (a new id and the real one's): 0 of 40 calls reach
    it, through a watch and through a listing; the views hold only echo's own instances; each refusal is logged."""
    address, opened = secured
    operator = opened[0]
    await operator.register_agent(AgentDescriptor(name="echo", capabilities=["echo"]))
    served: list[str] = []
    with BackgroundServer(labelled("echo", served).app) as real, BackgroundServer(labelled("rogue", served).app) as bad:
        echo_user, watching = (
            open_registry(url_for(address, "reach-agent-echo")),
            open_registry(url_for(address, "reach-operator")),
        )
        opened += [echo_user, watching]
        await watching.start()
        await echo_user.register_instance(Instance(agent="echo", instance_id="e1", endpoint=real.url))
        port = int(address.rpartition(":")[2])
        rogue = EtcdAccess.from_options(certificate("reach-agent-rogue")).client("127.0.0.1", port, timeout=3)
        with caplog.at_level(logging.WARNING, logger="reach_plugins.registry"):
            try:
                for instance_id in ("r1", "e1"):
                    forged = Instance(agent="echo", instance_id=instance_id, endpoint=bad.url, last_heartbeat=1e12)
                    await rogue.put(f"/reach/instances/rogue/{instance_id}".encode(), forged.model_dump_json().encode())
            finally:
                await rogue.close()
            # A later write of echo's own: once a watch shows it, the rogue's (earlier) writes were applied.
            await echo_user.register_instance(Instance(agent="echo", instance_id="e2", endpoint=real.url))
            await until(lambda: "e2" in watching.instances("echo"), within=10)
            listing = open_registry(url_for(address, "reach-operator"))
            opened.append(listing)
            for reader in (watching, listing):
                async with ReachClient(registry=reader) as client:
                    replies = [await client.reach("echo", {"text": f"t{i}"}) for i in range(CALLS // 2)]
                assert [reply.status for reply in replies] == ["success"] * (CALLS // 2)
                assert {i: inst.endpoint for i, inst in reader.instances("echo").items()} == {
                    "e1": real.url,
                    "e2": real.url,
                }
    assert served.count("rogue") == 0 and served.count("echo") == CALLS
    refused = [r.getMessage() for r in caplog.records if "/reach/instances/rogue/" in r.getMessage()]
    assert refused and all("refused" in message for message in refused), refused
    assert {message.split("'")[1] for message in refused} == {"/reach/instances/rogue/r1", "/reach/instances/rogue/e1"}


def rogue_descriptor(endpoint: str) -> AgentDescriptor:
    """Agent rogue whose descriptor lists an instance claiming to be echo's."""
    forged = Instance(agent="echo", instance_id="echo-9", endpoint=endpoint)
    return AgentDescriptor(name="rogue", capabilities=["echo"], instances=[forged])


async def test_memory_refuses_an_instance_filed_under_another_agent() -> None:
    """A descriptor listing an instance of another agent is a ConfigError naming both; nothing is filed."""
    registry = MemoryRegistry()
    with pytest.raises(ConfigError, match=r"agent 'rogue'.*instance 'echo-9' says agent 'echo'"):
        await registry.register_agent(rogue_descriptor("http://127.0.0.1:9"))
    assert registry.agents() == {} and registry.instances("rogue") == {}


async def test_file_refuses_an_instance_filed_under_another_agent(tmp_path: Path) -> None:
    """A file whose agent lists another agent's instance does not load; on reload the last good state stays."""
    path = tmp_path / "agents.yaml"
    forged = "    instances: [{agent: echo, instance_id: echo-9, endpoint: 'http://127.0.0.1:9'}]\n"
    good = "agents:\n  - name: rogue\n    endpoint: http://127.0.0.1:8\n    capabilities: [echo]\n"
    path.write_text(good + forged)
    with pytest.raises(ConfigError, match="says agent 'echo'"):
        FileRegistry(path)
    path.write_text(good)
    registry = FileRegistry(path)
    path.write_text(good + forged)
    os.utime(path, ns=(1, 1))
    assert registry.reload() is False
    assert registry.last_error is not None and "says agent 'echo'" in str(registry.last_error)
    assert list(registry.instances("rogue")) == ["rogue-0"]
