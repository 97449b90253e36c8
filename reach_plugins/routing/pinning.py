"""Pinning a caller's chosen instance: request metadata a :class:`TargetedRouter` applies around a router.

``reach.target`` (``agent/instance``) must serve the request or nobody does (a
broadcast copy); ``reach.prefer`` names an instance to use when it can take the
request (how a gateway or node honours the instance its caller already picked).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol, runtime_checkable

from reach_plugins.errors import NoHealthyAgent
from reach_plugins.model import ReachRequest, RouteDecision
from reach_plugins.routing.route import Route
from reach_plugins.wire.headers import PREFER, TARGET


class CandidateRouter(Protocol):
    """A router that can both pick one instance and list every usable one (``reach_plugins.routing.Router``)."""

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> Route: ...

    def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]: ...


@runtime_checkable
class PinningRouter(CandidateRouter, Protocol):
    """A router that answers "is this instance a usable candidate?" directly (``Router.pinned``, O(1))."""

    def pinned(
        self, request: ReachRequest, agent: str, instance_id: str, *, exclude: Collection[tuple[str, str]] = ()
    ) -> Route | None: ...


class TargetedRouter:
    """Honours ``reach.target`` and ``reach.prefer`` pins; any other request is routed by the inner router.

    A pin is served only when the pinned instance is among the request's
    candidates (tenant rules, health and breaker all still apply) and was not
    tried already; a failed-over request therefore leaves a preferred
    instance, and a targeted one ends with ``NoHealthyAgent``. A router that
    is a :class:`PinningRouter` is asked about the pinned instance alone;
    any other is asked for all its candidates (O(instances)).
    """

    def __init__(self, router: CandidateRouter) -> None:
        self.router = router
        self._pinning = router if isinstance(router, PinningRouter) else None

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> Route:
        metadata = request.metadata
        required = metadata.get(TARGET) if metadata else None
        wanted = required or (metadata.get(PREFER) if metadata else None)
        if wanted is None:
            return self.router.route(request, exclude=exclude)
        agent, _, instance = wanted.partition("/")
        found = self._find(request, agent, instance, exclude)
        if found is not None:
            return found
        if required is not None:
            raise NoHealthyAgent(
                f"target {wanted} cannot take this {request.capability!r} request: it is not a usable candidate "
                "(unknown here, not allowed for the tenant, unhealthy, or already tried)",
                reasons={wanted: "not a usable candidate"},
            )
        return self.router.route(request, exclude=exclude)

    def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]:
        return self.router.candidates(request, limit=limit)

    def _find(
        self, request: ReachRequest, agent: str, instance: str, exclude: Collection[tuple[str, str]]
    ) -> Route | None:
        """The route to the pinned instance if it is a usable candidate not in ``exclude``."""
        if self._pinning is not None:
            return self._pinning.pinned(request, agent, instance, exclude=exclude)
        if (agent, instance) in exclude:
            return None
        for route in self.router.candidates(request):
            if route.agent.name == agent and route.instance.instance_id == instance:
                return _pinned_by_caller(route, f"{agent}/{instance}")
        return None


def _pinned_by_caller(route: Route, wanted: str) -> Route:
    """``route``, explained as the caller's pin."""

    def explain() -> RouteDecision:
        return route.decision.model_copy(update={"reason": f"pinned by the caller to {wanted}"})

    return Route(route.agent, route.instance, route.capability, explain=explain, affinity=route.affinity)
