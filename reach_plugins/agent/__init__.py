"""The agent-side SDK: serve Python functions as a Reach agent, register it, keep its heartbeat alive.

Needs the ``server`` extra (Starlette, uvicorn): ``pip install "reach-plugins[server]"``.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('the agent SDK needs the server extra: pip install "reach-plugins[server]"') from exc

from reach_plugins.agent.agent import Outcome, ReachAgent
from reach_plugins.agent.handlers import ReachContext
from reach_plugins.agent.langgraph import add_langgraph, serve_langgraph
from reach_plugins.agent.registration import Registration
from reach_plugins.agent.server import BackgroundServer, mtls, serve, uvicorn_config
from reach_plugins.agent.snapshots import MemorySnapshotStore, SnapshotStore

__all__ = [
    "BackgroundServer",
    "MemorySnapshotStore",
    "Outcome",
    "ReachAgent",
    "ReachContext",
    "Registration",
    "SnapshotStore",
    "add_langgraph",
    "mtls",
    "serve",
    "serve_langgraph",
    "uvicorn_config",
]
