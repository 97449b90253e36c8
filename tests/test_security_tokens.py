"""Per-hop tokens, sans server: issuing, verification, rotation, exchange, caching (DESIGN.md 11.4)."""

from __future__ import annotations

import asyncio

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reach_plugins.config.loader import TenantConfig
from reach_plugins.errors import ConfigError, TokenClockSkew
from reach_plugins.security import (
    MAX_TTL,
    InvalidToken,
    KeyRing,
    LocalTokens,
    SigningKey,
    TokenCache,
    TokenDenied,
    TokenIssuer,
)
from reach_plugins.security.context import serving
from reach_plugins.security.held import holding
from reach_plugins.security.verifier import LEEWAY
from reach_plugins.server.issuer_role import tenant_rule


class WallClock:
    """A settable wall clock (tokens carry unix times)."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> WallClock:
    return WallClock()


@pytest.fixture
def issuer(clock: WallClock) -> TokenIssuer:
    return TokenIssuer(KeyRing([SigningKey.generate()]), issuer="reach", clock=clock)


async def test_issued_token_carries_the_contract_claims(issuer: TokenIssuer) -> None:
    """iss, sub, aud, tenant, chain, jti, exp are all in the token, and exp is 5 minutes out by default."""
    issued = issuer.for_tenant("alpha", "orders")
    payload = jwt.decode(issued.token, options={"verify_signature": False})
    assert {"iss", "sub", "aud", "tenant", "chain", "jti", "exp"} <= payload.keys()
    assert (payload["iss"], payload["sub"], payload["aud"], payload["tenant"]) == (
        "reach",
        "tenant:alpha",
        "orders",
        "alpha",
    )
    assert payload["exp"] - payload["iat"] == pytest.approx(300, abs=1)
    assert jwt.get_unverified_header(issued.token)["alg"] == "EdDSA"


def test_ttl_longer_than_15_minutes_is_refused() -> None:
    """A 24-hour token (the seed's incident) cannot be configured: the maximum is 15 minutes."""
    with pytest.raises(ConfigError, match="15 minutes"):
        TokenIssuer(ttl=24 * 3600)
    assert TokenIssuer(ttl=MAX_TTL).ttl == MAX_TTL


async def test_expired_token_is_refused(issuer: TokenIssuer, clock: WallClock) -> None:
    """A token past exp (plus the leeway) is refused with 'expired', even after being verified once."""
    token = issuer.for_tenant("alpha", "orders").token
    verifier = issuer.verifier()
    assert (await verifier.verify(token, audience="orders")).tenant == "alpha"
    clock.now += 301 + LEEWAY
    with pytest.raises(TokenClockSkew, match="expired"):
        await verifier.verify(token, audience="orders")


async def test_token_for_another_agent_is_refused(issuer: TokenIssuer) -> None:
    """A token whose audience is orders, replayed to tickets, is refused naming both agents (no forwarding)."""
    token = issuer.for_tenant("alpha", "orders").token
    with pytest.raises(TokenDenied, match="'orders', not 'tickets'"):
        await issuer.verifier().verify(token, audience="tickets")


async def test_token_from_another_issuer_is_refused(issuer: TokenIssuer, clock: WallClock) -> None:
    """A well-formed token signed by another issuer's key — even one using the same name — is refused."""
    rogue = TokenIssuer(KeyRing([SigningKey.generate()]), issuer="reach", clock=clock)
    with pytest.raises(InvalidToken, match="does not publish"):
        await issuer.verifier().verify(rogue.for_tenant("alpha", "orders").token, audience="orders")
    named = TokenIssuer(issuer.keys, issuer="elsewhere", clock=clock)
    with pytest.raises(InvalidToken, match="not issued by 'reach'"):
        await issuer.verifier().verify(named.for_tenant("alpha", "orders").token, audience="orders")


async def test_tampered_token_is_refused(issuer: TokenIssuer) -> None:
    """Changing the tenant in the payload breaks the signature: the token is refused."""
    token = issuer.for_tenant("alpha", "orders").token
    head, body, signature = token.split(".")
    forged_body = jwt.utils.base64url_encode(jwt.utils.base64url_decode(body).replace(b'"alpha"', b'"betaa"')).decode()
    with pytest.raises(InvalidToken):
        await issuer.verifier().verify(f"{head}.{forged_body}.{signature}", audience="orders")


async def test_alg_none_and_hs256_are_refused(issuer: TokenIssuer) -> None:
    """Tokens using another algorithm (none, HS256 keyed with the public key) are refused before any key lookup."""
    unsigned = jwt.encode({"aud": "orders"}, None, algorithm="none")
    hmac = jwt.encode({"aud": "orders"}, "secret-secret-secret-secret-secret", algorithm="HS256")
    for token in (unsigned, hmac):
        with pytest.raises(InvalidToken, match="EdDSA"):
            await issuer.verifier().verify(token, audience="orders")


async def test_rotation_keeps_old_tokens_valid_and_signs_with_the_new_key(issuer: TokenIssuer) -> None:
    """After rotate(): old tokens still verify, new ones use the new kid; retiring the old key ends the old tokens."""
    verifier = issuer.verifier()
    old_kid = issuer.keys.active.kid
    old = issuer.for_tenant("alpha", "orders").token
    new_key = issuer.keys.rotate()
    new = issuer.for_tenant("alpha", "orders").token
    assert jwt.get_unverified_header(new)["kid"] == new_key.kid != old_kid
    assert [k["kid"] for k in issuer.jwks()["keys"]] == [new_key.kid, old_kid]
    await verifier.verify(old, audience="orders")
    await verifier.verify(new, audience="orders")
    issuer.keys.retire(old_kid)
    fresh_verifier = TokenIssuer(issuer.keys, issuer="reach").verifier()
    with pytest.raises(InvalidToken, match="does not publish"):
        await fresh_verifier.verify(old, audience="orders")


async def test_exchange_binds_the_chain_and_never_returns_the_received_token(issuer: TokenIssuer) -> None:
    """front exchanges its token for one to orders: sub front, chain [tenant:alpha], tenant kept, a new token."""
    received = issuer.for_tenant("alpha", "front").token
    exchanged = await issuer.exchange(received, audience="orders", presenter="front")
    assert exchanged.token != received
    claims = await issuer.verifier().verify(exchanged.token, audience="orders")
    assert (claims.subject, claims.chain, claims.tenant) == ("front", ("tenant:alpha",), "alpha")


async def test_exchange_refuses_loops_and_bad_tokens(issuer: TokenIssuer, clock: WallClock) -> None:
    """A chain cannot come back to an agent already in it, and an expired token cannot be exchanged."""
    to_front = issuer.for_tenant("alpha", "front").token
    to_orders = (await issuer.exchange(to_front, audience="orders", presenter="front")).token
    with pytest.raises(TokenDenied, match="already in the token chain"):
        await issuer.exchange(to_orders, audience="front", presenter="orders")
    clock.now += 400
    with pytest.raises(InvalidToken, match="expired"):
        await issuer.exchange(to_orders, audience="tickets", presenter="orders")


async def test_tenant_rule_refuses_tokens_outside_the_allow_list(clock: WallClock) -> None:
    """The issuer gives a tenant tokens only for the agents of its allow-list."""
    tenants = {"alpha": TenantConfig(agents=["orders"])}
    issuer = TokenIssuer(issuer="reach", may_reach=tenant_rule(tenants), clock=clock)
    issuer.for_tenant("alpha", "orders")
    with pytest.raises(TokenDenied, match="may not reach agent 'payments'"):
        issuer.for_tenant("alpha", "payments")
    with pytest.raises(TokenDenied, match="not in the tenant table"):
        issuer.for_tenant("beta", "orders")


async def test_local_tokens_cache_until_shortly_before_expiry(issuer: TokenIssuer, clock: WallClock) -> None:
    """The same token is reused for the same target and tenant, and renewed in the last 10 % of its life."""
    tokens = LocalTokens(issuer)
    first = await tokens.token("orders", "alpha")
    assert await tokens.token("orders", "alpha") == first
    assert await tokens.token("orders", "beta") != first
    assert await tokens.token("tickets", "alpha") != first
    clock.now += 300 * 0.9 + 1
    assert await tokens.token("orders", "alpha") != first


async def test_concurrent_misses_share_one_issue(issuer: TokenIssuer) -> None:
    """Fifty concurrent first calls for one target get one token, issued once."""
    tokens = LocalTokens(issuer)
    got = await asyncio.gather(*(tokens.token("orders", "alpha") for _ in range(50)))
    assert len(set(got)) == 1


async def test_local_tokens_exchange_inside_a_served_handler(issuer: TokenIssuer) -> None:
    """Serving front and holding its received token (as the agent SDK does around a handler), the source exchanges
    it with front as the presenter."""
    received = issuer.for_tenant("alpha", "front").token
    tokens = LocalTokens(issuer)
    with serving("front", "handle"), holding(received):
        token = await tokens.token("orders", "ignored-tenant")
    claims = await issuer.verifier().verify(token, audience="orders")
    assert (claims.subject, claims.tenant) == ("front", "alpha")


def test_token_cache_is_bounded(clock: WallClock) -> None:
    """The cache never holds more than max_entries tokens."""
    cache = TokenCache(clock=clock, max_entries=3)
    for i in range(10):
        cache.put((f"a{i}", None, None), f"t{i}", clock.now + 300)
    assert cache.get(("a9", None, None)) == "t9"
    assert sum(cache.get((f"a{i}", None, None)) is not None for i in range(10)) == 3


def test_keys_load_from_files_and_env(tmp_path: pytest.TempPathFactory) -> None:
    """Keys come from PEM files (newest first) or $REACH_ISSUER_KEYS; a non-Ed25519 or garbage key is a ConfigError."""
    new, old = SigningKey.generate(), SigningKey.generate()
    paths = []
    for name, key in (("new.pem", new), ("old.pem", old)):
        path = tmp_path / name  # type: ignore[operator]
        path.write_bytes(key.pem())
        paths.append(path)
    ring = KeyRing.load(paths)
    assert ring.active.kid == new.kid and ring.get(old.kid) is not None
    from_env = KeyRing.load(environ={"REACH_ISSUER_KEYS": (new.pem() + old.pem()).decode()})
    assert [k["kid"] for k in from_env.jwks()["keys"]] == [new.kid, old.kid]
    with pytest.raises(ConfigError, match="PEM"):
        KeyRing.load(environ={"REACH_ISSUER_KEYS": "-----BEGIN PRIVATE KEY-----\nxx\n-----END PRIVATE KEY-----"})


@given(st.text(max_size=300) | st.binary(max_size=200).map(lambda b: b.hex()))
@settings(max_examples=300, deadline=None)
def test_any_garbage_token_is_an_invalid_token(garbage: str) -> None:
    """Whatever arrives in X-Reach-Token, the verifier answers InvalidToken (a 401), never another exception."""
    issuer = TokenIssuer()
    with pytest.raises(InvalidToken):
        asyncio.run(issuer.verifier().verify(garbage, audience="orders"))


@given(st.dictionaries(st.sampled_from(["alg", "kid", "typ"]), st.text(max_size=20) | st.integers() | st.none()))
@settings(max_examples=200, deadline=None)
def test_any_forged_header_is_an_invalid_token(header: dict[str, object]) -> None:
    """Tokens with arbitrary JOSE headers and a bogus signature are refused as InvalidToken."""
    import base64
    import json

    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    token = f"{part(header)}.{part({'aud': 'orders', 'tenant': 'alpha'})}.{part('sig')}"
    with pytest.raises(InvalidToken):
        asyncio.run(TokenIssuer().verifier().verify(token, audience="orders"))


def test_a_wrapping_transport_keeps_the_inner_transports_promises() -> None:
    """A token/trust/audit wrapper declares what its inner transport declares: retry owner, hop."""
    from reach_plugins.security.wrapping import Wrapping
    from transports.direct import DirectTransport
    from transports.gateway import GatewayTransport

    direct, hop = Wrapping(DirectTransport()), Wrapping(GatewayTransport("http://127.0.0.1:9"))
    assert (direct.owns_retries, direct.hop) == (False, None)
    assert hop.owns_retries and hop.hop is not None
