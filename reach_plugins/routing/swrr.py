"""Smooth weighted round robin, the nginx algorithm: exact shares, evenly interleaved.

Each pick adds every peer's weight to its running ``current`` value, takes the
peer with the largest one and subtracts the total from it. Over any ``W =
sum(weights)`` consecutive picks of a stable peer set each peer is chosen
exactly ``weight`` times, and picks of a heavy peer are spread out rather than
bunched (weights 5, 1, 1 give ``a a b a c a a``, not ``a a a a a b c``).
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class SmoothWeightedRoundRobin(Generic[K]):
    """Picks among ``(key, weight)`` peers; the peer set may change between picks.

    A peer seen for the first time starts at a random ``current`` below its
    weight, so many routers started together do not all hit the same first
    instance. Peers that disappear are forgotten once they outnumber the live ones.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._current: dict[K, int] = {}

    def pick(self, peers: Sequence[tuple[K, int]]) -> int:
        """Return the position in ``peers`` of the next peer; weights must be positive, ``peers`` non-empty."""
        current = self._current
        total = 0
        best = -1
        best_value = 0
        for position, (key, weight) in enumerate(peers):
            value = current.get(key)
            value = (self._rng.randrange(weight) if value is None else value) + weight
            current[key] = value
            total += weight
            if best < 0 or value > best_value:
                best, best_value = position, value
        current[peers[best][0]] = best_value - total
        if len(current) > 2 * len(peers) + 64:
            self._forget_absent(peers)
        return best

    def _forget_absent(self, peers: Sequence[tuple[K, int]]) -> None:
        live = {key for key, _ in peers}
        self._current = {key: value for key, value in self._current.items() if key in live}
