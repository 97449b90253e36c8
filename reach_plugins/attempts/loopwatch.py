"""Where the pipeline feeds :class:`~reach_plugins.policy.dependency.DependencyRates`: once per reach, after routing.

The caller is the last hop of the request's chain (an agent reaching on);
a reach from outside any agent has no caller and is not counted. A pair that
becomes a loop is logged once on ``reach_plugins.loops`` (WARNING) and counted
as ``reach.dependency.loop_alerts``; with ``on_loop: shed`` each later reach
of its newer direction is refused with ``LoopDetected`` until the pair cools.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from reach_plugins.clock import Clock
from reach_plugins.errors import LoopDetected
from reach_plugins.model import Hop, LoopSettings
from reach_plugins.policy.dependency import DependencyRates, LoopPair
from reach_plugins.telemetry.metrics import ReachMetrics

logger = logging.getLogger("reach_plugins.loops")


class LoopWatch:
    """The dependency-loop check of one pipeline (a client, a gateway's forwarder, a node)."""

    def __init__(self, settings: LoopSettings, clock: Clock, metrics: Callable[[], ReachMetrics | None]) -> None:
        if not settings.enabled:
            logger.warning(
                "dependency-loop alerts are off (loops.enabled: false): two agents reaching each other "
                "with fresh request ids will not be noticed"
            )
        self.rates = DependencyRates(settings) if settings.enabled else None
        self._clock = clock
        self._metrics = metrics
        self._shed = settings.on_loop == "shed"

    def check(self, hops: Sequence[Hop], target: str) -> None:
        """Count the reach ``hops[-1].agent -> target``; alert on a new loop; refuse its newer way when shedding."""
        rates = self.rates
        if rates is None or not hops:
            return
        caller = hops[-1].agent
        pair = rates.observe(caller, target, self._clock.monotonic())
        if pair is None:
            return
        if pair.alert:
            self._alert(pair)
        if self._shed and pair.newer == (caller, target):
            raise LoopDetected(
                f"dependency loop: {pair.first} and {pair.second} reach each other at {pair.rate:.2f}/s each way "
                f"(threshold {rates.settings.threshold:g}/s over {rates.settings.window:g}s), so the newer "
                f"direction {caller} -> {target} is shed; break the cycle between these agents "
                "(or set loops.on_loop: alert)",
                cycle=[caller, target, caller],
            )

    def pairs(self) -> list[LoopPair]:
        """The pairs that are loops now (none when the alerts are off)."""
        return [] if self.rates is None else self.rates.pairs(self._clock.monotonic())

    @property
    def looping(self) -> int:
        """How many pairs are loops, as of the last reach or listing (for a gauge read from another thread)."""
        return 0 if self.rates is None else self.rates.looping

    def _alert(self, pair: LoopPair) -> None:
        logger.warning(
            "dependency loop: %s and %s reach each other at %.2f/s and %.2f/s (newer direction %s -> %s)",
            pair.first,
            pair.second,
            pair.forward,
            pair.backward,
            *pair.newer,
        )
        metrics = self._metrics()
        if metrics is not None:
            metrics.loop_alert(pair.first, pair.second)
