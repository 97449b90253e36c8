"""Fail-static liveness: time while the registry was unreachable does not age a heartbeat (sans-IO)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from reach_plugins.registry.failstatic import MAX_OUTAGES, Reachability


def test_heartbeat_age_stops_while_unreachable_and_resumes_after() -> None:
    """A heartbeat 5 s before a 45 s outage is 5 s old during it and 5 + t s old t seconds after it."""
    reach = Reachability()
    reach.lost(105.0)
    assert reach.heartbeat_time(100.0, 150.0) == 105.0
    reach.found(150.0)
    assert reach.heartbeat_time(100.0, 152.0) == 107.0
    assert reach.heartbeat_time(151.0, 152.0) == 152.0, "a heartbeat after the outage ages normally"


def test_lost_twice_keeps_the_first_moment_and_found_without_loss_changes_nothing() -> None:
    """Repeated loss reports during one outage do not restart it; a stray 'found' is harmless."""
    reach = Reachability()
    reach.found(10.0)
    assert reach.reachable and reach.unseen(0.0, 20.0) == 0.0
    reach.lost(10.0)
    reach.lost(15.0)
    assert not reach.reachable and reach.unseen(0.0, 20.0) == 10.0


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 100)), max_size=10), st.floats(0, 1000), st.floats(0, 1000))
def test_unseen_time_is_within_the_heartbeat_age(spans: list[tuple[float, float]], since: float, later: float) -> None:
    """Whatever the outages, the judged moment never precedes the heartbeat nor follows now."""
    reach = Reachability()
    t = 0.0
    for gap, length in spans:
        reach.lost(t + gap)
        t += gap + length
        reach.found(t)
    now = since + later
    judged = reach.heartbeat_time(since, now)
    assert since - 1e-9 <= judged <= now


def test_memory_is_bounded() -> None:
    """Only the last MAX_OUTAGES outages are remembered."""
    reach = Reachability()
    for n in range(MAX_OUTAGES * 2):
        reach.lost(float(2 * n))
        reach.found(float(2 * n + 1))
    assert reach.unseen(0.0, 4.0 * MAX_OUTAGES) == MAX_OUTAGES
