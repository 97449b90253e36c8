"""What the router hands back, and the small protocols it accepts from its neighbours."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from reach_plugins.model import AgentDescriptor, Capability, Instance, RouteDecision

AvailabilityHook = Callable[[str, str], bool]
"""``is_available(agent, instance_id)``: ``False`` when the instance's circuit breaker is open."""


@dataclass(frozen=True, slots=True)
class Route:
    """One routing answer: the instance to call, the agent and capability it serves, and why."""

    decision: RouteDecision
    agent: AgentDescriptor
    instance: Instance
    capability: Capability


@runtime_checkable
class TenantLike(Protocol):
    """A tenant's allow-list (``reach_plugins.config.TenantConfig`` is one)."""

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
