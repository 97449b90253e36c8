"""The mcp client's OAuth 2.1: the whole flow against a protected scripted server, and the refresh on a clock."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey
from peer_servers import PEERS, _answers
from servers import free_port, interrupt, startup_seconds, wait_until

from reach_plugins import ReachClient
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor
from reach_plugins.protocols.base import HttpResponse
from reach_plugins.protocols.mcp_oauth import DPoP, OAuthClient, OAuthSettings, Running
from reach_plugins.protocols.mcp_tools import register_mcp_agent
from reach_plugins.registry.memory import MemoryRegistry
from reach_plugins.testing.clock import FakeClock
from transports.direct import DirectTransport

OAUTH = {"redirect_uri": "http://127.0.0.1:3999/callback", "client_name": "reach-test"}


@pytest.fixture(scope="module")
def protected() -> Iterator[str]:
    """The scripted server with ``--oauth``: every /mcp request needs a token of its own authorization server."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(PEERS / "mcp_wire_server.py"), str(port), "--oauth"])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _answers(url + "/counts"), startup_seconds(), "the OAuth-protected MCP server")
        yield url
    finally:
        interrupt(process)


def counts(url: str) -> dict[str, int]:
    seen: dict[str, int] = httpx.get(f"{url}/counts").json()
    return seen


async def test_a_protected_server_is_reached_after_discovery_registration_and_pkce(protected: str) -> None:
    """401 -> resource and server metadata -> dynamic registration -> authorization code with PKCE (the server
    checks the verifier) -> the tools listed and called with the bearer token; one registration, one grant."""
    registry = MemoryRegistry()
    agent = AgentDescriptor(
        name="locked", protocol="mcp", endpoints=[f"{protected}/mcp"], protocol_options={"oauth": OAUTH}
    )
    async with DirectTransport() as transport, ReachClient(registry=registry, transport=transport) as client:
        described = await asyncio.wait_for(register_mcp_agent(registry, agent, transport), 10)
        reply = await asyncio.wait_for(client.reach("show", {}, session_id="oauth-1"), 10)
    assert described.capabilities[0].name == "show"
    assert reply.status == "success", reply.error
    seen = counts(protected)
    assert (seen["register"], seen["grant:authorization_code"]) == (1, 1)
    assert seen["unauthorised"] == 1


def _verified(proof: str) -> dict[str, Any]:
    """A DPoP proof's claims, after checking its signature with the key its header carries."""
    head = json.loads(base64.urlsafe_b64decode(proof.split(".")[0] + "=="))
    assert head["typ"] == "dpop+jwt" and head["alg"] == "ES256"
    claims: dict[str, Any] = jwt.decode(proof, ECKey.import_key(head["jwk"])).claims
    return claims


def _response(status: int, body: dict[str, object]) -> HttpResponse:
    return HttpResponse(status, {"Content-Type": "application/json"}, json.dumps(body).encode())


def test_an_expired_token_is_refreshed_with_the_refresh_token() -> None:
    """On the clock: a token lasting 60 s is valid at 59 s, expired at 60 s; the refresh grant sends the refresh
    token and the client's credentials, and keeps the new tokens."""
    clock = FakeClock()
    settings = OAuthSettings.of({"client_id": "c1", "client_secret": "s1"})
    oauth = OAuthClient("http://127.0.0.1:9/mcp", settings, issuer="http://127.0.0.1:9")
    assert oauth._keep(_response(200, {"access_token": "a1", "refresh_token": "r1", "expires_in": 60}), clock.now())
    clock.advance(59)
    assert not oauth.expired(clock.now())
    clock.advance(1)
    assert oauth.expired(clock.now())
    running = Running(oauth.refresh(clock.now()))
    assert running.request is not None and running.request.url == "http://127.0.0.1:9/token"
    form = parse_qs((running.request.body or b"").decode())
    assert form["grant_type"] == ["refresh_token"] and form["refresh_token"] == ["r1"]
    assert running.request.headers["Authorization"].startswith("Basic ")
    running.feed(_response(200, {"access_token": "a2", "expires_in": 60}))
    assert running.request is None
    assert oauth.authorization("POST", "http://127.0.0.1:9/mcp") == {"Authorization": "Bearer a2"}
    assert oauth.refresh_token == "r1" and not oauth.expired(clock.now())


def test_an_unknown_oauth_option_names_the_known_ones() -> None:
    """A misspelt key is refused with the list of keys that exist."""
    with pytest.raises(ConfigError, match="client_secret"):
        OAuthSettings.of({"client_secret_key": "x"})


def test_a_dpop_token_is_presented_with_a_fresh_proof_bound_to_each_request() -> None:
    """A DPoP token (RFC 9449): the DPoP scheme, and per request a new proof naming its method, URL and the token."""
    oauth = OAuthClient("http://127.0.0.1:9/mcp", OAuthSettings.of({}), dpop=DPoP())
    oauth._keep(_response(200, {"access_token": "a1", "token_type": "DPoP"}), 0.0)
    first, second = (oauth.authorization("POST", "http://127.0.0.1:9/mcp?x=1") for _ in range(2))
    assert first["Authorization"] == "DPoP a1"
    claims = [_verified(headers["DPoP"]) for headers in (first, second)]
    assert claims[0]["htm"] == "POST" and claims[0]["htu"] == "http://127.0.0.1:9/mcp"
    digest = base64.urlsafe_b64encode(hashlib.sha256(b"a1").digest()).rstrip(b"=").decode()
    assert claims[0]["ath"] == digest
    assert claims[0]["jti"] != claims[1]["jti"]
