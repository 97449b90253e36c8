"""reach-plugins: reach other agents by capability, reliably, from any agent framework.

Importing this package never imports a framework or an optional extra; the
adapters (``reach_plugins.frameworks.langchain``, ``.llamaindex``, ``.dify``) and the
transports (``transports.direct``, ``.gateway``, ``.grpcnode``) are imported
on demand.
"""

from reach_plugins import errors
from reach_plugins.client.blocking import SyncReachClient
from reach_plugins.client.client import ReachClient, ReachOptions
from reach_plugins.frameworks.enhancer import ReachEnhancer
from reach_plugins.media import MediaPart
from reach_plugins.model import (
    AgentDescriptor,
    Attempt,
    Capability,
    Instance,
    ReachRequest,
    ReachResponse,
    ReachTrace,
)

__all__ = [
    "AgentDescriptor",
    "Attempt",
    "Capability",
    "Instance",
    "MediaPart",
    "ReachClient",
    "ReachEnhancer",
    "ReachOptions",
    "ReachRequest",
    "ReachResponse",
    "ReachTrace",
    "SyncReachClient",
    "errors",
]
