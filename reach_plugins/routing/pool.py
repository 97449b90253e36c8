"""The usable instances of one routing plan, kept between calls: per-call cost flat in the number of instances.

Judging every instance's heartbeat, status, breaker and weight on every call
is O(n): 21 ms a call when 1,000 agents of 3 instances offer a capability.
A :class:`Pool` keeps the outcome of one full look (the usable instances of
the best priority tier that has any, the others and why they were skipped,
the round-robin state) and keeps it honest at O(1) a call:

* the router checks the instance it picked, live, before using it, and looks
  again in full when it fails: an unusable instance is never handed out;
* each call re-checks one more entry in rotation, so a recovered instance,
  a closed breaker or a new load figure is seen within ``n`` calls;
* health changes are pushed, not polled: the whole pool is looked at again
  when the registry's ``revision`` or ``health`` moves (an instance added,
  removed, back up, judged down, or reporting another status), so an idle
  caller's call stays O(1) however many instances the pool holds;
* only a look that skipped an instance for a reason that heals with time
  alone (an open breaker, an ejected outlier, a missed heartbeat) is looked at
  again every ``refresh`` seconds of the router's clock, unless the rotation
  has re-checked every entry meanwhile (so a busy router never pays a full look).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from reach_plugins.model import CandidateScore, Instance
from reach_plugins.policy.outliers import is_outlier
from reach_plugins.routing.affinity import InstanceKey
from reach_plugins.routing.index import Offer
from reach_plugins.routing.policy import Plan
from reach_plugins.routing.swrr import SmoothWeightedRoundRobin

Skip = tuple[str, str, str]
"""A skipped candidate: agent, instance id (``*`` for the whole agent), reason."""


@dataclass(slots=True)
class Entry:
    """One instance as last judged: its weight for round robin, 0 when it could not take work."""

    offer: Offer
    instance: Instance
    weight: int
    why: str | None = None
    """Why the weight is cut (an outlier against its peers) or 0 (why it was skipped), when it is."""

    @property
    def key(self) -> InstanceKey:
        return (self.offer.name, self.instance.instance_id)


@dataclass(slots=True)
class Look:
    """One full look at a plan: every instance judged, tier by tier, up to the first tier with a usable one."""

    entries: list[Entry]
    priority: int
    skipped: list[Skip]
    cost: float = 0.0
    """The cost of the tier the usable entries belong to: the cheapest with a healthy instance in ``priority``."""
    priced: bool = False
    """Whether offers of ``priority`` differ in cost (then the reason says cost chose among them)."""
    heals: bool = False
    """Whether an instance was skipped for a reason that can end with time alone, no registry change pushed
    (an open breaker, an ejected outlier, a missed heartbeat): then the look expires after ``refresh``."""

    @property
    def usable(self) -> list[Entry]:
        return [entry for entry in self.entries if entry.weight > 0]

    @property
    def tier(self) -> tuple[int, float]:
        return (self.priority, self.cost)

    @property
    def where(self) -> str:
        """The tier in words, for a route's reason."""
        where = f"priority tier {self.priority}"
        return f"{where}, cost {self.cost:g}: the cheapest with a healthy instance" if self.priced else where


class Pool:
    """A plan, its latest :class:`Look`, and the round robin over that look's usable instances."""

    __slots__ = (
        "_cursor",
        "_rechecked",
        "by_key",
        "expires",
        "flagged",
        "health",
        "keys",
        "look",
        "plan",
        "reason",
        "rr",
        "seeds",
        "shown",
        "taken",
        "usable",
    )

    def __init__(self, plan: Plan, rng: random.Random) -> None:
        self.plan = plan
        self.rr: SmoothWeightedRoundRobin[InstanceKey] = SmoothWeightedRoundRobin(rng)
        self.look: Look | None = None
        self.usable: list[Entry] = []
        self.keys: list[InstanceKey] = []
        self.by_key: dict[InstanceKey, Entry] = {}
        self.expires = 0.0
        self.taken = 0.0
        """When the look was taken (the router's clock): a clock that went back before it forces a new look."""
        self.health = -1
        """The registry view's ``health`` the look was taken at; the look is kept until it moves."""
        self.shown: list[CandidateScore] | None = None
        self.seeds: list[int] | None = None
        """The rendezvous digests of ``keys`` (computed on the first session placed over this look)."""
        self.reason = ""
        self.flagged: dict[InstanceKey, str] = {}
        """The outliers of the look: a usable entry's why its weight is cut, a skipped one's why it is ejected."""
        self._cursor = 0
        self._rechecked = 0

    def load(self, look: Look, *, taken: float, expires: float, health: int) -> None:
        """Adopt a fresh look (it has at least one usable entry), taken at ``taken`` at the view's ``health``;
        the round robin keeps its place."""
        self.look = look
        self.usable = look.usable
        self.keys = [(entry.offer.name, entry.instance.instance_id) for entry in self.usable]  # ``key``, inlined
        self.by_key = dict(zip(self.keys, self.usable, strict=True))
        self.rr.update((key, entry.weight) for key, entry in zip(self.keys, self.usable, strict=True))
        self.expires, self.taken, self.health = expires, taken, health
        self._rechecked = 0
        self.shown = None
        self.seeds = None
        self.reason = f"smooth weighted round robin over {len(self.usable)} healthy instance(s) in {look.where}"
        self.flagged = {entry.key: entry.why for entry in self.usable if entry.why}
        self.flagged.update(((agent, instance), why) for agent, instance, why in look.skipped if is_outlier(why))

    @property
    def where(self) -> str:
        return self.look.where if self.look is not None else "no tier yet"

    @property
    def skipped(self) -> list[Skip]:
        return self.look.skipped if self.look is not None else []

    def pick(self) -> Entry:
        return self.by_key[self.rr.pick()]

    def reweigh(self, entry: Entry, weight: int, why: str | None) -> None:
        """A usable entry's load or outlier standing moved: its round-robin weight follows, its why is redone."""
        entry.weight, entry.why = weight, why
        self.rr.set(entry.key, weight)
        self.shown = None
        if why:
            self.flagged[entry.key] = why
        else:
            self.flagged.pop(entry.key, None)

    def due(self) -> Entry | None:
        """The next entry of the rotation (each call re-checks one), or ``None`` before the first look."""
        entries = self.look.entries if self.look is not None else ()
        if not entries:
            return None
        cursor = self._cursor = (self._cursor + 1) % len(entries)
        self._rechecked += 1
        return entries[cursor]

    def prolong(self, expires: float) -> bool:
        """Keep the look until ``expires`` if the rotation re-checked every entry since it was taken or last kept."""
        if self.look is None or self._rechecked < len(self.look.entries):
            return False
        self.expires = expires
        self._rechecked = 0
        return True
