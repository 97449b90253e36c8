"""What a caller's core sends through: its transport, guarded by trust levels, carrying per-hop tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from reach_plugins.errors import ConfigError
from reach_plugins.security.source import LocalTokens
from reach_plugins.security.token_transport import TokenTransport
from reach_plugins.security.trust_guard import TrustGuard

if TYPE_CHECKING:
    from reach_plugins.security.source import TokenSource
    from reach_plugins.transport import Transport


def caller_transport(transport: Transport, tokens: TokenSource | Literal[False] | None) -> Transport:
    """``transport`` as a client sends through it.

    A transport to agents (not a gateway or node: those own retries and
    obtain the agents' tokens themselves) refuses L1 agents without mutual
    TLS and L3 agents outright, and adds each target's token: from ``tokens``,
    else from this process's in-process issuer (the embedded default: agents
    served here with ``tokens=default_issuer().verifier()`` accept them, with
    no setup). ``tokens=False`` sends none.
    """
    if transport.owns_retries:
        if tokens:
            raise ConfigError(
                "tokens= is for a client reaching agents directly; through a gateway or node, the hop obtains "
                "each agent's token itself (the client authenticates to the hop with its tenant token)"
            )
        return transport
    if tokens is not False:
        transport = TokenTransport(transport, tokens if tokens is not None else LocalTokens())
    return TrustGuard(transport)
