"""The demo: a LangGraph front desk reaches four agents by capability, and survives one of them dying.

Everything runs in this process on the embedded default: an in-memory registry,
the agents served on 127.0.0.1 by the agent SDK (real HTTP, real uvicorn), a
scripted chat model. Halfway through, the orders instance that holds the
conversation is killed; the next call fails over to the other instance and says
so (``context_restore``).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.tree import Tree

from reach_plugins.agent import BackgroundServer, Registration
from reach_plugins.client.client import ReachClient
from reach_plugins.demo.agents import scenario
from reach_plugins.demo.model import Rule, demo_model
from reach_plugins.frameworks.enhancer import ReachEnhancer
from reach_plugins.frameworks.langchain import create_agent
from reach_plugins.matching import CapabilityMatcher
from reach_plugins.model import ReachTrace
from reach_plugins.registry import MemoryRegistry
from reach_plugins.stores.budget import DEFAULT_BUDGET
from reach_plugins.stores.sessions import MemorySessions
from reach_plugins.telemetry.metrics import fan_out
from reach_plugins.telemetry.spans import EVENT_ATTEMPT, EVENT_FAILOVER
from reach_plugins.telemetry.trace import JsonLinesSink
from reach_plugins.telemetry.traceview import rounded

CONVERSATION = "conv-42"
TURNS = [
    "Hi! Where is my order A1001?",
    "Is the blue kettle, SKU K-7, in stock?",
    "And what about order A1002?",
    "The kettle from A1001 arrived broken, please open work order WO-88 for it.",
    "What is your return policy?",
]
KILL_BEFORE_TURN = 2
RULES = [
    Rule(r"order (A\d+)\?", "lookup_order_status", lambda m: {"order_id": m.group(1)}),
    Rule(r"SKU ([A-Z]-\d+)", "check_stock", lambda m: {"sku": m.group(1)}),
    Rule(
        r"(A\d+) arrived broken.*work order (WO-\d+)",
        "open_support_ticket",
        lambda m: {"wo_number": m.group(2), "order_id": m.group(1), "summary": "kettle arrived broken"},
    ),
    Rule(r"return policy", "search_knowledge", lambda m: {"query": "return policy"}),
]


@tool
def lookup_order_status(order_id: str) -> str:
    """Look up where a customer's order is and when it will arrive."""
    return f"(local fallback) order {order_id}: status unknown"


@tool
def check_stock(sku: str) -> str:
    """Check how many units of a product are in stock."""
    return f"(local fallback) stock of {sku}: unknown"


@tool
def open_support_ticket(wo_number: str, summary: str, order_id: str = "") -> str:
    """Open an after-sales ticket for a broken item or a complaint."""
    return f"(local fallback) ticket for {wo_number} not filed"


class CollectingSink:
    """Keeps every request's trace, in order."""

    def __init__(self) -> None:
        self.traces: list[ReachTrace] = []

    def emit(self, trace: ReachTrace) -> None:
        self.traces.append(trace)


@dataclass
class DemoReport:
    """What happened, for the printout and for the test that checks the demo."""

    answers: list[str] = field(default_factory=list)
    traces: list[ReachTrace] = field(default_factory=list)
    killed: str = ""
    spans: list[ReadableSpan] = field(default_factory=list)
    seconds: float = 0.0
    failed_over: str = ""
    """The request id of the call that failed over (``reach trace`` it from the trace file)."""


@dataclass
class _Instance:
    server: BackgroundServer
    registration: Registration


async def run_demo(console: Console, *, seed: int = 7, trace_file: Path | None = None) -> DemoReport:
    """Start the agents, hold the conversation, kill an instance midway, print what happened.

    ``trace_file`` gets one JSON line per request (started afresh), for ``reach trace``.
    """
    started = time.perf_counter()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = MemoryRegistry()
    instances: dict[str, _Instance] = {}
    with console.status("starting agents on 127.0.0.1 ...") as status:
        for factory, count in scenario():
            for number in range(1, count + 1):
                agent = factory(provider)
                server = BackgroundServer(agent.app).start()
                instance_id = f"{agent.name}-{number}"
                registration = await agent.register(registry, server.url, instance_id=instance_id)
                instances[instance_id] = _Instance(server, registration)
                status.update(f"started {instance_id} at {server.url}")
    console.print(f"[bold]{len(instances)} agent instances[/bold] registered: {', '.join(instances)}")

    sink = CollectingSink()
    lines = None
    if trace_file is not None:
        trace_file.write_text("", encoding="utf-8")
        lines = JsonLinesSink(trace_file)
    client = ReachClient(
        registry,  # over the default transport: DirectTransport, real HTTP to the agents
        tenant="demo",
        sessions=MemorySessions(budget=DEFAULT_BUDGET),
        sink=fan_out(sink, lines),
        tracer_provider=provider,
        rng=random.Random(seed),
    )
    # The demo opts in to routing by meaning (at the embedder's measured threshold) and waits for the sentence
    # model (no routing budget), so even a cold first run maps tools by meaning.
    matcher = CapabilityMatcher((), timeout=None)
    enhancer = ReachEnhancer(
        client=client,
        tracer_provider=provider,
        match="semantic",
        matcher=matcher,
        expose=["search_knowledge"],
    )
    front_desk = create_agent(
        demo_model(RULES),
        [lookup_order_status, check_stock, open_support_ticket],
        enhanced_by=enhancer,
        checkpointer=InMemorySaver(),
    )
    report = DemoReport()
    config = {"configurable": {"thread_id": CONVERSATION}}
    try:
        for turn, text in enumerate(TURNS):
            if turn == KILL_BEFORE_TURN:
                report.killed = await _kill_pinned(instances, sink.traces, console)
            before = len(sink.traces)
            result = await front_desk.ainvoke({"messages": [HumanMessage(text)]}, config)
            answer = _last_answer(result["messages"])
            report.answers.append(answer)
            _print_turn(console, turn, text, answer, sink.traces[before:])
    finally:
        await client.aclose()
        for instance_id, item in instances.items():
            if instance_id != report.killed:
                await item.registration.stop()
                item.server.stop()
        if lines is not None:
            lines.close()
    provider.force_flush()  # every server span has ended (its server stopped): the tree is complete
    report.traces = sink.traces
    report.spans = list(exporter.get_finished_spans())
    report.failed_over = next((t.request_id for t in sink.traces if _failed_over(t)), "")
    report.seconds = time.perf_counter() - started
    _print_events(console, report.traces)
    console.print(_trace_tree(report.spans))
    if trace_file is not None and report.failed_over:
        console.print(f"replay its route decision: [bold]reach trace {report.failed_over} --file {trace_file}[/bold]")
    console.print(f"[dim]done in {report.seconds:.1f}s[/dim]")
    return report


