"""Fleet-wide quotas, applied once per request by the pipeline of whoever owns its retries.

:class:`Quotas` judges a routed request against its layers (global, tenant,
tenant and agent: :func:`~reach_plugins.stores.quotas.layers_of`) in the shared
store and hands back a :class:`Lease` its concurrency slots are returned with.
A refusal is :class:`~reach_plugins.errors.RateLimited` naming the layer and
``retry_after``. A lease lasts the request's deadline plus :data:`LEASE_GRACE`; a
stream, which only ``stream_idle`` bounds, renews it as it flows (:meth:`Quotas.keep`).
A client whose transport is a gateway or node leaves quotas to
that hop (it owns the request's retries too), so a call is counted once.

A refused call whose priority may wait (``quotas.waits``) waits here, the one
place every path (client, gateway worker, node) judges its quotas: it sleeps
the refusal's ``retry_after`` (a concurrency refusal: until this process gives
a slot back, or its ``retry_after``) and is judged again, within its wait, its
deadline and :data:`~reach_plugins.policy.quota_wait.MAX_RECHECKS` re-checks
(:class:`~reach_plugins.policy.quota_wait.QuotaWait` decides). Waiting holds
no lease and is charged nothing; each call that waited is recorded on
``reach.quota.waits`` (seconds, by priority and outcome).

While the shared store is unreachable each process enforces its share of every
budget alone (``fallback.processes``: ``rate / processes``, burst and slots
rounded up), never an unlimited one; the switch is logged as a warning, every
call judged so is counted on ``reach.quota.fallbacks``, and the store is tried
again ``fallback.recheck`` seconds later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final

from opentelemetry.metrics import MeterProvider, get_meter

from reach_plugins.clock import Clock, as_clock
from reach_plugins.config.quotas import QuotaConfig
from reach_plugins.errors import BackendUnavailable, RateLimited
from reach_plugins.ids import new_request_id
from reach_plugins.model import ReachRequest
from reach_plugins.policy.gcra import QuotaLayer, Refusal
from reach_plugins.policy.quota_wait import QuotaWait
from reach_plugins.stores.keys import DEFAULT_TENANT
from reach_plugins.stores.quotas import MemoryQuotaStore, QuotaStore, layers_of
from reach_plugins.stores.urls import open_quota_store
from reach_plugins.telemetry.metrics import DURATION_BUCKETS, QUOTA_FALLBACKS, QUOTA_REFUSALS, QUOTA_WAITS

logger = logging.getLogger("reach_plugins.quotas")

LEASE_GRACE: Final = 2.0
"""Seconds a concurrency lease outlives its request's deadline: a killed process holds a slot no longer."""


@dataclass(frozen=True, slots=True)
class Lease:
    """One admitted call's claim on its layers, and the store that holds it."""

    layers: tuple[QuotaLayer, ...]
    id: str
    store: QuotaStore
    ttl: float
    """Seconds the store holds its slots from the last acquire or renewal."""
    renew_at: float
    """Monotonic time past which a call still running renews it (half its ttl): :meth:`Quotas.keep`."""
    waited: float = 0.0
    """Seconds the call waited for its quota before it was admitted (0: admitted at once)."""
    rechecks: int = 0
    """Times it was judged again after a refusal."""


