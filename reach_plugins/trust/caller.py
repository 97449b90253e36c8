"""What a caller's core sends through: its transport, guarded by trust levels, carrying tokens when given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reach_plugins.errors import ConfigError
from reach_plugins.trust.guard import TrustGuard

if TYPE_CHECKING:
    from reach_plugins.tokens.source import TokenSource
    from reach_plugins.transport import Transport


def caller_transport(transport: Transport, tokens: TokenSource | None) -> Transport:
    """``transport`` as a client sends through it.

    A transport to agents (not a gateway or node: those own retries and
    obtain the agents' tokens themselves) refuses L1 agents without mutual
    TLS and L3 agents outright, and with ``tokens`` adds each target's token.
    """
    if transport.owns_retries:
        if tokens is not None:
            raise ConfigError(
                "tokens= is for a client reaching agents directly; through a gateway or node, the hop obtains "
                "each agent's token itself (the client authenticates to the hop with its tenant token)"
            )
        return transport
    if tokens is not None:
        from reach_plugins.tokens.transport import TokenTransport

        transport = TokenTransport(transport, tokens)
    return TrustGuard(transport)
