"""What the router hands back, and the small protocols it accepts from its neighbours."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor, Capability, Instance, RouteDecision
from reach_plugins.policy.outliers import Standing

AvailabilityHook = Callable[[str, str], bool]
"""``is_available(agent, instance_id)``: ``False`` when the instance's circuit breaker is open."""

StandingHook = Callable[[str, str], Standing]
"""``standing(agent, instance_id)``: the share of its weight an instance keeps against its peers (outlier detection,
:mod:`reach_plugins.policy.outliers`; 0.0 while ejected) and why it is below 1.0."""

Affinity = Literal["none", "new", "pinned", "restored", "degraded"]
"""How a session's request was placed (``none`` without a session)."""


class Route:
    """One routing answer: the instance to call, the agent and capability it serves, and why.

    The why (a :class:`RouteDecision`) is built on first read of ``decision``:
    most requests are never explained (no trace asked, no sink, success), and
    building it eagerly cost more than the routing itself. ``explain`` must
    therefore capture what it reports at routing time, not read it later.
    """

    __slots__ = ("_why", "affinity", "agent", "capability", "instance")

    def __init__(
        self,
        agent: AgentDescriptor,
        instance: Instance,
        capability: Capability,
        *,
        decision: RouteDecision | None = None,
        explain: Callable[[], RouteDecision] | None = None,
        affinity: Affinity | None = None,
    ) -> None:
        why = decision if decision is not None else explain
        if why is None or (decision is not None and explain is not None):
            raise ConfigError("a Route needs exactly one of decision= (built) or explain= (built on demand)")
        self.agent = agent
        self.instance = instance
        self.capability = capability
        self._why: RouteDecision | Callable[[], RouteDecision] = why
        self.affinity: Affinity = affinity if affinity is not None else decision.affinity if decision else "none"

    @property
    def decision(self) -> RouteDecision:
        """Why the request went where it went (built once, on first read)."""
        why = self._why
        if isinstance(why, RouteDecision):
            return why
        decision = self._why = why()
        return decision

    def __repr__(self) -> str:
        return f"Route({self.agent.name}/{self.instance.instance_id}, {self.capability.name!r}, {self.affinity})"


@runtime_checkable
class TenantLike(Protocol):
    """A tenant's allow-list (``reach_plugins.config.loader.TenantConfig`` is one)."""

    def allows(self, agent_name: str) -> bool: ...


@runtime_checkable
class NamedAllowList(Protocol):
    """A tenant whose allow-list can be read: ``agents`` is a list of names or ``"*"``.

    Only a tenant that *names* an ``internal_only`` agent reaches it; ``"*"``
    does not count. Tenants without a readable list reach ``internal_only``
    agents only through the agent's own ``tenants`` list.
    """

    @property
    def agents(self) -> list[str] | str: ...
