"""Outlier detection: find the instance that is slower or failing more than its peers, before callers pay for it.

A breaker opens on an instance's own failure rate over a window; an instance
that still answers, only seconds late, keeps its share of calls until the
window fills (issue 25: a +2-5 s instance kept 33 % of the calls for ~13 s).
Here each instance of an agent keeps an EWMA of its attempts' latency (a
timeout counts as the time it took: a lower bound; a hedge's cancelled loser is
a censored sample, :meth:`OutlierDetector.censored`) and of its failures, and is
judged against its peers, the agent's other instances with fresh figures
(Envoy's outlier detection, with a latency variant); at least ``min_peers``
of them are needed (Envoy asks for 5 hosts; two peers are enough to tell
which one of three is off, and an agent of two instances is left to its
breakers). An instance is an outlier when

* slow: its latency EWMA is at least ``slow_ratio`` times its peers' median,
  at least ``min_excess`` seconds above it, and ``min_z`` robust z-scores
  above it (the spread is 1.4826 x the peers' median absolute deviation); or
* failing: its failure EWMA is at least ``failure_rate`` while its peers'
  median is under half of that (Envoy's failure percentage, relative).

A mildly slow outlier's routing weight shrinks at once (to ``peers' median /
its latency``, never below ``min_share``) and it is ejected, like an open
breaker, after ``eject_after`` outlier verdicts in a row; a severe one (at
least ``eject_ratio`` times the median, or failing) is ejected at its first
verdict: a cut weight would only slow the evidence down. Then a probation:

============  ==========================================  ===========================================
state         event                                       next
============  ==========================================  ===========================================
healthy       an outlier verdict                          slow (weight reduced)
slow          ``eject_after`` verdicts in a row (a severe  ejected for ``eject_for * 2**(n-1)``, capped
              one: the first), room to eject
              (``max_ejected``, never all)
slow          a verdict in line with its peers            healthy (full weight)
ejected       the ejection ends                           probation (``probation_share``, fresh stats)
probation     ``min_samples`` in line with its peers      healthy (``n`` back to 0)
probation     an outlier verdict                          ejected (``n + 1``: twice as long)
============  ==========================================  ===========================================

An agent never has more than ``max_ejected`` of its instances ejected at once
(at least one may be), and never all of them. Sans-IO: the time is an
argument (monotonic seconds); the attempt engine feeds it, the router reads
:meth:`OutlierDetector.standing`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import ClassVar, Literal

from reach_plugins.errors import ConfigError

State = Literal["healthy", "slow", "ejected", "probation"]
Standing = tuple[float, str | None]
"""The share of its routing weight an instance keeps (1.0 in line, 0.0 ejected) and why, when below 1.0."""

_SPREAD = 1.4826
"""Scales a median absolute deviation to a standard deviation (normal data)."""
_IN_LINE: Standing = (1.0, None)
_PREFIX = "outlier "
"""Every why of this module starts so: :func:`is_outlier` tells its reasons from a breaker's or a probe's."""


def is_outlier(why: str) -> bool:
    """Whether a routing reason is this detector's (a cut weight, a probation, an ejection)."""
    return why.startswith(_PREFIX)


@dataclass(frozen=True, slots=True)
class OutlierPolicy:
    """When an instance counts as an outlier among its peers, and what follows (defaults find +2 s in seconds)."""

    min_samples: int = 5
    """Attempts since the last reset before an instance is judged."""
    min_peers: int = 2
    """Peers with ``min_samples`` and a sample in the last ``stale_after`` seconds needed to judge an instance."""
    stale_after: float = 30.0
    alpha: float = 0.3
    """Weight of the newest attempt in each EWMA."""
    slow_ratio: float = 2.0
    eject_ratio: float = 5.0
    """At this many times the peers' median (or failing) an outlier is ejected at its first verdict."""
    min_excess: float = 0.25
    min_z: float = 3.0
    failure_rate: float = 0.5
    eject_after: int = 3
    eject_for: float = 5.0
    max_eject: float = 300.0
    max_ejected: float = 0.5
    min_share: float = 0.05
    probation_share: float = 0.1
    max_instances: int = 10_000
    """Instances tracked at most (instance ids come and go): past it, the longest silent half is forgotten."""

    def __post_init__(self) -> None:
        if min(self.min_samples, self.eject_after, self.min_peers, self.max_instances) < 1 or self.stale_after <= 0:
            raise ConfigError(
                "min_samples, eject_after, min_peers and max_instances must be >= 1 and stale_after > 0, got "
                f"{self.min_samples}, {self.eject_after}, {self.min_peers}, {self.max_instances} and {self.stale_after}"
            )
        if not (0 < self.alpha <= 1 and 0 < self.max_ejected <= 1 and 0 < self.failure_rate <= 1):
            raise ConfigError(
                "alpha, max_ejected and failure_rate are fractions in (0, 1], "
                f"got {self.alpha}, {self.max_ejected} and {self.failure_rate}"
            )
        if not (0 < self.min_share <= 1 and 0 < self.probation_share <= 1):
            raise ConfigError(
                f"min_share and probation_share are fractions in (0, 1], got {self.min_share}, {self.probation_share}"
            )
        if not 1 < self.slow_ratio <= self.eject_ratio or self.eject_for <= 0 or self.max_eject < self.eject_for:
            raise ConfigError(
                "1 < slow_ratio <= eject_ratio and 0 < eject_for <= max_eject are needed, "
                f"got {self.slow_ratio}, {self.eject_ratio}, {self.eject_for} and {self.max_eject}"
            )


