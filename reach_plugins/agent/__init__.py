"""The agent-side SDK: serve Python functions as a Reach agent, register it, keep its heartbeat alive.

Needs the ``server`` extra (Starlette, uvicorn): ``pip install "reach-plugins[server]"``.
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError('the agent SDK needs the server extra: pip install "reach-plugins[server]"') from exc

from reach_plugins.agent.a2a_parts import File, Reply, ask
from reach_plugins.agent.agent import ReachAgent
from reach_plugins.agent.approval import ApprovalDecision, ApprovalRequest, CallerApproval, WebhookApprover
from reach_plugins.agent.handlers import Final, ReachContext, WithMedia
from reach_plugins.agent.langgraph import ServedAgent, add_langgraph, serve_graph, serve_langgraph
from reach_plugins.agent.outcome import Outcome
from reach_plugins.agent.registration import Registration
from reach_plugins.agent.server import serve
from reach_plugins.server.uvicorn import BackgroundServer, mtls, uvicorn_config
from reach_plugins.stores.snapshots import MemorySnapshotStore, SnapshotStore

__all__ = [
    "ApprovalDecision",
    "ApprovalRequest",
    "BackgroundServer",
    "CallerApproval",
    "File",
    "Final",
    "MemorySnapshotStore",
    "Outcome",
    "ReachAgent",
    "ReachContext",
    "Registration",
    "Reply",
    "ServedAgent",
    "SnapshotStore",
    "WebhookApprover",
    "WithMedia",
    "add_langgraph",
    "ask",
    "mtls",
    "serve",
    "serve_graph",
    "serve_langgraph",
    "uvicorn_config",
]
