"""The dedup claim of a keyed request as data (DESIGN 11.2): what a ``begin`` answer means, and how a claim ends.

A claim is ``inflight`` while its owner runs, ``done`` once a result is
stored, ``unknown`` when an attempt may have run and its answer was lost (a
waiter never treats it as free). The pipeline looks both tables up; an answer
or an ending they do not list raises :class:`~reach_plugins.attempts.lifecycle.ImpossibleMove`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from reach_plugins.attempts.lifecycle import ImpossibleMove

OnBegin = Literal["run", "take_over", "replay", "wait"]
Ending = Literal["done", "unknown", "released"]

ON_BEGIN: dict[str, OnBegin] = {
    "new": "run",
    "unknown": "take_over",
    "done": "replay",
    "inflight": "wait",
}
"""What the store's ``begin`` answer asks of the caller: run it (the key is ours), take an ``unknown`` key over
pinned where it can be checked, replay the stored result, or wait for the twin in flight."""

ON_END: dict[tuple[bool, bool], Ending] = {
    (True, False): "done",
    (True, True): "done",
    (False, True): "unknown",
    (False, False): "released",
}
"""How the owner's flight ended -> what the claim records, keyed by (succeeded, may have run somewhere unanswered)."""


def on_begin(state: str, has_result: bool) -> OnBegin:
    """The step for a ``begin`` answer (a ``done`` whose result is not readable yet is waited for)."""
    step = ON_BEGIN.get(state)
    if step is None:
        raise ImpossibleMove(f"a dedup store answered begin with {state!r}; the answers are: {', '.join(ON_BEGIN)}")
    return "wait" if step == "replay" and not has_result else step


def on_end(succeeded: bool, may_have_run: bool) -> Ending:
    """What the claim records once its owner's flight is over."""
    return ON_END[(succeeded, may_have_run)]


@dataclass(slots=True)
class Claim:
    """The flight's dedup claim: where it says the key was sent, and how to tell the store it moved."""

    where: str | None
    tell: Callable[[str], Awaitable[None]]

    async def moved(self, where: str) -> None:
        """Record ``where`` before sending there: a crashed owner's heir then asks the right instance."""
        self.where = where
        await self.tell(where)
