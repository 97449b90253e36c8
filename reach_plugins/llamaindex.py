"""``reach_plugins.llamaindex``, where LlamaIndex users import it (DESIGN.md 9): the adapter lives in
:mod:`reach_plugins.frameworks.llamaindex`."""

from reach_plugins.frameworks.llamaindex import (
    APPROVALS,
    SESSION_KEY,
    ReachStreamEvent,
    ReachTool,
    ReachToolRetriever,
    enhance_agent,
    enhance_tools,
    error_output,
    workflow_approver,
)

__all__ = [
    "APPROVALS",
    "SESSION_KEY",
    "ReachStreamEvent",
    "ReachTool",
    "ReachToolRetriever",
    "enhance_agent",
    "enhance_tools",
    "error_output",
    "workflow_approver",
]