async def _kill_pinned(instances: dict[str, _Instance], traces: list[ReachTrace], console: Console) -> str:
    """Kill the orders instance that served the conversation: no goodbye, no deregistration, heartbeats just stop."""
    pinned = next(t.route.instance for t in traces if t.route is not None and t.route.agent == "orders")
    victim = instances[pinned]
    await victim.registration.halt()
    victim.server.stop()
    console.print(Panel(f"[red]killed {pinned}[/red] (the orders instance holding {CONVERSATION})", expand=False))
    return pinned


def _failed_over(trace: ReachTrace) -> bool:
    return any(event.get("event") == EVENT_FAILOVER for event in trace.events)


def _last_answer(messages: list[Any]) -> str:
    return next(str(m.content) for m in reversed(messages) if isinstance(m, AIMessage) and m.content)


def _print_turn(console: Console, turn: int, text: str, answer: str, traces: list[ReachTrace]) -> None:
    console.print(f"\n[bold cyan]customer[/bold cyan] {text}")
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 1))
    for column in ("capability", "agent", "instance", "affinity", "attempts", "status", "ms"):
        table.add_column(column)
    for trace in traces:
        route = trace.route
        affinity: str = route.affinity if route else "-"
        if route and route.context_restore:
            affinity = "[yellow]restored (context_restore)[/yellow]"
        table.add_row(
            trace.capability,
            route.agent if route else "-",
            route.instance if route else "-",
            affinity,
            str(len(trace.attempts)),
            trace.status,
            f"{trace.duration_ms:.1f}",
        )
    if traces:
        console.print(table)
    console.print(f"[bold green]front-desk[/bold green] {answer}")


def _print_events(console: Console, traces: list[ReachTrace]) -> None:
    lines = [
        f"{trace.capability}: {event.get('event', '?')} "
        + json.dumps({k: rounded(v) for k, v in event.items() if k not in ("event", "at")})
        for trace in traces
        for event in trace.events
    ]
    failed = [
        f"{trace.capability}: attempt {a.number} at {a.instance} -> {a.outcome} ({a.error})"
        for trace in traces
        for a in trace.attempts
        if a.outcome != "success"
    ]
    body = "\n".join(failed + lines) or "no failover, retry or breaker event"
    console.print(Panel(body, title="failover, retry and breaker events", expand=False))


def _trace_tree(spans: list[ReadableSpan]) -> Tree:
    """The spans of the failover turn's trace, nested by parent: framework -> client -> agent."""
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None and span.parent.span_id in by_id else None
        children.setdefault(parent, []).append(span)
    failed_over = {s.context.trace_id for s in spans if s.context and any(e.name == EVENT_FAILOVER for e in s.events)}
    roots = children.get(None, [])
    chosen = [s for s in roots if s.context and s.context.trace_id in failed_over] or roots[-1:]
    tree = Tree("[bold]trace of the call that failed over[/bold] (framework -> client -> agent)")

    def add(node: Tree, span: ReadableSpan) -> None:
        ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
        events = ", ".join(e.name for e in span.events if e.name != EVENT_ATTEMPT)
        note = f" [yellow]{events}[/yellow]" if events else ""
        branch = node.add(f"{span.name} [dim]{span.kind.name.lower()} {ms:.1f} ms[/dim]{note}")
        for child in sorted(children.get(span.context.span_id if span.context else None, []), key=_start):
            add(branch, child)

    for root in chosen:
        add(tree, root)
    return tree


def _start(span: ReadableSpan) -> int:
    return span.start_time or 0
