"""Capability index: capability name -> the agents offering it, rebuilt only when the registry revision moves.

A dict lookup per request keeps the first routing step O(1) whatever the
number of agents; heartbeats do not change the revision, so they never force a
rebuild. Offers are ordered by priority, then cost (the capability's ``cost``,
else the agent's ``routing.cost``), then name; the distinct
``input_tokens_required`` limits of a capability are kept sorted so the router
estimates a payload's tokens only for capabilities that have a limit.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from reach_plugins.model import AgentDescriptor, Capability
from reach_plugins.registry.base import RegistryView


@dataclass(frozen=True, slots=True)
class Offer:
    """One agent offering one capability, with the routing preferences the hot path reads."""

    agent: AgentDescriptor
    capability: Capability
    name: str
    priority: int
    weight: int
    cost: float = 0.0
    """The capability's ``cost`` when it names one, else the agent's ``routing.cost``: cheaper is tried first."""


@dataclass(frozen=True, slots=True)
class CapabilityIndex:
    """Offers per capability name, best priority first, for one registry revision."""

    revision: int
    offers: Mapping[str, tuple[Offer, ...]]
    token_limits: Mapping[str, tuple[int, ...]]
    """Per capability name, the distinct ``input_tokens_required`` of its offers, ascending (absent: no limit)."""

    @classmethod
    def build(cls, view: RegistryView) -> CapabilityIndex:
        revision = view.revision
        found: dict[str, list[Offer]] = {}
        for agent in view.agents().values():
            routing = agent.routing
            for capability in agent.capabilities:
                cost = routing.cost if capability.cost is None else capability.cost
                offer = Offer(agent, capability, agent.name, routing.priority, routing.weight, cost)
                found.setdefault(capability.name, []).append(offer)
        ordered = {
            name: tuple(sorted(group, key=lambda o: (o.priority, o.cost, o.name))) for name, group in found.items()
        }
        limits = {name: _limits(group) for name, group in found.items()}
        return cls(revision=revision, offers=ordered, token_limits={name: cut for name, cut in limits.items() if cut})

    def closest(self, capability: str, limit: int = 3) -> list[str]:
        """Known capability names that look like ``capability`` (for ``UnknownCapability``)."""
        return difflib.get_close_matches(capability, list(self.offers), n=limit, cutoff=0.5)


def _limits(offers: list[Offer]) -> tuple[int, ...]:
    """The distinct token limits among ``offers``, ascending."""
    found = {offer.capability.input_tokens_required for offer in offers}
    return tuple(sorted(limit for limit in found if limit is not None))
