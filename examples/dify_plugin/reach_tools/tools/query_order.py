"""Every call of this tool reaches the ``query_order`` capability (one Tool subclass per file, as Dify requires)."""

from reach_plugins.dify import reach_tool

QueryOrder = reach_tool("query_order")
