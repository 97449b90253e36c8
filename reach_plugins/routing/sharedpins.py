"""One pin per conversation across processes: the local router's pin agrees with the shared store's.

Each process's router pins a new conversation by rendezvous hashing under a
bounded load it counts itself, so two processes can pick different instances
for one conversation. With a shared :class:`~reach_plugins.stores.sessions.PinStore`
the first pick written wins: a process routes locally, offers its pick to the
store, and adopts the stored pin when another process was first. A stored pin
that cannot serve here (gone, unhealthy, breaker open) is replaced with this
process's new pick, unless another process replaced it first (DESIGN 11.3).

There is one decision per turn: :func:`agree_on_pin` returns the route the
pipeline then takes as it is (routing again would see the new pin as a plain
one and drop the ``context_restore`` of a conversation that moved). Whenever
the conversation leaves the instance it was pinned to — locally or in the
store — the route is a context restore. A failover inside the pipeline moves
the pin on: :func:`follow_failover` writes it to the store, so the next turn,
in any process, goes where this one was served and no conversation is served
by two live instances.
"""

from __future__ import annotations

from reach_plugins.errors import ReachError
from reach_plugins.model import ReachRequest, ReachResponse, RouteDecision
from reach_plugins.routing.route import Route
from reach_plugins.routing.router import Router
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.sessions import PinStore, session_key
from reach_plugins.wire.headers import PREFER, TARGET


async def agree_on_pin(router: Router, store: object, request: ReachRequest) -> Route | None:
    """The route of the request's conversation, agreed with ``store``; ``None`` without a PinStore (or a pin
    the caller chose, or nothing to serve it here): the pipeline routes then."""
    key = _conversation(store, request)
    if key is None or not isinstance(store, PinStore):
        return None
    pins = router.sessions.get(key)
    before = dict(pins.instances) if pins is not None else {}
    try:
        route = router.route(request)
    except ReachError:
        return None  # nothing can serve it here: the pipeline raises the same error
    agent, chosen = route.agent.name, route.instance.instance_id
    left = before.get(agent)
    stored = await store.claim_pin(key, agent, chosen, replace=left if left != chosen else None)
    if stored == chosen:
        return route
    router.sessions.pin(key, request.capability, agent, stored)
    again = router.route(request)
    if again.agent.name == agent and again.instance.instance_id == stored:
        return again  # the pin another process wrote first, usable here
    replaced = await store.claim_pin(key, again.agent.name, again.instance.instance_id, replace=stored)
    if replaced == again.instance.instance_id:
        return again  # moved off the stored pin: the router flagged it restored
    router.sessions.pin(key, request.capability, again.agent.name, replaced)
    return _restored(router.route(request), f"{agent}/{stored}")


async def follow_failover(
    router: Router, store: object, request: ReachRequest, agreed: Route | None, served: ReachResponse
) -> None:
    """After a turn: if the pipeline failed over away from the ``agreed`` route, move the stored pin with it."""
    key = _conversation(store, request)
    if key is None or not isinstance(store, PinStore) or agreed is None or not served.instance or not served.agent:
        return
    agent, instance = served.agent, served.instance
    if agent == agreed.agent.name and instance == agreed.instance.instance_id:
        return
    replace = agreed.instance.instance_id if agent == agreed.agent.name else None
    stored = await store.claim_pin(key, agent, instance, replace=replace)
    if stored != instance:
        router.sessions.pin(key, request.capability, agent, stored)


def _conversation(store: object, request: ReachRequest) -> ScopedKey | None:
    """The conversation's key when the store shares pins and the caller did not pick the instance itself."""
    session_id = request.session_id
    metadata = request.metadata
    if session_id is None or not isinstance(store, PinStore) or TARGET in metadata or PREFER in metadata:
        return None
    return session_key(request.tenant, session_id)


def _restored(route: Route, left: str) -> Route:
    """``route`` as a context restore: the conversation left ``left`` (``agent/instance``) for it."""
    if route.affinity == "restored":
        return route

    def explain() -> RouteDecision:
        decision = route.decision
        reason = f"{decision.reason}; moved off {left}, which another process replaced: context restore"
        return decision.model_copy(update={"affinity": "restored", "context_restore": True, "reason": reason})

    return Route(route.agent, route.instance, route.capability, explain=explain, affinity="restored")
