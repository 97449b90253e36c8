"""A generic tool: the app builder picks the capability (form parameter ``reach_capability``), the model asks.

The question (``query``) goes into the one text field the capability's schema asks for, or the model gives the
arguments as a JSON object (``arguments``); see ``reach_plugins.frameworks.dify.ask``.
"""

from reach_plugins.dify import AskAgent

__all__ = ["AskAgent"]
