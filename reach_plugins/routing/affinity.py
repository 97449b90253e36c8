"""Session affinity: rendezvous (HRW) hashing with bounded load, and the table of pinned sessions.

Rendezvous hashing scores every (session, instance) pair and takes the highest
score: removing an instance moves only the sessions that were on it, adding
one takes about ``1/(N+1)`` of them, and no ring has to be maintained. The
session id is digested once with BLAKE2b; each instance's digest is mixed in
with the SplitMix64 finalizer, which is cheap and spreads even near-identical
keys (``a-prod``, ``b-prod``...) uniformly.

Bounded load (Mirrokni, Thorup, Zadimoghaddam, "Consistent hashing with
bounded loads") caps each instance at ``ceil(c * (active + 1) / n)`` pinned
sessions: a new session goes to its best-scoring instance that is under the
cap, so a hot key range cannot pile onto one instance.

The table of pinned sessions is addressed by each conversation's
:class:`~reach_plugins.stores.keys.ScopedKey` (two tenants' ``s-1`` are two
conversations) and bounded by a :class:`~reach_plugins.stores.budget.Budget`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Final

from reach_plugins.errors import ConfigError
from reach_plugins.stores.budget import BoundedStore, Budget, LruTable
from reach_plugins.stores.keys import ScopedKey

InstanceKey = tuple[str, str]
"""``(agent, instance_id)``."""

_MASK: Final = (1 << 64) - 1
_SCALE: Final = float(1 << 64)
_MAX_DIGESTS: Final = 1_000_000


def digest(text: str) -> int:
    """64-bit BLAKE2b digest of ``text``."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a session landed: the chosen key and the bounded-load cap that applied."""

    key: InstanceKey
    cap: int


class Rendezvous:
    """HRW ranking with bounded load; caches instance digests (a router keeps them per pool: its seeds)."""

    def __init__(self, bounded_load: float = 1.25) -> None:
        if not bounded_load >= 1.0:
            raise ConfigError(f"bounded_load must be >= 1.0 (1.25 allows 25 % above the average), got {bounded_load}")
        self.bounded_load = bounded_load
        self._digests: dict[InstanceKey, int] = {}

    def seeds(self, keys: Sequence[InstanceKey]) -> list[int]:
        """Each key's own digest, in order: what :meth:`place` mixes with the session's (compute once per pool)."""
        digests = self._digests
        if len(digests) + len(keys) > _MAX_DIGESTS:
            digests.clear()
        found = []
        for key in keys:
            own = digests.get(key)
            if own is None:
                own = digests[key] = digest(f"{key[0]}/{key[1]}")
            found.append(own)
        return found

    def scores(self, session_id: str, keys: Sequence[InstanceKey]) -> list[tuple[float, InstanceKey]]:
        """``(score in [0, 1), key)`` pairs, best first."""
        mixed = _mix(digest(session_id), self.seeds(keys))
        ranked = sorted(zip(mixed, keys, strict=True), reverse=True)
        return [(value / _SCALE, key) for value, key in ranked]

    def place(
        self,
        session_id: str,
        keys: Sequence[InstanceKey],
        active: Mapping[InstanceKey, int],
        seeds: Sequence[int] | None = None,
    ) -> Placement:
        """The best-scoring key holding fewer than ``ceil(c * (total + 1) / n)`` active sessions.

        ``seeds`` are ``self.seeds(keys)``, passed in when the caller keeps them.
        Only the best key is looked for (O(n), no sort); the ranking is sorted
        only when the best one is at its cap.
        """
        mixed = _mix(digest(session_id), self.seeds(keys) if seeds is None else seeds)
        total = sum(map(active.get, keys, repeat(0))) if active else 0
        cap = math.ceil(self.bounded_load * (total + 1) / len(keys))
        best = keys[mixed.index(max(mixed))]
        if not active or active.get(best, 0) < cap:
            return Placement(best, cap)
        ranked = sorted(zip(mixed, keys, strict=True), reverse=True)
        return Placement(next(key for _, key in ranked if active.get(key, 0) < cap), cap)


