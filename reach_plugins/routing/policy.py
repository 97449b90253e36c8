"""Who may serve a request at all: intents, scope tags, input size, tenant allow-lists and ``internal_only``.

These filters depend only on the registry revision, the request's
``(capability, tenant, intent, scope_tags)`` and which token limits its
payload exceeds, so the router caches the resulting :class:`Plan` and the hot
path only checks health. Tiers are ``(priority, cost)`` pairs, best first: the
cheapest offer within a priority tier is tried before a costlier one (the
seeds' ``cost``, as LiteLLM's cost-based routing), and only offers of equal
priority and cost share smooth weighted round robin.

A payload's size is estimated from its JSON text (:func:`payload_tokens`, the
estimate usage figures use); an offer whose ``input_tokens_required`` is below
it is refused (seed 001 section 4.2, the "rejection condition"), and when that
leaves nobody the request is refused with :class:`InputTooLong`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reach_plugins.errors import InputTooLong, NoHealthyAgent, PermissionDenied
from reach_plugins.model import ReachRequest
from reach_plugins.routing.index import Offer
from reach_plugins.routing.route import NamedAllowList, TenantLike
from reach_plugins.units import CHARS_PER_TOKEN, estimate_tokens


@dataclass(frozen=True, slots=True)
class Plan:
    """The offers a request may use, grouped in ``(priority, cost)`` tiers (best first)."""

    tiers: tuple[tuple[Offer, ...], ...]
    by_agent: Mapping[str, Offer]
    priced: frozenset[int] = frozenset()
    """Priorities whose offers differ in cost (more than one tier)."""
    oversized: tuple[tuple[str, str, str], ...] = ()
    """Offers skipped because the payload is over their ``input_tokens_required`` (agent, ``*``, why): the route
    decision lists them."""


def payload_tokens(payload: Mapping[str, Any]) -> int:
    """The estimated input tokens of a payload: its compact JSON text at about four characters a token."""
    return estimate_tokens(len(json.dumps(payload, ensure_ascii=False, separators=(",", ":"))))


def make_plan(
    offers: Sequence[Offer],
    request: ReachRequest,
    tenants: Mapping[str, TenantLike] | None,
    tokens: int | None = None,
) -> Plan:
    """Filter ``offers`` for ``request`` (``tokens``: its estimated input, when a limit applies); raise when nobody
    is left, saying why each was refused."""
    fitting: list[Offer] = []
    refused: dict[str, str] = {}
    too_small: list[int] = []
    oversized: list[tuple[str, str, str]] = []
    for offer in offers:
        reason = _misfit(offer, request)
        limit = offer.capability.input_tokens_required
        if reason is None and tokens is not None and limit is not None and tokens > limit:
            reason = f"estimated input over its input_tokens_required {limit}"
            too_small.append(limit)
            oversized.append((offer.name, "*", reason))
        if reason is None:
            fitting.append(offer)
        else:
            refused[f"{offer.name}/*"] = reason
    if not fitting and too_small:
        largest = max(too_small)
        raise InputTooLong(
            f"the payload of {request.capability!r} is about {tokens} tokens (its JSON text at "
            f"{CHARS_PER_TOKEN:g} characters a token), more than any agent offering it accepts "
            f"(largest input_tokens_required: {largest}); shorten or split the payload to at most {largest} tokens, "
            "or register an agent with a larger input_tokens_required: "
            + "; ".join(f"{key}: {why}" for key, why in refused.items()),
            tokens=tokens,
            limit=largest,
        )
    if not fitting:
        raise NoHealthyAgent(
            f"no agent offers {request.capability!r} with the requested intent and scope tags: "
            + "; ".join(f"{key}: {why}" for key, why in refused.items()),
            reasons=refused,
        )
    allowed: list[Offer] = []
    denied: list[str] = []
    for offer in fitting:
        reason = tenant_denial(offer, request.tenant, tenants)
        if reason is None:
            allowed.append(offer)
        else:
            denied.append(f"{offer.name}: {reason}")
    if not allowed:
        raise PermissionDenied(
            f"tenant {request.tenant!r} may not reach capability {request.capability!r} ({'; '.join(denied)}); "
            "add the agent to the tenant's allow-list or the tenant to the agent's 'tenants'"
        )
    tiers: dict[tuple[int, float], list[Offer]] = {}
    for offer in allowed:
        tiers.setdefault((offer.priority, offer.cost), []).append(offer)
    priorities = [priority for priority, _ in tiers]
    return Plan(
        tiers=tuple(tuple(tiers[tier]) for tier in sorted(tiers)),
        by_agent={offer.name: offer for offer in allowed},
        priced=frozenset(priority for priority in priorities if priorities.count(priority) > 1),
        oversized=tuple(oversized),
    )


def _misfit(offer: Offer, request: ReachRequest) -> str | None:
    intents = offer.agent.intents
    if request.intent is not None and intents and request.intent not in intents:
        return f"intent {request.intent!r} not among {intents}"
    missing = [tag for tag in request.scope_tags if tag not in offer.capability.scope_tags]
    if missing:
        return f"capability lacks scope tags {missing}"
    return None


def tenant_denial(offer: Offer, tenant: str | None, tenants: Mapping[str, TenantLike] | None) -> str | None:
    """Why ``tenant`` may not reach the offer's agent, or ``None`` when it may.

    With a tenant table, the tenant must be in it and its allow-list must admit
    the agent; the agent's own ``tenants`` list (``None`` = no restriction)
    must admit the tenant too. An ``internal_only`` agent needs the tenant to be
    named explicitly, by the agent's list or by the tenant's: ``"*"`` is not enough.
    """
    agent = offer.agent
    config = None
    if tenants:
        if tenant is None:
            return "the request names no tenant and a tenant table is configured"
        config = tenants.get(tenant)
        if config is None:
            return f"tenant {tenant!r} is not in the tenant table"
        if not config.allows(agent.name):
            return f"not in tenant {tenant!r}'s allow-list"
    own = agent.tenants
    if own is not None and "*" not in own and tenant not in own:
        return f"the agent admits only tenants {own}"
    if agent.internal_only and not _names(own, tenant) and not _lists(config, agent.name):
        return "internal_only: the tenant must be named in the agent's 'tenants' or name the agent in its allow-list"
    return None


def _names(own: list[str] | None, tenant: str | None) -> bool:
    return tenant is not None and own is not None and tenant in own


def _lists(config: TenantLike | None, agent: str) -> bool:
    if not isinstance(config, NamedAllowList):
        return False
    listed = config.agents
    return not isinstance(listed, str) and agent in listed
