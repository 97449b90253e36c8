"""What the hostile re-test of issue 24 found still open on the first merged tree, each against real servers
(each test failed there and passes since its fix):

* the A2A card builds its URLs from the caller's ``Host`` header;
* a descriptor's ``auth.value_env`` may name any variable of the gateway (its own etcd password), and the
  gateway then sends it to that descriptor's endpoint;
* ``reach issuer`` signs a tenant a token for an L3 agent that the agent may then exchange for a direct hop
  (the L3 check reads a claim only the gateway's own issuer writes);
* the audit records (an issued exchange, an approval decision) are logged at INFO on library loggers that
  ``reach issuer`` and ``serve()`` leave unconfigured: nothing of them reaches the process's output;
* the idempotency stores share one byte budget across tenants: one tenant's large keyed replies evict another
  tenant's record within its window, and that tenant's retry runs the side effect again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
from hop_support import free_port, write_config
from starlette.types import Receive, Scope, Send

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.gateway import create_app
from reach_plugins.security import KeyRing, SigningKey, TokenIssuer
from reach_plugins.server.issuer_server import create_issuer_app

ENVIRON = {"ACME_TOKEN": "tok-acme", "PLUGIN_ISSUER": "iss-plugin", "REACH_ETCD_PASSWORD": "etcd-pw-5e1f0a"}
TENANTS = {"acme": {"token_env": "ACME_TOKEN", "agents": "*", "networks": ["127.0.0.0/8"]}}


def _wait_port(port: int, process: subprocess.Popen[bytes], within: float = 60.0) -> None:
    end = time.monotonic() + within
    while time.monotonic() < end:
        assert process.poll() is None, "the server exited at start"
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listened on {port} within {within} s")


def test_the_agent_card_does_not_take_its_urls_from_the_host_header() -> None:
    """A caller's ``Host: 127.6.6.6:4444`` must not become the card's JSON-RPC URL that other callers follow."""
    agent = ReachAgent("echo")

    @agent.capability("echo")
    def echo(text: str) -> dict[str, str]:
        return {"text": text}

    with BackgroundServer(agent.app) as served:
        # A2A-Version 0.3: the card with its 0.3 ``url`` too, so every URL it can name is checked.
        forged = {"Host": "127.6.6.6:4444", "A2A-Version": "0.3"}
        card = httpx.get(f"{served.url}/.well-known/agent-card.json", headers=forged).json()
    urls = [card["url"], *(face["url"] for face in card["supportedInterfaces"])]
    assert not [url for url in urls if "127.6.6.6" in url], urls


def test_a_descriptor_cannot_send_the_gateways_own_etcd_password(tmp_path: Path) -> None:
    """``auth.value_env: REACH_ETCD_PASSWORD`` in a descriptor: refused at load, or never sent to the endpoint."""
    received: list[bytes | None] = []
    agent = ReachAgent("echo", tokens="open")

    @agent.capability("echo")
    def echo(text: str = "") -> dict[str, str]:
        return {"text": text}

    async def recording(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            received.append(dict(scope["headers"]).get(b"x-api-key"))
        await agent.app(scope, receive, send)

    with BackgroundServer(recording) as served:
        auth = {"type": "header", "key": "X-Api-Key", "value_env": "REACH_ETCD_PASSWORD"}
        config = write_config(
            tmp_path / "gw.yaml", {"echo": {"endpoints": [served.url], "capabilities": ["echo"], "auth": auth}}, TENANTS
        )
        try:
            app = create_app(config, environ=ENVIRON)
        except Exception as exc:  # refused at load: the fix may do that
            assert "REACH_ETCD_PASSWORD" in str(exc)
            return
        with BackgroundServer(app) as gateway:
            httpx.post(
                f"{gateway.url}/v1/reach",
                json={"capability": "echo", "payload": {}},
                headers={"Authorization": "Bearer tok-acme"},
                timeout=15,
            )
    assert received, "the gateway never reached the agent"
    assert ENVIRON["REACH_ETCD_PASSWORD"].encode() not in received, received


def test_reach_issuer_never_lets_an_l3_agent_exchange_for_a_direct_hop(tmp_path: Path) -> None:
    """``plugin`` is L3 in the issuer's config: a tenant token for it is refused, or its exchange is (403)."""
    key = tmp_path / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    agents = {
        "plugin": {"endpoints": ["http://127.0.0.1:9"], "capabilities": ["relay"], "trust": "L3"},
        "payments": {"endpoints": ["http://127.0.0.1:9"], "capabilities": ["transfer"]},
    }
    config = write_config(tmp_path / "issuer.yaml", agents, TENANTS)
    app = create_issuer_app(config, keys=[key], environ=ENVIRON, agent_tokens={"plugin": "PLUGIN_ISSUER"})
    with BackgroundServer(app) as issuer:
        url = f"{issuer.url}/v1/tokens"
        asked = httpx.post(url, json={"audience": "plugin"}, headers={"Authorization": "Bearer tok-acme"})
        if asked.status_code != 200:
            assert asked.status_code == 403
            return
        exchange = {"audience": "payments", "subject_token": asked.json()["token"]}
        exchanged = httpx.post(url, json=exchange, headers={"Authorization": "Bearer iss-plugin"})
    assert exchanged.status_code == 403, exchanged.text