def _mix(session: int, seeds: Sequence[int]) -> list[int]:
    """The 64-bit score of each (session, instance) pair: the SplitMix64 finalizer of their digests' XOR.

    Its last step (``x ^ x >> 31``) is left out: it leaves the top 31 bits
    as they are, so the ranking is the same (bar ties in those bits), and this
    runs for every instance of every new session. One expression, no
    statements: the interpreter's cheapest loop.
    """
    return [
        (
            (x := (((y := ((session ^ own) + 0x9E3779B97F4A7C15) & _MASK) ^ (y >> 30)) * 0xBF58476D1CE4E5B9) & _MASK)
            ^ (x >> 27)
        )
        * 0x94D049BB133111EB
        & _MASK
        for own in seeds
    ]


@dataclass(slots=True)
class Pins:
    """One session's pins: the instance it uses on each agent, and the agent it uses for each capability."""

    instances: dict[str, str] = field(default_factory=dict)
    groups: dict[str, str] = field(default_factory=dict)

    def agent_for(self, capability: str, offered: Container[str]) -> str | None:
        """The agent this session uses for ``capability``: the one pinned for it, else any pinned agent offering it."""
        agent = self.groups.get(capability)
        if agent is not None:
            return agent
        return next((name for name in self.instances if name in offered), None)

    def size(self) -> int:
        """Estimated bytes: the names held."""
        return sum(map(len, self.instances)) + sum(map(len, self.instances.values())) + sum(map(len, self.groups))


class SessionTable(BoundedStore):
    """Pinned sessions within a :class:`Budget` (least recently used first out), with the count per instance."""

    def __init__(self, *, budget: Budget) -> None:
        super().__init__(budget=budget)
        self.table: LruTable[Pins] = LruTable(budget, "session pin", lambda _key, pins: self._uncount(pins.instances))
        self._active: dict[InstanceKey, int] = {}

    @property
    def active(self) -> Mapping[InstanceKey, int]:
        """Pinned sessions per instance."""
        return self._active

    def __len__(self) -> int:
        return len(self.table)

    def get(self, key: ScopedKey) -> Pins | None:
        """The pins of a session (refreshes its LRU position)."""
        return self.table.get(key)

    def pin(self, key: ScopedKey, capability: str, agent: str, instance_id: str) -> None:
        """Pin a session's ``capability`` to an instance of ``agent``, dropping a pin nothing uses any more."""
        before = self.table.get(key)
        if before is not None and before.groups.get(capability) == agent and before.instances.get(agent) == instance_id:
            return  # pinned there already (the common case): refreshed as most recently used
        held = before.instances if before is not None else {}
        pins = Pins(dict(held), dict(before.groups)) if before is not None else Pins()
        former = pins.groups.get(capability)
        pins.groups[capability] = agent
        pins.instances[agent] = instance_id
        if former is not None and former != agent and former not in pins.groups.values():
            del pins.instances[former]
        self.table.put(key, pins, pins.size())  # refuses an oversized entry before any count moves
        for name, instance in held.items():
            if pins.instances.get(name) != instance:
                self._count((name, instance), -1)
        for name, instance in pins.instances.items():
            if held.get(name) != instance:
                self._count((name, instance), +1)

    def release(self, key: ScopedKey) -> bool:
        """Forget a session (it was closed); return whether it was pinned."""
        pins = self.table.pop(key)
        if pins is None:
            return False
        self._uncount(pins.instances)
        return True

    def _uncount(self, instances: Mapping[str, str]) -> None:
        for agent, instance_id in instances.items():
            self._count((agent, instance_id), -1)

    def _count(self, key: InstanceKey, delta: int) -> None:
        value = self._active.get(key, 0) + delta
        if value > 0:
            self._active[key] = value
        else:
            self._active.pop(key, None)
