"""Framework integration: ReachEnhancer, tool mapping, and the thin LangChain, LlamaIndex and Dify adapters.

Importing this package imports no framework: each adapter is a leaf module that imports its host on demand.
"""
