"""Endpoint policy: http, https or grpc only, no userinfo, not link-local, optional allowed networks (an
EndpointPolicy value given to what admits records) — on load and on read (DESIGN.md 11.4)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import aetcd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from reach_plugins.cli import app
from reach_plugins.config.loader import load_config
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor, Instance
from reach_plugins.registry import MemoryRegistry, open_registry
from reach_plugins.security import SCHEMES, EndpointPolicy, endpoint_problem

BAD = {
    "file:///etc/passwd": "scheme must be http, https or grpc",
    "gopher://127.0.0.1:70/": "scheme must be http, https or grpc",
    "http://admin:hunter2@127.0.0.1:8080": "userinfo",
    "http://169.254.169.254/latest/meta-data": "link-local",
    "http://[fe80::1]:8080": "link-local",
}


@pytest.mark.parametrize(("url", "why"), BAD.items())
def test_bad_endpoints_are_refused_when_loading(tmp_path: Path, url: str, why: str) -> None:
    """A YAML agent with such an endpoint is a ConfigError naming the rule it breaks."""
    path = tmp_path / "agents.yaml"
    path.write_text(f"agents:\n  - name: echo\n    endpoint: '{url}'\n    capabilities: [echo]\n")
    with pytest.raises(ConfigError, match=why):
        load_config(path)


def test_reach_agents_load_refuses_bad_endpoints(tmp_path: Path) -> None:
    """`reach agents --load` with a gopher endpoint exits 2 and says why; nothing is loaded."""
    path = tmp_path / "agents.yaml"
    path.write_text("agents:\n  - name: echo\n    endpoint: gopher://127.0.0.1:70/\n    capabilities: [echo]\n")
    result = CliRunner().invoke(app, ["agents", "--registry", "memory://", "--load", str(path)])
    assert result.exit_code == 2
    assert "must be http, https or grpc, not 'gopher'" in " ".join(result.output.split())


def test_userinfo_never_shows_in_the_message() -> None:
    """The refusal names the rule and the host, never the password it found."""
    problem = endpoint_problem("http://admin:hunter2@127.0.0.1:8080")
    assert problem is not None and "userinfo" in problem and "127.0.0.1:8080" in problem
    assert "hunter2" not in problem and "admin" not in problem


async def test_allowed_networks_limit_endpoints() -> None:
    """With networks configured, only literal addresses inside them pass; hostnames and outsiders are refused."""
    registry = MemoryRegistry(endpoints=EndpointPolicy.limited_to("127.0.0.0/8"))
    await registry.register_agent(AgentDescriptor(name="x", endpoints=["http://127.1.2.3:80"]))
    for url in ("http://[::1]:80", "http://localhost:80"):
        with pytest.raises(ConfigError, match="outside the allowed networks"):
            await registry.register_instance(Instance(agent="x", instance_id="i", endpoint=url))
    with pytest.raises(ConfigError, match="not a CIDR"):
        EndpointPolicy.limited_to("10.0.0.0/33")


async def test_bad_records_in_etcd_are_ignored_on_read(etcd_url: str) -> None:
    """An instance written straight into etcd with a file:// endpoint never reaches the router; a good one does."""
    prefix = f"/reach-test/{uuid.uuid4().hex}/"
    host, _, port = etcd_url.removeprefix("etcd://").rpartition(":")
    async with aetcd.Client(host, int(port), timeout=5) as raw:
        descriptor = AgentDescriptor(name="echo", capabilities=["echo"]).model_dump_json()
        await raw.put(f"{prefix}agents/echo".encode(), descriptor.encode())
        for instance_id, endpoint in (("bad", "file:///etc/passwd"), ("good", "http://127.0.0.1:9")):
            record = {"agent": "echo", "instance_id": instance_id, "endpoint": endpoint}
            await raw.put(f"{prefix}instances/echo/{instance_id}".encode(), json.dumps(record).encode())
        registry = open_registry(f"{etcd_url}{prefix}")
        try:
            assert list(registry.instances("echo")) == ["good"]
        finally:
            await registry.aclose()
            await raw.delete_prefix(prefix.encode())


@given(st.text(max_size=60), st.sampled_from(["http", "https", "grpc", "file", "gopher", "ftp", "", "HTTP"]))
def test_accepted_endpoints_always_obey_the_policy(rest: str, scheme: str) -> None:
    """Whatever the text, an accepted endpoint has an allowed scheme, no userinfo and is not link-local."""
    url = f"{scheme}://{rest}"
    if endpoint_problem(url) is None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        assert parts.scheme in SCHEMES
        assert "@" not in parts.netloc
        assert parts.hostname and not parts.hostname.startswith("169.254.")


