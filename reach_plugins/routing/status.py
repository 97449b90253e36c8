"""What the router would decide about each instance now, and why: the read-only view behind ``reach agents`` and
``GET /v1/agents``.

A registry says an instance is ``ready`` and its lease alive until the lease
runs out; the probes, breakers and ejections of the process that routes know
better (issue 28: a killed instance read ``ready/alive`` after the gateway's own
probe logged it down). :func:`judge` folds every source the router consults —
lease, status, probe, breaker, outlier and consistency ejections — into one
:class:`InstanceStatus`, in the order the router checks them, so the first
reason given is the one the router acts on. Sans-IO: every time is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from reach_plugins.model import Instance
from reach_plugins.policy.outliers import Standing
from reach_plugins.routing.probes import Probed


class GuardView(Protocol):
    """The core's guards of one instance (:class:`reach_plugins.attempts.pipeline.Guarded`)."""

    @property
    def breaker(self) -> str: ...
    @property
    def reopens_in(self) -> float | None: ...
    @property
    def ejected_for(self) -> float | None: ...
    @property
    def window(self) -> tuple[int, int] | None: ...


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    """One instance as the router sees it now; ``reason`` says why it takes no new calls (``None``: it does)."""

    instance_id: str
    status: str
    lease_alive: bool
    heartbeat_age: float | None
    probe: Probed | None
    probe_age: float | None
    breaker: str
    reopens_in: float | None
    ejected_for: float | None
    load: float
    in_flight: int | None
    limit: int | None
    pins: int | None
    reason: str | None

    @property
    def available(self) -> bool:
        return self.reason is None

    def as_json(self) -> dict[str, Any]:
        """The view as JSON (the same fields ``reach agents --json`` and ``GET /v1/agents`` give); no endpoint."""
        probe = self.probe
        return {
            "instance_id": self.instance_id,
            "status": self.status,
            "available": self.available,
            "reason": self.reason,
            "alive": self.lease_alive and not (probe is not None and probe.down),
            "lease": {"alive": self.lease_alive, "heartbeat_age": _round(self.heartbeat_age)},
            "probe": None
            if probe is None
            else {
                "ok": probe.ok,
                "why": _brief(probe.why),
                "age": _round(self.probe_age),
                "failures": probe.failures,
                "down": probe.down,
                "unready": probe.unready,
            },
            "breaker": {"state": self.breaker, "reopens_in": _round(self.reopens_in)},
            "ejected_for": _round(self.ejected_for),
            "load": {"reported": self.load, "in_flight": self.in_flight, "limit": self.limit},
            "pins": self.pins,
        }


def judge(
    inst: Instance,
    now: float,
    *,
    alive: bool,
    probe: Probed | None = None,
    probe_now: float = 0.0,
    guarded: GuardView | None = None,
    standing: Standing | None = None,
    pins: int | None = None,
) -> InstanceStatus:
    """The status of ``inst`` at ``now`` (the registry's clock; ``probe_now`` is the prober's) from what each source
    holds: its lease (``alive``), latest probe, the core's guards, its outlier ``standing`` and its pinned sessions."""
    seen = inst.last_heartbeat
    age = None if seen is None else max(0.0, now - seen)
    breaker = guarded.breaker if guarded is not None else "closed"
    reopens_in = guarded.reopens_in if guarded is not None else None
    ejected_for = guarded.ejected_for if guarded is not None else None
    window = guarded.window if guarded is not None else None
    reasons = [
        f"status {inst.status}" if inst.status != "ready" else None,
        None if alive else ("no heartbeat" if age is None else f"heartbeat missed: last one {age:.0f}s ago"),
        (standing[1] or "outlier ejected") if standing is not None and standing[0] <= 0.0 else None,
        _breaker_reason(breaker, reopens_in),
        f"ejected for {ejected_for:.1f}s more" if ejected_for is not None else None,
        _probe_reason(probe),
    ]
    return InstanceStatus(
        instance_id=inst.instance_id,
        status=inst.status,
        lease_alive=alive,
        heartbeat_age=age,
        probe=probe,
        probe_age=None if probe is None else max(0.0, probe_now - probe.at),
        breaker=breaker,
        reopens_in=reopens_in,
        ejected_for=ejected_for,
        load=inst.load,
        in_flight=window[0] if window is not None else None,
        limit=window[1] if window is not None else None,
        pins=pins,
        reason=next((why for why in reasons if why is not None), None),
    )


def _breaker_reason(state: str, reopens_in: float | None) -> str | None:
    if state == "open":
        return f"circuit open: reopens in {reopens_in or 0.0:.1f}s"
    return None


def _probe_reason(probe: Probed | None) -> str | None:
    if probe is None:
        return None
    if probe.down:
        return f"liveness probe failed {probe.failures} time(s) in a row ({_brief(probe.why)})"
    return "readiness probe failed" if probe.unready else None


def _brief(why: str) -> str:
    """A probe's why without its detail (an exception's message names the endpoint, which views never show)."""
    return why.partition(":")[0]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
