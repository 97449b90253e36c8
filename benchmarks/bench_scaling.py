"""A whole ``reach`` through MockTransport as the estate grows: is per-call cost flat, and what does memory cost?

No network: routing + resilience core + an in-memory transport, one event
loop, calls one after another, no OpenTelemetry SDK. Two parts, one run:

1. **Flatness** (targets): one capability offered by 1 / 10 / 100 / 1,000
   agents of 3 instances, ``ReachClient.reach`` per call, beside the core alone
   (the pipeline with a router that always answers the same route: what
   routing cannot go below). The cases run interleaved, a batch each in turn,
   so load on the shared machine drifts every case alike. Targets: p50 <= 30 us
   at 1 agent, and the 1,000-agent p50 within 1.5x of it; a new-session route
   decision (router only, 1 agent of 3 and 5 agents of 3) <= 20 us p50; the
   same over 1,000 agents is timed after the rest, with fewer calls (rendezvous
   hashing scores every instance: it is O(instances)).
2. **Stateless caller** (issue 29.5): how a caller with no sessions sees a
   fresh estate: a new registry of 10 or 1,000 agents of 3 instances, a new
   client, a short warm-up (200 calls), then 1,000 session-less calls spread
   by round robin over every instance, with and without per-hop tokens (the
   in-process issuer mints one per target agent, on its first call). The
   registry's own garbage is collected before the client's first call (it is
   the build's cost, not a call's); nothing is frozen. Each case runs in
   ``STATELESS_ROUNDS`` fresh rounds, interleaved; the median round counts.
   Target: mean and p50 at 1,000 agents <= 1.5x those at 10. Beside it, the
   router alone for a caller that calls less than once a ``refresh`` period
   (the router's clock moved 1.1 s between calls): each call then pays the
   pool's full look, O(instances) (health is re-checked, not pushed).
3. **Scaling curve**: p50 and mean per call, and memory, as the number of
   agents (3 instances each, all offering the capability), instances of one
   agent, and open conversations (pinned sessions revisited at random) grow
   from 10 to 10,000. Memory is what ``tracemalloc`` sees allocated by the
   registry and the client after the first call. Table printed, JSON in
   ``benchmarks/results/scaling.json``, curves in ``scaling.png``.

The router and registry run on the real clock, so the pools' periodic full
look (every second) lands in the figures (mean and p99) rather than being
hidden by a frozen clock.

    python benchmarks/bench_scaling.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Collection
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reach_plugins import ReachClient
from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.model import AgentDescriptor, Capability, Instance, ReachRequest, RouteDecision
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Route, Router
from reach_plugins.security.source import default_issuer
from reach_plugins.telemetry.spans import spans_are_noop
from reach_plugins.transport import MockTransport

RESULTS = Path(__file__).parent / "results" / "scaling.json"
PICTURE = RESULTS.with_suffix(".png")
FLAT_SIZES = (1, 10, 100, 1_000)
CURVE_SIZES = (10, 100, 1_000, 10_000)
INSTANCES = 3
TARGET_P50_US = 30.0
TARGET_FLATNESS = 1.5
TARGET_NEW_SESSION_US = 20.0
STATELESS_SIZES = (10, 1_000)
STATELESS_WARMUP = 200
STATELESS_CALLS = 1_000
STATELESS_ROUNDS = 7
SLOW_CALLS = 300
"""New-session decisions timed over 1,000 agents (each scores all 3,000 instances)."""
PAYLOAD = {"order_id": "A1"}
Call = Callable[[int], Awaitable[Any]]
ROUTER_GROWTH: list[int] = []
"""Bytes the routing state grew by on a client's first calls (filled by the curve's builders)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One measured point."""

    part: str
    dimension: str
    size: int
    calls: int
    p50_us: float
    p99_us: float
    mean_us: float
    memory_mb: float | None = None
    router_mb: float | None = None


async def estate(agents: int, instances: int) -> MemoryRegistry:
    """``agents`` agents of ``instances`` instances, all offering ``query_order``.

    The instances carry no heartbeat (alive until marked down): a run under load
    outlasts the 30 s heartbeat grace, and the router's cost is the same either way.
    """
    registry = MemoryRegistry()
    for a in range(agents):
        name = f"agent-{a}"
        capabilities = [Capability(name="query_order"), Capability(name=f"own_{a}")]
        await registry.register_agent(AgentDescriptor(name=name, capabilities=capabilities))
        for n in range(instances):
            await registry.register_instance(
                Instance(
                    agent=name,
                    instance_id=f"{name}-{n}",
                    endpoint=f"http://127.0.0.1:{8000 + n % 1000}",
                    load=(a * 7 + n * 3) % 10 / 20,
                )
            )
    return registry


def client_for(registry: MemoryRegistry) -> ReachClient:
    """A client over a MockTransport that records no calls (neither memory figures nor the collector see them)."""
    return ReachClient(registry, transport=MockTransport(lambda call: {"status": "shipped"}, record=0))


def core_alone() -> Pipeline:
    """The pipeline behind a router that always answers the same route (the floor for any routing)."""
    capability = Capability(name="query_order")
    instance = Instance(agent="orders", instance_id="orders-0", endpoint="http://127.0.0.1:8000")
    agent = AgentDescriptor(name="orders", capabilities=[capability], instances=[instance])
    decision = RouteDecision(
        capability="query_order", agent="orders", instance="orders-0", endpoint=instance.endpoint, reason="static"
    )
    route = Route(agent, instance, capability, decision=decision)

    class Static:
        def route(self, request: ReachRequest, *, exclude: Collection[tuple[str, str]] = ()) -> Route:
            return route

    return Pipeline(router=Static(), transport=MockTransport(lambda call: {"status": "shipped"}, record=0))


async def timed(call: Call, count: int, offset: int = 0) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for n in range(offset, offset + count):
        started = clock()
        await call(n)
        samples.append(clock() - started)
    return samples


def row(
    part: str, dimension: str, size: int, samples: list[int], memory: float | None = None, router: float | None = None
) -> Row:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000  # noqa: E731
    mean = statistics.fmean(samples) / 1000
    return Row(part, dimension, size, len(samples), pick(0.5), pick(0.99), mean, memory, router)


async def new_sessions(agents: int, count: int) -> Call:
    """A router over ``agents`` agents of 3, deciding for a fresh session id on each call."""
    router = Router(await estate(agents, INSTANCES))
    sessions = [ReachRequest(capability="query_order", session_id=f"s-{agents}-{n}") for n in range(count)]

    async def decide(n: int) -> None:
        router.route(sessions[n])

    return decide


ALONE = "reach, 1 agent(s), alone"
"""The one-agent case timed by itself before the interleaved rounds (where the other estates evict its caches)."""


async def flatness(calls: int, batch: int) -> list[Row]:
    """Part 1: the four estates and the core alone, interleaved batch by batch (and one agent alone first)."""
    cases: dict[str, Call] = {}
    keep: list[ReachClient] = []
    pipeline = core_alone()
    request = ReachRequest(capability="query_order", payload=PAYLOAD)
    cases["core alone"] = lambda n: pipeline.run(request)
    for size in FLAT_SIZES:
        client = client_for(await estate(size, INSTANCES))
        keep.append(client)
        cases[f"reach, {size} agent(s)"] = lambda n, c=client: c.reach("query_order", PAYLOAD)
    deciders = {size: await new_sessions(size, calls + batch) for size in (1, 5, 1_000)}
    cases["new-session decision, 1 agent(s)"] = deciders[1]
    cases["new-session decision, 5 agent(s)"] = deciders[5]
    samples: dict[str, list[int]] = {name: [] for name in cases}
    for call in cases.values():
        await timed(call, batch)  # warm-up: pools loaded, code paths hot
    gc.collect()
    gc.freeze()
    # One agent as its only user sees it: the same calls back to back, caches not shared with other estates.
    samples[ALONE] = await timed(cases["reach, 1 agent(s)"], calls, offset=batch)
    done = 0
    while done < calls:
        for name, call in cases.items():
            samples[name] += await timed(call, batch, offset=batch + done)
        done += batch
    # HRW scores every instance (affinity.py): about 2 ms a decision over 3,000, so fewer calls, after the rest.
    samples["new-session decision, 1000 agent(s)"] = await timed(deciders[1_000], SLOW_CALLS, offset=batch)
    gc.unfreeze()
    for client in keep:
        await client.aclose()
    await pipeline.aclose()
    rows = []
    for name, got in samples.items():
        size = int(name.split(", ")[1].split(" ")[0]) if "agent" in name else 0
        rows.append(row("flatness", name, size, got))
    return rows


async def stateless_round(agents: int, tokens: bool, calls: int) -> tuple[list[int], int]:
    """One stateless caller's first calls over a fresh estate (see the module docstring, part 2), and how many of
    the timed calls were the first to their agent (each of those mints a token, when tokens are on)."""
    registry = await estate(agents, INSTANCES)
    gc.collect()
    seen: set[str] = set()

    def answer(call: Any) -> dict[str, str]:
        seen.add(call.agent.name)
        return {"status": "shipped"}

    transport = MockTransport(answer, record=0)
    client = ReachClient(registry, transport=transport) if tokens else ReachClient(registry, transport, tokens=False)
    await timed(lambda n: client.reach("query_order", PAYLOAD), STATELESS_WARMUP)
    before = len(seen)
    samples = await timed(lambda n: client.reach("query_order", PAYLOAD), calls)
    await client.aclose()
    return samples, len(seen) - before


def sparse_caller_us(agents: int, calls: int = 100) -> float:
    """The router's mean decision, in microseconds, when every call comes after the pool's ``refresh`` period."""
    now = [1_000.0]
    router = Router(asyncio.run(estate(agents, INSTANCES)), clock=lambda: now[0])
    request = ReachRequest(capability="query_order")
    router.route(request)
    took = []
    for _ in range(calls):
        now[0] += 1.1
        started = time.perf_counter_ns()
        router.route(request)
        took.append(time.perf_counter_ns() - started)
    return statistics.fmean(took) / 1000


def signature_us() -> float:
    """The floor of a token miss: one Ed25519 signature of a token-sized message (median of 2,000)."""
    key = default_issuer().keys.active.private
    message = b"x" * 300
    took = []
    for _ in range(2_000):
        started = time.perf_counter_ns()
        key.sign(message)
        took.append(time.perf_counter_ns() - started)
    return statistics.median(took) / 1000


async def stateless(calls: int, rounds: int) -> tuple[list[Row], dict[str, float]]:
    """Part 2: 10 and 1,000 agents, with and without tokens, each in ``rounds`` fresh rounds (median round kept);
    and the floor with tokens: the 1,000-agent mean without tokens plus one signature for each timed call that met
    a new agent, against the 10-agent mean with tokens (what the target compares)."""
    cases = [(agents, tokens) for tokens in (False, True) for agents in STATELESS_SIZES]
    measured: dict[tuple[int, bool], list[Row]] = {case: [] for case in cases}
    firsts: list[int] = []
    for _ in range(rounds):
        for agents, tokens in cases:
            name = f"stateless, {'tokens' if tokens else 'no tokens'}"
            samples, new = await stateless_round(agents, tokens, calls)
            measured[agents, tokens].append(row("stateless", name, agents, samples))
            if tokens and agents == STATELESS_SIZES[-1]:
                firsts.append(new)
    rows = [sorted(got, key=lambda r: r.mean_us)[len(got) // 2] for got in measured.values()]
    by = {(r.dimension, r.size): r for r in rows}
    few = by["stateless, tokens", STATELESS_SIZES[0]]
    plain = by["stateless, no tokens", STATELESS_SIZES[-1]]
    signed = signature_us()
    share = statistics.median(firsts) / calls
    floor = {
        "signature_us": round(signed, 1),
        "calls_meeting_a_new_agent": round(share, 3),
        "tokens_floor_mean_ratio": round((plain.mean_us + share * signed) / few.mean_us, 2),
    }
    return rows, floor


async def built(
    make: Callable[[], Awaitable[tuple[ReachClient, Call]]],
) -> tuple[ReachClient, Call, float, float]:
    """Build an estate and its client, make one call; return them, the megabytes allocated, and the router's share.

    The router's share is what the pools, round robin and session table hold:
    the growth from just before the first call to just after it (for open
    conversations, from before the first conversation).
    """
    gc.collect()
    tracemalloc.start()
    client, call = await make()
    await call(0)
    gc.collect()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return client, call, size / 1e6, ROUTER_GROWTH.pop() / 1e6


async def curve(calls: int) -> list[Row]:
    """Part 2: agents, instances per agent and open conversations from 10 to 10,000."""
    rows = []

    def shape(agents: int, instances: int) -> Callable[[], Awaitable[tuple[ReachClient, Call]]]:
        async def make() -> tuple[ReachClient, Call]:
            client = client_for(await estate(agents, instances))
            before, _ = tracemalloc.get_traced_memory()
            await client.reach("query_order", PAYLOAD)
            ROUTER_GROWTH.append(tracemalloc.get_traced_memory()[0] - before)
            return client, lambda n: client.reach("query_order", PAYLOAD)

        return make

    def conversations(count: int) -> Callable[[], Awaitable[tuple[ReachClient, Call]]]:
        async def make() -> tuple[ReachClient, Call]:
            client = client_for(await estate(1, INSTANCES))
            before, _ = tracemalloc.get_traced_memory()
            for n in range(count):
                await client.reach("query_order", PAYLOAD, session_id=f"conv-{n}")
            ROUTER_GROWTH.append(tracemalloc.get_traced_memory()[0] - before)
            order = [f"conv-{random.Random(n).randrange(count)}" for n in range(calls + 1)]
            return client, lambda n: client.reach("query_order", PAYLOAD, session_id=order[n % len(order)])

        return make

    dimensions = (
        ("agents (3 instances each)", lambda size: shape(size, INSTANCES)),
        ("instances of one agent", lambda size: shape(1, size)),
        ("open conversations", conversations),
    )
    for dimension, maker in dimensions:
        for size in CURVE_SIZES:
            client, call, memory, router = await built(maker(size))
            await timed(call, min(calls, 500), offset=1)
            gc.collect()
            gc.freeze()
            samples = await timed(call, calls, offset=1)
            gc.unfreeze()
            rows.append(row("curve", dimension, size, samples, round(memory, 2), round(router, 2)))
            await client.aclose()
            print(f"  {dimension:28} {size:>6,}: p50 {rows[-1].p50_us:8.1f} us  memory {memory:7.1f} MB", flush=True)
    return rows


def stateless_verdict(rows: list[Row]) -> dict[str, Any]:
    """1,000 agents against 10, mean and p50, with and without tokens."""
    checks: dict[str, Any] = {"target_stateless_ratio": TARGET_FLATNESS}
    for kind in ("no tokens", "tokens"):
        by = {r.size: r for r in rows if r.dimension == f"stateless, {kind}"}
        few, many = by[STATELESS_SIZES[0]], by[STATELESS_SIZES[-1]]
        key = kind.replace(" ", "_")
        checks[f"stateless_{key}_mean_ratio"] = round(many.mean_us / few.mean_us, 2)
        checks[f"stateless_{key}_p50_ratio"] = round(many.p50_us / few.p50_us, 2)
        checks[f"met_stateless_{key}"] = max(many.mean_us / few.mean_us, many.p50_us / few.p50_us) <= TARGET_FLATNESS
    return checks


def verdict(rows: list[Row]) -> dict[str, Any]:
    by = {r.dimension: r for r in rows if r.part == "flatness"}
    one, many = by["reach, 1 agent(s)"].p50_us, by["reach, 1000 agent(s)"].p50_us
    alone = by[ALONE].p50_us
    new = by["new-session decision, 1 agent(s)"].p50_us
    new_15 = by["new-session decision, 5 agent(s)"].p50_us
    agents = {r.size: r for r in rows if r.dimension.startswith("agents")}
    per_10k = agents.get(10_000)
    return {
        "reach_p50_1_agent_us": one,
        "reach_p50_1_agent_alone_us": alone,
        "target_reach_p50_1_agent_us": TARGET_P50_US,
        "met_reach_p50": one <= TARGET_P50_US,
        "met_reach_p50_alone": alone <= TARGET_P50_US,
        "reach_p50_1000_agents_us": many,
        "ratio_1000_to_1": round(many / one, 2),
        "target_ratio": TARGET_FLATNESS,
        "met_flatness": many / one <= TARGET_FLATNESS,
        "core_alone_p50_us": by["core alone"].p50_us,
        "new_session_decision_p50_us": new,
        "new_session_decision_15_instances_p50_us": new_15,
        "target_new_session_us": TARGET_NEW_SESSION_US,
        "met_new_session": max(new, new_15) <= TARGET_NEW_SESSION_US,
        "memory_mb_per_10000_agents_of_3": per_10k.memory_mb if per_10k else None,
        "routing_state_mb_per_10000_agents_of_3": per_10k.router_mb if per_10k else None,
        **stateless_verdict(rows),
    }


def draw(rows: list[Row], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (cost, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    for dimension in dict.fromkeys(r.dimension for r in rows if r.part == "curve"):
        points = [r for r in rows if r.dimension == dimension]
        sizes = [r.size for r in points]
        cost.plot(sizes, [r.p50_us for r in points], marker="o", label=f"{dimension} (p50)")
        cost.plot(sizes, [r.mean_us for r in points], linestyle=":", marker=".", label=f"{dimension} (mean)")
        memory.plot(sizes, [r.memory_mb for r in points], marker="o", label=dimension)
    for axis, title, unit in ((cost, "a whole reach via MockTransport", "us per call"), (memory, "memory", "MB")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("count (10 -> 10,000)")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"reach-plugins scaling (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run, not a measurement")
    parser.add_argument("--stateless-only", action="store_true", help="part 2 alone (the stateless caller)")
    args = parser.parse_args(argv)
    calls, batch, curve_calls = (2_000, 200, 500) if args.quick else (20_000, 500, 5_000)
    load_before = os.getloadavg()[0]
    lone, floor = asyncio.run(stateless(STATELESS_CALLS, 2 if args.quick else STATELESS_ROUNDS))
    for agents in STATELESS_SIZES:
        floor[f"sparse_caller_route_mean_us_{agents}"] = round(sparse_caller_us(agents), 1)
    print(f"{'stateless caller (median round)':40} {'agents':>6} {'p50 us':>8} {'p99 us':>8} {'mean us':>8}")
    for r in lone:
        print(f"{r.dimension:40} {r.size:>6,} {r.p50_us:8.1f} {r.p99_us:8.1f} {r.mean_us:8.1f}")
    lone_checks = {**stateless_verdict(lone), **floor}
    for kind in ("no_tokens", "tokens"):
        mean, p50 = (lone_checks[f"stateless_{kind}_{q}_ratio"] for q in ("mean", "p50"))
        print(f"  1,000 / 10 agents, {kind.replace('_', ' '):9}: mean {mean:.2f}x, p50 {p50:.2f}x (target <= 1.5x)")
    few, many = (floor[f"sparse_caller_route_mean_us_{agents}"] for agents in STATELESS_SIZES)
    print(f"  a caller calling once a second, route alone: {few:.1f} us at 10 agents, {many:.1f} us at 1,000")
    print(
        f"  the floor with tokens: {floor['calls_meeting_a_new_agent']:.0%} of the timed calls meet a new agent, "
        f"one signature each ({floor['signature_us']:.1f} us): mean {floor['tokens_floor_mean_ratio']:.2f}x"
    )
    if args.stateless_only:
        alone = RESULTS.with_name("scaling_stateless.json")
        return report(args, load_before, lone, lone_checks, drawn=False, path=alone)
    flat = asyncio.run(flatness(calls, batch))
    print(f"{'case':40} {'p50 us':>8} {'p99 us':>8} {'mean us':>8}")
    for r in flat:
        print(f"{r.dimension:40} {r.p50_us:8.1f} {r.p99_us:8.1f} {r.mean_us:8.1f}")
    print("scaling curve:")
    rows = lone + flat + asyncio.run(curve(curve_calls))
    checks = {**verdict(rows), **floor}
    print(
        f"\n{'dimension':28} {'size':>7} {'p50 us':>8} {'p99 us':>9} {'mean us':>8} "
        f"{'memory MB':>10} {'routing MB':>10}"
    )
    for r in rows[len(lone) + len(flat) :]:
        print(
            f"{r.dimension:28} {r.size:>7,} {r.p50_us:8.1f} {r.p99_us:9.1f} {r.mean_us:8.1f} "
            f"{r.memory_mb:10.2f} {r.router_mb:10.2f}"
        )
    print("\ntargets:")
    print(f"  reach p50, 1 agent:        {checks['reach_p50_1_agent_us']:.1f} us (target <= {TARGET_P50_US:g})")
    print(f"  the same, timed alone:     {checks['reach_p50_1_agent_alone_us']:.1f} us (target <= {TARGET_P50_US:g})")
    print(f"  1,000 agents / 1 agent:    {checks['ratio_1000_to_1']:.2f}x (target <= {TARGET_FLATNESS:g}x)")
    for label, key in (("3", "new_session_decision_p50_us"), ("15", "new_session_decision_15_instances_p50_us")):
        print(f"  new session, {label:>2} instances: {checks[key]:.1f} us (target <= {TARGET_NEW_SESSION_US:g})")
    print(
        f"  memory, 10,000 agents x 3: {checks['memory_mb_per_10000_agents_of_3']} MB "
        f"(routing state {checks['routing_state_mb_per_10000_agents_of_3']} MB)"
    )
    return report(args, load_before, rows, checks, drawn=draw(rows, PICTURE), path=RESULTS)


def report(
    args: argparse.Namespace, load_before: float, rows: list[Row], checks: dict[str, Any], *, drawn: bool, path: Path
) -> int:
    """Write the run's rows and verdicts, with the machine's load before and after, as JSON at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": "scaling",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "machine": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average_1m_before": round(load_before, 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "otel_sdk": not spans_are_noop(),
        "quick": args.quick,
        "rows": [asdict(r) for r in rows],
        "targets": checks,
        "picture": PICTURE.name if drawn else None,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}" + (f" and {PICTURE}" if drawn else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
