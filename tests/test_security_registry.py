"""A registry only owners can write: etcd with TLS and authentication, the documented role layout (DESIGN.md 11.4).

Runs against the secured etcd ``scripts/services.sh start`` runs (TLS with
client certificates, auth on, users by certificate CN or password; see the
role layout there). The attacks of the issue, replayed: a rogue instance
under another agent's name, a rewritten descriptor pointing a tenant's
credential elsewhere, an unauthenticated client.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hop_support import TOKENS, until
from servers import _missing
from typer.testing import CliRunner

from reach_plugins import ReachClient
from reach_plugins.agent import BackgroundServer, ReachAgent, ReachContext, Registration
from reach_plugins.cli import app
from reach_plugins.errors import BackendUnavailable, ConfigError, PermissionDenied
from reach_plugins.gateway import create_app
from reach_plugins.model import AgentDescriptor, Instance
from reach_plugins.registry import Registry, open_registry
from transports.gateway import GatewayTransport

PREFIX = "/reach/"
TLS_DIR = Path(os.environ.get("REACH_TEST_ETCD_TLS_DIR", Path(__file__).parent.parent / ".ci-state/etcd-secure/tls"))
Opener = Callable[..., Registry]


@pytest.fixture(scope="module")
def secure_address() -> str:
    """host:port of the secured etcd (skipped, or failed under CI, when it is not running)."""
    address = os.environ.get("REACH_TEST_ETCD_TLS", "127.0.0.1:23791")
    if not (TLS_DIR / "ca.pem").is_file():
        _missing(f"no secured etcd certificates in {TLS_DIR}")
    return address


def url_for(address: str, cert: str, **extra: str) -> str:
    """The registry URL presenting certificate ``cert`` (its CN is the etcd user unless ``user=`` is given)."""
    params = {"ca": f"{TLS_DIR}/ca.pem", "cert": f"{TLS_DIR}/{cert}.pem", "key": f"{TLS_DIR}/{cert}-key.pem"}
    params.update(extra)
    return f"etcd://{address}{PREFIX}?" + "&".join(f"{k}={v}" for k, v in params.items()) + "&timeout=3"


@pytest.fixture
async def opened(secure_address: str) -> AsyncIterator[Opener]:
    """Open registries as a user; the operator's view starts empty; everything opened is closed after."""
    registries: list[Registry] = []

    def open_as(cert: str, **extra: str) -> Registry:
        registry = open_registry(url_for(secure_address, cert, **extra))
        registries.append(registry)
        return registry

    operator = open_as("reach-operator")
    for name in list(operator.agents()):
        await operator.deregister_agent(name)
    yield open_as
    for registry in registries:
        await registry.aclose()


