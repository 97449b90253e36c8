"""A generic tool: the app builder picks the capability (form parameter ``reach_capability``), the model asks."""

from reach_plugins.dify import ReachTool

__all__ = ["ReachTool"]
