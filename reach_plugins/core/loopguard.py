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


def check_target(hops: Sequence[Hop], agent: str, capability: str) -> Hop:
    """Refuse a target already in the chain, naming the cycle; return the hop to append."""
    target = Hop(agent=agent, capability=capability)
    for index, hop in enumerate(hops):
        if hop.agent == agent and hop.capability == capability:
            cycle = " -> ".join(str(step) for step in [*hops[index:], target])
            raise LoopDetected(
                f"loop detected: {cycle} (the chain already visited {target}); "
                "break the cycle between these agents or route this call to another capability",
                cycle=[str(step) for step in [*hops[index:], target]],
            )
    return target


def hops_header(hops: Sequence[Hop], target: Hop) -> str:
    """``X-Reach-Hops``: the chain including this hop, comma separated ``agent/capability``."""
    return ",".join(str(hop) for hop in [*hops, target])


def parse_hops_header(value: str | None) -> list[Hop]:
    """Read ``X-Reach-Hops`` back into hops (a gateway or an agent does this on receipt)."""
    if not value:
        return []
    return [Hop.parse(part) for part in value.split(",") if part.strip()]
