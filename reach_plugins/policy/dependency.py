"""Dependency-loop alerts (seed 004, section 4.1, second step): two agents reaching each other at a high rate.

The loop guard stops a chain that revisits an agent, but the seed's coupon
incident was two agents reaching each other for half an hour with a fresh
request id (a fresh chain) every time: each reach looked fine on its own.
:class:`DependencyRates` counts reaches per directed edge ``caller -> target``
(the caller is the last hop of the request's chain) over a sliding window of
buckets; the two-way rate of a pair is the lower of its two directions, and a
pair at or above ``threshold`` reaches per second both ways is a loop. The
direction seen second is the *newer* one: the edge that closed the loop, the
one a ``shed`` policy refuses.

Sans-IO: every method takes the monotonic time; an observation is amortised
O(1) (a bucket ring per edge with a running total); at most ``max_edges``
edges are kept, the least recently reached evicted first.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from reach_plugins.errors import ConfigError
from reach_plugins.model import LoopSettings

__all__ = ["DependencyRates", "LoopPair", "LoopSettings"]


@dataclass(frozen=True, slots=True)
class LoopPair:
    """Two agents reaching each other: ``first -> second`` was seen first, ``second -> first`` is the newer way."""

    first: str
    second: str
    forward: float
    """Reaches per second ``first -> second`` over the window."""
    backward: float
    """Reaches per second ``second -> first`` over the window."""
    since: float
    """Monotonic time the pair became a loop."""
    alert: bool = False
    """True on the observation that made it a loop (the one to log and count)."""

    @property
    def rate(self) -> float:
        """The two-way rate: the lower of the two directions."""
        return min(self.forward, self.backward)

    @property
    def newer(self) -> tuple[str, str]:
        """``(caller, target)`` of the direction that closed the loop."""
        return self.second, self.first

    def as_json(self) -> dict[str, object]:
        return {
            "pair": [self.first, self.second],
            "rate": round(self.rate, 3),
            "forward": round(self.forward, 3),
            "backward": round(self.backward, 3),
            "newer": f"{self.second} -> {self.first}",
        }


class _Edge:
    """One direction's reaches: a ring of bucket counts ending at bucket ``head``, and their running total."""

    __slots__ = ("born", "counts", "head", "total")

    def __init__(self, buckets: int, head: int, born: int) -> None:
        self.counts = [0] * buckets
        self.head = head
        self.total = 0
        self.born = born
        """Order of first sight among edges: of two directions, the later born is the newer."""

    def advance(self, bucket: int) -> None:
        """Slide the ring to ``bucket``, dropping the buckets that left the window (a clock going back: kept)."""
        gap = bucket - self.head
        if gap <= 0:
            return
        counts = self.counts
        size = len(counts)
        if gap >= size:
            counts[:] = [0] * size
            self.total = 0
        else:
            for step in range(self.head + 1, bucket + 1):
                slot = step % size
                self.total -= counts[slot]
                counts[slot] = 0
        self.head = bucket


class DependencyRates:
    """Reaches per directed agent pair over a sliding window, and the pairs that reach each other too often."""

    def __init__(self, settings: LoopSettings | None = None) -> None:
        self.settings = settings = settings or LoopSettings()
        if not (math.isfinite(settings.window) and settings.window > 0):
            raise ConfigError(f"loops.window must be a positive number of seconds, got {settings.window}")
        self._width = settings.window / settings.buckets
        self._need = settings.threshold * settings.window
        """Reaches in the window, each way, that make a loop."""
        self._edges: OrderedDict[tuple[str, str], _Edge] = OrderedDict()
        self._born = 0
        self._loops: dict[tuple[str, str], float] = {}
        """Each looping pair, keyed ``(first, second)`` in the order first seen, and since when."""

    def __len__(self) -> int:
        return len(self._edges)

    @property
    def looping(self) -> int:
        """Pairs held as loops as of the last observation or listing (reads without sliding: safe for a gauge)."""
        return len(self._loops)

    def observe(self, caller: str, target: str, now: float) -> LoopPair | None:
        """Count one reach ``caller -> target`` at ``now``; the pair if it is a loop now (``alert``: it just became)."""
        if caller == target:
            return None
        bucket = int(now // self._width)
        edges = self._edges
        key = (caller, target)
        edge = edges.get(key)
        if edge is None:
            if len(edges) >= self.settings.max_edges:
                self._evict()
            self._born += 1
            edge = edges[key] = _Edge(self.settings.buckets, bucket, self._born)
        else:
            edges.move_to_end(key)
            edge.advance(bucket)
        edge.counts[bucket % len(edge.counts)] += 1
        edge.total += 1
        back = edges.get((target, caller))
        if back is None:
            return None
        return self._judge(key, edge, back, bucket, now)

    def pairs(self, now: float) -> list[LoopPair]:
        """The pairs that are loops at ``now``, highest two-way rate first (a pair that cooled down is dropped)."""
        bucket = int(now // self._width)
        found = []
        for first, second in list(self._loops):
            one, other = self._edges.get((first, second)), self._edges.get((second, first))
            if one is None or other is None:
                self._loops.pop((first, second), None)
                continue
            pair = self._judge((first, second), one, other, bucket, now)
            if pair is not None:
                found.append(pair)
        return sorted(found, key=lambda pair: (-pair.rate, pair.first, pair.second))

    def rate(self, caller: str, target: str, now: float) -> float:
        """Reaches per second ``caller -> target`` over the window ending at ``now``."""
        edge = self._edges.get((caller, target))
        if edge is None:
            return 0.0
        edge.advance(int(now // self._width))
        return edge.total / self.settings.window

    def _judge(self, key: tuple[str, str], edge: _Edge, back: _Edge, bucket: int, now: float) -> LoopPair | None:
        """The pair of ``edge`` and its reverse ``back`` if both carry the threshold now, keeping the loop table."""
        back.advance(bucket)
        edge.advance(bucket)
        first, second = key if edge.born < back.born else (key[1], key[0])
        ordered = (first, second)
        forward, backward = (edge, back) if ordered == key else (back, edge)
        if min(forward.total, backward.total) < self._need:
            self._loops.pop(ordered, None)
            return None
        since = self._loops.get(ordered)
        alert = since is None
        if since is None:
            since = self._loops[ordered] = now
        window = self.settings.window
        return LoopPair(first, second, forward.total / window, backward.total / window, since, alert)

    def _evict(self) -> None:
        """Drop the least recently reached edge, and its pair's loop with it."""
        (caller, target), _ = self._edges.popitem(last=False)
        self._loops.pop((caller, target), None)
        self._loops.pop((target, caller), None)
