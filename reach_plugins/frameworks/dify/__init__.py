"""Dify integration: the ``before_invoke`` hook Dify lacks, and dify-plugin entry points that use it.

Dify has no hook before a tool call, in Dify or in its plugin SDK.
:func:`before_invoke` is one; ``ReachAgentStrategy`` (an ``AgentStrategy``)
installs it around every ``self.session.tool.invoke(...)`` of an agent, and
``ReachTool`` / :func:`reach_tool` (a ``Tool``) forward one tool to a
capability; ``AskAgent`` shapes a plain-words question by the capability's
schema (:mod:`~reach_plugins.frameworks.dify.ask`). A hooked strategy streams
the agent's items and writes a Dify agent log for each reach. The
conversation id is the affinity key; closed conversations are refused
(session liveness).

``before_invoke`` and the settings need no ``dify_plugin``. The entry points
(``ReachTool``, ``reach_tool``, ``AskAgent``, ``ReachAgentStrategy``, ``reach_strategy``)
import it on first use, because importing ``dify_plugin`` monkey-patches the
process with gevent: ``pip install "reach-plugins[dify]"`` in the plugin's
environment only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reach_plugins.frameworks.dify.ask import ARGUMENTS_PARAMETER, QUESTION_PARAMETER, ask_payload, text_field
from reach_plugins.frameworks.dify.hook import (
    CAPABILITY_PARAMETER,
    ReachSettings,
    before_invoke,
    before_invoke_stream,
    check_settings,
    close_conversation,
    configure,
    default_enhancer,
    enhancer_for,
    enhancer_from,
    reach_capability,
    shutdown,
    stream_reach,
)

if TYPE_CHECKING:
    from reach_plugins.frameworks.dify.plugin import (
        AskAgent,
        ReachAgentStrategy,
        ReachTool,
        reach_strategy,
        reach_tool,
    )

_ENTRY_POINTS = frozenset({"AskAgent", "ReachAgentStrategy", "ReachTool", "reach_strategy", "reach_tool"})

__all__ = [
    "ARGUMENTS_PARAMETER",
    "CAPABILITY_PARAMETER",
    "QUESTION_PARAMETER",
    "AskAgent",
    "ReachAgentStrategy",
    "ReachSettings",
    "ReachTool",
    "ask_payload",
    "before_invoke",
    "before_invoke_stream",
    "check_settings",
    "close_conversation",
    "configure",
    "default_enhancer",
    "enhancer_for",
    "enhancer_from",
    "reach_capability",
    "reach_strategy",
    "reach_tool",
    "shutdown",
    "stream_reach",
    "text_field",
]


def __getattr__(name: str) -> Any:
    """Import ``dify_plugin`` (and its gevent patching) only when an entry point is asked for."""
    if name in _ENTRY_POINTS:
        try:
            from reach_plugins.frameworks.dify import plugin
        except ImportError as exc:
            raise ImportError(f'{name} needs the dify extra: pip install "reach-plugins[dify]"') from exc
        return getattr(plugin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
