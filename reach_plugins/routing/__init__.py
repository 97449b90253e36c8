"""Capability routing: index, tenant rules, health, priority tiers, session affinity, weighted round robin.

``Router(view).route(request)`` returns a :class:`Route`: the instance to call,
its agent and capability, and the :class:`~reach_plugins.model.RouteDecision`
that explains the choice.
"""

from reach_plugins.routing.affinity import Rendezvous, SessionTable
from reach_plugins.routing.capacity import FreeCapacity
from reach_plugins.routing.index import CapabilityIndex, Offer
from reach_plugins.routing.route import AvailabilityHook, Route, TenantLike
from reach_plugins.routing.router import Router
from reach_plugins.routing.swrr import SmoothWeightedRoundRobin

__all__ = [
    "AvailabilityHook",
    "CapabilityIndex",
    "FreeCapacity",
    "Offer",
    "Rendezvous",
    "Route",
    "Router",
    "SessionTable",
    "SmoothWeightedRoundRobin",
    "TenantLike",
]
