"""Loop guard: a request carries its hop chain; reaching an (agent, capability) twice is a loop.

The seeds' two agents that called each other for half an hour are stopped on
the second lap: the chain travels as ``X-Reach-Hops`` and every layer checks
it before sending anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from reach_plugins.errors import LoopDetected
from reach_plugins.model import Hop

DEFAULT_MAX_HOPS = 8


def check_length(hops: Sequence[Hop], max_hops: int = DEFAULT_MAX_HOPS) -> None:
    """Refuse a chain that already has ``max_hops`` hops (one more would exceed it)."""
    if len(hops) >= max_hops:
        chain = " -> ".join(str(hop) for hop in hops)
        raise LoopDetected(
            f"the hop chain has {len(hops)} hops, the limit is {max_hops}: {chain}; "
            "an agent chain this deep is usually a loop (raise max_hops if it is not)",
            hops=[str(hop) for hop in hops],
        )


def check_target(hops: Sequence[Hop], agent: str, capability: str) -> None:
    """Refuse a target (agent, capability) already in the chain, naming the cycle."""
    for index, hop in enumerate(hops):
        if hop.agent == agent and hop.capability == capability:
            cycle = [str(step) for step in hops[index:]] + [f"{agent}/{capability}"]
            raise LoopDetected(
                f"loop detected: {' -> '.join(cycle)} (the chain already visited {agent}/{capability}); "
                "break the cycle between these agents or route this call to another capability",
                cycle=cycle,
            )


def hops_header(hops: Sequence[Hop], agent: str, capability: str) -> str:
    """``X-Reach-Hops``: the chain including this hop, comma separated ``agent/capability``."""
    this = f"{agent}/{capability}"
    return ",".join([*(str(hop) for hop in hops), this]) if hops else this


def parse_hops_header(value: str | None) -> list[Hop]:
    """Read ``X-Reach-Hops`` back into hops (a gateway or an agent does this on receipt)."""
    if not value:
        return []
    return [Hop.parse(part) for part in value.split(",") if part.strip()]
