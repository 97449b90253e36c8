"""Reply consistency: eject an instance that is "up" yet answers beside the question (seed 001, section 2.2).

Health checks and breakers see errors and timeouts; they cannot see an agent
that answers every request promptly with nonsense — and that poisons the rest
of a chain. For capabilities that opt in (``consistency:``), every successful
reply is scored against its request (:func:`score_reply`: the cosine of the
request's intent and payload text with the reply's text, with the project's
embedders; the lexical one by default). :class:`ConsistencyMonitor` keeps each
instance's last ``window`` verdicts and follows a breaker's lifecycle:

    ============  ==========================================  =============================
    state         event                                       next
    ============  ==========================================  =============================
    healthy       low-score rate >= max_low_rate              ejected (eject_for * 2**(n-1))
                  (with >= min_replies scored)
    ejected       the ejection ends                           probing (one call admitted)
    probing       the probe's reply scores >= min_similarity  healthy (window cleared, n reset)
    probing       the probe's reply scores low                ejected (n + 1: twice as long)
    probing       no scored reply within the last ejection's  ejected (n + 1: twice as long)
                  length (failed, timed out, lost)
    ============  ==========================================  =============================

A probe that fails (an error, a timeout, a lost answer) brings no score; it
counts as a bad probe once the last ejection's length has passed since it was
sent, so another probe follows later: an ejection is never permanent.

Sans-IO: the time is an argument (monotonic seconds); the pipeline feeds it.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from reach_plugins.matching import Embedder, LexicalEmbedder
from reach_plugins.model import ConsistencyPolicy, ReachRequest

State = Literal["healthy", "ejected", "probing"]


@dataclass(frozen=True, slots=True)
class ConsistencyTransition:
    """One instance changed state, and why (for the trace, the log and metrics)."""

    kind: ClassVar[str] = "consistency"
    agent: str
    instance: str
    before: State
    after: State
    at: float
    reason: str


@dataclass(slots=True)
class _Track:
    low: deque[bool]
    policy: ConsistencyPolicy
    state: State = "healthy"
    until: float = 0.0
    """While ejected: when the ejection ends; while a probe is out: when it counts as failed."""
    ejected_for: float = 0.0
    ejections: int = 0
    probe_out: bool = False


@dataclass(slots=True)
class ConsistencyMonitor:
    """Per-instance windows of reply verdicts, and which instances are ejected now."""

    listener: Callable[[ConsistencyTransition], None] | None = None
    _tracks: dict[tuple[str, str], _Track] = field(default_factory=dict)

    def healthy(self, agent: str, instance: str) -> bool:
        """Whether the instance is plainly healthy (never judged low, or recovered): the router's fast path."""
        track = self._tracks.get((agent, instance))
        return track is None or track.state == "healthy"

    def available(self, agent: str, instance: str, now: float) -> bool:
        """Whether routing may send to the instance: healthy, or its ejection ended and no probe is out."""
        track = self._tracks.get((agent, instance))
        if track is None or track.state == "healthy":
            return True
        if track.probe_out and now >= track.until:
            track.probe_out = False
            why = f"the probe brought no scored reply within {track.ejected_for:g}s"
            self._eject(agent, instance, track, track.policy, now, why, None)
        if track.state == "ejected" and now >= track.until:
            self._move(agent, instance, track, "probing", now, "the ejection ended: one probe call")
        return track.state == "probing" and not track.probe_out

    def sent(self, agent: str, instance: str, now: float) -> None:
        """A call went to the instance: while probing, it is the probe, failed unless scored within the last
        ejection's length."""
        track = self._tracks.get((agent, instance))
        if track is not None and track.state == "probing" and not track.probe_out:
            track.probe_out = True
            track.until = now + track.ejected_for

    def record(
        self,
        agent: str,
        instance: str,
        policy: ConsistencyPolicy,
        score: float,
        now: float,
        *,
        on_move: Callable[[ConsistencyTransition], None] | None = None,
    ) -> bool:
        """Record one reply's score; returns whether it was low. ``on_move`` also hears a change this causes."""
        key = (agent, instance)
        track = self._tracks.get(key)
        if track is None:
            track = self._tracks[key] = _Track(deque(maxlen=policy.window), policy)
        track.policy = policy
        low = score < policy.min_similarity
        if track.state == "probing":
            track.probe_out = False
            if low:
                self._eject(agent, instance, track, policy, now, f"the probe's reply scored {score:.2f}", on_move)
            else:
                track.low.clear()
                track.ejections = 0
                self._move(agent, instance, track, "healthy", now, f"the probe's reply scored {score:.2f}", on_move)
            return low
        track.low.append(low)
        scored, lows = len(track.low), sum(track.low)
        if track.state == "healthy" and scored >= policy.min_replies and lows / scored >= policy.max_low_rate:
            why = f"{lows} of its last {scored} replies scored below {policy.min_similarity:g}"
            self._eject(agent, instance, track, policy, now, why, on_move)
        return low

    def state(self, agent: str, instance: str) -> State:
        track = self._tracks.get((agent, instance))
        return "healthy" if track is None else track.state

    def ejected_until(self, agent: str, instance: str) -> float | None:
        """When the instance's ejection for inconsistent replies ends (its clock), ``None`` unless ejected."""
        track = self._tracks.get((agent, instance))
        return track.until if track is not None and track.state == "ejected" else None

    def _eject(
        self,
        agent: str,
        instance: str,
        track: _Track,
        policy: ConsistencyPolicy,
        now: float,
        why: str,
        on_move: Callable[[ConsistencyTransition], None] | None,
    ) -> None:
        track.ejections += 1
        track.ejected_for = min(policy.max_eject, policy.eject_for * 2 ** (track.ejections - 1))
        track.until = now + track.ejected_for
        track.low.clear()
        self._move(agent, instance, track, "ejected", now, f"{why}; ejected for {track.ejected_for:g}s", on_move)

    def _move(
        self,
        agent: str,
        instance: str,
        track: _Track,
        after: State,
        now: float,
        reason: str,
        on_move: Callable[[ConsistencyTransition], None] | None = None,
    ) -> None:
        before, track.state = track.state, after
        if self.listener is None and on_move is None:
            return
        transition = ConsistencyTransition(agent, instance, before, after, now, reason)
        if self.listener is not None:
            self.listener(transition)
        if on_move is not None:
            on_move(transition)


def _texts(value: Any) -> Iterator[str]:
    """Every string inside ``value`` (dict values, list items), in order."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)


def request_text(request: ReachRequest) -> str:
    """What a request asks, in words: its intent and the text of its payload."""
    return " ".join([request.intent or "", *_texts(request.payload)]).strip()


def reply_text(data: Any) -> str:
    """What a reply says: a chat agent's ``reply_content``, else the text inside it (JSON as a last resort)."""
    if isinstance(data, Mapping) and isinstance(data.get("reply_content"), str):
        return str(data["reply_content"])
    words = " ".join(_texts(data)).strip()
    return words or json.dumps(data, default=str)


def score_reply(request: ReachRequest, data: Any, embedder: Embedder | None = None) -> float:
    """Cosine similarity of the request's text and the reply's text (0.0 when either says nothing)."""
    asked, answered = request_text(request), reply_text(data)
    if not asked or not answered:
        return 0.0
    first, second = (embedder or _LEXICAL).embed([asked, answered])
    dot = sum(a * b for a, b in zip(first, second, strict=True))
    norm = math.sqrt(sum(a * a for a in first)) * math.sqrt(sum(b * b for b in second))
    return dot / norm if norm else 0.0


_LEXICAL = LexicalEmbedder()
