"""The capability router: which instance of which agent serves a request, and why (DESIGN.md section 6).

Steps: capability index -> intents and scope tags -> tenant allow-list and
``internal_only`` (cached per registry revision in a :class:`Plan`) -> health
(heartbeat fresh, ``ready``, breaker closed, not excluded) -> best priority
tier with a healthy instance -> session affinity (rendezvous hashing with
bounded load) or smooth weighted round robin with load-aware weights.

Draining instances take no new work, but a session already pinned to one stays
there: draining exists to let open conversations finish. A pinned session also
stays when a better priority tier recovers: moving it would lose its context.
Pins live in a bounded LRU table in this process; ``release(session_id)`` drops
them when the conversation closes.

The router is synchronous and not thread-safe: use it from one event loop. Its
caches (index, per-request plans) are keyed by the view's ``revision``, so a
registry change is picked up on the next call; heartbeats need no invalidation
because health is read live on every call.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Final, Literal

from reach_plugins.errors import CircuitOpen, NoHealthyAgent, UnknownCapability
from reach_plugins.model import CandidateScore, Instance, ReachRequest, RouteDecision
from reach_plugins.registry.base import Clock, RegistryView
from reach_plugins.routing.affinity import InstanceKey, Rendezvous, SessionTable
from reach_plugins.routing.index import CapabilityIndex, Offer
from reach_plugins.routing.policy import Plan, make_plan
from reach_plugins.routing.route import AvailabilityHook, Route, TenantLike
from reach_plugins.routing.swrr import SmoothWeightedRoundRobin

MAX_RECORDED: Final = 16
"""Candidates kept in a ``RouteDecision``: enough to explain, bounded so cost stays flat."""
_MAX_PLANS: Final = 4096
_MAX_CARDS: Final = 65_536
_CIRCUIT_OPEN: Final = "circuit open"

Affinity = Literal["none", "new", "pinned", "restored", "degraded"]
Healthy = list[tuple[Offer, Instance]]
Record = tuple[str, str, float | None]
"""A considered candidate: agent, instance id, score."""
Skip = tuple[str, str, str]
"""A skipped candidate: agent, instance id (``*`` for the whole agent), reason."""


@dataclass(slots=True)
class _Scan:
    """Healthy instances of the first tier that has any, plus why the others were skipped."""

    healthy: Healthy
    priority: int
    skipped: list[Skip]


@dataclass(frozen=True, slots=True)
class _Shown:
    """The explanation last given for a capability's round robin; reused while its inputs repeat (they mostly do)."""

    peers: list[tuple[InstanceKey, int]]
    skipped: list[Skip]
    priority: int
    shown: list[CandidateScore]
    reason: str


