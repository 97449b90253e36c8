"""Quota stores: where the fleet's budgets are kept, and the layers a call draws from.

A call of ``tenant`` to ``agent`` draws from up to three layers, widest first
(:func:`layers_of`): ``global``, ``tenant`` (the tenant's own budget, or the
``other`` budget every unlisted tenant shares) and ``agent`` (the tenant's
budget for that agent). Each layer's key is a
:class:`~reach_plugins.stores.keys.ScopedKey` of kind ``quota`` whose tenant is
the budget's owner, and only budgets named in the config have one: the keys
are bounded by the config, whatever tenants callers name.

:class:`QuotaStore` is the contract; :class:`MemoryQuotaStore` keeps one
process's books (:class:`~reach_plugins.policy.gcra.QuotaLedger`), the Redis
store the fleet's (:mod:`reach_plugins.stores.redis_quotas`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from reach_plugins.config.quotas import Limit, QuotaConfig
from reach_plugins.policy.gcra import QuotaLayer, QuotaLedger, Refusal
from reach_plugins.stores.keys import ScopedKey

KIND: Final = "quota"
FLEET: Final = "*"
"""The owner of the global budget in its key (no tenant may be named ``*`` in a quota config)."""
OTHER: Final = "*other"
"""The owner of the budget shared by every unlisted tenant."""


class QuotaStore(Protocol):
    """Judges and charges a call against its layers atomically; gives its concurrency slots back."""

    async def acquire(self, layers: Sequence[QuotaLayer], share: float, lease: str, ttl: float) -> Refusal | None:
        """Charge one call to every layer (holding ``lease`` for ``ttl`` s where a layer counts concurrency), or
        none of them and say which refused. Raises ``BackendUnavailable`` when the store cannot be reached."""
        ...

    async def renew(self, layers: Sequence[QuotaLayer], lease: str, ttl: float) -> None:
        """Hold ``lease``'s live slots ``ttl`` s from now (a call outliving its first ttl, a long stream).
        Raises ``BackendUnavailable`` when the store cannot be reached."""
        ...

    async def release(self, layers: Sequence[QuotaLayer], lease: str) -> None:
        """Give back ``lease``'s slots (an unreachable store lets them expire instead)."""
        ...

    async def aclose(self) -> None: ...


class MemoryQuotaStore:
    """:class:`QuotaStore` in this process's memory: the budgets of one process."""

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self.ledger = QuotaLedger()
        self._clock = clock or time.monotonic

    async def acquire(self, layers: Sequence[QuotaLayer], share: float, lease: str, ttl: float) -> Refusal | None:
        return self.ledger.acquire(layers, share, lease, ttl, self._clock())

    async def renew(self, layers: Sequence[QuotaLayer], lease: str, ttl: float) -> None:
        self.ledger.renew(layers, lease, self._clock() + ttl)

    async def release(self, layers: Sequence[QuotaLayer], lease: str) -> None:
        self.ledger.release(layers, lease)

    async def aclose(self) -> None:
        return None


def layers_of(config: QuotaConfig, tenant: str, agent: str) -> tuple[QuotaLayer, ...]:
    """The layers a call of ``tenant`` to ``agent`` draws from, widest first (none: no quota applies)."""
    layers: list[QuotaLayer] = []
    if config.global_ is not None:
        key = ScopedKey(FLEET, KIND, "global")
        layers.append(_layer("global", key, "the fleet", "quotas.global", config.global_))
    own = config.tenants.get(tenant)
    budget = own if own is not None else config.other
    if budget is not None:
        owner, label, path = (
            (tenant, f"tenant {tenant!r}", f"quotas.tenants.{tenant}")
            if own is not None
            else (OTHER, "the unlisted tenants", "quotas.other")
        )
        layers.append(_layer("tenant", ScopedKey(owner, KIND, "tenant"), label, path, budget))
        per_agent = budget.agents.get(agent)
        if per_agent is not None:
            key = ScopedKey(owner, KIND, f"agent:{agent}")
            layers.append(_layer("agent", key, f"{label} on agent {agent!r}", f"{path}.agents.{agent}", per_agent))
    return tuple(layers)


def _layer(name: str, key: ScopedKey, label: str, path: str, limit: Limit) -> QuotaLayer:
    return QuotaLayer(name, key.encode(), label, path, limit.rate, limit.allowance, limit.concurrency)