OUTSIDER = "agents:\n  - name: echo\n    endpoint: http://127.0.1.3:80\n    capabilities: [echo]\n"


def test_records_never_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The networks limit is not a property of records: with the variable set, building one outside it still works."""
    monkeypatch.setenv("REACH_ENDPOINT_NETWORKS", "127.0.0.0/24")
    assert AgentDescriptor(name="echo", endpoints=["http://127.0.1.3:80"]).endpoints == ["http://127.0.1.3:80"]
    assert EndpointPolicy.from_environ({"REACH_ENDPOINT_NETWORKS": "127.0.0.0/24"}).problem("http://127.0.1.3:80")
    assert EndpointPolicy.from_environ({}).problem("http://127.0.1.3:80") is None


def test_the_loader_names_the_endpoint_outside_the_policy(tmp_path: Path) -> None:
    """load_config under a policy refuses an outside endpoint, naming the file and the key's path."""
    path = tmp_path / "agents.yaml"
    path.write_text(OUTSIDER)
    assert load_config(path).agents[0].endpoints == ["http://127.0.1.3:80"]
    with pytest.raises(ConfigError, match=r"agents\.yaml: agents\[0\]\.endpoints\[0\]: .*outside the allowed networks"):
        load_config(path, endpoints=EndpointPolicy.limited_to(["127.0.0.0/24"]))


def test_reach_agents_load_reads_the_networks_from_the_environment(tmp_path: Path) -> None:
    """The CLI is the edge: $REACH_ENDPOINT_NETWORKS there refuses the load (exit 2); without it the file loads."""
    path = tmp_path / "agents.yaml"
    path.write_text(OUTSIDER)
    command = ["agents", "--registry", "memory://", "--load", str(path)]
    limited = CliRunner().invoke(app, command, env={"REACH_ENDPOINT_NETWORKS": "127.0.0.0/24"})
    assert limited.exit_code == 2
    assert "outside the allowed networks (127.0.0.0/24)" in " ".join(limited.output.split())
    assert CliRunner().invoke(app, command, env={"REACH_ENDPOINT_NETWORKS": ""}).exit_code == 0


def test_gateway_startup_applies_the_networks_of_its_environment(tmp_path: Path) -> None:
    """build_forwarder (gateway and node startup) reads the variable from the environ it is given, once."""
    from reach_plugins.gateway.serve import build_forwarder

    path = tmp_path / "agents.yaml"
    path.write_text(OUTSIDER)
    with pytest.raises(ConfigError, match="outside the allowed networks"):
        build_forwarder(path, environ={"REACH_ENDPOINT_NETWORKS": "127.0.0.0/24"}, allow_open=True)


def test_a_file_registry_admits_under_its_policy(tmp_path: Path) -> None:
    """file:// opened with a policy refuses a file naming an outside endpoint; opened without one, it loads it."""
    path = tmp_path / "agents.yaml"
    path.write_text(OUTSIDER)
    assert list(open_registry(f"file://{path}").instances("echo")) == ["echo-0"]
    with pytest.raises(ConfigError, match="outside the allowed networks"):
        open_registry(f"file://{path}", endpoints=EndpointPolicy.limited_to("127.0.0.0/24"))


async def test_etcd_records_outside_the_networks_are_ignored_on_read(etcd_url: str) -> None:
    """An instance written straight into etcd outside the allowed networks never reaches the router; one inside does."""
    prefix = f"/reach-test/{uuid.uuid4().hex}/"
    host, _, port = etcd_url.removeprefix("etcd://").rpartition(":")
    async with aetcd.Client(host, int(port), timeout=5) as raw:
        descriptor = AgentDescriptor(name="echo", capabilities=["echo"]).model_dump_json()
        await raw.put(f"{prefix}agents/echo".encode(), descriptor.encode())
        for instance_id, endpoint in (("outside", "http://127.0.1.3:9"), ("inside", "http://127.0.0.1:9")):
            record = {"agent": "echo", "instance_id": instance_id, "endpoint": endpoint}
            await raw.put(f"{prefix}instances/echo/{instance_id}".encode(), json.dumps(record).encode())
        registry = open_registry(f"{etcd_url}{prefix}", endpoints=EndpointPolicy.limited_to("127.0.0.0/24"))
        try:
            assert list(registry.instances("echo")) == ["inside"]
            with pytest.raises(ConfigError, match="outside the allowed networks"):
                await registry.register_instance(
                    Instance(agent="echo", instance_id="new", endpoint="http://127.0.1.1:9")
                )
        finally:
            await registry.aclose()
            await raw.delete_prefix(prefix.encode())
