"""A panel of expert agents for broadcasts: each works out an answer, or confirms one already in.

Used by the broadcast tests and ``benchmarks/bench_broadcast.py`` to show the
seeds' shared-summary optimisation (004, section 6.2): a copy that arrives with
a summary holding an answer (``ReachContext.summary``) checks it briefly
instead of deliberating from scratch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from reach_plugins.agent import ReachAgent, ReachContext

QUESTION = {"type": "object", "properties": {"question": {"type": "string"}}, "required": ["question"]}


@dataclass
class Expert:
    """One panel member: how long it deliberates, and what it did (``worked`` / ``confirmed`` per call)."""

    label: str
    think: Callable[[], float]
    confirm: float = 0.01
    did: list[str] = field(default_factory=list)


def _answer(question: str) -> str:
    return f"answer to {question.strip().lower()}"


def panel_agent(name: str, expert: Expert) -> ReachAgent:
    """An agent offering ``answer_question``, served by ``expert``."""
    agent = ReachAgent(name)

    @agent.capability("answer_question", description="Answer a question after deliberating", params_schema=QUESTION)
    async def answer_question(question: str, ctx: ReachContext) -> dict[str, str]:
        known = [item.get("answer") for item in ctx.summary if item.get("status") == "success"]
        mine = {"answer": _answer(question)}
        if json.dumps(mine) in known:
            expert.did.append("confirmed")
            await asyncio.sleep(expert.confirm)
        else:
            expert.did.append("worked")
            await asyncio.sleep(expert.think())
        return mine

    return agent
