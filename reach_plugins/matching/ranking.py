"""Capacity-aware ranking of a near tie (seed 001, section 3.2): similarity alone never picks among close matches.

When several capabilities match a tool within the matcher's margin, the
matcher refuses to choose (``ambiguous``). :class:`CapacityRanking` breaks
such a tie with what the registry knows: each contender scores
``weights[0] * similarity + weights[1] * free_capacity`` (the seeds' 0.7 /
0.3 by default), and the best one is chosen only if it beats the runner-up
by more than ``weights[0] * margin`` — the similarity part of a tie stays a
tie, so equal capacity keeps the matcher's answer (``ambiguous``), and only a
real difference in free capacity decides. Free capacity is a number in
[0, 1] per capability (``1 - load`` averaged over ready instances, see
:mod:`reach_plugins.routing.capacity`); it is read on every ranking, never
cached in a decision, because load moves between calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from reach_plugins.errors import ConfigError
from reach_plugins.matching.matcher import MatchResult

DEFAULT_WEIGHTS: Final = (0.7, 0.3)
"""Similarity, free capacity: the seeds' final score."""

FreeCapacityOf = Callable[[str], float]
"""A capability's free capacity in [0, 1] (1: every instance idle; 0: none ready or all saturated)."""


@dataclass(frozen=True, slots=True)
class Contender:
    """One capability of a near tie: both parts of its score, and the score."""

    capability: str
    similarity: float
    capacity: float
    score: float

    def __str__(self) -> str:
        parts = f"similarity {self.similarity:.3f}, free capacity {self.capacity:.2f}"
        return f"{self.capability} {self.score:.3f} ({parts})"


@dataclass(frozen=True, slots=True)
class Ranked:
    """A near tie ranked: the choice (``None`` while still a tie), every contender best first, and why."""

    capability: str | None
    contenders: tuple[Contender, ...]
    reason: Literal["capacity", "ambiguous"]

    def __str__(self) -> str:
        ranked = "; ".join(map(str, self.contenders))
        head = f"{self.capability}: capacity" if self.capability else "nothing: ambiguous even with capacity"
        return f"{head} (ranked {ranked})"


class CapacityRanking:
    """Ranks a matcher's near tie by ``weights`` of similarity and free capacity."""

    def __init__(self, weights: Sequence[float] = DEFAULT_WEIGHTS, *, margin: float) -> None:
        self.weights = check_weights(weights)
        self.margin = margin

    def rank(self, match: MatchResult, capacity: FreeCapacityOf) -> Ranked | None:
        """The tie of ``match`` ranked, or ``None`` when there is no tie to rank (fewer than two contenders)."""
        if match.reason != "ambiguous" or len(match.contenders) < 2:
            return None
        similar, free = self.weights
        scored = []
        for name, similarity in match.contenders:
            room = min(1.0, max(0.0, capacity(name)))
            scored.append(Contender(name, similarity, room, similar * similarity + free * room))
        scored.sort(key=lambda contender: (-contender.score, contender.capability))
        best, second = scored[0], scored[1]
        if best.score - second.score > similar * self.margin:
            return Ranked(best.capability, tuple(scored), "capacity")
        return Ranked(None, tuple(scored), "ambiguous")


def check_weights(weights: Sequence[float]) -> tuple[float, float]:
    """``(similarity, capacity)`` weights: two finite numbers >= 0 summing to 1 (``ConfigError`` names the fix)."""
    values = tuple(weights)
    if (
        len(values) != 2
        or not all(isinstance(w, int | float) and math.isfinite(w) and w >= 0 for w in values)
        or not math.isclose(sum(values), 1.0, abs_tol=1e-9)
    ):
        raise ConfigError(
            f"capacity_weights must be two numbers >= 0 that sum to 1 (similarity, free capacity), e.g. (0.7, 0.3); "
            f"got {weights!r}"
        )
    similar, free = float(values[0]), float(values[1])
    if similar == 0.0:
        raise ConfigError("capacity_weights gives similarity no weight: capacity alone would route any tool anywhere")
    return similar, free
