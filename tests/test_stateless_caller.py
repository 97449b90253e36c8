"""A stateless caller's first call to each agent: its token is signed inline and verifies; new instances stay cheap."""

from __future__ import annotations

import base64
import json

import jwt
import pytest

from reach_plugins.model import CircuitBreakerConfig
from reach_plugins.policy.breaker import CircuitBreaker
from reach_plugins.security.issuer import TokenIssuer
from reach_plugins.security.keys import ALGORITHM, KeyRing, SigningKey
from reach_plugins.security.source import LocalTokens


def test_a_token_miss_is_signed_without_suspending() -> None:
    """A tenant's token for a new agent is made in the same step: the coroutine finishes on its first send."""
    tokens = LocalTokens(TokenIssuer())
    step = tokens.token("orders-17", "alpha")
    with pytest.raises(StopIteration) as done:
        step.send(None)
    assert isinstance(done.value.value, str) and done.value.value.count(".") == 2


async def test_the_inline_token_is_what_the_verifier_and_pyjwt_accept() -> None:
    """The hand-made compact JWS carries the key id and EdDSA header, and verifies with our verifier and with PyJWT."""
    key = SigningKey.generate()
    issuer = TokenIssuer(KeyRing([key]))
    token = await LocalTokens(issuer).token("orders", "alpha", trust="L2")
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"alg": ALGORITHM, "kid": key.kid, "typ": "JWT"}
    claims = await issuer.verifier().verify(token, audience="orders")
    assert (claims.subject, claims.audience, claims.tenant, claims.trust) == ("tenant:alpha", "orders", "alpha", "L2")
    decoded = jwt.decode(token, key.private.public_key(), algorithms=[ALGORITHM], audience="orders")
    assert decoded["jti"] == claims.jti and len(claims.jti) == 32
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(token, SigningKey.generate().private.public_key(), algorithms=[ALGORITHM], audience="orders")


async def test_tokens_for_different_agents_differ_and_repeat_from_the_cache() -> None:
    """One signature per target agent: the same agent gets the cached token back, another agent a new one."""
    tokens = LocalTokens(TokenIssuer())
    first = await tokens.token("orders", "alpha")
    assert await tokens.token("orders", "alpha") == first
    assert await tokens.token("billing", "alpha") != first


def test_a_breaker_window_forgets_exactly_what_slides_out() -> None:
    """The window's one list of counts: failures that slid out no longer count; those inside still open it."""
    config = CircuitBreakerConfig(window=10.0, buckets=10, min_calls=4, error_threshold=0.5)
    breaker = CircuitBreaker(config)

    def fail(now: float) -> None:
        permit = breaker.acquire(now)
        assert permit is not None
        breaker.record(permit, now, failure=True, duration=0.01)

    for _ in range(3):
        fail(0.0)
    fail(10.5)  # the three at t=0 slid out: one call in the window, below min_calls
    assert breaker.state(10.5) == "closed"
    for at in (11.0, 15.0):
        fail(at)
    assert breaker.state(15.0) == "closed"  # three inside the window
    fail(19.9)
    assert breaker.state(19.9) == "open"  # four failures within 10 s
