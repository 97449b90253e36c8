"""The knowledge agent: searches the help-centre articles.

    python examples/agents/knowledge.py                   # 127.0.0.1:18104, as examples/agents.yaml says

Passages are ranked by the words they share with the query (the article
title counts too); a query nothing matches gets no passages, not an error.
"""

from __future__ import annotations

import re

from launch import configured_port, from_config, run_agent
from shop import ARTICLES


def _words(text: str) -> set[str]:
    return {word.rstrip("s") for word in re.findall(r"[a-z0-9]+", text.lower()) if len(word) > 2}


async def search_knowledge(query: str, top_k: int = 3) -> dict[str, list[str]]:
    wanted = _words(query)
    scored = [(len(wanted & _words(f"{title} {text}")), text) for title, text in ARTICLES.items()]
    ranked = sorted((pair for pair in scored if pair[0]), key=lambda pair: -pair[0])
    return {"passages": [text for _, text in ranked[:top_k]]}


agent = from_config("knowledge", {"search_knowledge": search_knowledge})

if __name__ == "__main__":
    run_agent(agent, configured_port("knowledge"))
