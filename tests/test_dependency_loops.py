"""Dependency-loop alerts (seed 004, 4.1): two-way reach rates per agent pair over a sliding window, on a fake clock."""

from __future__ import annotations

import logging

import pytest

from reach_plugins.attempts.loopwatch import LoopWatch
from reach_plugins.errors import ConfigError, LoopDetected
from reach_plugins.model import Hop
from reach_plugins.policy.dependency import DependencyRates, LoopSettings
from reach_plugins.testing.clock import FakeClock

FAST = LoopSettings(window=10.0, buckets=10, threshold=1.0)
"""10 s window: a loop needs 10 reaches each way inside it."""


def reach_both_ways(rates: DependencyRates, start: float, count: int, every: float) -> list[float]:
    """``orders -> ops`` then ``ops -> orders``, ``count`` times, ``every`` seconds apart; the times of alerts."""
    alerts = []
    for n in range(count):
        now = start + n * every
        for caller, target in (("ops", "orders"), ("orders", "ops")):
            pair = rates.observe(caller, target, now)
            if pair is not None and pair.alert:
                alerts.append(now)
    return alerts


def test_a_pair_reaching_each_other_above_the_threshold_is_one_alert() -> None:
    """Ten reaches each way inside 10 s make the pair a loop: one alert, then the pair is listed, newer way named."""
    rates = DependencyRates(FAST)
    alerts = reach_both_ways(rates, 0.0, 20, 0.5)
    assert alerts == [4.5]  # the tenth reach each way
    [pair] = rates.pairs(9.9)
    assert (pair.first, pair.second, pair.newer) == ("ops", "orders", ("orders", "ops"))
    assert pair.rate == pytest.approx(2.0)


def test_one_way_traffic_is_never_a_loop() -> None:
    """A thousand reaches one way only: no pair (a dependency, not a loop)."""
    rates = DependencyRates(FAST)
    assert all(rates.observe("ops", "orders", n * 0.01) is None for n in range(1000))
    assert rates.pairs(10.0) == []
    assert rates.rate("ops", "orders", 9.99) == pytest.approx(100.0)


def test_the_two_way_rate_is_the_slower_direction() -> None:
    """Fast one way, slow the other: the pair stays below a threshold the slow way does not reach."""
    rates = DependencyRates(FAST)
    for n in range(100):
        rates.observe("ops", "orders", n * 0.1)
        if n % 20 == 0:
            rates.observe("orders", "ops", n * 0.1)
    assert rates.pairs(9.95) == []


def test_the_window_slides_a_cooled_pair_out_and_a_new_burst_alerts_again() -> None:
    """Once both ways fall below the threshold the pair is dropped; a later storm is a new alert."""
    rates = DependencyRates(FAST)
    assert reach_both_ways(rates, 0.0, 20, 0.5) == [4.5]
    assert rates.pairs(12.0) != []  # buckets 3..12 still hold 14 reaches each way
    assert rates.pairs(21.0) == []
    assert reach_both_ways(rates, 100.0, 20, 0.5) == [104.5]


def test_edges_are_bounded_oldest_out() -> None:
    """At ``max_edges`` the least recently reached edge goes (and its pair with it)."""
    rates = DependencyRates(LoopSettings(window=10.0, max_edges=4))
    for n in range(10):
        rates.observe(f"a{n}", "b", float(n))
    assert len(rates) == 4
    assert rates.rate("a0", "b", 10.0) == 0.0 and rates.rate("a9", "b", 10.0) > 0


def test_an_agent_reaching_itself_is_not_a_pair() -> None:
    """Self-reaches (another capability of the same agent) are the loop guard's, not a two-agent loop."""
    rates = DependencyRates(FAST)
    assert all(rates.observe("ops", "ops", n * 0.01) is None for n in range(100))


def test_bad_settings_are_config_errors() -> None:
    """A window that is not a positive number of seconds, or a threshold <= 0, says what to fix."""
    with pytest.raises(ConfigError, match=r"loops\.window"):
        DependencyRates(LoopSettings(window=0.0))
    with pytest.raises(ValueError, match="threshold"):
        LoopSettings(threshold=0)


def hop(agent: str) -> list[Hop]:
    return [Hop(agent=agent, capability="anything")]


def test_watch_logs_and_sheds_only_the_newer_direction(caplog: pytest.LogCaptureFixture) -> None:
    """``on_loop: shed``: one WARNING on ``reach_plugins.loops``; the newer way is refused, the older one is not."""
    caplog.set_level(logging.WARNING, logger="reach_plugins.loops")
    clock = FakeClock(0.0)
    watch = LoopWatch(FAST.model_copy(update={"on_loop": "shed"}), clock, lambda: None)
    refused = []
    for _ in range(30):
        watch.check(hop("ops"), "orders")  # the older direction: never shed
        try:
            watch.check(hop("orders"), "ops")
        except LoopDetected as exc:
            refused.append(clock.monotonic())
            assert "orders -> ops is shed" in exc.message
        clock.advance(0.5)
    assert refused and refused[0] == 4.5
    loops = [r for r in caplog.records if r.name == "reach_plugins.loops"]
    assert len(loops) == 1 and "ops and orders" in loops[0].getMessage()


def test_a_reach_from_outside_any_agent_is_not_counted() -> None:
    """No hop chain, no caller: nothing counted."""
    watch = LoopWatch(FAST, FakeClock(), lambda: None)
    watch.check([], "orders")
    assert watch.rates is not None and len(watch.rates) == 0


def test_opting_out_warns(caplog: pytest.LogCaptureFixture) -> None:
    """``loops.enabled: false`` is named and logged: the alerts are off."""
    caplog.set_level(logging.WARNING, logger="reach_plugins.loops")
    watch = LoopWatch(LoopSettings(enabled=False), FakeClock(), lambda: None)
    watch.check(hop("ops"), "orders")
    assert watch.pairs() == [] and "alerts are off" in caplog.text
