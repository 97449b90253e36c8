"""The capability router: which instance of which agent serves a request, and why (DESIGN.md section 6).

Steps: capability index -> intents, scope tags and ``input_tokens_required``
-> tenant allow-list and ``internal_only`` (cached per registry revision in a
:class:`Plan`) -> health (heartbeat fresh, ``ready``, breaker closed, not
excluded) -> best ``(priority, cost)`` tier with a healthy instance -> session
affinity (rendezvous hashing with bounded load) or smooth weighted round robin
with load-aware weights.

How cost composes with the rest: priority first, then cost (within a priority
tier the cheapest offer with a healthy instance takes every new placement, as
LiteLLM's cost-based routing), then weight and load (smooth weighted round robin
among equal-cost offers, each weight scaled by ``1 - load``). A session already
pinned stays where it is even when a cheaper instance appears: cost orders new
placements, affinity keeps a conversation's context.

Draining instances take no new work, but a session already pinned to one stays
there: draining exists to let open conversations finish. A pinned session also
stays when a better priority tier recovers: moving it would lose its context.
Pins live in a bounded LRU table in this process, per tenant; ``release(key)`` drops
them when the conversation closes. An instance that stays above its load threshold has
some of its idle conversations marked by hot-spot relief (:mod:`reach_plugins.routing.relief`);
a marked one is placed on a peer at its next turn, as a context restore naming where it came from.

The router is synchronous and not thread-safe: use it from one event loop. Its
caches (index, per-request plans and their pools) are keyed by the view's
``revision``, so a registry change is picked up on the next call. Health is not
re-read for every instance on every call (that made a call O(n)): a
:class:`~reach_plugins.routing.pool.Pool` keeps the last full look, checks the
picked instance live, re-checks one other per call in rotation, and looks in
full again when the view's ``health`` moves (a change pushed by the registry),
or every ``refresh`` seconds while it skips an instance that heals with time.
"""

from __future__ import annotations

import math
import random
import time
from bisect import bisect_left
from collections.abc import Callable, Collection, Mapping
from time import perf_counter_ns
from typing import Final

from reach_plugins.errors import CircuitOpen, ConfigError, NoHealthyAgent, UnknownCapability
from reach_plugins.model import CandidateScore, Instance, ReachRequest, ReliefPolicy, RouteDecision
from reach_plugins.registry.base import Clock, RegistryView
from reach_plugins.routing.affinity import InstanceKey, Placement, Rendezvous, SessionTable
from reach_plugins.routing.index import CapabilityIndex, Offer
from reach_plugins.routing.policy import Plan, make_plan, payload_tokens
from reach_plugins.routing.pool import Entry, Look, Pool, Skip
from reach_plugins.routing.relief import ReliefTracker
from reach_plugins.routing.route import Affinity, AvailabilityHook, Route, StandingHook, TenantLike
from reach_plugins.stores.budget import DEFAULT_BUDGET, Budget
from reach_plugins.stores.keys import ScopedKey
from reach_plugins.stores.sessions import session_key

MAX_RECORDED: Final = 16
"""Candidates kept in a ``RouteDecision``: enough to explain, bounded so cost stays flat."""
_MAX_PLANS: Final = 4096
_MAX_CARDS: Final = 65_536
_CIRCUIT_OPEN: Final = "circuit open"

Record = tuple[str, str, float | None]
"""A considered candidate: agent, instance id, score."""
Told = Callable[[], tuple[list[CandidateScore], str]]
"""How a route is explained, when asked: the candidates shown and the reason."""


