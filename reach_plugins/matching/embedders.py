"""What the matcher needs from an embedding model, and how the default one is chosen.

An :class:`Embedder` turns texts into vectors; the matcher compares them by
cosine. Any ``Callable[[Sequence[str]], Sequence[Sequence[float]]]`` works as
well (:func:`as_embedder` wraps it). The built-in embedders also carry a
``recommended_threshold``: the cosine a tool must reach to be mapped, measured
on the labelled set in :mod:`reach_plugins.matching.evalset`; scores are not
comparable across models, so a custom embedder has to bring its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from reach_plugins.errors import ConfigError
from reach_plugins.matching.extra import minilm_available
from reach_plugins.matching.lexical import LexicalEmbedder

Vectors = Sequence[Sequence[float]]
EmbedFunction = Callable[[Sequence[str]], Vectors]


@runtime_checkable
class Embedder(Protocol):
    """Texts in, one vector per text out (any length, the same for every text of one embedder)."""

    @property
    def name(self) -> str:
        """Short identifier shown in logs and match explanations (``lexical``, ``all-MiniLM-L6-v2``)."""
        ...

    def embed(self, texts: Sequence[str]) -> Vectors:
        """One vector per text, in order."""
        ...


class FunctionEmbedder:
    """Adapts a plain function ``texts -> vectors`` to the :class:`Embedder` protocol."""

    def __init__(self, function: EmbedFunction, *, name: str | None = None) -> None:
        self._function = function
        self._name = name or str(getattr(function, "__name__", type(function).__name__))

    @property
    def name(self) -> str:
        return self._name

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self._function(texts)


HYBRID_DENSE_WEIGHT = 0.6
HYBRID_THRESHOLD = 0.46
"""Tuned on :data:`~reach_plugins.matching.evalset.CASES` (75 cases): at weight 0.6 every threshold
from 0.44 to 0.56 maps no unrelated tool, and 0.34-0.46 all reach the best accuracy (96 %); weights
0.5-0.8 stay within two points of it. 0.46 keeps a margin on both sides."""


class HybridEmbedder:
    """A sentence model and the lexical embedder in one vector: ``score = w * dense + (1 - w) * lexical``.

    Both parts are scaled to unit length and weighted by ``sqrt(w)`` and
    ``sqrt(1 - w)`` before being concatenated, so the cosine of two hybrid
    vectors is exactly the weighted sum of the two cosines. The lexical part
    rewards shared words (tool names are terse and precise), the dense part
    shared meaning; on the evaluation set the mix beats either alone.
    """

    def __init__(
        self,
        dense: Embedder,
        lexical: Embedder,
        *,
        dense_weight: float = HYBRID_DENSE_WEIGHT,
        recommended_threshold: float | None = None,
    ) -> None:
        if not 0.0 < dense_weight < 1.0:
            raise ConfigError(f"dense_weight must be strictly between 0 and 1, got {dense_weight}")
        self.dense = dense
        self.lexical = lexical
        self.dense_weight = dense_weight
        self.recommended_threshold = recommended_threshold

    @property
    def name(self) -> str:
        return f"{self.dense.name}+{self.lexical.name}"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        dense = self.dense.embed(texts)
        lexical = self.lexical.embed(texts)
        a, b = math.sqrt(self.dense_weight), math.sqrt(1.0 - self.dense_weight)
        return [_scaled(d, a) + _scaled(x, b) for d, x in zip(dense, lexical, strict=True)]


def _scaled(vector: Sequence[float], weight: float) -> list[float]:
    norm = math.sqrt(sum(float(x) * float(x) for x in vector))
    return [float(x) * weight / norm for x in vector] if norm else [0.0] * len(vector)


def as_embedder(embedder: Embedder | EmbedFunction) -> Embedder:
    """Accept an :class:`Embedder` as is, wrap a plain callable, refuse anything else."""
    if isinstance(embedder, Embedder):
        return embedder
    if callable(embedder):
        return FunctionEmbedder(embedder)
    raise ConfigError(
        f"embedder must have embed(texts) -> vectors or be a callable texts -> vectors, got {type(embedder).__name__}"
    )


def default_embedder() -> Embedder:
    """all-MiniLM-L6-v2 (mixed with the lexical embedder) when its weights are installed, else the lexical one.

    The model's weights are read on the first ``embed`` call, not here, so
    choosing the default costs nothing until something is matched. The
    matcher's ``describe()`` says which one was chosen.
    """
    if not minilm_available():
        return LexicalEmbedder()
    from reach_plugins.matching.minilm import MiniLMEmbedder

    return HybridEmbedder(
        MiniLMEmbedder(),
        LexicalEmbedder(),
        dense_weight=HYBRID_DENSE_WEIGHT,
        recommended_threshold=HYBRID_THRESHOLD,
    )
