"""The caller's side: ReachClient (one event loop), SyncReachClient (its own loop), broadcast.

``reach_plugins.transport`` holds the Transport contract every client sends through.
"""

from reach_plugins.client.client import ReachClient, ReachOptions

__all__ = ["ReachClient", "ReachOptions"]