@pytest.fixture
def gateway_password(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    password = (TLS_DIR / "reach-gateway.password").read_text().strip()
    monkeypatch.setenv("REACH_ETCD_PASSWORD", password)
    yield password


def echo_descriptor(**fields: Any) -> AgentDescriptor:
    """The operator's echo agent: tenant alpha's API key goes to it in X-Api-Key."""
    auth = {"type": "header", "key": "X-Api-Key", "value_env": "ALPHA_KEY"}
    return AgentDescriptor(name="echo", capabilities=["echo"], auth=auth, **fields)


async def test_rogue_instance_under_another_agent_is_refused(opened: Opener) -> None:
    """An agent's user may write only its own instance keys: rogue registering under echo is PermissionDenied."""
    await opened("reach-operator").register_agent(echo_descriptor())
    await opened("reach-agent-echo").register_instance(
        Instance(agent="echo", instance_id="e1", endpoint="http://127.0.0.1:9")
    )
    rogue = opened("reach-agent-rogue")
    with pytest.raises(PermissionDenied, match="permission denied"):
        await rogue.register_instance(Instance(agent="echo", instance_id="r1", endpoint="http://127.0.0.1:8"))
    assert list(opened("reach-operator").instances("echo")) == ["e1"]


async def test_descriptor_rewrite_by_an_agent_is_refused(opened: Opener) -> None:
    """Neither the rogue agent nor echo itself may rewrite echo's descriptor (say, auth.value_env -> BETA_TOKEN)."""
    operator = opened("reach-operator")
    await operator.register_agent(echo_descriptor())
    rewritten = echo_descriptor(endpoints=["http://127.0.0.1:8"]).model_copy(
        update={"auth": echo_descriptor().auth.model_copy(update={"value_env": "BETA_TOKEN"})}
    )
    for user in ("reach-agent-rogue", "reach-agent-echo"):
        with pytest.raises(PermissionDenied):
            await opened(user).register_agent(rewritten)
    stored = await operator.get("echo")
    assert stored is not None and stored.auth.value_env == "ALPHA_KEY" and stored.endpoints == []


async def test_readers_authenticated_by_password_cannot_write(opened: Opener, gateway_password: str) -> None:
    """The gateway's user (password over TLS) sees the registry and writes nothing."""
    await opened("reach-operator").register_agent(echo_descriptor())
    gateway = opened("reach-client", user="reach-gateway")
    assert list(gateway.agents()) == ["echo"]
    with pytest.raises(PermissionDenied):
        await gateway.register_agent(echo_descriptor())


async def test_unauthenticated_clients_are_refused(secure_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain gRPC, TLS without a client certificate, or a wrong password: nothing is read."""
    host_port = secure_address
    attempts = [
        f"etcd://{host_port}{PREFIX}?timeout=1",
        f"etcd://{host_port}{PREFIX}?ca={TLS_DIR}/ca.pem&timeout=1",
    ]
    for url in attempts:
        with pytest.raises(BackendUnavailable):
            open_registry(url)
    monkeypatch.setenv("REACH_ETCD_PASSWORD", "not-the-password")
    with pytest.raises((BackendUnavailable, PermissionDenied)):
        open_registry(url_for(host_port, "reach-client", user="reach-gateway"))


def test_url_options_are_checked() -> None:
    """No userinfo in etcd URLs; a user needs a password variable; a client cert needs its key; files must exist."""
    with pytest.raises(ConfigError, match="no user:password@"):
        open_registry("etcd://root:secret@127.0.0.1:2379")
    with pytest.raises(ConfigError, match="REACH_TEST_UNSET_VARIABLE_X: that environment variable is not set"):
        open_registry("etcd://127.0.0.1:2379?user=someone&password_env=REACH_TEST_UNSET_VARIABLE_X")
    with pytest.raises(ConfigError, match="both cert= and key="):
        open_registry(f"etcd://127.0.0.1:2379?cert={TLS_DIR}/ca.pem")
    with pytest.raises(ConfigError, match="not found"):
        open_registry("etcd://127.0.0.1:2379?ca=/nonexistent/ca.pem")


async def test_agent_sdk_registers_its_instance_under_the_operators_descriptor(opened: Opener) -> None:
    """The SDK never rewrites an existing descriptor: under its own user it registers its instance only."""
    operator = opened("reach-operator")
    await operator.register_agent(echo_descriptor())
    agent = ReachAgent("echo")

    @agent.capability("echo")
    def echo(text: str) -> str:
        return text

    registration = Registration(agent, opened("reach-agent-echo"), "http://127.0.0.1:9", instance_id="sdk-1")
    await registration.start()
    try:
        stored = await operator.get("echo")
        assert stored is not None and stored.auth.value_env == "ALPHA_KEY"
        await until(lambda: "sdk-1" in operator.instances("echo"))
    finally:
        await registration.stop()


async def test_tenant_key_never_reaches_a_rogue_endpoint(
    opened: Opener, secure_address: str, gateway_password: str, tmp_path: Path
) -> None:
    """End to end: a gateway reading the secured registry serves echo six times; the rogue's endpoint, refused at
    registration, receives none of tenant alpha's API keys (the first release leaked it on 3 of 6 calls)."""
    received: dict[str, list[str | None]] = {"echo": [], "rogue": []}

    def build(label: str) -> ReachAgent:
        agent = ReachAgent("echo")

        @agent.capability("echo")
        def echo(text: str, ctx: ReachContext) -> str:
            received[label].append(ctx.headers.get("x-api-key"))
            return text

        return agent

    operator = opened("reach-operator")
    await operator.register_agent(echo_descriptor())
    config = tmp_path / "gateway.yaml"
    config.write_text("tenants:\n  alpha:\n    token_env: DEMO_TOKEN\n    agents: '*'\n")
    environ = {**TOKENS, "ALPHA_KEY": "alpha-secret"}
    with BackgroundServer(build("echo").app) as real, BackgroundServer(build("rogue").app) as attacker:
        await opened("reach-agent-echo").register_instance(Instance(agent="echo", instance_id="e1", endpoint=real.url))
        with pytest.raises(PermissionDenied):
            await opened("reach-agent-rogue").register_instance(
                Instance(agent="echo", instance_id="r1", endpoint=attacker.url)
            )
        registry_url = url_for(secure_address, "reach-client", user="reach-gateway")
        app = create_app(config, registry=registry_url, environ=environ)
        with BackgroundServer(app, proxy_headers=False) as gateway:
            transport = GatewayTransport(gateway.url, token=TOKENS["DEMO_TOKEN"])
            async with ReachClient(opened("reach-operator"), transport, tenant="alpha", environ=environ) as client:
                replies = [await client.reach("echo", {"text": f"t{i}"}) for i in range(6)]
    assert [reply.status for reply in replies] == ["success"] * 6
    assert received == {"echo": ["alpha-secret"] * 6, "rogue": []}


def test_only_the_operator_loads_descriptors_with_the_cli(opened: Opener, secure_address: str, tmp_path: Path) -> None:
    """`reach agents --load` works with the operator's certificate and exits 2 naming the refusal for an agent's."""
    agents = tmp_path / "agents.yaml"
    agents.write_text("agents:\n  - name: echo\n    endpoint: http://127.0.0.1:9\n    capabilities: [echo]\n")
    runner = CliRunner()
    as_rogue = runner.invoke(
        app, ["agents", "--registry", url_for(secure_address, "reach-agent-rogue"), "--load", str(agents)]
    )
    assert as_rogue.exit_code == 2 and "permission denied" in " ".join(as_rogue.output.split())
    as_operator = runner.invoke(
        app, ["agents", "--registry", url_for(secure_address, "reach-operator"), "--load", str(agents)]
    )
    assert as_operator.exit_code == 0, as_operator.output
    assert "echo" in opened("reach-operator").agents()
