"""The token issuer (sans-IO): signs short-lived per-hop tokens and exchanges a received token for the next hop.

``issue`` serves a tenant's caller (a client, a gateway, a node) reaching an
agent; ``exchange`` serves an agent reaching further: the token it received
(audience = that agent) becomes a new token whose subject is that agent,
bound to the chain so far. The received token itself is never sent on.

An exchange checks everything an issue does, and more (RFC 8693's "actor"
rule): the *presenter* must be authenticated by the caller of
:meth:`TokenIssuer.exchange` (an agent's own bearer at the HTTP route, the
serving agent in-process) and must be the received token's holder; the
tenant's allow-list (``may_reach``) must admit the new audience; the chain may
not loop nor pass :data:`MAX_CHAIN`; a token held by an L3 agent is never
exchanged (it reaches further only through the gateway). Every exchange,
issued or refused, is one JSON record on the ``reach_plugins.security.exchange``
logger.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reach_plugins.errors import ConfigError, ExchangeDenied, ReachError, TokenDenied
from reach_plugins.security.auditlog import audit_logger
from reach_plugins.security.claims import DEFAULT_TTL, MAX_CHAIN, MAX_TTL, TENANT_PREFIX, Claims
from reach_plugins.security.keys import KeyRing
from reach_plugins.security.verifier import KeySource, TokenVerifier

MayReach = Callable[[str | None, str], "str | None"]
"""``(tenant, agent) -> None`` when allowed, else the reason it is not."""
exchanges = audit_logger("reach_plugins.security.exchange")
"""One JSON object per exchange (``json.dumps`` of a dict: no field is spliced into text)."""


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
        trust_of: Callable[[str], str | None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < ttl <= MAX_TTL:
            raise ConfigError(f"token ttl must lie in (0, {MAX_TTL:g}] seconds (15 minutes at most), got {ttl!r}")
        self.keys = keys or KeyRing.load(environ={})
        self.issuer = issuer
        self.ttl = ttl
        self._may_reach = may_reach
        self._trust_of = trust_of
        """An agent's trust level as this issuer's config declares it (tokens for it carry it; an L3 holder's
        token is never exchanged, whatever its claims say)."""
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
        trust: str | None = None,
    ) -> Issued:
        """A token for ``subject`` to reach ``audience`` on ``tenant``'s behalf (``TokenDenied`` if not allowed);
        ``trust`` is the audience's trust level when the caller knows it (the gateway does)."""
        reason = self._refusal(tenant, audience)
        if reason is not None:
            raise TokenDenied(f"no token for agent {audience!r}: {reason}")
        if trust is None and self._trust_of is not None:
            trust = self._trust_of(audience)
        return self._sign(subject=subject, audience=audience, tenant=tenant, chain=chain, via=via, ttl=ttl, trust=trust)

    def _refusal(self, tenant: str | None, audience: str) -> str | None:
        return None if self._may_reach is None else self._may_reach(tenant, audience)

    def _sign(
        self,
        *,
        subject: str,
        audience: str,
        tenant: str | None,
        chain: tuple[str, ...],
        via: str | None,
        ttl: float | None,
        trust: str | None = None,
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
            "jti": os.urandom(16).hex(),
            "iat": int(now),
            "exp": expires,
        }
        if via is not None:
            payload["via"] = via
        if trust is not None:
            payload["trust"] = trust
        return Issued(self.keys.active.sign(payload), expires, Claims.from_payload(payload))

    def for_tenant(
        self, tenant: str | None, audience: str, *, via: str | None = None, trust: str | None = None
    ) -> Issued:
        """A token a tenant's caller presents to ``audience``."""
        subject = f"{TENANT_PREFIX}{tenant or ''}"
        return self.issue(subject=subject, audience=audience, tenant=tenant, via=via, trust=trust)

    async def exchange(self, subject_token: str, *, audience: str, presenter: str) -> Issued:
        """The token ``presenter`` (an authenticated agent) sends to ``audience`` in place of the one it received.

        ``ExchangeDenied`` names what does not hold; ``InvalidToken`` when the received token proves nothing.
        """
        record: dict[str, Any] = {"event": "token_exchange", "presenter": presenter, "audience": audience}
        try:
            received = await self._verifier.verify(subject_token)
            record.update(subject=received.subject, holder=received.audience, tenant=received.tenant)
            record["chain"] = [*received.chain, received.subject]
            self._may_exchange(received, audience=audience, presenter=presenter)
            issued = self._sign(
                subject=received.audience,
                audience=audience,
                tenant=received.tenant,
                chain=(*received.chain, received.subject),
                via=None,
                ttl=None,
            )
        except ReachError as exc:
            exchanges.warning(json.dumps({**record, "verdict": "refused", "code": exc.code, "reason": exc.message}))
            raise
        exchanges.info(json.dumps({**record, "verdict": "issued", "jti": issued.claims.jti}))
        return issued

    def _may_exchange(self, received: Claims, *, audience: str, presenter: str) -> None:
        """Raise ``ExchangeDenied`` unless ``presenter`` may turn ``received`` into a token for ``audience``."""
        holder = received.audience
        if presenter != holder:
            raise ExchangeDenied(
                f"{presenter!r} presented a token issued to agent {holder!r}: only the agent a token was issued to "
                "may exchange it (authenticate as that agent)"
            )
        if received.trust == "L3" or (self._trust_of is not None and self._trust_of(holder) == "L3"):
            raise ExchangeDenied(
                f"agent {holder!r} is L3 (sandboxed): its token is never exchanged for a direct hop; it reaches "
                f"{audience!r} only through the gateway"
            )
        if holder == audience:
            raise ExchangeDenied(f"agent {audience!r} cannot exchange a token for a call to itself")
        chain = (*received.chain, received.subject)
        if audience in chain:
            raise ExchangeDenied(f"agent {audience!r} is already in the token chain {' -> '.join(chain)}: a loop")
        if len(chain) >= MAX_CHAIN:
            raise ExchangeDenied(f"the token chain is {len(chain)} hops long; at most {MAX_CHAIN} are issued")
        reason = self._refusal(received.tenant, audience)
        if reason is not None:
            raise ExchangeDenied(f"no token for agent {audience!r} in exchange: {reason}")


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
