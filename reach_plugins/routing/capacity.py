"""Free capacity per agent and per capability, from the registry: the capacity half of a ranked near tie.

An agent's free capacity is ``mean(1 - load)`` over its ready, alive
instances (0 when it has none: nothing can take the call); a capability's is
that of the freest agent offering it (where the router can still place the
call). The table is computed in one pass over the registry and kept while
the registry revision stays and for at most ``ttl`` seconds of the clock:
heartbeats move load without moving the revision, and a ranking must see a
load figure at most ``ttl`` old, while a call costs a dict lookup.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from reach_plugins.errors import ConfigError
from reach_plugins.model import Instance
from reach_plugins.registry.base import RegistryView


class FreeCapacity:
    """``capacity(name)``: a capability's free capacity in [0, 1] (0 for one nobody offers)."""

    def __init__(self, view: RegistryView, *, clock: Callable[[], float] = time.time, ttl: float = 1.0) -> None:
        if not ttl > 0:
            raise ConfigError(f"ttl must be a positive number of seconds (how old a load figure may be), got {ttl}")
        self.view = view
        self.ttl = ttl
        self._clock = clock
        self._revision: int | None = None
        self._until = 0.0
        self._agents: dict[str, float] = {}
        self._capabilities: dict[str, float] = {}

    def __call__(self, capability: str) -> float:
        return self._fresh().get(capability, 0.0)

    def agent(self, name: str) -> float:
        """The free capacity of agent ``name`` (0 for an unknown agent)."""
        self._fresh()
        return self._agents.get(name, 0.0)

    def _fresh(self) -> dict[str, float]:
        now = self._clock()
        view = self.view
        if view.revision != self._revision or not now < self._until:
            self._revision, self._until = view.revision, now + self.ttl
            self._agents, self._capabilities = _table(view, now)
        return self._capabilities


def _table(view: RegistryView, now: float) -> tuple[dict[str, float], dict[str, float]]:
    """Every agent's free capacity, and every capability's (its freest agent's), in one pass."""
    agents: dict[str, float] = {}
    capabilities: dict[str, float] = {}
    for name, agent in view.agents().items():
        room = [1.0 - inst.load for inst in view.instances(name).values() if _ready(view, inst, now)]
        free = agents[name] = sum(room) / len(room) if room else 0.0
        for capability in agent.capabilities:
            capabilities[capability.name] = max(free, capabilities.get(capability.name, 0.0))
    return agents, capabilities


def _ready(view: RegistryView, inst: Instance, now: float) -> bool:
    return inst.status == "ready" and view.is_alive(inst, now)
