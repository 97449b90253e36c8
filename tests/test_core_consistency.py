"""Reply consistency: the score of a reply against its request, and the ejection lifecycle on a fake clock."""

from __future__ import annotations

from reach_plugins.model import ConsistencyPolicy, ReachRequest
from reach_plugins.policy.consistency import ConsistencyMonitor, ConsistencyTransition, score_reply

POLICY = ConsistencyPolicy(min_similarity=0.2, window=10, min_replies=4, max_low_rate=0.5, eject_for=5, max_eject=20)
ASK = ReachRequest(
    capability="query_order", intent="where is my order", payload={"order_id": "A1", "q": "order status"}
)


def test_an_on_topic_reply_scores_above_an_off_topic_one() -> None:
    """The lexical embedder ranks an answer about the order well above one about the weather."""
    on_topic = score_reply(ASK, {"order_id": "A1", "status": "order shipped, delivery tomorrow"})
    off_topic = score_reply(ASK, {"reply_content": "Sunny in Paris, 24 degrees, light wind"})
    assert on_topic >= POLICY.min_similarity > off_topic


def test_a_reply_without_text_scores_zero() -> None:
    """Nothing to compare is not a match."""
    assert score_reply(ReachRequest(capability="ping"), {"n": 1}) == 0.0


def test_low_rate_ejects_then_a_probe_restores_or_doubles() -> None:
    """Eject at the low-rate threshold; after eject_for one probe: a good one restores, a bad one doubles the wait."""
    moves: list[ConsistencyTransition] = []
    monitor = ConsistencyMonitor(listener=moves.append)
    for score in (0.9, 0.0, 0.9):
        monitor.record("orders", "o1", POLICY, score, now=0.0)
    assert monitor.state("orders", "o1") == "healthy"
    monitor.record("orders", "o1", POLICY, 0.0, now=1.0)  # 2 of 4 low: 50 %
    assert monitor.state("orders", "o1") == "ejected" and not monitor.available("orders", "o1", 5.9)
    assert monitor.available("orders", "o1", 6.0) and monitor.state("orders", "o1") == "probing"
    monitor.sent("orders", "o1", 6.0)
    assert not monitor.available("orders", "o1", 6.0), "only one probe at a time"
    monitor.record("orders", "o1", POLICY, 0.0, now=6.1)  # a bad probe: ejected for 10 s now
    assert not monitor.available("orders", "o1", 16.0) and monitor.available("orders", "o1", 16.2)
    monitor.sent("orders", "o1", 16.2)
    monitor.record("orders", "o1", POLICY, 0.8, now=16.3)
    assert monitor.state("orders", "o1") == "healthy" and monitor.available("orders", "o1", 16.3)
    assert [m.after for m in moves] == ["ejected", "probing", "ejected", "probing", "healthy"]
    assert "2 of its last 4 replies" in moves[0].reason and "ejected for 10s" in moves[2].reason


def test_ejection_time_is_capped_and_instances_are_independent() -> None:
    """Repeated bad probes never eject longer than max_eject; another instance is untouched."""
    monitor = ConsistencyMonitor()
    for _ in range(4):
        monitor.record("orders", "o1", POLICY, 0.0, now=0.0)
    now = 0.0
    for _ in range(5):
        now += 100.0
        assert monitor.available("orders", "o1", now)
        monitor.sent("orders", "o1", now)
        monitor.record("orders", "o1", POLICY, 0.0, now=now)
    assert not monitor.available("orders", "o1", now + 19.9) and monitor.available("orders", "o1", now + 20.0)
    assert monitor.state("orders", "o2") == "healthy" and monitor.available("orders", "o2", now)


async def test_an_instance_that_starts_answering_off_topic_is_ejected() -> None:
    """Through ReachClient: once o2's answers stop matching the questions, routing leaves it; scores are traced."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from test_metrics import points, total

    from reach_plugins import AgentDescriptor, Capability, ReachClient
    from reach_plugins.registry import MemoryRegistry
    from reach_plugins.telemetry.metrics import CONSISTENCY_EJECTIONS, CONSISTENCY_SCORES, ReachMetrics
    from reach_plugins.transport import Call, MockTransport

    policy = ConsistencyPolicy(min_similarity=0.2, window=6, min_replies=3, max_low_rate=0.5, eject_for=60)
    capability = Capability(name="query_order", description="Where an order is", consistency=policy)
    registry = MemoryRegistry()
    registry.put_agent(
        AgentDescriptor(
            name="orders", endpoints=["http://127.0.0.1:9001", "http://127.0.0.1:9002"], capabilities=[capability]
        )
    )
    off_topic = next(i.instance_id for i in registry.instances("orders").values() if i.endpoint.endswith("9002"))
    served: list[str] = []

    def agent(call: Call) -> dict[str, str]:
        served.append(call.instance.instance_id)
        order = call.request.payload["order_id"]
        if call.instance.instance_id == off_topic and len(served) > 4:
            return {"reply_content": "Sunny in Paris, 24 degrees, light wind"}
        return {"order_id": order, "status": f"order {order} shipped, delivery tomorrow"}

    reader = InMemoryMetricReader()
    sink = ReachMetrics(meter_provider=MeterProvider(metric_readers=[reader]))
    async with ReachClient(registry, MockTransport(agent), sink=sink) as client:
        answers = [
            await client.reach("query_order", {"order_id": f"A{n}"}, intent="order status", trace=True)
            for n in range(30)
        ]
    scores = [e for a in answers if a.trace for e in a.trace.events if e["event"] == "reach.consistency"]
    assert len(scores) == 30 and all(answer.ok for answer in answers)
    low = [e for e in scores if e["low"]]
    assert low and all(e["instance"] == off_topic for e in low)
    ejected_at = max(n for n, instance in enumerate(served) if instance == off_topic)
    assert ejected_at < 15 and served[ejected_at + 1 :] and off_topic not in served[ejected_at + 1 :]
    assert any(e["event"] == "reach.consistency_state" for a in answers if a.trace for e in a.trace.events)
    found = points(reader)
    assert (
        total(found, CONSISTENCY_SCORES) == 30
        and total(found, CONSISTENCY_EJECTIONS, **{"reach.instance": off_topic}) == 1
    )


def test_a_probe_that_brings_no_score_is_a_failed_probe_and_another_follows() -> None:
    """A probe that errs or times out (no reply scored) re-ejects for twice as long, then a new probe goes out."""
    moves: list[ConsistencyTransition] = []
    monitor = ConsistencyMonitor(listener=moves.append)
    for _ in range(4):
        monitor.record("orders", "o1", POLICY, 0.0, now=0.0)
    assert monitor.available("orders", "o1", 5.0)
    monitor.sent("orders", "o1", 5.0)  # the probe: its call fails, nothing is scored
    assert not monitor.available("orders", "o1", 9.9), "the probe has the last ejection's length to come back"
    assert not monitor.available("orders", "o1", 10.0) and monitor.state("orders", "o1") == "ejected"
    assert "no scored reply within 5s" in moves[-1].reason and "ejected for 10s" in moves[-1].reason
    assert not monitor.available("orders", "o1", 19.9) and monitor.available("orders", "o1", 20.0)
    monitor.sent("orders", "o1", 20.0)
    monitor.record("orders", "o1", POLICY, 0.9, now=20.5)
    assert monitor.state("orders", "o1") == "healthy"
