"""Wiring of the issuer role into servers: the issuer a gateway or ``reach issuer`` runs, the tenant rule it applies,
and the transport a gateway or node reaches agents with (token added, L3 audited).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from reach_plugins.errors import ConfigError
from reach_plugins.security.audit import AuditTransport
from reach_plugins.security.claims import DEFAULT_TTL
from reach_plugins.security.issuer import MayReach, TokenIssuer
from reach_plugins.security.keys import ENV_KEYS, KeyRing
from reach_plugins.security.source import LocalTokens, default_issuer
from reach_plugins.security.token_transport import TokenTransport
from reach_plugins.security.trust_guard import TrustGuard, l1_problem

if TYPE_CHECKING:
    from reach_plugins.config.loader import TenantConfig
    from reach_plugins.security.audit import AuditHook
    from reach_plugins.server.access import Access
    from reach_plugins.transport import Transport


def tenant_rule(tenants: Mapping[str, TenantConfig]) -> MayReach:
    """The tenant allow-list as the issuer's rule (no tenant table: every tenant may ask)."""

    def may_reach(tenant: str | None, agent: str) -> str | None:
        if not tenants:
            return None
        config = tenants.get(tenant) if tenant is not None else None
        if config is None:
            return f"tenant {tenant!r} is not in the tenant table"
        if config.agents != "*" and agent not in config.agents:
            return f"tenant {tenant!r} may not reach agent {agent!r} (its allow-list: {', '.join(config.agents)})"
        return None

    return may_reach


def build_issuer(
    tenants: Mapping[str, TenantConfig],
    *,
    keys: Sequence[str | os.PathLike[str]] = (),
    name: str = "reach",
    ttl: float = DEFAULT_TTL,
    environ: Mapping[str, str] = os.environ,
    trust: Mapping[str, str] | None = None,
) -> TokenIssuer:
    """An issuer signing with ``keys`` (PEM files, else ``$REACH_ISSUER_KEYS``, else this process's in-process key,
    so agents served in the same process with ``default_issuer().verifier()`` accept its tokens); ``trust`` (agent
    name -> trust level, from the config's agents) is written into tokens and keeps L3 tokens from exchange."""
    ring = KeyRing.load(keys, environ=environ) if keys or environ.get(ENV_KEYS) else default_issuer().keys
    trust_of = dict(trust).get if trust else None
    return TokenIssuer(ring, issuer=name, ttl=ttl, may_reach=tenant_rule(tenants), trust_of=trust_of)


def presenter_tokens(names: Mapping[str, str], environ: Mapping[str, str], access: Access) -> dict[str, str]:
    """Each agent's issuer token (agent name -> the variable holding it), with which it presents the tokens it
    received for exchange (``--agent-token NAME=ENV`` of ``reach issuer`` and ``reach gateway``). A variable unset,
    two agents sharing a token, or an agent sharing a tenant's bearer is a ConfigError: a token names one caller."""
    tokens: dict[str, str] = {}
    for agent, variable in names.items():
        token = environ.get(variable)
        if not token:
            raise ConfigError(
                f"agent {agent!r}: environment variable {variable} is not set; it holds the token this agent "
                "presents to exchange the tokens it receives"
            )
        tokens[agent] = token
    if len(set(tokens.values())) < len(tokens):
        raise ConfigError("two agents share one issuer token; give each agent its own")
    shared = sorted(tenant for tenant in access.tenants if access.token(tenant) in tokens.values())
    if shared:
        raise ConfigError(f"tenants {shared} share a token with an agent; give every tenant and agent its own")
    return tokens


def agent_transport(
    issuer: TokenIssuer, *, via: str | None, audit: AuditHook | str | None = None, inner: Transport | None = None
) -> Transport:
    """How a server reaches agents: DirectTransport with its own token per agent, L3 calls audited (else refused),
    L1 calls only over https with a client certificate, as the client's own (refused before a token is made)."""
    if inner is None:
        from transports.direct import DirectTransport

        inner = DirectTransport()
    inner = AuditTransport(inner, audit)
    return TrustGuard(TokenTransport(inner, LocalTokens(issuer, via=via)), check=l1_problem)
