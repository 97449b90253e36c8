"""Re-record the adapter cassettes from the project's own local test servers.

    .venv/bin/python tests/cassettes/record.py                  # every cassette
    .venv/bin/python tests/cassettes/record.py openai_reply     # only the ones named

It runs the real peers of ``tests/peers`` (an OpenAI-compatible server built
from the ``openai`` package's models, an ``a2a-sdk`` 1.x agent; both from
``.venv-peers``), the fake app of ``tests/test_direct_adapters.py`` (raw-http,
and the openai failures the peer does not make) and a ReachAgent, on free
ports of 127.0.0.1, makes each call of ``scenarios.py`` through
DirectTransport's httpx engine while vcrpy records, and stores the servers'
address as ``scenarios.HOST``. Re-record after changing a fake server or how
an adapter builds its request (a replay then fails with vcrpy's
``CannotOverwriteExistingCassetteException``), and review the YAML diff like code.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cassettes.scenarios import FOLDER, SCENARIOS, Scenario, cassettes
from peer_servers import peer
from test_direct_adapters import fake_app

from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.errors import BusinessError, ReachError
from transports.direct import DirectTransport

knowledge = ReachAgent("kb")


@knowledge.capability("search_kb")
def search_kb(query: str) -> dict[str, str]:
    """An upgraded agent that renamed ``content`` to ``text``; an empty query is a business error."""
    if not query.strip():
        raise BusinessError("say what to search for in 'query'")
    return {"text": f"found {query}"}


async def record(scenario: Scenario, endpoint: str) -> str:
    """Make the scenario's call against ``endpoint`` with vcrpy recording; what came back, in a few words."""
    (FOLDER / scenario.cassette).unlink(missing_ok=True)
    with cassettes("all").use_cassette(scenario.cassette) as cassette:
        async with DirectTransport(engine="httpx") as transport:
            call = scenario.call(endpoint)
            try:
                if scenario.stream:
                    outcome = " ".join([event.kind async for event in transport.stream(call)])
                else:
                    outcome = (await transport.send(call)).status
            except ReachError as exc:
                outcome = type(exc).__name__
        return f"{len(cassette)} interaction(s), {outcome}"


async def record_all(names: list[str]) -> None:
    with (
        BackgroundServer(fake_app()) as fake,
        BackgroundServer(knowledge.app) as reach,
        peer("openai_server.py", "/last") as openai,
        peer("a2a_server.py", "/.well-known/agent-card.json") as a2a,
    ):
        endpoints = {"fake": fake.url, "reach": reach.url, "openai": openai, "a2a": a2a}
        for name in names:
            scenario = SCENARIOS[name]
            print(f"{scenario.cassette}: {await record(scenario, endpoints[scenario.server])}")


def main() -> None:
    parser = argparse.ArgumentParser(description="Re-record the adapter cassettes from local test servers.")
    parser.add_argument("names", nargs="*", choices=[[], *SCENARIOS], help="scenarios to record (default: all)")
    names = parser.parse_args().names or list(SCENARIOS)
    asyncio.run(record_all(names))


if __name__ == "__main__":
    main()
