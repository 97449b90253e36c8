"""Credentials only where they are sent (issue 24, deliverable 6), against a real gateway and a real node.

A caller behind a ``reach gateway`` (uvicorn) or a ``reach node`` (grpc.aio) process resolves no downstream
credential: the tenant's key for agent ``orders`` lives only in the hop's environment, the caller's has
none, and the agent still receives it. And a descriptor may name as its secret only a variable the operator
allowed: never a tenant's own token (which would then be sent to the descriptor's endpoint), and with
``secrets: {env_prefix: ...}`` only variables with that prefix.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hop_support import TOKENS, demo_tenants, free_port, serve_agents, until_true, write_config
from servers import interrupt

from reach_plugins import ReachClient, errors
from reach_plugins.config.loader import parse_config
from reach_plugins.transport import Transport
from transports.gateway import GatewayTransport
from transports.grpcnode import GrpcNodeTransport

CLI = "from reach_plugins.cli import main; main()"


async def _gateway_up(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/healthz", timeout=0.5)).status_code == 200
    except httpx.TransportError:
        return False


async def _node_up(transport: GrpcNodeTransport) -> bool:
    try:
        await transport.result("probe")
    except errors.ConnectError:
        return False
    except errors.ReachError:
        pass
    return True


@asynccontextmanager
async def hop(kind: str, config: Path, env: dict[str, str], *extra: str) -> AsyncIterator[Transport]:
    """A ``reach gateway`` or ``reach node`` process on a free port with ``env``; its client transport."""
    port = free_port()
    command = [sys.executable, "-c", CLI, kind, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen([*command, *extra], env={**os.environ, **env}, stderr=subprocess.PIPE, text=True)
    transport: Transport
    up: Callable[[], Any]
    if kind == "gateway":
        url = f"http://127.0.0.1:{port}"
        transport = GatewayTransport(url, token=env["DEMO_TOKEN"])
        up = lambda: _gateway_up(url)  # noqa: E731
    else:
        node = GrpcNodeTransport(f"127.0.0.1:{port}", token=env["DEMO_TOKEN"])
        transport, up = node, lambda: _node_up(node)

    async def answering() -> bool:
        assert process.poll() is None, process.stderr.read() if process.stderr else "the hop exited"
        return bool(await up())

    try:
        await until_true(answering, within=60)
        yield transport
    finally:
        interrupt(process)
        if process.stderr is not None:
            process.stderr.close()


@pytest.mark.parametrize("kind", ["gateway", "node"])
async def test_a_caller_behind_a_hop_needs_none_of_the_downstream_secrets(tmp_path: Path, kind: str) -> None:
    """DEMO_KEY only at the hop, absent at the caller: the call succeeds and the agent sees the tenant's key."""
    with serve_agents(("orders", "o1")) as agents:
        config = write_config(tmp_path / "agents.yaml", {"orders": [agents[0].url]}, demo_tenants())
        async with hop(kind, config, TOKENS) as transport:
            caller_env = {name: value for name, value in TOKENS.items() if name != "DEMO_KEY"}
            async with ReachClient(str(config), transport, tenant="demo", environ=caller_env) as client:
                response = await client.reach("whoami", timeout_ms=5000)
    assert response.ok, response.error
    assert response.data["x-api-key"] == TOKENS["DEMO_KEY"]
    assert response.data["tenant"] == "demo"


def _config(auth_env: str, secrets: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "agents": [
            {
                "name": "orders",
                "endpoints": ["http://127.0.0.1:9"],
                "capabilities": ["whoami"],
                "auth": {"type": "header", "key": "X-Api-Key", "value_env": auth_env},
            }
        ],
        "tenants": {
            "acme": {"token_env": "ACME_TOKEN", "agents": ["orders"]},
            "beta": {"token_env": "BETA_TOKEN", "agents": ["orders"]},
        },
    }
    if secrets is not None:
        doc["secrets"] = secrets
    return doc


def test_a_descriptor_may_not_name_a_tenants_token_as_its_secret() -> None:
    """auth.value_env: BETA_TOKEN (tenant beta's gateway bearer) is refused at load, naming the key and what to do."""
    with pytest.raises(errors.ConfigError) as refused:
        parse_config(_config("BETA_TOKEN"), source="agents.yaml")
    message = refused.value.message
    assert "agents.yaml: agents[0].auth.value_env: environment variable BETA_TOKEN holds a tenant's token" in message
    assert "give the agent a variable of its own" in message
    assert parse_config(_config("ORDERS_KEY")).agents[0].auth.value_env == "ORDERS_KEY"
    doc = _config("ORDERS_KEY")
    doc["tenants"]["acme"]["credentials"] = {"orders": {"value_env": "BETA_TOKEN"}}
    with pytest.raises(errors.ConfigError, match=r"tenants\.acme\.credentials\.orders\.value_env: .*BETA_TOKEN"):
        parse_config(doc)


def test_with_a_secrets_prefix_descriptors_name_only_allowed_variables() -> None:
    """secrets: {env_prefix: REACH_SECRET_, env_allow: [LEGACY_KEY]}: others are refused at load."""
    secrets = {"env_prefix": "REACH_SECRET_", "env_allow": ["LEGACY_KEY"]}
    with pytest.raises(errors.ConfigError, match=r"agents\[0\]\.auth\.value_env: .*HOME is not allowed.*REACH_SECRET_"):
        parse_config(_config("HOME", secrets))
    assert parse_config(_config("REACH_SECRET_ORDERS", secrets)).secrets.env_prefix == "REACH_SECRET_"
    assert parse_config(_config("LEGACY_KEY", secrets)).agents[0].auth.value_env == "LEGACY_KEY"
    with pytest.raises(errors.ConfigError, match="BETA_TOKEN holds a tenant's token"):
        parse_config(_config("BETA_TOKEN", {"env_allow": ["BETA_TOKEN"]}))


async def test_a_registry_descriptor_cannot_pull_another_tenants_bearer_through_the_gateway(tmp_path: Path) -> None:
    """A descriptor read from a registry names BETA_TOKEN: demo's call through a real gateway is refused and the
    agent never receives beta's bearer (on the first release it did, as acme's downstream key)."""
    with serve_agents(("orders", "o1")) as agents:
        tenants = {name: {"token_env": f"{name.upper()}_TOKEN", "agents": "*"} for name in ("demo", "beta")}
        config = write_config(tmp_path / "gateway.yaml", {}, tenants)
        descriptor = {"name": "orders", "endpoints": [agents[0].url], "capabilities": ["whoami"]}
        seen_by_caller = tmp_path / "caller.yaml"
        seen_by_caller.write_text(yaml.safe_dump({"agents": [descriptor]}))
        descriptor["auth"] = {"type": "header", "key": "X-Api-Key", "value_env": "BETA_TOKEN"}
        registry = tmp_path / "registry.yaml"
        registry.write_text(yaml.safe_dump({"agents": [descriptor]}))
        env = {**TOKENS, "BETA_TOKEN": "tok-beta"}
        async with (
            hop("gateway", config, env, "--registry", f"file://{registry}") as transport,
            ReachClient(str(seen_by_caller), transport, tenant="demo", environ={}) as client,
        ):
            try:
                response = await client.reach("whoami", timeout_ms=5000)
            except errors.ReachError as exc:
                refusal = exc.message
            else:
                assert not response.ok, response.data
                refusal = response.error.message if response.error else ""
        assert agents[0].count("whoami") == 0
    assert "tok-beta" not in refusal