class Router:
    """Chooses an instance for each :class:`ReachRequest` from a registry view; never awaits."""

    def __init__(
        self,
        view: RegistryView,
        *,
        tenants: Mapping[str, TenantLike] | None = None,
        is_available: AvailabilityHook | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        bounded_load: float = 1.25,
        max_sessions: int = 100_000,
    ) -> None:
        self.view = view
        self.tenants = tenants
        self.is_available = is_available
        self._clock: Clock = clock or time.time
        self._rng = rng or random.Random()
        self._hrw = Rendezvous(bounded_load)
        self._sessions = SessionTable(max_sessions)
        self._index = CapabilityIndex.build(view)
        self._plans: dict[tuple[object, ...], Plan] = {}
        self._rr: dict[str, SmoothWeightedRoundRobin[InstanceKey]] = {}
        self._card_cache: dict[tuple[str, str, float | None, str | None], CandidateScore] = {}
        self._last_shown: dict[str, _Shown] = {}

    # ------------------------------------------------------------------ public

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> Route:
        """Pick one instance; ``exclude`` lists ``(agent, instance_id)`` pairs to avoid (failover).

        Raises ``UnknownCapability``, ``PermissionDenied``, ``NoHealthyAgent`` or
        ``CircuitOpen`` before anything is sent.
        """
        started = perf_counter_ns()
        plan = self._plan(request)
        now = self._clock()
        if request.session_id is not None:
            return self._route_session(request, request.session_id, plan, now, exclude, started)
        capability = request.capability
        scan = self._scan(plan, capability, now, exclude)
        healthy = scan.healthy
        peers = [((inst.agent, inst.instance_id), _weight(offer.weight, inst.load)) for offer, inst in healthy]
        rr = self._rr.get(capability)
        if rr is None:
            rr = self._rr[capability] = SmoothWeightedRoundRobin(self._rng)
        offer, inst = healthy[rr.pick(peers)]
        last = self._last_shown.get(capability)
        if last is not None and last.peers == peers and last.skipped == scan.skipped and last.priority == scan.priority:
            shown, reason = last.shown, last.reason
        else:
            shown = self._cards([(key[0], key[1], float(weight)) for key, weight in peers], scan.skipped)
            tier = scan.priority
            reason = f"smooth weighted round robin over {len(peers)} healthy instance(s) in priority tier {tier}"
            self._last_shown[capability] = _Shown(peers, scan.skipped, scan.priority, shown, reason)
        return self._answer(request, offer, inst, shown, reason, "none", started)

    def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]:
        """Every healthy instance, best tier first (broadcast, failover lists); touches no pin and no counter.

        Within a tier, a request with a session id is ordered by rendezvous
        score, one without by load-aware weight.
        """
        started = perf_counter_ns()
        plan = self._plan(request)
        now = self._clock()
        ordered: list[tuple[float, Offer, Instance]] = []
        skipped: list[Skip] = []
        for tier in plan.tiers:
            healthy = self._healthy(tier, now, (), skipped)
            if request.session_id is None:
                scored = [(float(_weight(offer.weight, inst.load)), offer, inst) for offer, inst in healthy]
            else:
                rank = self._ranks(request.session_id, healthy)
                scored = [(rank[inst.agent, inst.instance_id], offer, inst) for offer, inst in healthy]
            scored.sort(key=lambda item: (-item[0], item[2].agent, item[2].instance_id))
            ordered.extend(scored)
        if not ordered:
            raise _nobody(request.capability, skipped)
        ordered = ordered[:limit] if limit is not None else ordered
        shown = self._cards([(inst.agent, inst.instance_id, score) for score, _, inst in ordered], skipped)
        return [
            self._answer(request, offer, inst, shown, f"candidate {n + 1} of {len(ordered)}", "none", started)
            for n, (_, offer, inst) in enumerate(ordered)
        ]

    def release(self, session_id: str) -> bool:
        """Forget a session's pins (the conversation was closed); return whether it had any."""
        return self._sessions.release(session_id)

    forget = release

    @property
    def sessions(self) -> SessionTable:
        """The pin table (read it for metrics; change it through ``route`` and ``release``)."""
        return self._sessions

    # ------------------------------------------------------------------ sessions

    def _route_session(
        self,
        request: ReachRequest,
        session_id: str,
        plan: Plan,
        now: float,
        exclude: Collection[tuple[str, str]],
        started: int,
    ) -> Route:
        capability = request.capability
        pins = self._sessions.get(session_id)
        pinned_agent = pins.agent_for(capability, plan.by_agent) if pins is not None else None
        if pins is None or pinned_agent is None:
            scan = self._scan(plan, capability, now, exclude)
            return self._place(request, session_id, scan, "new", "new session", started)
        pinned_id = pins.instances[pinned_agent]
        offer = plan.by_agent.get(pinned_agent)
        why = f"agent {pinned_agent} can no longer serve this request"
        if offer is not None:
            inst = self.view.instances(pinned_agent).get(pinned_id)
            trouble = "deregistered" if inst is None else self._unusable(inst, now, exclude, sticky=True)
            if inst is not None and trouble is None:
                self._sessions.pin(session_id, capability, pinned_agent, pinned_id)
                reason = f"session pinned to {pinned_agent}/{pinned_id}"
                shown = self._cards([(pinned_agent, pinned_id, None)], [])
                return self._answer(request, offer, inst, shown, reason, "pinned", started)
            skipped: list[Skip] = [(pinned_agent, pinned_id, trouble or "unusable")]
            healthy = self._healthy((offer,), now, exclude, skipped)
            if healthy:
                scan = _Scan(healthy, offer.priority, skipped)
                reason = f"pinned instance {pinned_agent}/{pinned_id} unusable ({trouble}); context restore"
                return self._place(request, session_id, scan, "restored", reason, started)
            why = f"no usable instance of pinned agent {pinned_agent}"
        scan = self._scan(plan, capability, now, exclude)
        reason = f"{why}; degraded to another agent offering {capability!r}"
        return self._place(request, session_id, scan, "degraded", reason, started)

    def _place(
        self, request: ReachRequest, session_id: str, scan: _Scan, affinity: Affinity, why: str, started: int
    ) -> Route:
        """Rendezvous-hash a session over ``scan.healthy`` under the bounded-load cap, and pin it."""
        by_key = {(inst.agent, inst.instance_id): (offer, inst) for offer, inst in scan.healthy}
        placed = self._hrw.place(session_id, list(by_key), self._sessions.active)
        agent, instance_id = placed.key
        offer, inst = by_key[placed.key]
        self._sessions.pin(session_id, request.capability, agent, instance_id)
        shown = [{"agent": key[0], "instance": key[1], "score": score} for score, key in placed.ranked[:MAX_RECORDED]]
        shown += [
            {"agent": a, "instance": i, "skipped": skip} for a, i, skip in scan.skipped[: MAX_RECORDED - len(shown)]
        ]
        reason = (
            f"{why}: rendezvous hash over {len(by_key)} instance(s) in priority tier {scan.priority} "
            f"(bounded load: at most {placed.cap} sessions each) picked {agent}/{instance_id}"
        )
        return self._answer(request, offer, inst, shown, reason, affinity, started)

    def _ranks(self, session_id: str, healthy: Healthy) -> dict[InstanceKey, float]:
        return {
            key: score for score, key in self._hrw.scores(session_id, [(i.agent, i.instance_id) for _, i in healthy])
        }

    # ------------------------------------------------------------------ filtering

    def _plan(self, request: ReachRequest) -> Plan:
        index = self._index
        if index.revision != self.view.revision:
            index = self._index = CapabilityIndex.build(self.view)
            self._plans.clear()
        tenant = request.tenant
        key = (request.capability, tenant, request.intent, tuple(request.scope_tags), id(self.tenants))
        plan = self._plans.get(key)
        if plan is None:
            offers = index.offers.get(request.capability)
            if not offers:
                raise UnknownCapability(request.capability, known=index.closest(request.capability))
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            plan = self._plans[key] = make_plan(offers, request, self.tenants)
        return plan

    def _scan(self, plan: Plan, capability: str, now: float, exclude: Collection[tuple[str, str]]) -> _Scan:
        """The first priority tier with a healthy instance."""
        skipped: list[Skip] = []
        for tier in plan.tiers:
            healthy = self._healthy(tier, now, exclude, skipped)
            if healthy:
                return _Scan(healthy, tier[0].priority, skipped)
        raise _nobody(capability, skipped)

    def _healthy(
        self,
        offers: tuple[Offer, ...],
        now: float,
        exclude: Collection[tuple[str, str]],
        skipped: list[Skip],
    ) -> Healthy:
        healthy: Healthy = []
        instances = self.view.instances
        alive = self.view.is_alive
        hook = self.is_available
        for offer in offers:
            if offer.weight == 0:
                skipped.append((offer.name, "*", "routing weight 0"))
                continue
            found = instances(offer.name)
            if not found:
                skipped.append((offer.name, "*", "no instances registered"))
            for inst in found.values():
                if (
                    not exclude
                    and inst.status == "ready"
                    and alive(inst, now)
                    and (hook is None or hook(inst.agent, inst.instance_id))
                ):
                    healthy.append((offer, inst))
                    continue
                why = self._unusable(inst, now, exclude, sticky=False)
                if why is None:
                    healthy.append((offer, inst))
                else:
                    skipped.append((offer.name, inst.instance_id, why))
        return healthy

    def _unusable(
        self, inst: Instance, now: float, exclude: Collection[tuple[str, str]], *, sticky: bool
    ) -> str | None:
        """Why ``inst`` cannot take this request, or ``None``; ``sticky`` keeps a pinned session on a draining one."""
        if exclude and (inst.agent, inst.instance_id) in exclude:
            return "excluded"
        status = inst.status
        if status != "ready" and (status == "down" or not sticky):
            return status
        if not self.view.is_alive(inst, now):
            seen = inst.last_heartbeat
            return "not alive" if seen is None else f"heartbeat missed: last one {now - seen:.0f}s ago"
        hook = self.is_available
        if hook is not None and not hook(inst.agent, inst.instance_id):
            return _CIRCUIT_OPEN
        return None

    # ------------------------------------------------------------------ answers

    def _answer(
        self,
        request: ReachRequest,
        offer: Offer,
        inst: Instance,
        shown: Sequence[CandidateScore | dict[str, object]],
        reason: str,
        affinity: Affinity,
        started: int,
    ) -> Route:
        decision = RouteDecision.model_validate(
            {
                "capability": request.capability,
                "candidates": shown,
                "agent": offer.name,
                "instance": inst.instance_id,
                "endpoint": inst.endpoint,
                "reason": reason,
                "affinity": affinity,
                "context_restore": affinity == "restored",
                "degraded": affinity == "degraded",
                "elapsed_us": (perf_counter_ns() - started) / 1000,
            }
        )
        return Route(decision=decision, agent=offer.agent, instance=inst, capability=offer.capability)

    def _cards(self, records: list[Record], skipped: list[Skip]) -> list[CandidateScore]:
        """At most ``MAX_RECORDED`` candidates, scored ones first; the records are shared between decisions."""
        card = self._card
        shown = [card(agent, instance, score, None) for agent, instance, score in records[:MAX_RECORDED]]
        shown += [card(agent, instance, None, why) for agent, instance, why in skipped[: MAX_RECORDED - len(shown)]]
        return shown

    def _card(self, agent: str, instance: str, score: float | None, skipped: str | None) -> CandidateScore:
        """A ``CandidateScore`` from the cache: they are immutable and mostly repeat."""
        key = (agent, instance, score, skipped)
        card = self._card_cache.get(key)
        if card is None:
            if len(self._card_cache) >= _MAX_CARDS:
                self._card_cache.clear()
            card = self._card_cache[key] = CandidateScore(agent=agent, instance=instance, score=score, skipped=skipped)
        return card


def _weight(weight: int, load: float) -> int:
    """Load-aware SWRR weight: the agent's weight scaled by ``1 - load``, never below 1."""
    return weight if load == 0.0 else max(1, round(weight * (1.0 - load)))


def _nobody(capability: str, skipped: list[Skip]) -> NoHealthyAgent:
    reasons = {f"{agent}/{instance}": why for agent, instance, why in skipped}
    summary = "; ".join(f"{key}: {why}" for key, why in list(reasons.items())[:MAX_RECORDED])
    if len(reasons) > MAX_RECORDED:
        summary += f"; and {len(reasons) - MAX_RECORDED} more"
    if reasons and all(why == _CIRCUIT_OPEN for why in reasons.values()):
        return CircuitOpen(f"every instance offering {capability!r} has its circuit open: {summary}", reasons)
    return NoHealthyAgent(f"no healthy instance offers {capability!r}: {summary}", reasons)