class Quotas:
    """The fleet's budgets for one process: the shared store, and this process's share while it is down."""

    def __init__(
        self,
        config: QuotaConfig,
        *,
        store: QuotaStore | None = None,
        clock: Clock | Callable[[], float] | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        """``store`` overrides ``config.store`` (a URL, opened and closed here); with neither, memory only."""
        self.config = config
        self._clock = as_clock(clock)
        self._owns_store = store is None and config.store is not None
        self.store = store if store is not None else open_quota_store(config.store) if config.store else None
        self.local = MemoryQuotaStore(clock=self._clock.monotonic)
        """This process's books: the whole budget without a shared store, its share while the store is down."""
        self._local_until = -math.inf
        meter = get_meter("reach_plugins.quotas", meter_provider=meter_provider)
        self._fallbacks = meter.create_counter(
            QUOTA_FALLBACKS, unit="{request}", description="Calls judged by a process's local share of the quotas."
        )
        self._refusals = meter.create_counter(QUOTA_REFUSALS, unit="{request}", description="Calls refused by quotas.")
        self._waits = meter.create_histogram(
            QUOTA_WAITS, unit="s", description="Time calls refused by a quota waited to be judged again.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )  # fmt: skip
        self._freed = asyncio.Event()
        """Set (then replaced) whenever this process gives slots back: wakes its calls waiting for a slot."""

    @property
    def on_fallback(self) -> bool:
        """Whether calls are judged locally now because the shared store failed."""
        return self._clock.monotonic() < self._local_until

    async def acquire(self, request: ReachRequest, agent: str, remaining: float) -> Lease | None:
        """Admit ``request`` to ``agent`` (``remaining`` seconds to its deadline), after waiting for it if its
        priority may wait, or raise RateLimited."""
        tenant = request.tenant or DEFAULT_TENANT
        layers = layers_of(self.config, tenant, agent)
        if not layers:
            return None
        share = self.config.share(request.priority, tenant)
        lease = new_request_id()
        start = self._clock.monotonic()
        wait = QuotaWait.start(start, max_wait=self.config.wait(request.priority, tenant), remaining=remaining)
        while True:
            freed = self._freed
            ttl = max(wait.deadline - self._clock.monotonic(), 0.0) + LEASE_GRACE
            store, refusal = await self._judge(layers, share, lease, ttl)
            now = self._clock.monotonic()
            delay = None if refusal is None else wait.delay(refusal, now)
            if refusal is None or delay is None:
                break
            await self._pause(delay, freed if refusal.kind == "concurrency" else None)
            wait = wait.again()
        waited = wait.waited(now) if wait.rechecked else 0.0
        if wait.rechecked:
            outcome = "refused" if refusal is not None else "admitted"
            self._waits.record(waited, {"priority": request.priority, "outcome": outcome})
        if refusal is not None:
            self._refusals.add(1, {"layer": refusal.layer.name, "kind": refusal.kind})
            raise _refused(refusal, request, share, waited)
        return Lease(layers, lease, store, ttl, now + ttl / 2, waited, wait.rechecked)

    async def _pause(self, seconds: float, freed: asyncio.Event | None) -> None:
        """Sleep ``seconds``, or until ``freed`` is set (a slot given back here) if that comes first."""
        if freed is None:
            await self._clock.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            async with self._clock.timeout_at(self._clock.now() + seconds):
                await freed.wait()

    async def keep(self, lease: Lease) -> Lease:
        """``lease`` renewed for another ttl once half of it passed (a stream outliving its deadline's lease holds
        its slots while it flows); a store that cannot be reached is logged and tried again at the next event."""
        now = self._clock.monotonic()
        if now < lease.renew_at:
            return lease
        try:
            await lease.store.renew(lease.layers, lease.id, lease.ttl)
        except BackendUnavailable as exc:
            logger.info("%s", exc.message)
            return lease
        return replace(lease, renew_at=now + lease.ttl / 2)

    async def release(self, lease: Lease) -> None:
        """Return ``lease``'s slots (waking this process's calls waiting for one); a store that cannot be reached
        lets them expire."""
        try:
            await lease.store.release(lease.layers, lease.id)
        except BackendUnavailable as exc:
            logger.info("%s", exc.message)
        if any(layer.concurrency is not None for layer in lease.layers):
            self._freed.set()
            self._freed = asyncio.Event()

    async def _judge(
        self, layers: tuple[QuotaLayer, ...], share: float, lease: str, ttl: float
    ) -> tuple[QuotaStore, Refusal | None]:
        shared = self.store
        if shared is None:
            return self.local, await self.local.acquire(layers, share, lease, ttl)
        if not self.on_fallback:
            try:
                return shared, await shared.acquire(layers, share, lease, ttl)
            except BackendUnavailable as exc:
                processes = self.config.fallback.processes
                logger.warning(
                    "%s; for %gs this process enforces 1/%d of every quota alone",
                    exc.message,
                    self.config.fallback.recheck,
                    processes,
                )
                self._local_until = self._clock.monotonic() + self.config.fallback.recheck
        self._fallbacks.add(1)
        mine = tuple(layer.share(self.config.fallback.processes) for layer in layers)
        return self.local, await self.local.acquire(mine, share, lease, ttl)

    async def aclose(self) -> None:
        if self._owns_store and self.store is not None:
            await self.store.aclose()


def _refused(refusal: Refusal, request: ReachRequest, share: float, waited: float) -> RateLimited:
    """The RateLimited of ``refusal``: which layer, whose budget, how long the call waited, and what to do."""
    layer = refusal.layer
    if refusal.kind == "rate":
        budget = f"{layer.rate:g} requests/s (burst {layer.burst})"
    else:
        budget = f"{layer.concurrency} calls in flight"
    part = "" if share >= 1 else f"; {request.priority} calls may use {share:g} of it"
    after = f" after waiting {waited:.3g}s" if waited > 0 else ""
    return RateLimited(
        f"the {layer.name} quota of {layer.label} ({budget}{part}) refused request {request.request_id}{after}; "
        f"retry after {refusal.retry_after:.3g}s, or raise {layer.path}",
        layer=layer.name,
        retry_after=refusal.retry_after,
    )


def open_quotas(quotas: QuotaConfig | Quotas, *, clock: Clock | Callable[[], float] | None = None) -> Quotas:
    """``quotas`` as :class:`Quotas` (a config is opened here, its store too: the caller closes them)."""
    return quotas if isinstance(quotas, Quotas) else Quotas(quotas, clock=clock)
