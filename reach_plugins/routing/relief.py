"""Hot-spot relief (seed 001, section 4.2, fault 3): move some idle conversations off an instance that stays hot.

Bounded load caps *new* placements, but conversations pinned while an instance
was alone (or hashed onto it by a skewed id scheme, the seed's ``-prod``
suffix) stay where they are, and that instance keeps every one of them. The
seed's rule: an instance above its load threshold for 30 s gives some of its
conversations back. :class:`ReliefTracker` follows each conversation's turns
(where it was served, whether a turn is in flight, when its last one ended)
and, fed the instances' loads, marks a bounded share of a hot instance's
*idle* conversations as relieved; the router then places each marked
conversation on a peer at its next turn, as a context restore, and the route
decision names the instance it came from. A conversation mid-call is never
marked. Sans-IO: every method takes the time; the tables are bounded.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from reach_plugins.model import ReliefPolicy
from reach_plugins.routing.affinity import InstanceKey
from reach_plugins.stores.keys import ScopedKey

__all__ = ["MAX_CONVERSATIONS", "ReliefPolicy", "ReliefTracker", "Relieved"]

MAX_CONVERSATIONS: Final = 100_000
"""Conversations followed (least recently served first out), as the router's pin table."""


@dataclass(slots=True)
class _Turns:
    """One conversation as relief sees it: where it was last served, turns in flight, when the last one ended."""

    where: InstanceKey
    open: int
    ended: float


@dataclass(frozen=True, slots=True)
class Relieved:
    """A conversation marked to leave a hot instance: where from, and why (the route decision's reason)."""

    source: InstanceKey
    why: str


class ReliefTracker:
    """Turns of conversations and hot instances; :meth:`take` hands the router a marked conversation once."""

    def __init__(self, policy: ReliefPolicy | None = None, *, max_conversations: int = MAX_CONVERSATIONS) -> None:
        self.policy = policy or ReliefPolicy()
        self._max = max_conversations
        self._turns: OrderedDict[ScopedKey, _Turns] = OrderedDict()
        self._on: dict[InstanceKey, dict[ScopedKey, None]] = {}
        """The conversations last served on each instance (a relieve pass reads only the hot ones')."""
        self._hot_since: dict[InstanceKey, float] = {}
        self._marked: dict[ScopedKey, Relieved] = {}
        self._next_look = -math.inf
        self.moved = 0
        """Conversations marked so far."""

    # ------------------------------------------------------------------ turns (the pipeline's port)

    def turn_started(self, conversation: ScopedKey, where: InstanceKey) -> None:
        """A turn of ``conversation`` was routed to ``where`` and is in flight."""
        turns = self._turns.get(conversation)
        if turns is None:
            if len(self._turns) >= self._max:
                self.forget(next(iter(self._turns)))
            self._turns[conversation] = _Turns(where, 1, -math.inf)
            self._on.setdefault(where, {})[conversation] = None
            return
        self._turns.move_to_end(conversation)
        turns.open += 1
        if turns.where != where:
            self._leave(conversation, turns.where)
            self._on.setdefault(where, {})[conversation] = None
            turns.where = where

    def turn_ended(self, conversation: ScopedKey, now: float) -> None:
        """A turn of ``conversation`` ended (answered, failed or given up) at ``now``."""
        turns = self._turns.get(conversation)
        if turns is not None:
            turns.open = max(0, turns.open - 1)
            turns.ended = now

    def forget(self, conversation: ScopedKey) -> None:
        """The conversation was closed (or is the oldest one past the bound)."""
        turns = self._turns.pop(conversation, None)
        if turns is not None:
            self._leave(conversation, turns.where)
        self._marked.pop(conversation, None)

    def _leave(self, conversation: ScopedKey, where: InstanceKey) -> None:
        held = self._on.get(where)
        if held is not None:
            held.pop(conversation, None)
            if not held:
                del self._on[where]

    # ------------------------------------------------------------------ relief (the router's side)

    def due(self, now: float) -> bool:
        """Whether it is time to look at the loads again (at most every ``check_every`` seconds)."""
        return now >= self._next_look

    def relieve(self, loads: Mapping[InstanceKey, float], now: float) -> list[ScopedKey]:
        """Mark idle conversations of the instances hot for ``hold`` seconds; the ones marked now.

        ``loads``: each instance's load (0..1) as the registry has it. An instance marks ``ceil(share * idle)``
        of its idle conversations, then waits another ``hold`` before marking more.
        """
        policy = self.policy
        self._next_look = now + policy.check_every
        hot = self._hot_since
        for key in [key for key in hot if loads.get(key, 0.0) < policy.threshold]:
            del hot[key]
        due: dict[InstanceKey, float] = {}
        for key, load in loads.items():
            if load >= policy.threshold:
                since = hot.setdefault(key, now)
                if now - since >= policy.hold:
                    due[key] = load
        if not due:
            return []
        marks, turns_of = self._marked, self._turns
        marked = []
        for key in due:
            conversations = [
                conversation
                for conversation in self._on.get(key, {})
                if conversation not in marks
                and not (turns := turns_of[conversation]).open
                and now - turns.ended >= policy.idle
            ]
            hot[key] = now  # another hold before this instance gives more back
            count = math.ceil(policy.share * len(conversations))
            why = (
                f"relieved from {key[0]}/{key[1]}: load {due[key]:.2f} >= {policy.threshold:g} "
                f"for {policy.hold:g}s, {count} of its {len(conversations)} idle conversation(s) moved"
            )
            for conversation in conversations[:count]:
                self._marked[conversation] = Relieved(key, why)
                marked.append(conversation)
        self.moved += len(marked)
        return marked

    def take(self, conversation: ScopedKey, where: InstanceKey) -> Relieved | None:
        """The mark of ``conversation`` if it is still pinned ``where`` the mark moves it from (consumed)."""
        mark = self._marked.pop(conversation, None) if self._marked else None
        if mark is None or mark.source != where:
            return None
        turns = self._turns.get(conversation)
        if turns is not None and turns.open > 0:
            return None  # mid-call after all: stays
        return mark
