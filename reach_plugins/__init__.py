"""reach-plugins: reach other agents by capability, reliably, from any agent framework."""

from reach_plugins.model import (
    AgentDescriptor,
    Attempt,
    Capability,
    Instance,
    ReachRequest,
    ReachResponse,
    ReachTrace,
)

__all__ = sorted(
    [
        "AgentDescriptor",
        "Attempt",
        "Capability",
        "Instance",
        "ReachRequest",
        "ReachResponse",
        "ReachTrace",
    ]
)
