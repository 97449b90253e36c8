"""The request an agent is serving right now, so the reaches it makes on its behalf continue its chain.

An agent served by the agent SDK may itself reach other agents (a LangGraph
agent whose tools are other agents). Those nested reaches must carry the hop
chain that brought the request here, or the loop guard cannot see a cycle
across processes; they should also stay within the caller's deadline. The SDK
sets :func:`serving` around every handler; the enhancer reads :func:`current`.
The trace needs nothing here: the SDK's server span is the current OpenTelemetry
span while the handler runs, and OpenTelemetry keeps it in its own ContextVar.

A ContextVar is copied into threads (``anyio.to_thread``, LangGraph's executor)
and into tasks, so a handler's whole call tree sees the same value.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from reach_plugins.model import Hop


@dataclass(frozen=True, slots=True)
class Served:
    """One request being served: by which agent, for which capability, down which chain."""

    agent: str
    capability: str
    hops: tuple[Hop, ...]
    """The chain that led here, ending with this agent and capability."""
    session_id: str | None = None
    tenant: str | None = None
    deadline: float | None = None
    """``time.monotonic()`` value by which the caller stops waiting."""

    def remaining_ms(self) -> int | None:
        """Milliseconds left before the caller's deadline (at least 1), or ``None`` without one."""
        if self.deadline is None:
            return None
        return max(1, int((self.deadline - time.monotonic()) * 1000))


_CURRENT: ContextVar[Served | None] = ContextVar("reach_plugins_served", default=None)


def current() -> Served | None:
    """The request being served in this context, or ``None`` outside any served handler."""
    return _CURRENT.get()


def current_hops() -> tuple[Hop, ...]:
    """The hop chain a nested reach must carry (empty outside a served handler)."""
    served = _CURRENT.get()
    return served.hops if served is not None else ()


def chain(incoming: Iterable[Hop | str], agent: str, capability: str) -> tuple[Hop, ...]:
    """The incoming ``X-Reach-Hops`` chain, ending with ``agent/capability`` (appended unless already last)."""
    hops = tuple(hop if isinstance(hop, Hop) else Hop.parse(hop) for hop in incoming)
    here = Hop(agent=agent, capability=capability)
    return hops if hops and hops[-1] == here else (*hops, here)


@contextmanager
def serving(
    agent: str,
    capability: str,
    *,
    hops: Iterable[Hop | str] = (),
    session_id: str | None = None,
    tenant: str | None = None,
    deadline: float | None = None,
) -> Iterator[Served]:
    """Mark the enclosed code as serving ``agent/capability`` for a request that came down ``hops``."""
    served = Served(agent, capability, chain(hops, agent, capability), session_id, tenant, deadline)
    token = _CURRENT.set(served)
    try:
        yield served
    finally:
        _CURRENT.reset(token)
