"""Per-tool-call overhead of the Reach middleware against a plain tool calling the same agent with httpx.

Run ``python benchmarks/bench_enhancer.py`` (``--quick`` for a smoke run). One
agent-SDK server (uvicorn on 127.0.0.1) offers ``check_inventory``. Every case
runs one tool call through the same one-node LangGraph graph (a ``ToolNode``)
with a ``thread_id``, so the framework's own cost is in every number:

* ``plain httpx tool, async``   a hand-written tool that POSTs the wire body with ``httpx.AsyncClient``;
* ``reach, async, httpx``       a local stub tool that ReachMiddleware swaps for a reach through
                                ReachClient + DirectTransport(engine="httpx"): the same HTTP client on
                                the same loop, so the difference is what the middleware costs;
* ``reach, async``              the same with DirectTransport's default engine (aiohttp): what users get;
* ``plain httpx tool`` and ``reach``: the same through ``invoke`` (the plain tool on ``httpx.Client``;
                                the reach hops onto the client's own loop, see ReachEnhancer.reach).

Below the framework, lines split the cost: bare ``httpx`` posts, ``ReachClient``
(route + core + transport) and ``ReachEnhancer`` (plus mapping and the
execute_tool span). Cases take turns call by call, so load from other
processes hits all of them alike. Results land in
``benchmarks/results/enhancer.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from reach_plugins import AgentDescriptor, ReachEnhancer
from reach_plugins.agent import BackgroundServer, ReachAgent
from reach_plugins.frameworks.toolcalls import ToolCall
from reach_plugins.langchain import ReachMiddleware
from reach_plugins.registry import MemoryRegistry
from transports.direct import DirectTransport

RESULTS = Path(__file__).parent / "results" / "enhancer.json"
THREAD = {"configurable": {"thread_id": "bench-conversation"}}
REQUEST: Any = {
    "messages": [AIMessage(content="", tool_calls=[{"name": "check_inventory", "args": {"sku": "S-1"}, "id": "c1"}])]
}


@dataclass(frozen=True, slots=True)
class Case:
    """One measured line."""

    name: str
    calls: int
    p50_us: float
    p99_us: float
    mean_us: float


def serve_inventory() -> BackgroundServer:
    agent = ReachAgent("inventory")

    @agent.capability("check_inventory", description="How many units of a product are in stock")
    async def check_inventory(sku: str) -> dict[str, Any]:
        return {"sku": sku, "in_stock": 3}

    return BackgroundServer(agent.app).start()


def plain_tool(url: str, http: httpx.Client, ahttp: httpx.AsyncClient) -> BaseTool:
    """What a developer writes without Reach: POST the wire body, return the data."""

    def body(sku: str) -> dict[str, Any]:
        return {"request_id": uuid.uuid4().hex, "capability": "check_inventory", "payload": {"sku": sku}}

    def run(sku: str) -> str:
        return json.dumps(http.post(f"{url}/reach", json=body(sku)).json()["data"])

    async def arun(sku: str) -> str:
        return json.dumps((await ahttp.post(f"{url}/reach", json=body(sku))).json()["data"])

    return StructuredTool.from_function(run, coroutine=arun, name="check_inventory", description="Units in stock")


def stub_tool() -> BaseTool:
    """The local tool the middleware replaces with a reach (it must never run)."""

    def run(sku: str) -> str:
        raise AssertionError("the middleware should have sent this call to the agent")

    return StructuredTool.from_function(run, name="check_inventory", description="Units in stock")


def graph(tool: BaseTool, middleware: ReachMiddleware | None = None) -> Any:
    wrappers: dict[str, Any] = {}
    if middleware is not None:
        wrappers = {"wrap_tool_call": middleware.wrap_tool_call, "awrap_tool_call": middleware.awrap_tool_call}
    builder = StateGraph(MessagesState)
    builder.add_node("tools", ToolNode([tool], **wrappers))
    builder.add_edge(START, "tools")
    return builder.compile()


def timed(fn: Callable[[], object]) -> int:
    started = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - started


async def atimed(fn: Callable[[], Awaitable[object]]) -> int:
    started = time.perf_counter_ns()
    await fn()
    return time.perf_counter_ns() - started


def summarise(name: str, samples: list[int]) -> Case:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return Case(name, len(samples), pick(0.50), pick(0.99), statistics.fmean(samples) / 1000)


def enhancer_on(url: str, engine: str) -> ReachEnhancer:
    registry = MemoryRegistry()
    descriptor = AgentDescriptor(name="inventory", endpoints=[url], capabilities=["check_inventory"])
    asyncio.run(registry.register_agent(descriptor))
    return ReachEnhancer(registry=registry, transport=DirectTransport(engine=engine), matcher=False)  # type: ignore[arg-type]


def run(calls: int, warmup: int) -> list[Case]:
    server = serve_inventory()
    url = server.url
    http, ahttp = httpx.Client(), httpx.AsyncClient()
    blocking, async_same, async_default = (enhancer_on(url, engine) for engine in ("aiohttp", "httpx", "aiohttp"))
    plain = graph(plain_tool(url, http, ahttp))
    reach, areach_same, areach_default = (
        graph(stub_tool(), ReachMiddleware(e, local_tools=[stub_tool()])) for e in (blocking, async_same, async_default)
    )
    call = ToolCall("check_inventory", {"sku": "S-1"}, session_key="bench-conversation")
    body = {"request_id": "r", "capability": "check_inventory", "payload": {"sku": "S-1"}}
    sync_cases: dict[str, Callable[[], object]] = {
        "plain httpx tool": lambda: plain.invoke(REQUEST, THREAD),
        "reach": lambda: reach.invoke(REQUEST, THREAD),
        "below: httpx.Client.post": lambda: http.post(f"{url}/reach", json=body).json(),
        "below: SyncReachClient.reach": lambda: blocking.blocking.reach(
            "check_inventory", {"sku": "S-1"}, session_id="bench-conversation"
        ),
        "below: ReachEnhancer.reach": lambda: blocking.reach(call),
    }
    async_cases: dict[str, Callable[[], Awaitable[object]]] = {
        "plain httpx tool, async": lambda: plain.ainvoke(REQUEST, THREAD),
        "reach, async, httpx": lambda: areach_same.ainvoke(REQUEST, THREAD),
        "reach, async": lambda: areach_default.ainvoke(REQUEST, THREAD),
        "below: httpx.AsyncClient.post": lambda: ahttp.post(f"{url}/reach", json=body),
        "below: ReachEnhancer.areach, httpx": lambda: async_same.areach(call),
    }
    loop = asyncio.new_event_loop()
    samples: dict[str, list[int]] = {name: [] for name in [*sync_cases, *async_cases]}
    try:
        for index in range(warmup + calls):
            if index == warmup:
                gc.collect()
            for name, fn in sync_cases.items():
                samples[name].append(timed(fn))
            for name, afn in async_cases.items():
                samples[name].append(loop.run_until_complete(atimed(afn)))
        samples = {name: values[warmup:] for name, values in samples.items()}
    finally:
        for closing in (ahttp.aclose(), async_same.aclose(), async_default.aclose()):
            loop.run_until_complete(closing)
        loop.close()
        http.close()
        blocking.close()
        server.stop()
    return [summarise(name, values) for name, values in samples.items()]


def overheads(cases: list[Case]) -> dict[str, float]:
    """p50 differences in microseconds: the middleware's cost with the same HTTP client, and as shipped."""
    p50 = {case.name: case.p50_us for case in cases}

    def minus(a: str, b: str) -> float:
        return round(p50[a] - p50[b], 1)

    return {
        "middleware_overhead_async_same_http_client_p50_us": minus("reach, async, httpx", "plain httpx tool, async"),
        "reach_minus_plain_async_p50_us": minus("reach, async", "plain httpx tool, async"),
        "reach_minus_plain_sync_p50_us": minus("reach", "plain httpx tool"),
        "enhancer_and_core_over_bare_async_post_p50_us": minus(
            "below: ReachEnhancer.areach, httpx", "below: httpx.AsyncClient.post"
        ),
        "enhancer_over_client_sync_p50_us": minus("below: ReachEnhancer.reach", "below: SyncReachClient.reach"),
    }


def render(cases: list[Case], summary: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="One tool call through a LangGraph ToolNode (us)")
    for column in ("case", "calls", "p50", "p99", "mean"):
        table.add_column(column, justify="left" if column == "case" else "right")
    for case in cases:
        table.add_row(case.name, f"{case.calls:,}", f"{case.p50_us:.0f}", f"{case.p99_us:.0f}", f"{case.mean_us:.0f}")
    Console().print(table)
    print(json.dumps(summary, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run, not a measurement")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results file (default {RESULTS})")
    args = parser.parse_args(argv)
    calls, warmup = (100, 20) if args.quick else (2_000, 200)
    cases = run(calls, warmup)
    summary = overheads(cases)
    render(cases, summary)
    report = {
        "benchmark": "enhancer",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "machine": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "quick": args.quick,
        "shape": (
            f"{calls} calls per case after {warmup} warm-up calls, cases interleaved call by call; one tool call "
            "per graph run through a LangGraph ToolNode with a thread_id; agent-SDK server (uvicorn) on "
            "127.0.0.1 in the same process"
        ),
        "cases": [asdict(case) for case in cases],
        "summary": summary,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
