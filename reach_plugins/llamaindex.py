"""``reach_plugins.llamaindex``, where LlamaIndex users import it (DESIGN.md 9): the adapter lives in
:mod:`reach_plugins.frameworks.llamaindex`."""

from reach_plugins.frameworks.llamaindex import (
    SESSION_KEY,
    ReachTool,
    ReachToolRetriever,
    enhance_agent,
    enhance_tools,
    error_output,
)

__all__ = ["SESSION_KEY", "ReachTool", "ReachToolRetriever", "enhance_agent", "enhance_tools", "error_output"]
