"""Quota layers judged by GCRA (rate) and by expiring leases (concurrency), pure state fed ``now``.

GCRA (the generic cell rate algorithm) keeps one number per layer, the
theoretical arrival time ``tat``: a call at ``now`` moves it to
``max(tat, now) + 1/rate`` and is admitted while that is at most ``burst/rate``
ahead of ``now`` (``burst`` calls back to back, then the steady rate). A call
allowed a ``share`` of a layer (its priority) is admitted only while the new
``tat`` is at most ``share * burst/rate`` ahead (never less than one call), so
under a contested budget the lower shares are refused first. Concurrency is a
set of leases ``id -> expiry``; an expired lease counts no more, so a process
killed mid-call leaks its slots only until their expiry. A call passes every
layer or none: all are judged before any is charged.

:class:`QuotaLedger` keeps this state in memory (one process, or a process's
share while the shared store is down); the Redis store runs the same rules in
one Lua script (:mod:`reach_plugins.stores.redis_quotas`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

CONCURRENCY_RETRY: Final = 1.0
"""The longest ``retry_after`` of a concurrency refusal: a slot frees when a call ends, which no lease predicts."""
EPSILON: Final = 1e-9


@dataclass(frozen=True, slots=True)
class QuotaLayer:
    """One layer a call draws from: its name (``global``/``tenant``/``agent``), store key and budget."""

    name: str
    key: str
    """Unique per layer; the store's keys for its rate and its leases derive from it."""
    label: str
    """Whose budget, for messages (``tenant 'demo'``)."""
    path: str
    """Where the config sets it (``quotas.tenants.demo``), for messages."""
    rate: float | None
    burst: int
    concurrency: int | None

    def share(self, processes: int) -> QuotaLayer:
        """This layer as one of ``processes`` enforcing it alone: its rate divided, burst and slots rounded up."""
        if processes == 1:
            return self
        return replace(
            self,
            rate=None if self.rate is None else self.rate / processes,
            burst=max(1, math.ceil(self.burst / processes)),
            concurrency=None if self.concurrency is None else max(1, math.ceil(self.concurrency / processes)),
        )


@dataclass(frozen=True, slots=True)
class Refusal:
    """Which layer refused, on what (``rate`` or ``concurrency``), and seconds until a call may pass."""

    layer: QuotaLayer
    kind: Literal["rate", "concurrency"]
    retry_after: float


def allowed_ahead(layer: QuotaLayer, share: float) -> float:
    """How far ahead of now a layer's ``tat`` may run for a call of ``share``: at least one call's interval."""
    assert layer.rate is not None
    interval = 1.0 / layer.rate
    return max(interval, share * layer.burst * interval)


def slots(layer: QuotaLayer, share: float) -> int:
    """The concurrency slots a call of ``share`` may see taken before it is refused (at least one)."""
    assert layer.concurrency is not None
    return max(1, math.floor(share * layer.concurrency + EPSILON))


class QuotaLedger:
    """GCRA and lease state of some layers, in memory: bounded by the layers (from config) and their slots."""

    def __init__(self) -> None:
        self._tats: dict[str, float] = {}
        self._leases: dict[str, dict[str, float]] = {}

    def acquire(self, layers: Sequence[QuotaLayer], share: float, lease: str, ttl: float, now: float) -> Refusal | None:
        """Charge every layer for one call (its ``lease`` held for ``ttl`` seconds), or charge none and refuse."""
        tats: list[tuple[str, float]] = []
        for layer in layers:
            if layer.rate is not None:
                tat = max(self._tats.get(layer.key, now), now) + 1.0 / layer.rate
                over = tat - now - allowed_ahead(layer, share)
                if over > EPSILON:
                    return Refusal(layer, "rate", over)
                tats.append((layer.key, tat))
            if layer.concurrency is not None:
                held = self._leases.get(layer.key, {})
                live = {one: until for one, until in held.items() if until > now}
                self._leases[layer.key] = live
                if len(live) >= slots(layer, share):
                    return Refusal(layer, "concurrency", min(CONCURRENCY_RETRY, min(live.values()) - now))
        self._tats.update(tats)
        for layer in layers:
            if layer.concurrency is not None:
                self._leases[layer.key][lease] = now + ttl
        return None

    def renew(self, layers: Sequence[QuotaLayer], lease: str, until: float) -> None:
        """Hold a call's live slots until ``until`` (a long stream); a lease already expired or released stays so."""
        for layer in layers:
            held = self._leases.get(layer.key, {})
            if lease in held:
                held[lease] = until

    def release(self, layers: Sequence[QuotaLayer], lease: str) -> None:
        """Give a call's slots back."""
        for layer in layers:
            self._leases.get(layer.key, {}).pop(lease, None)

    def held(self, layer: QuotaLayer, now: float) -> int:
        """Leases of ``layer`` live at ``now``."""
        return sum(1 for until in self._leases.get(layer.key, {}).values() if until > now)
