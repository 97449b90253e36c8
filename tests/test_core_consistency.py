"""Reply consistency: the score of a reply against its request, and the ejection lifecycle on a fake clock."""

from __future__ import annotations

from reach_plugins.core.consistency import ConsistencyMonitor, ConsistencyTransition, score_reply
from reach_plugins.model import ConsistencyPolicy, ReachRequest

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
    monitor.sent("orders", "o1")
    assert not monitor.available("orders", "o1", 6.0), "only one probe at a time"
    monitor.record("orders", "o1", POLICY, 0.0, now=6.1)  # a bad probe: ejected for 10 s now
    assert not monitor.available("orders", "o1", 16.0) and monitor.available("orders", "o1", 16.2)
    monitor.sent("orders", "o1")
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
        monitor.sent("orders", "o1")
        monitor.record("orders", "o1", POLICY, 0.0, now=now)
    assert not monitor.available("orders", "o1", now + 19.9) and monitor.available("orders", "o1", now + 20.0)
    assert monitor.state("orders", "o2") == "healthy" and monitor.available("orders", "o2", now)
