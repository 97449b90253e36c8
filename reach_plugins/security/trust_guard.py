"""The client's side of trust levels: what it refuses to send directly (DESIGN.md 11.4).

L1 agents are reached only over mutual TLS: an ``https`` endpoint and a
``cert`` credential (the client certificate DirectTransport presents). L3
agents are reached only through the gateway: a direct call is refused before
anything is sent. A gateway or node forwarding to agents applies the same L1
check (:func:`l1_problem`): a hop never sends L1 traffic, token included, over
plain http or without its client certificate.
"""

from __future__ import annotations

from collections.abc import Callable

from reach_plugins.errors import PermissionDenied
from reach_plugins.security.wrapping import Wrapping
from reach_plugins.transport import Call, EventStream, Reply, Transport


def trust_problem(call: Call) -> str | None:
    """Why ``call`` may not go straight to its agent, or ``None``."""
    agent = call.agent
    if agent.trust_level == "L3":
        return f"agent {agent.name!r} is L3 (sandboxed): it is reachable only through the gateway; use GatewayTransport"
    return l1_problem(call)


def l1_problem(call: Call) -> str | None:
    """Why ``call`` may not be sent to an L1 agent (not https, or no client certificate), or ``None``."""
    agent = call.agent
    if agent.trust_level == "L1":
        if not call.instance.endpoint.startswith("https://"):
            endpoint = call.instance.endpoint
            return f"agent {agent.name!r} is L1: it needs an https endpoint (mutual TLS), not {endpoint!r}"
        if call.credential.type != "cert":
            return (
                f"agent {agent.name!r} is L1: it is reached only with a client certificate "
                "(auth type 'cert' with client_cert/client_key and ca_file)"
            )
    return None


class TrustGuard(Wrapping):
    """``inner`` (a transport straight to agents) refusing what the agents' trust levels forbid (``check``: the
    client's :func:`trust_problem`, or a hop's :func:`l1_problem`, which reaches L3 agents under audit)."""

    def __init__(self, inner: Transport, *, check: Callable[[Call], str | None] = trust_problem) -> None:
        super().__init__(inner)
        self._problem = check

    def _check(self, call: Call) -> None:
        problem = self._problem(call)
        if problem is not None:
            raise PermissionDenied(problem)

    async def send(self, call: Call) -> Reply:
        self._check(call)
        return await self.inner.send(call)

    async def stream(self, call: Call) -> EventStream:
        self._check(call)
        async for event in self.inner.stream(call):
            yield event
