"""Outlier detection: a slow or failing instance is found against its peers, cut, ejected, probed and restored."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter

import pytest

from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import ConfigError
from reach_plugins.model import AgentDescriptor, ReachRequest, RouteDecision
from reach_plugins.policy.outliers import OutlierDetector, OutlierPolicy, OutlierTransition
from reach_plugins.registry import MemoryRegistry
from reach_plugins.routing import Router
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import Call, MockTransport

FAST, MILD, SLOW = 0.1, 0.4, 2.0
THREE = OutlierPolicy(min_samples=3)
"""Judged from the third attempt on (the default waits for five): the counts below are easier to follow."""


def feed(detector: OutlierDetector, now: float, latencies: dict[str, float], *, failed: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """One attempt finished at every instance named, at ``now``."""
    for instance, latency in latencies.items():
        detector.record("orders", instance, latency=latency, failure=instance in failed, now=now)


def test_censored_samples_of_an_instance_losing_every_race_climb_until_it_is_ejected() -> None:
    """Cut after 20 ms each time (a hedge's loser), o3 is only known to be at least that slow: its trend climbs
    (bound plus its mean so far) until it is ejected for latency; on probation, more lost races never restore it
    but eject it again, twice as long."""
    detector = OutlierDetector(THREE)
    feed(detector, 0, {"o1": FAST, "o2": FAST, "o3": FAST})
    cuts = 0
    while detector.available("orders", "o3", cuts) and cuts < 100:
        cuts += 1
        feed(detector, cuts, {"o1": FAST, "o2": FAST})
        detector.censored("orders", "o3", at_least=0.02, now=cuts)
    share, why = detector.standing("orders", "o3", cuts)
    assert share == 0.0 and why is not None and "latency" in why, why
    assert 10 <= cuts <= 60, cuts
    later = cuts + 5.0
    feed(detector, later, {"o1": FAST, "o2": FAST})
    assert detector.standing("orders", "o3", later)[0] == THREE.probation_share
    for n in range(THREE.min_samples):
        assert detector.state("orders", "o3") == "probation", "lost races never show it in line"
        detector.censored("orders", "o3", at_least=0.02, now=later + n)
    share, why = detector.standing("orders", "o3", later + n)
    assert share == 0.0 and why is not None and why.startswith("outlier ejected for 10s"), why


def test_an_occasional_lost_race_leaves_a_healthy_instance_healthy() -> None:
    """One censored sample in twenty (a healthy instance past its p95 now and then): never judged."""
    detector = OutlierDetector(THREE)
    for n in range(200):
        feed(detector, n, {"o1": FAST, "o2": FAST, **({} if n % 20 == 19 else {"o3": FAST})})
        if n % 20 == 19:
            detector.censored("orders", "o3", at_least=2 * FAST, now=n)
        assert detector.standing("orders", "o3", n) == (1.0, None), n


def test_a_mildly_slow_instance_is_cut_then_ejected_probed_and_restored() -> None:
    """4x its peers: min_samples in, weight cut; eject_after verdicts, ejected 5 s; probation; in line: healthy."""
    moves: list[OutlierTransition] = []
    detector = OutlierDetector(THREE, listener=moves.append)
    for n in range(2):
        feed(detector, n, {"o1": FAST, "o2": FAST, "o3": MILD})
    assert detector.standing("orders", "o3", 2) == (1.0, None), "two samples are not enough to judge"
    feed(detector, 2, {"o1": FAST, "o2": FAST, "o3": MILD})
    share, why = detector.standing("orders", "o3", 2)
    assert share == pytest.approx(FAST / MILD) and why is not None and "latency 0.4s" in why and "0.1s" in why
    assert detector.standing("orders", "o1", 2) == (1.0, None)
    for n in (3, 4):
        feed(detector, n, {"o1": FAST, "o2": FAST, "o3": MILD})
    assert detector.state("orders", "o3") == "ejected" and not detector.available("orders", "o3", 8.9)
    assert detector.standing("orders", "o3", 8.9)[1] == moves[-1].reason
    assert "ejected for 5s: latency" in moves[-1].reason
    share, why = detector.standing("orders", "o3", 9.0)
    assert detector.state("orders", "o3") == "probation" and share == 0.1 and "probation" in (why or "")
    for n in range(3):
        feed(detector, 9 + n, {"o1": FAST, "o3": FAST})
    assert detector.standing("orders", "o3", 12) == (1.0, None)
    assert [m.after for m in moves] == ["slow", "ejected", "probation", "healthy"]


def test_a_severely_slow_instance_is_ejected_at_its_first_verdict() -> None:
    """20x its peers (eject_ratio 5): no cut-weight stage that would only slow the evidence down."""
    detector = OutlierDetector(THREE)
    for n in range(3):
        feed(detector, n, {"o1": FAST, "o2": FAST, "o3": SLOW})
    assert detector.state("orders", "o3") == "ejected"


def test_a_probation_that_is_still_slow_ejects_twice_as_long() -> None:
    """Back from ejection and still slow: ejected again for 10 s at once (no strikes to wait for)."""
    detector = OutlierDetector(THREE)
    for n in range(5):
        feed(detector, n, {"o1": FAST, "o2": FAST, "o3": SLOW})
    assert detector.available("orders", "o3", 9.0)
    for n in range(3):
        feed(detector, 9 + n, {"o1": FAST, "o2": FAST, "o3": SLOW})
    assert not detector.available("orders", "o3", 11 + 9.9) and detector.available("orders", "o3", 11 + 10)


def test_never_more_than_max_ejected_and_never_all() -> None:
    """Of 5 instances 2 slow, max_ejected 20 %: one is ejected, the other keeps its cut weight and serves."""
    detector = OutlierDetector(OutlierPolicy(min_samples=3, max_ejected=0.2))
    for n in range(10):
        feed(detector, n * 0.1, {"o1": FAST, "o2": FAST, "o3": FAST, "o4": SLOW, "o5": SLOW})
    states = Counter(detector.state("orders", f"o{n}") for n in range(1, 6))
    assert states == {"ejected": 1, "slow": 1, "healthy": 3}
    lone = OutlierDetector(OutlierPolicy(min_samples=3, max_ejected=1.0))
    for n in range(3):
        feed(lone, n * 0.1, {"o2": FAST, "o3": FAST, "o1": SLOW})
    for n in range(10):  # o2 turns slow and failing: with o1 ejected, one peer is too few to judge it by
        feed(lone, 0.3 + n * 0.1, {"o2": SLOW, "o3": FAST}, failed={"o2"})
    assert lone.state("orders", "o1") == "ejected" and lone.available("orders", "o2", 1.0)


def test_a_failing_instance_is_found_by_its_failure_rate() -> None:
    """Prompt failures (latency in line) are caught by the failure percentage against the peers'."""
    detector = OutlierDetector(THREE)
    for n in range(5):
        feed(detector, n, {"o1": FAST, "o2": FAST, "o3": FAST}, failed={"o3"})
    assert detector.state("orders", "o3") == "ejected"
    assert "failure rate 100% against its peers' median 0%" in (detector.standing("orders", "o3", 5)[1] or "")


def test_healthy_jitter_is_never_an_outlier() -> None:
    """3,000 attempts each of 3 instances with lognormal jitter (sigma 0.25 around 0.5 s): nothing is flagged."""
    moves: list[OutlierTransition] = []
    detector = OutlierDetector(listener=moves.append)
    rng = random.Random(11)
    for n in range(3000):
        feed(detector, n * 0.01, {name: 0.5 * math.exp(rng.gauss(0, 0.25)) for name in ("o1", "o2", "o3")})
    assert moves == []


def test_too_few_or_stale_peers_judge_nobody() -> None:
    """One peer is too few (two instances are left to the breakers); peers silent for stale_after do not count."""
    detector = OutlierDetector(THREE)
    for n in range(10):
        feed(detector, n, {"o1": SLOW, "o2": FAST}, failed={"o1"})
    assert detector.standing("orders", "o1", 10) == (1.0, None)
    stale = OutlierDetector(THREE)
    for n in range(5):
        feed(stale, n, {"o2": FAST, "o3": FAST})
    for n in range(10):
        feed(stale, 40 + n, {"o1": SLOW})  # o2 and o3 last answered at 4: stale by 34
    assert stale.standing("orders", "o1", 50) == (1.0, None)
    feed(stale, 50, {"o2": FAST, "o3": FAST, "o1": SLOW})
    assert stale.state("orders", "o1") == "ejected", "fresh peers again: judged"


@pytest.mark.parametrize(
    "bad",
    [
        {"min_samples": 0},
        {"alpha": 0.0},
        {"max_ejected": 1.5},
        {"slow_ratio": 1.0},
        {"eject_ratio": 1.5},
        {"eject_for": 10, "max_eject": 5},
    ],
)
def test_a_bad_policy_is_refused_with_what_to_fix(bad: dict[str, float]) -> None:
    """Each out-of-range setting is a ConfigError naming it."""
    with pytest.raises(ConfigError, match=next(iter(bad))):
        OutlierPolicy(**bad)  # type: ignore[arg-type]


async def test_the_pipeline_moves_calls_off_a_slow_instance_and_the_route_says_why() -> None:
    """3 instances, one answering 2 s late, 10 calls/s on virtual time: after 4 s it gets under 1/3 by a margin."""
    clock = FakeClock()
    registry = MemoryRegistry(clock=clock)
    endpoints = [f"http://127.0.0.1:{18001 + n}" for n in range(3)]
    registry.put_agent(AgentDescriptor(name="orders", endpoints=endpoints, capabilities=["query_order"]))
    slow = next(i.instance_id for i in registry.instances("orders").values() if i.endpoint == endpoints[2])
    started: list[tuple[float, str]] = []

    async def answer(call: Call) -> dict[str, bool]:
        started.append((clock.now(), call.instance.instance_id))
        if call.instance.instance_id == slow:
            await clock.sleep(SLOW)
        return {"ok": True}

    holder: list[Pipeline] = []
    router = Router(
        registry,
        clock=clock,
        rng=random.Random(5),
        is_available=lambda a, i: holder[0].is_available(a, i),
        standing=lambda a, i: holder[0].standing(a, i),
    )
    pipeline = Pipeline(router=router, transport=MockTransport(answer), clock=clock, rng=random.Random(6))
    holder.append(pipeline)
    request = ReachRequest(capability="query_order", payload={}, timeout_ms=3000)
    begin = clock.now()
    why: RouteDecision | None = None
    calls = []
    for _ in range(200):
        calls.append(asyncio.ensure_future(pipeline.run(request, trace=True)))
        await clock.sleep(0.1)
        decision = router.route(request).decision
        if why is None and decision.outliers:
            why = decision
    responses = await asyncio.gather(*calls)
    assert all(response.ok for response in responses)
    late = [instance for at, instance in started if at - begin >= 4.0]
    p = 0.1 / 2.1  # the most it gets: a probation share of 10 % of one weight beside two full ones
    bound = len(late) * p + 3 * math.sqrt(len(late) * p * (1 - p)) + 3  # + 3: the probe calls of one probation
    assert Counter(late)[slow] <= bound < len(late) / 3
    assert why is not None and "latency 2s against its peers' median 0s" in why.outliers[f"orders/{slow}"]
    moves = [e for r in responses if r.trace for e in r.trace.events if e["event"] == "reach.outlier"]
    assert moves and moves[0]["instance"] == slow and "latency" in moves[0]["reason"], "the trace tells of the ejection"


def test_the_instances_tracked_are_bounded() -> None:
    """Past max_instances the longest silent half is forgotten (an instance id that left frees its entry)."""
    detector = OutlierDetector(OutlierPolicy(max_instances=4))
    for n in range(100):
        feed(detector, n, {f"o{n}": FAST})
        assert detector.tracked <= 4
    assert detector.tracked == 4