class Router:
    """Chooses an instance for each :class:`ReachRequest` from a registry view; never awaits."""

    def __init__(
        self,
        view: RegistryView,
        *,
        tenants: Mapping[str, TenantLike] | None = None,
        is_available: AvailabilityHook | None = None,
        standing: StandingHook | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        bounded_load: float = 1.25,
        max_sessions: int = 100_000,
        refresh: float = 1.0,
        relief: ReliefPolicy | None = None,
    ) -> None:
        """``relief``: hot-spot relief (:mod:`reach_plugins.routing.relief`), on by default (``enabled=False``: off)."""
        if not refresh > 0:
            raise ConfigError(f"refresh must be a positive number of seconds (how stale a pool may get), got {refresh}")
        self.view = view
        self.tenants = tenants
        self._is_available = is_available
        """The health port (breaker, ejection, probes), fixed at construction: nobody swaps it under a live router."""
        self._standing = standing
        """The outlier port: the share of its weight each instance keeps against its peers (0: ejected), and why."""
        self.refresh = refresh
        self._clock: Clock = clock or time.time
        self._rng = rng or random.Random()
        self._hrw = Rendezvous(bounded_load)
        self._sessions = SessionTable(budget=Budget(max_entries=max_sessions, max_bytes=DEFAULT_BUDGET.max_bytes))
        self._index = CapabilityIndex.build(view)
        self._pools: dict[tuple[object, ...], Pool] = {}
        self._card_cache: dict[tuple[str, str, float | None, str | None], CandidateScore] = {}
        relief = relief or ReliefPolicy()
        self.relief = ReliefTracker(relief, max_conversations=max_sessions) if relief.enabled else None
        """Turns of conversations (the pipeline reports them) and the idle ones marked to leave a hot instance."""

    # ------------------------------------------------------------------ public

    def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> Route:
        """Pick one instance; ``exclude`` lists ``(agent, instance_id)`` pairs to avoid (failover).

        Raises ``UnknownCapability``, ``PermissionDenied``, ``NoHealthyAgent`` or
        ``CircuitOpen`` before anything is sent.
        """
        started = perf_counter_ns()
        pool = self._pool(request)
        now = self._clock()
        if request.session_id is not None:
            relief = self.relief
            if relief is not None and relief.due(now):
                relief.relieve(self._loads(), now)
            return self._route_session(request, request.session_id, pool, now, exclude, started)
        if exclude:
            return self._route_excluding(request, pool, now, exclude, started)
        self._keep_fresh(pool, now)
        entry = pool.pick()
        if not self._usable_now(pool, entry, now):
            self._reload(pool, now)
            entry = pool.pick()
        shown = pool.shown
        if shown is None:
            shown = pool.shown = self._cards(
                [(*entry.key, float(entry.weight)) for entry in pool.usable[:MAX_RECORDED]], pool.skipped
            )
        flagged = dict(pool.flagged) if pool.flagged else None
        return self._answer(request, entry.offer, entry.instance, "none", started, _told(shown, pool.reason), flagged)

    def candidates(self, request: ReachRequest, *, limit: int | None = None) -> list[Route]:
        """Every healthy instance, best tier first (broadcast, failover lists); touches no pin and no counter.

        Within a tier, a request with a session id is ordered by rendezvous
        score, one without by load-aware weight.
        """
        started = perf_counter_ns()
        plan = self._pool(request).plan
        now = self._clock()
        ordered: list[tuple[float, Offer, Instance]] = []
        skipped: list[Skip] = list(plan.oversized)
        for tier in plan.tiers:
            usable = [entry for entry in self._judge(tier, now, (), skipped) if entry.weight > 0]
            if request.session_id is None:
                scored = [(float(entry.weight), entry.offer, entry.instance) for entry in usable]
            else:
                rank = self._ranks(request.session_id, [entry.key for entry in usable])
                scored = [(rank[entry.key], entry.offer, entry.instance) for entry in usable]
            scored.sort(key=lambda item: (-item[0], item[2].agent, item[2].instance_id))
            ordered.extend(scored)
        if not ordered:
            raise _nobody(request.capability, skipped)
        ordered = ordered[:limit] if limit is not None else ordered
        shown = self._cards([(inst.agent, inst.instance_id, score) for score, _, inst in ordered], skipped)
        return [
            self._answer(request, offer, inst, "none", started, _told(shown, f"candidate {n + 1} of {len(ordered)}"))
            for n, (_, offer, inst) in enumerate(ordered)
        ]

    def pinned(
        self, request: ReachRequest, agent: str, instance_id: str, *, exclude: Collection[tuple[str, str]] = ()
    ) -> Route | None:
        """The route to ``agent/instance_id`` if it is one of the request's candidates, else ``None``; O(1).

        Candidate means what :meth:`candidates` lists: an agent the request's
        plan admits (intent, scope tags, tenant) with a routing weight, and an
        instance that could take the request now (not in ``exclude``).
        """
        started = perf_counter_ns()
        offer = self._pool(request).plan.by_agent.get(agent)
        inst = self.view.instances(agent).get(instance_id) if offer is not None and offer.weight > 0 else None
        if offer is None or inst is None or self._unusable(inst, self._clock(), exclude, sticky=False) is not None:
            return None
        return self._answer(
            request, offer, inst, "none", started, self._told_one(agent, instance_id, "pinned by the caller")
        )

    def release(self, key: ScopedKey) -> bool:
        """Forget a conversation's pins (it was closed; ``key`` from ``session_key``); return whether it had any."""
        if self.relief is not None:
            self.relief.forget(key)
        return self._sessions.release(key)

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
        pool: Pool,
        now: float,
        exclude: Collection[tuple[str, str]],
        started: int,
    ) -> Route:
        capability = request.capability
        plan = pool.plan
        key = session_key(request.tenant, session_id)
        pins = self._sessions.get(key)
        pinned_agent = pins.agent_for(capability, plan.by_agent) if pins is not None else None
        if pins is None or pinned_agent is None:
            return self._place_new(request, session_id, pool, now, exclude, "new", "new session", started)
        pinned_id = pins.instances[pinned_agent]
        offer = plan.by_agent.get(pinned_agent)
        why = f"agent {pinned_agent} can no longer serve this request"
        if offer is not None:
            inst = self.view.instances(pinned_agent).get(pinned_id)
            trouble = "deregistered" if inst is None else self._unusable(inst, now, exclude, sticky=True)
            relieved = self.relief.take(key, (pinned_agent, pinned_id)) if self.relief and trouble is None else None
            if inst is not None and trouble is None and relieved is None:
                self._sessions.pin(key, capability, pinned_agent, pinned_id)
                told = self._told_one(pinned_agent, pinned_id, "session pinned")
                return self._answer(request, offer, inst, "pinned", started, told)
            if relieved is not None:
                trouble, exclude = relieved.why, {*exclude, (pinned_agent, pinned_id)}
            skipped: list[Skip] = [(pinned_agent, pinned_id, trouble or "unusable")]
            entries = self._judge((offer,), now, exclude, skipped)
            if any(entry.weight > 0 for entry in entries):
                look = Look(entries, offer.priority, skipped, offer.cost)
                reason = f"pinned instance {pinned_agent}/{pinned_id} unusable ({trouble}); context restore"
                placed = self._place(request, session_id, look.usable, look, "restored", reason, started)
                return placed if relieved is None else _moved(placed, f"{pinned_agent}/{pinned_id}")
            if inst is not None and relieved is not None:  # no peer to take it: it stays
                self._sessions.pin(key, capability, pinned_agent, pinned_id)
                told = self._told_one(pinned_agent, pinned_id, "session pinned (no peer to relieve it)")
                return self._answer(request, offer, inst, "pinned", started, told)
            why = f"no usable instance of pinned agent {pinned_agent}"
        reason = f"{why}; degraded to another agent offering {capability!r}"
        return self._place_new(request, session_id, pool, now, exclude, "degraded", reason, started)

    def _place_new(
        self,
        request: ReachRequest,
        session_id: str,
        pool: Pool,
        now: float,
        exclude: Collection[tuple[str, str]],
        affinity: Affinity,
        why: str,
        started: int,
    ) -> Route:
        """Place a session over the pool (or, when failing over, over a fresh look without ``exclude``)."""
        if exclude:
            look = self._look(pool.plan, now, exclude)
            return self._place(request, session_id, look.usable, look, affinity, why, started)
        self._keep_fresh(pool, now)
        placed = self._place_over(session_id, pool)
        if not self._usable_now(pool, pool.by_key[placed.key], now):
            self._reload(pool, now)
            placed = self._place_over(session_id, pool)
        seen = (pool.keys, pool.where, pool.skipped)
        return self._pin(request, session_id, placed, pool.by_key, seen, affinity, why, started)

    def _place_over(self, session_id: str, pool: Pool) -> Placement:
        seeds = pool.seeds
        if seeds is None:
            seeds = pool.seeds = self._hrw.seeds(pool.keys)
        return self._hrw.place(session_id, pool.keys, self._sessions.active, seeds)

    def _place(
        self,
        request: ReachRequest,
        session_id: str,
        usable: list[Entry],
        look: Look,
        affinity: Affinity,
        why: str,
        started: int,
    ) -> Route:
        """Rendezvous-hash a session over ``usable`` under the bounded-load cap, and pin it."""
        by_key = {entry.key: entry for entry in usable}
        keys = list(by_key)
        placed = self._hrw.place(session_id, keys, self._sessions.active)
        seen = (keys, look.where, look.skipped)
        return self._pin(request, session_id, placed, by_key, seen, affinity, why, started)

    def _pin(
        self,
        request: ReachRequest,
        session_id: str,
        placed: Placement,
        by_key: Mapping[InstanceKey, Entry],
        seen: tuple[list[InstanceKey], str, list[Skip]],
        affinity: Affinity,
        why: str,
        started: int,
    ) -> Route:
        """Pin the session where rendezvous hashing placed it; ``seen`` (keys, tier, skipped) explains why, later."""
        agent, instance_id = placed.key
        entry = by_key[placed.key]
        self._sessions.pin(session_key(request.tenant, session_id), request.capability, agent, instance_id)

        def told() -> tuple[list[CandidateScore], str]:
            keys, where, skipped = seen
            ranked = self._hrw.scores(session_id, keys)[:MAX_RECORDED]
            reason = (
                f"{why}: rendezvous hash over {len(keys)} instance(s) in {where} "
                f"(bounded load: at most {placed.cap} sessions each) picked {agent}/{instance_id}"
            )
            return self._cards([(*key, score) for score, key in ranked], skipped), reason

        return self._answer(request, entry.offer, entry.instance, affinity, started, told)

    def _loads(self) -> dict[InstanceKey, float]:
        """Every registered instance's load, as the registry has it (relief looks at most every ``check_every``)."""
        view = self.view
        return {(agent, i): inst.load for agent in view.agents() for i, inst in view.instances(agent).items()}

    def _ranks(self, session_id: str, keys: list[InstanceKey]) -> dict[InstanceKey, float]:
        return {key: score for score, key in self._hrw.scores(session_id, keys)}

    # ------------------------------------------------------------------ failover

    def _route_excluding(
        self, request: ReachRequest, pool: Pool, now: float, exclude: Collection[tuple[str, str]], started: int
    ) -> Route:
        """Failover: a fresh full look without ``exclude``; the pool's round robin chooses when the tier is the same.

        Rare (once per failed attempt), so it pays for an exact look rather than trusting the pool.
        """
        look = self._look(pool.plan, now, exclude)
        usable = {entry.key: entry for entry in look.usable}
        self._keep_fresh(pool, now)
        entry = None
        if pool.look is not None and pool.look.tier == look.tier:
            entry = usable.get(pool.rr.pick_where(usable.__contains__) or ("", ""))
        if entry is None:
            entry = max(look.usable, key=lambda candidate: candidate.weight)
        shown = self._cards([(*key, float(found.weight)) for key, found in usable.items()], look.skipped)
        reason = (
            f"smooth weighted round robin over {len(usable)} healthy instance(s) in {look.where}, "
            f"{len(exclude)} excluded"
        )
        return self._answer(request, entry.offer, entry.instance, "none", started, _told(shown, reason))

    # ------------------------------------------------------------------ filtering

    def _pool(self, request: ReachRequest) -> Pool:
        """The pool of the request's plan (capability, tenant, intent, scope tags, token limits its payload exceeds),
        for this registry revision. The payload's tokens are estimated only when an offer of the capability has a
        limit; plans differ only by how many of the distinct limits it exceeds, so they stay few."""
        index = self._index
        if index.revision != self.view.revision:
            index = self._index = CapabilityIndex.build(self.view)
            self._pools.clear()
        limits = index.token_limits.get(request.capability)
        tokens = payload_tokens(request.payload) if limits else None
        exceeded = 0 if limits is None or tokens is None else bisect_left(limits, tokens)
        tags = tuple(request.scope_tags)
        key = (request.capability, request.tenant, request.intent, tags, id(self.tenants), exceeded)
        pool = self._pools.get(key)
        if pool is None:
            offers = index.offers.get(request.capability)
            if not offers:
                raise UnknownCapability(request.capability, known=index.closest(request.capability))
            if len(self._pools) >= _MAX_PLANS:
                self._pools.clear()
            pool = self._pools[key] = Pool(make_plan(offers, request, self.tenants, tokens), self._rng)
        return pool

    def _keep_fresh(self, pool: Pool, now: float) -> None:
        """Load the pool if a health change was pushed or it is due, else re-check the next entry of its rotation
        (O(1))."""
        entry = pool.due()
        if entry is None or pool.health != self.view.health or now < pool.taken:  # no look, a change, time went back
            self._reload(pool, now)
            return
        if now >= pool.expires and not pool.prolong(now + self.refresh):
            self._reload(pool, now)
            return
        live = self.view.instances(entry.offer.name).get(entry.instance.instance_id)
        if live is None or (self._unusable(live, now, (), sticky=False) is None) != (entry.weight > 0):
            self._reload(pool, now)
        elif entry.weight > 0:
            self._adopt(pool, entry, live)

    def _reload(self, pool: Pool, now: float) -> None:
        """A full look (O(n)); it expires after ``refresh`` only if it skipped an instance that heals with time."""
        health = self.view.health
        look = self._look(pool.plan, now, ())
        pool.load(look, taken=now, expires=now + self.refresh if look.heals else math.inf, health=health)

    def _usable_now(self, pool: Pool, entry: Entry, now: float) -> bool:
        """Whether the picked entry can take the request now; it adopts the registry's latest record of it."""
        live = self.view.instances(entry.offer.name).get(entry.instance.instance_id)
        if live is None or self._unusable(live, now, (), sticky=False) is not None:
            return False
        self._adopt(pool, entry, live)
        return True

    def _adopt(self, pool: Pool, entry: Entry, live: Instance) -> None:
        """Take the registry's latest record of a usable entry (a heartbeat replaced it); its weight follows its load
        and its standing against its peers."""
        if live is entry.instance and self._standing is None:
            return
        entry.instance = live
        weight, why = self._weigh(entry.offer, live)
        if weight != entry.weight or why != entry.why:
            pool.reweigh(entry, weight, why)

    def _weigh(self, offer: Offer, inst: Instance) -> tuple[int, str | None]:
        """A usable instance's round-robin weight: the offer's, scaled by ``1 - load`` and by its outlier share."""
        share, why = (1.0, None) if self._standing is None else self._standing(inst.agent, inst.instance_id)
        return _weight(offer.weight, inst.load, share), why

    def _look(self, plan: Plan, now: float, exclude: Collection[tuple[str, str]]) -> Look:
        """Judge every instance, tier by tier, up to the first tier with a usable one (O(n): on reloads only)."""
        skipped: list[Skip] = list(plan.oversized)
        judged: list[Entry] = []
        heals = False
        for tier in plan.tiers:
            entries = self._judge(tier, now, exclude, skipped)
            judged += entries
            heals = heals or any(not entry.weight and entry.why != entry.instance.status for entry in entries)
            if any(entry.weight > 0 for entry in entries):
                best = tier[0]
                return Look(judged, best.priority, skipped, best.cost, best.priority in plan.priced, heals)
        raise _nobody(plan.tiers[0][0].capability.name, skipped)

    def _judge(
        self,
        offers: tuple[Offer, ...],
        now: float,
        exclude: Collection[tuple[str, str]],
        skipped: list[Skip],
    ) -> list[Entry]:
        """Every instance of ``offers`` with its round-robin weight (0 when unusable, and why into ``skipped``)."""
        judged: list[Entry] = []
        instances = self.view.instances
        for offer in offers:
            if offer.weight == 0:
                skipped.append((offer.name, "*", "routing weight 0"))
                continue
            found = instances(offer.name)
            if not found:
                skipped.append((offer.name, "*", "no instances registered"))
            for inst in found.values():
                why = self._unusable(inst, now, exclude, sticky=False)
                if why is None:
                    judged.append(Entry(offer, inst, *self._weigh(offer, inst)))
                else:
                    judged.append(Entry(offer, inst, 0, why))
                    skipped.append((offer.name, inst.instance_id, why))
        return judged

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
        standing = self._standing
        if standing is not None:
            share, outlier = standing(inst.agent, inst.instance_id)
            if share <= 0.0:
                return outlier or "outlier ejected"
        hook = self._is_available
        if hook is not None and not hook(inst.agent, inst.instance_id):
            return _CIRCUIT_OPEN
        return None

    # ------------------------------------------------------------------ answers

    def _answer(
        self,
        request: ReachRequest,
        offer: Offer,
        inst: Instance,
        affinity: Affinity,
        started: int,
        told: Told,
        flagged: Mapping[InstanceKey, str] | None = None,
    ) -> Route:
        """The route to ``inst``; its decision is built from ``told`` (candidates, reason) only if it is read.
        ``flagged``: the outliers among the candidates, as of routing time."""
        elapsed_us = (perf_counter_ns() - started) / 1000
        capability = request.capability

        def explain() -> RouteDecision:
            shown, reason = told()
            return RouteDecision(
                capability=capability,
                candidates=shown,
                agent=offer.name,
                instance=inst.instance_id,
                endpoint=inst.endpoint,
                reason=reason,
                affinity=affinity,
                context_restore=affinity == "restored",
                degraded=affinity == "degraded",
                elapsed_us=elapsed_us,
                outliers={f"{agent}/{instance}": why for (agent, instance), why in (flagged or {}).items()},
            )

        return Route(offer.agent, inst, offer.capability, explain=explain, affinity=affinity)

    def _told_one(self, agent: str, instance_id: str, why: str) -> Told:
        """The explanation of a route that considered one instance only: ``why`` it went there."""
        return lambda: (self._cards([(agent, instance_id, None)], []), f"{why} to {agent}/{instance_id}")

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


