"""The token issuer (sans-IO): signs short-lived per-hop tokens and exchanges a received token for the next hop.

``issue`` serves a tenant's caller (a client, a gateway, a node) reaching an
agent; ``exchange`` serves an agent reaching further: the token it received
(audience = that agent) becomes a new token whose subject is that agent,
bound to the chain so far. The received token itself is never sent on.
``may_reach(tenant, agent)`` (the tenant allow-list) is asked before issuing
to a tenant; an exchange continues a call already admitted.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jwt

from reach_plugins.errors import ConfigError, TokenDenied
from reach_plugins.security.claims import DEFAULT_TTL, MAX_CHAIN, MAX_TTL, TENANT_PREFIX, Claims
from reach_plugins.security.keys import ALGORITHM, KeyRing
from reach_plugins.security.verifier import KeySource, TokenVerifier

MayReach = Callable[[str | None, str], "str | None"]
"""``(tenant, agent) -> None`` when allowed, else the reason it is not."""


@dataclass(frozen=True, slots=True)
class Issued:
    """A signed token and the wall-clock time it expires."""

    token: str
    expires_at: float
    claims: Claims


class TokenIssuer:
    """Signs tokens with ``keys.active``; ``jwks()`` publishes every key of the ring."""

    def __init__(
        self,
        keys: KeyRing | None = None,
        *,
        issuer: str = "reach",
        ttl: float = DEFAULT_TTL,
        may_reach: MayReach | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < ttl <= MAX_TTL:
            raise ConfigError(f"token ttl must lie in (0, {MAX_TTL:g}] seconds (15 minutes at most), got {ttl!r}")
        self.keys = keys or KeyRing.load(environ={})
        self.issuer = issuer
        self.ttl = ttl
        self._may_reach = may_reach
        self.clock = clock
        self._verifier = TokenVerifier(issuer=issuer, keys=RingKeys(self.keys), clock=clock)

    def jwks(self) -> dict[str, Any]:
        return self.keys.jwks()

    def verifier(self) -> TokenVerifier:
        """A verifier trusting this issuer in-process (its keys, rotation included)."""
        return self._verifier

    def issue(
        self,
        *,
        subject: str,
        audience: str,
        tenant: str | None,
        chain: tuple[str, ...] = (),
        via: str | None = None,
        ttl: float | None = None,
    ) -> Issued:
        """A token for ``subject`` to reach ``audience`` on ``tenant``'s behalf (``TokenDenied`` if not allowed)."""
        if self._may_reach is not None:
            reason = self._may_reach(tenant, audience)
            if reason is not None:
                raise TokenDenied(f"no token for agent {audience!r}: {reason}")
        return self._sign(subject=subject, audience=audience, tenant=tenant, chain=chain, via=via, ttl=ttl)

    def _sign(
        self,
        *,
        subject: str,
        audience: str,
        tenant: str | None,
        chain: tuple[str, ...],
        via: str | None,
        ttl: float | None,
    ) -> Issued:
        if len(chain) >= MAX_CHAIN:
            raise TokenDenied(f"the token chain is {len(chain)} hops long; at most {MAX_CHAIN} are issued")
        lifetime = self.ttl if ttl is None else min(ttl, self.ttl)
        now = self.clock()
        expires = now + lifetime
        payload: dict[str, Any] = {
            "iss": self.issuer,
            "sub": subject,
            "aud": audience,
            "tenant": tenant,
            "chain": list(chain),
            "jti": uuid.uuid4().hex,
            "iat": int(now),
            "exp": expires,
        }
        if via is not None:
            payload["via"] = via
        key = self.keys.active
        token = jwt.encode(payload, key.private, algorithm=ALGORITHM, headers={"kid": key.kid})
        return Issued(token, expires, Claims.from_payload(payload))

    def for_tenant(self, tenant: str | None, audience: str, *, via: str | None = None) -> Issued:
        """A token a tenant's caller presents to ``audience``."""
        return self.issue(subject=f"{TENANT_PREFIX}{tenant or ''}", audience=audience, tenant=tenant, via=via)

    async def exchange(self, subject_token: str, *, audience: str) -> Issued:
        """The token an agent presents to ``audience`` in place of the one it received (never forwarded)."""
        received = await self._verifier.verify(subject_token)
        if received.audience == audience:
            raise TokenDenied(f"agent {audience!r} cannot exchange a token for a call to itself")
        chain = (*received.chain, received.subject)
        if audience in chain:
            raise TokenDenied(f"agent {audience!r} is already in the token chain {' -> '.join(chain)}: a loop")
        return self._sign(
            subject=received.audience, audience=audience, tenant=received.tenant, chain=chain, via=None, ttl=None
        )


class RingKeys(KeySource):
    """The public keys of an in-process :class:`KeyRing` (always current: nothing to refresh)."""

    def __init__(self, ring: KeyRing) -> None:
        self._ring = ring
        self._cache: dict[str, Any] = {}

    def key(self, kid: str) -> Any:
        found = self._cache.get(kid)
        if found is None:
            signing = self._ring.get(kid)
            if signing is None:
                return None
            found = self._cache[kid] = signing.private.public_key()
        elif self._ring.get(kid) is None:
            del self._cache[kid]
            return None
        return found

    async def refresh(self) -> None:
        return None