_APPROVING_AGENT = textwrap.dedent(
    """
    import sys
    from reach_plugins.agent import ReachAgent, serve
    from reach_plugins.agent.approval import ApprovalDecision

    agent = ReachAgent("payments", approver=lambda request: ApprovalDecision(False, "cfo", "never"))

    @agent.capability("transfer", danger_level="high")
    def transfer(amount: int) -> dict:
        return {"sent": amount}

    serve(agent, port=int(sys.argv[1]))
    """
)


def test_serve_writes_the_approval_audit_record_somewhere() -> None:
    """An agent run with ``serve()``: the decision it audited (denied by cfo) appears in its output."""
    port = free_port()
    keys = KeyRing([SigningKey.generate()])
    env = {**os.environ, "REACH_ISSUER_KEYS": keys.active.pem().decode(), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-c", _APPROVING_AGENT, str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        _wait_port(port, process)
        token = TokenIssuer(keys).for_tenant("acme", "payments").token
        answer = httpx.post(
            f"http://127.0.0.1:{port}/reach",
            json={"capability": "transfer", "payload": {"amount": 5}},
            headers={"X-Reach-Token": token},
            timeout=15,
        ).json()
        assert "denied by cfo" in answer["error"]["message"]
    finally:
        process.terminate()
        output = process.communicate(timeout=15)[0].decode()
    assert '"cfo"' in output, output[-2000:]


def test_reach_issuer_writes_every_issued_exchange_to_its_output(tmp_path: Path) -> None:
    """``reach issuer``: an exchange it granted is one ``token_exchange`` record in its output, as a refusal is."""
    key = tmp_path / "issuer.pem"
    key.write_bytes(SigningKey.generate().pem())
    agents = {name: {"endpoints": ["http://127.0.0.1:9"], "capabilities": ["x"]} for name in ("echo", "payments")}
    config = write_config(tmp_path / "issuer.yaml", agents, TENANTS)
    port = free_port()
    env = {**os.environ, **ENVIRON, "ECHO_ISSUER": "iss-echo"}
    command = [sys.executable, "-m", "reach_plugins.cli", "issuer", "--config", str(config), "--port", str(port)]
    command += ["--key", str(key), "--agent-token", "echo=ECHO_ISSUER"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, process)
        url = f"http://127.0.0.1:{port}/v1/tokens"
        token = httpx.post(url, json={"audience": "echo"}, headers={"Authorization": "Bearer tok-acme"}).json()["token"]
        exchange = {"audience": "payments", "subject_token": token}
        granted = httpx.post(url, json=exchange, headers={"Authorization": "Bearer iss-echo"})
        assert granted.status_code == 200, granted.text
        to_itself = httpx.post(url, json={**exchange, "audience": "echo"}, headers={"Authorization": "Bearer iss-echo"})
        assert to_itself.status_code == 403, to_itself.text
    finally:
        process.terminate()
        output = process.communicate(timeout=15)[0].decode()
    assert '"verdict": "refused"' in output, output[-2000:]  # the refusal is written: the output is read
    assert '"verdict": "issued"' in output, output[-2000:]


def test_one_tenants_keyed_calls_never_rerun_anothers_keyed_call(tmp_path: Path) -> None:
    """The idempotency stores share one byte budget: acme's 150 keyed calls with 0.9 MB replies push beta's record
    out of the gateway and the agent, and beta's retry within the window runs the charge a second time."""
    runs: list[int] = []
    agent = ReachAgent("billing")

    @agent.capability("charge")
    def charge(amount: int) -> dict[str, int]:
        runs.append(amount)
        return {"run": len(runs)}

    @agent.capability("big")
    def big(i: int) -> dict[str, Any]:
        return {"blob": "x" * 900_000, "i": i}

    tenants = {
        name: {"token_env": f"{name.upper()}_TOKEN", "agents": "*", "networks": ["127.0.0.0/8"]}
        for name in ("acme", "beta")
    }
    environ = {**ENVIRON, "BETA_TOKEN": "tok-beta"}
    with BackgroundServer(agent.app) as served:
        agent_spec = {"endpoints": [served.url], "capabilities": ["charge", "big"]}
        config = write_config(tmp_path / "gw.yaml", {"billing": agent_spec}, tenants)
        with BackgroundServer(create_app(config, environ=environ)) as gateway, httpx.Client(timeout=30) as http:
            url = f"{gateway.url}/v1/reach"
            beta, acme = {"Authorization": "Bearer tok-beta"}, {"Authorization": "Bearer tok-acme"}
            keyed = {"capability": "charge", "payload": {"amount": 100}, "idempotency_key": "beta-pay-1"}
            assert http.post(url, json=keyed, headers=beta).json()["data"] == {"run": 1}
            for i in range(150):
                flood = {"capability": "big", "payload": {"i": i}, "idempotency_key": f"acme-{i}"}
                assert http.post(url, json=flood, headers=acme).json()["status"] == "success"
            http.post(url, json=keyed, headers=beta)
    assert runs == [100], f"beta's keyed charge ran {len(runs)} times"
