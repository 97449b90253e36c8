"""The strategy Dify loads from this file: reach_plugins' function-calling strategy with the Reach hook installed.

To hook your own strategy instead, decorate it (keep exactly one AgentStrategy subclass in this file):

    from reach_plugins.dify import reach_strategy

    @reach_strategy
    class MyStrategy(AgentStrategy):
        def _invoke(self, parameters): ...   # every self.session.tool.invoke(...) now goes through Reach
"""

from reach_plugins.dify import ReachAgentStrategy

__all__ = ["ReachAgentStrategy"]
