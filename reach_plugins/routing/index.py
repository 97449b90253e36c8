"""Capability index: capability name -> the agents offering it, rebuilt only when the registry revision moves.

A dict lookup per request keeps the first routing step O(1) whatever the
number of agents; heartbeats do not change the revision, so they never force a
rebuild.
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


@dataclass(frozen=True, slots=True)
class CapabilityIndex:
    """Offers per capability name, best priority first, for one registry revision."""

    revision: int
    offers: Mapping[str, tuple[Offer, ...]]

    @classmethod
    def build(cls, view: RegistryView) -> CapabilityIndex:
        revision = view.revision
        found: dict[str, list[Offer]] = {}
        for agent in view.agents().values():
            routing = agent.routing
            for capability in agent.capabilities:
                offer = Offer(agent, capability, agent.name, routing.priority, routing.weight)
                found.setdefault(capability.name, []).append(offer)
        ordered = {name: tuple(sorted(group, key=lambda o: (o.priority, o.name))) for name, group in found.items()}
        return cls(revision=revision, offers=ordered)

    def closest(self, capability: str, limit: int = 3) -> list[str]:
        """Known capability names that look like ``capability`` (for ``UnknownCapability``)."""
        return difflib.get_close_matches(capability, list(self.offers), n=limit, cutoff=0.5)
