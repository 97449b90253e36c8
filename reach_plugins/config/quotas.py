"""The ``quotas:`` section: fleet-wide budgets, global and per tenant (and per tenant and agent), with priorities.

::

    quotas:
      store: redis://127.0.0.1:6379/0     # shared by every process; without it, this process's memory only
      global: {rate: 1000, burst: 100, concurrency: 200}
      tenants:
        demo:
          rate: 100                       # requests a second (GCRA)
          burst: 10                       # back-to-back requests on top (default: a tenth of a second's worth)
          concurrency: 20                 # calls in flight at once (leases that expire)
          priority: batch                 # the highest priority this tenant's calls are judged at
          agents: {order_agent: {rate: 20}}
      other: {rate: 10}                   # every tenant not listed shares this one budget
      priorities: {online: 1.0, batch: 0.5}
      waits: {online: 250ms, batch: 0s}   # how long a refused call of each priority may wait (default 0s)
      fallback: {processes: 4, recheck: 1s}

Priorities: a call of priority ``p`` (its request's ``priority``, lowered to
its tenant's ``priority`` when that is lower) may fill each layer only up to
``priorities[p]`` of it: a GCRA layer's burst allowance and a concurrency
layer's slots. Under a shared budget the lower shares are refused first
(their allowance runs out while the higher still have room); uncontested,
every priority gets the layer's full rate. ``waits`` says who waits: a
refused call whose priority may wait sleeps until its quota says it may pass
(within that wait and its deadline) and is judged again
(:mod:`reach_plugins.policy.quota_wait`); a priority without a wait is refused
at once. Only tenants named here (and ``other``) get quota keys, so the keys
are as many as the config says.
"""

from __future__ import annotations

import math
from typing import Annotated, Final

from pydantic import AfterValidator, Field, model_validator

from reach_plugins.model import Priority, Strict
from reach_plugins.units import Duration

Share = Annotated[float, Field(gt=0, le=1)]
"""A share of a budget, in (0, 1]."""
DEFAULT_SHARES: Final[dict[Priority, float]] = {"online": 1.0, "batch": 0.5}
"""How much of each layer a call of each priority may fill, unless ``priorities:`` says otherwise."""
LONGEST_WAIT: Final = 10.0
"""The longest ``waits:`` entry (seconds): a caller that can wait longer should retry after ``retry_after``."""


def _bounded_wait(seconds: float) -> float:
    if seconds > LONGEST_WAIT:
        raise ValueError(
            f"a quota wait of {seconds:g}s holds its caller that long; at most {LONGEST_WAIT:g}s (a caller that "
            "can wait longer retries after the refusal's retry_after)"
        )
    return seconds


Wait = Annotated[Duration, AfterValidator(_bounded_wait)]
"""How long a refused call may wait for its quota: a duration of at most :data:`LONGEST_WAIT`."""


class Limit(Strict):
    """One layer's budget: a rate (GCRA, with a burst on top) and/or a number of calls in flight."""

    rate: float | None = Field(default=None, gt=0)
    """Requests a second admitted over the fleet."""
    burst: int | None = Field(default=None, ge=1)
    """Requests admitted back to back beyond the steady rate; default ``ceil(rate / 10)`` (100 ms worth)."""
    concurrency: int | None = Field(default=None, ge=1)
    """Calls in flight at once over the fleet; each holds a lease that expires with its deadline."""

    @model_validator(mode="after")
    def _something(self) -> Limit:
        if self.rate is None and self.concurrency is None:
            raise ValueError("a quota needs 'rate' (requests a second) and/or 'concurrency' (calls in flight)")
        if self.burst is not None and self.rate is None:
            raise ValueError("'burst' needs a 'rate' to burst above")
        return self

    @property
    def allowance(self) -> int:
        """The burst in effect (requests), 0 without a rate."""
        if self.rate is None:
            return 0
        return self.burst if self.burst is not None else max(1, math.ceil(self.rate / 10))


class TenantQuota(Limit):
    """A tenant's budget, its priority ceiling, and optional budgets per agent it reaches."""

    priority: Priority | None = None
    """The highest priority this tenant's calls are judged at (``batch``: always shed before ``online`` callers)."""
    agents: dict[str, Limit] = Field(default_factory=dict)


class QuotaFallback(Strict):
    """What a process enforces alone while the shared store is unreachable: its share of every budget."""

    processes: int = Field(default=1, ge=1)
    """How many processes share the budgets: each enforces ``budget / processes`` locally (rounded up for burst
    and concurrency, never below 1). The default 1 lets one process spend the whole budget; set it to the fleet's
    size so that an outage cannot multiply the budget."""
    recheck: Duration = Field(default=1.0, gt=0)
    """Seconds a process stays on its local share after the store failed before trying the store again."""


class QuotaConfig(Strict):
    """The whole ``quotas:`` section (module docstring)."""

    model_config = Strict.model_config | {"populate_by_name": True}

    store: str | None = None
    """``redis://HOST:PORT/DB`` shared by every client, gateway worker and node; None: this process's memory."""
    global_: Limit | None = Field(default=None, alias="global")
    tenants: dict[str, TenantQuota] = Field(default_factory=dict)
    other: TenantQuota | None = None
    """The budget shared by every tenant not in ``tenants`` (a request naming none is tenant ``default``)."""
    priorities: dict[Priority, Share] = Field(default_factory=lambda: dict(DEFAULT_SHARES))
    """The share of every layer a call of each priority may fill (module docstring)."""
    waits: dict[Priority, Wait] = Field(default_factory=dict)
    """Seconds a refused call of each priority may wait for its quota and be judged again (missing: 0, refused at
    once); lowered to its tenant's ``priority:`` wait, and never past the request's deadline."""
    fallback: QuotaFallback = Field(default_factory=QuotaFallback)

    @model_validator(mode="after")
    def _tenant_names(self) -> QuotaConfig:
        reserved = sorted(name for name in self.tenants if name.startswith("*") or not name.isprintable())
        if reserved:
            raise ValueError(f"tenant names {reserved} are reserved (a leading '*' names the fleet's own budgets)")
        return self

    def share_of(self, priority: Priority) -> float:
        """The share of a layer a call of ``priority`` may fill (``priorities:``, else :data:`DEFAULT_SHARES`)."""
        return self.priorities.get(priority, DEFAULT_SHARES[priority])

    def share(self, priority: Priority, tenant: str) -> float:
        """The share of each layer a ``priority`` call of ``tenant`` may fill (its tenant's ceiling applied)."""
        ceiling = self.tenant(tenant)
        share = self.share_of(priority)
        if ceiling is not None and ceiling.priority is not None:
            share = min(share, self.share_of(ceiling.priority))
        return share

    def wait(self, priority: Priority, tenant: str) -> float:
        """Seconds a refused ``priority`` call of ``tenant`` may wait for its quota (its tenant's ceiling applied)."""
        ceiling = self.tenant(tenant)
        wait = self.waits.get(priority, 0.0)
        if ceiling is not None and ceiling.priority is not None:
            wait = min(wait, self.waits.get(ceiling.priority, 0.0))
        return wait

    def tenant(self, tenant: str) -> TenantQuota | None:
        """The budget ``tenant`` draws from: its own, else ``other``'s (None: no tenant layer)."""
        return self.tenants.get(tenant, self.other)