@dataclass(frozen=True, slots=True)
class OutlierTransition:
    """One instance changed state, and why (for the trace, the log and metrics)."""

    kind: ClassVar[str] = "outlier"
    agent: str
    instance: str
    before: State
    after: State
    at: float
    reason: str


@dataclass(slots=True)
class _Track:
    latency: float = 0.0
    failures: float = 0.0
    samples: int = 0
    last: float = 0.0
    strikes: int = 0
    state: State = "healthy"
    until: float = 0.0
    ejections: int = 0
    share: float = 1.0
    why: str | None = None


@dataclass(slots=True)
class OutlierDetector:
    """Per agent, each instance's latency and failure trends against its peers; which are slowed or ejected now."""

    policy: OutlierPolicy = field(default_factory=OutlierPolicy)
    listener: Callable[[OutlierTransition], None] | None = None
    _agents: dict[str, dict[str, _Track]] = field(default_factory=dict)
    _flagged: int = 0
    """Instances not plainly healthy: zero is the fast path of :meth:`standing`."""
    _tracked: int = 0

    def standing(self, agent: str, instance: str, now: float) -> Standing:
        """The share of its weight the instance keeps now and why (``(0.0, why)`` while ejected)."""
        if not self._flagged:
            return _IN_LINE
        track = self._agents.get(agent, {}).get(instance)
        if track is None or track.state == "healthy":
            return _IN_LINE
        self._expire(agent, instance, track, now)
        return (track.share, track.why)

    def available(self, agent: str, instance: str, now: float) -> bool:
        """Whether routing may send to the instance (not ejected)."""
        return self.standing(agent, instance, now)[0] > 0.0

    @property
    def tracked(self) -> int:
        """Instances tracked now (bounded by ``max_instances``)."""
        return self._tracked

    def state(self, agent: str, instance: str) -> State:
        track = self._agents.get(agent, {}).get(instance)
        return "healthy" if track is None else track.state

    def ejected_until(self, agent: str, instance: str) -> float | None:
        """When the instance's ejection ends (its clock), ``None`` unless ejected."""
        track = self._agents.get(agent, {}).get(instance)
        return track.until if track is not None and track.state == "ejected" else None

    def record(
        self,
        agent: str,
        instance: str,
        *,
        latency: float,
        failure: bool,
        now: float,
        on_move: Callable[[OutlierTransition], None] | None = None,
    ) -> None:
        """One finished attempt: its duration in seconds (a timeout's too) and whether the instance failed it;
        ``on_move`` also hears a change this causes."""
        self._sample(agent, instance, latency, failure, now, on_move)

    def censored(
        self,
        agent: str,
        instance: str,
        *,
        at_least: float,
        now: float,
        on_move: Callable[[OutlierTransition], None] | None = None,
    ) -> None:
        """An attempt cut after ``at_least`` seconds without an answer (a hedge's loser): a censored sample.

        It is neither a success nor a failure (the failure trend is left alone), and its latency is only known to
        exceed ``at_least``: it counts as what an instance with a memoryless tail of its current mean is expected to
        take once it has run that long, ``at_least`` plus that mean (the mean from before an ejection, on
        probation). An instance that keeps losing races so keeps producing evidence and its trend climbs until it
        is judged, although the hedge cuts each attempt after a short delay (a plain ``max(at_least, mean)`` would
        stay near that delay and never be judged slow). A censored sample can convict, never acquit: only an
        answer brings a slowed instance or one on probation back to healthy."""
        self._sample(agent, instance, at_least, None, now, on_move)

    def _sample(
        self,
        agent: str,
        instance: str,
        latency: float,
        failure: bool | None,
        now: float,
        on_move: Callable[[OutlierTransition], None] | None,
    ) -> None:
        """Fold one attempt into the instance's trends (``failure`` None: censored, see :meth:`censored`), judge."""
        if self._tracked >= self.policy.max_instances and instance not in self._agents.get(agent, {}):
            self._prune()
        peers = self._agents.setdefault(agent, {})
        track = peers.get(instance)
        if track is None:
            track = peers[instance] = _Track(last=now)
            self._tracked += 1
        self._expire(agent, instance, track, now, on_move)
        if track.state == "ejected":
            return  # a late answer from before the ejection: the probation judges it afresh
        alpha = self.policy.alpha
        if failure is None:
            latency += track.latency
        if track.samples == 0:
            track.latency = latency
            if failure is not None:
                track.failures = float(failure)
        else:
            track.latency += alpha * (latency - track.latency)
            if failure is not None:
                track.failures += alpha * (float(failure) - track.failures)
        track.samples += 1
        track.last = now
        if track.samples >= self.policy.min_samples:
            self._judge(agent, instance, track, peers, now, on_move, censored=failure is None)

    def _judge(
        self,
        agent: str,
        instance: str,
        track: _Track,
        peers: dict[str, _Track],
        now: float,
        on_move: Callable[[OutlierTransition], None] | None,
        *,
        censored: bool,
    ) -> None:
        policy = self.policy
        fresh = now - policy.stale_after
        judged = [
            other
            for name, other in peers.items()
            if name != instance
            and other.samples >= policy.min_samples
            and other.last >= fresh
            and other.state in ("healthy", "slow")
        ]
        if len(judged) < policy.min_peers:
            return
        found = self._verdict(track, judged)
        if found is None:
            if censored:
                return  # "at least this slow" never shows an instance in line
            track.strikes = 0
            if track.state != "healthy":
                if track.state == "probation":
                    track.ejections = 0
                track.share, track.why = 1.0, None
                self._move(agent, instance, track, "healthy", now, "in line with its peers again", on_move)
            return
        why, share, severe = found
        track.strikes += 1
        ejected = sum(1 for other in peers.values() if other.state == "ejected")
        room = ejected < max(1, math.floor(policy.max_ejected * len(peers))) and ejected + 1 < len(peers)
        if room and (severe or track.state == "probation" or track.strikes >= policy.eject_after):
            track.ejections += 1
            length = min(policy.max_eject, policy.eject_for * 2 ** (track.ejections - 1))
            track.until, track.share = now + length, 0.0
            track.why = f"{_PREFIX}ejected for {length:g}s: {why}"
            self._move(agent, instance, track, "ejected", now, track.why, on_move)
        elif track.state != "probation":
            track.share, track.why = share, f"{_PREFIX}at {share:.0%} of its weight: {why}"
            if track.state != "slow":
                self._move(agent, instance, track, "slow", now, track.why, on_move)

    def _verdict(self, track: _Track, peers: list[_Track]) -> tuple[str, float, bool] | None:
        """Why ``track`` is an outlier among ``peers``, the share of weight it keeps and whether it is severe."""
        policy = self.policy
        latencies = [peer.latency for peer in peers]
        middle = median(latencies)
        spread = max(_SPREAD * median(abs(value - middle) for value in latencies), 0.05 * middle, 0.001)
        excess = track.latency - middle
        if (
            track.latency >= policy.slow_ratio * middle
            and excess >= policy.min_excess
            and excess / spread >= policy.min_z
        ):
            share = max(policy.min_share, middle / track.latency)
            severe = track.latency >= policy.eject_ratio * middle
            return f"latency {track.latency:.3g}s against its peers' median {middle:.3g}s", share, severe
        usual = median(peer.failures for peer in peers)
        if track.failures >= policy.failure_rate and usual < policy.failure_rate / 2:
            return f"failure rate {track.failures:.0%} against its peers' median {usual:.0%}", policy.min_share, True
        return None

    def _expire(
        self,
        agent: str,
        instance: str,
        track: _Track,
        now: float,
        on_move: Callable[[OutlierTransition], None] | None = None,
    ) -> None:
        """An ejection whose time is up ends in probation: fresh statistics, a small share of the calls."""
        if track.state == "ejected" and now >= track.until:
            track.samples = track.strikes = 0
            share = self.policy.probation_share
            track.share, track.why = share, f"{_PREFIX}on probation at {share:.0%} of its weight after an ejection"
            self._move(agent, instance, track, "probation", now, "the ejection ended", on_move)

    def _prune(self) -> None:
        """Forget the longest silent half of the tracked instances (those instances left, most likely)."""
        tracks = sorted(
            (track.last, agent, instance) for agent, peers in self._agents.items() for instance, track in peers.items()
        )
        for _, agent, instance in tracks[: max(1, len(tracks) // 2)]:
            track = self._agents[agent].pop(instance)
            self._flagged -= track.state != "healthy"
            self._tracked -= 1
            if not self._agents[agent]:
                del self._agents[agent]

    def _move(
        self,
        agent: str,
        instance: str,
        track: _Track,
        after: State,
        now: float,
        reason: str,
        on_move: Callable[[OutlierTransition], None] | None = None,
    ) -> None:
        before, track.state = track.state, after
        self._flagged += (after != "healthy") - (before != "healthy")
        if self.listener is None and on_move is None:
            return
        transition = OutlierTransition(agent, instance, before, after, now, reason)
        for hear in (self.listener, on_move):
            if hear is not None:
                hear(transition)
