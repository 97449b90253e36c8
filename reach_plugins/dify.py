"""``reach_plugins.dify``, where Dify users import it (DESIGN.md 9): the adapter lives in
:mod:`reach_plugins.frameworks.dify`; its dify-plugin entry points still load only on first use (gevent)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reach_plugins.frameworks import dify as _dify
from reach_plugins.frameworks.dify import (
    ARGUMENTS_PARAMETER,
    CAPABILITY_PARAMETER,
    QUESTION_PARAMETER,
    ReachSettings,
    ask_payload,
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
    text_field,
)

if TYPE_CHECKING:
    from reach_plugins.frameworks.dify.plugin import (
        AskAgent,
        ReachAgentStrategy,
        ReachTool,
        reach_strategy,
        reach_tool,
    )

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
    """The dify-plugin entry points, imported on first use as :mod:`reach_plugins.frameworks.dify` does."""
    return getattr(_dify, name)
