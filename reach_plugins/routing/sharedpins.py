"""One pin per conversation across processes: the local router's pin agrees with the shared store's.

Each process's router pins a new conversation by rendezvous hashing under a
bounded load it counts itself, so two processes can pick different instances
for one conversation. With a shared :class:`~reach_plugins.stores.sessions.PinStore`
the first pick written wins: a process routes locally, offers its pick to the
store, and adopts the stored pin when another process was first. A stored pin
that cannot serve here (gone, unhealthy, breaker open) is replaced with this
process's new pick, unless another process replaced it first (DESIGN 11.3).
"""

from __future__ import annotations

from reach_plugins.errors import ReachError
from reach_plugins.model import ReachRequest
from reach_plugins.routing.router import Router
from reach_plugins.stores.sessions import PinStore, session_key
from reach_plugins.wire.headers import PREFER, TARGET


async def agree_on_pin(router: Router, store: object, request: ReachRequest) -> None:
    """Make ``router``'s pin of the request's conversation the one in ``store`` (a no-op without a PinStore)."""
    session_id = request.session_id
    metadata = request.metadata
    if session_id is None or not isinstance(store, PinStore) or TARGET in metadata or PREFER in metadata:
        return
    key = session_key(request.tenant, session_id)
    try:
        route = router.route(request)
    except ReachError:
        return  # nothing can serve it here: the pipeline raises the same error
    agent, chosen = route.agent.name, route.instance.instance_id
    stored = await store.claim_pin(key, agent, chosen)
    if stored == chosen:
        return
    router.sessions.pin(key, request.capability, agent, stored)
    again = router.route(request)
    if again.agent.name == agent and again.instance.instance_id == stored:
        return
    replaced = await store.claim_pin(key, again.agent.name, again.instance.instance_id, replace=stored)
    if replaced != again.instance.instance_id:
        router.sessions.pin(key, request.capability, again.agent.name, replaced)