def _moved(route: Route, source: str) -> Route:
    """``route`` with its decision naming the hot instance the conversation was relieved from."""
    return Route(
        route.agent,
        route.instance,
        route.capability,
        explain=lambda: route.decision.model_copy(update={"relieved_from": source}),
        affinity=route.affinity,
    )


def _told(shown: list[CandidateScore], reason: str) -> Told:
    """An explanation already at hand (the pool keeps its candidates and reason between calls)."""
    return lambda: (shown, reason)


def _weight(weight: int, load: float, share: float = 1.0) -> int:
    """Load-aware SWRR weight: the agent's weight scaled by ``1 - load`` and the outlier ``share``, never below 1."""
    return weight if load == 0.0 and share == 1.0 else max(1, round(weight * (1.0 - load) * share))


def _nobody(capability: str, skipped: list[Skip]) -> NoHealthyAgent:
    reasons = {f"{agent}/{instance}": why for agent, instance, why in skipped}
    summary = "; ".join(f"{key}: {why}" for key, why in list(reasons.items())[:MAX_RECORDED])
    if len(reasons) > MAX_RECORDED:
        summary += f"; and {len(reasons) - MAX_RECORDED} more"
    if reasons and all(why == _CIRCUIT_OPEN for why in reasons.values()):
        return CircuitOpen(f"every instance offering {capability!r} has its circuit open: {summary}", reasons)
    return NoHealthyAgent(f"no healthy instance offers {capability!r}: {summary}", reasons)
