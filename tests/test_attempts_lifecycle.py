"""The attempt lifecycle: its tables, its hooks, a keyed call's pin after an unknown outcome, the stream's timers."""

from __future__ import annotations

import random
from typing import Any

import pytest
from core_fakes import FakeRouter, make_agent

from reach_plugins.attempts.bounded import within
from reach_plugins.attempts.claims import ON_BEGIN, on_begin, on_end
from reach_plugins.attempts.hooks import Moved
from reach_plugins.attempts.lifecycle import AFTER, PHASES, ImpossibleMove, moved
from reach_plugins.attempts.pipeline import Pipeline
from reach_plugins.errors import ConnectError, ConnectionLost, OutcomeUnknown
from reach_plugins.model import AttemptRecord, CircuitBreakerConfig, Idempotency, ReachRequest, Timeouts
from reach_plugins.testing.clock import FakeClock
from reach_plugins.transport import BaseTransport, Call, EventStream, MockTransport, Reply, StreamEvent


def test_every_outcome_has_a_row_and_every_phase_lists_its_moves() -> None:
    """AFTER covers each (DESIGN 11.1 outcome, keyed) pair; only a keyed unknown pins; only not_delivered fails over."""
    stages = ("not_delivered", "unknown", "failed", "business", "success")
    assert set(AFTER) == {(stage, keyed) for stage in stages for keyed in (False, True)}
    assert {key for key, row in AFTER.items() if row.pin} == {("unknown", True)}
    assert {key[0] for key, row in AFTER.items() if row.fail_over_first} == {"not_delivered"}
    assert moved("ready", "admit") == "admitted" and moved("sent", "fail_over") == "ready"
    assert PHASES["done"] == {}


@pytest.mark.parametrize(("phase", "move"), [("done", "send"), ("ready", "send"), ("admitted", "retry")])
def test_an_impossible_move_raises(phase: Any, move: Any) -> None:
    """A move the phase table does not list raises ImpossibleMove naming the moves that are allowed."""
    with pytest.raises(ImpossibleMove, match="cannot"):
        moved(phase, move)


def test_the_claim_tables_say_what_a_begin_answer_and_an_ending_mean() -> None:
    """new runs, unknown is taken over, done replays (or waits), inflight waits; a lost answer leaves it unknown."""
    assert {state: on_begin(state, True) for state in ON_BEGIN} == {
        "new": "run",
        "unknown": "take_over",
        "done": "replay",
        "inflight": "wait",
    }
    assert on_begin("done", False) == "wait"
    assert (on_end(True, True), on_end(False, True), on_end(False, False)) == ("done", "unknown", "released")
    with pytest.raises(ImpossibleMove, match="begin"):
        on_begin("lost", True)


class Heard:
    """A pipeline hook that keeps what it hears."""

    def __init__(self) -> None:
        self.attempts: list[AttemptRecord] = []
        self.moves: list[Moved] = []

    def attempt(self, record: AttemptRecord) -> None:
        self.attempts.append(record)

    def moved(self, change: Moved) -> None:
        self.moves.append(change)


async def test_hooks_hear_every_attempt_and_the_breaker_transition_it_caused() -> None:
    """A pipeline's hooks get a frozen record per attempt and the breaker's open, with no observer set on the engine."""
    breaker = CircuitBreakerConfig(min_calls=1, error_threshold=0.5)
    agent = make_agent(instances=1, circuit_breaker=breaker)

    def fail(call: Call) -> Reply:
        raise ConnectionLost("reset after send")

    heard = Heard()
    pipeline = Pipeline(
        router=FakeRouter([agent]),
        transport=MockTransport(fail),
        clock=FakeClock(),
        rng=random.Random(1),
        hooks=[heard],
    )
    response = await pipeline.run(ReachRequest(capability="query_order"))
    assert response.status != "success"
    assert heard.attempts and all(record.outcome == "transient" for record in heard.attempts)
    with pytest.raises(AttributeError):
        heard.attempts[0].outcome = "success"  # type: ignore[misc]
    assert [(change.kind, change.after) for change in heard.moves][:1] == [("breaker", "open")]
    assert not hasattr(pipeline._engine, "observer")


async def test_a_keyed_call_never_moves_to_another_agent_after_an_unknown_outcome() -> None:
    """DESIGN 11.1: after an unknown outcome a keyed retry stays where its key is checked, else OutcomeUnknown."""
    shared = make_agent("orders", instances=1, idempotency=Idempotency(shared=True))
    other = make_agent("backup", instances=1)
    sent: list[str] = []

    def handler(call: Call) -> Reply:
        sent.append(call.instance.instance_id)
        if len(sent) == 1:
            raise ConnectionLost("reset after the request was sent")
        raise ConnectError("refused: nothing ran")

    pipeline = Pipeline(
        router=FakeRouter([shared, other]), transport=MockTransport(handler), clock=FakeClock(), rng=random.Random(1)
    )
    response = await pipeline.run(ReachRequest(capability="query_order", idempotency_key="k-1", timeout_ms=20_000))
    assert sent[0] == "orders-0"
    assert "backup-0" not in sent
    assert response.status != "success"
    assert response.error is not None and response.error.type == OutcomeUnknown.code


class SilentAfterFirst(BaseTransport):
    """Streams one event, then stays silent for ``silence`` seconds of the fake clock; notes when it was closed."""

    def __init__(self, clock: FakeClock, *, first_after: float = 0.0, silence: float = 60.0) -> None:
        self.clock = clock
        self.first_after = first_after
        self.silence = silence
        self.closed_at: list[float] = []

    async def stream(self, call: Call) -> EventStream:
        try:
            await self.clock.sleep(self.first_after)
            yield StreamEvent("data", "first")
            await self.clock.sleep(self.silence)
            yield StreamEvent("data", "too late")
            yield StreamEvent("end")
        finally:
            self.closed_at.append(self.clock.now())


async def test_a_silent_stream_is_cut_at_its_idle_limit_on_the_fake_clock() -> None:
    """A stream silent longer than stream_idle is cut exactly stream_idle after its last event, with an error event."""
    clock = FakeClock()
    agent = make_agent(instances=1, timeouts=Timeouts(stream_idle=5))
    transport = SilentAfterFirst(clock)
    pipeline = Pipeline(router=FakeRouter([agent]), transport=transport, clock=clock, rng=random.Random(1))
    start = clock.now()
    events = [event async for event in pipeline.stream(ReachRequest(capability="query_order"))]
    assert [event.kind for event in events] == ["data", "error"]
    assert events[-1].error is not None and "stream_idle" in events[-1].error.message
    assert transport.closed_at[0] - start == pytest.approx(5.0)


async def test_ttfbt_bounds_the_wait_for_a_streams_first_event() -> None:
    """With ttfbt set, a stream whose first event is late is given up at ttfbt, not at connect + response."""
    clock = FakeClock()
    agent = make_agent(instances=1, timeouts=Timeouts(connect=1, response=10, ttfbt=2))
    transport = SilentAfterFirst(clock, first_after=30.0, silence=0.0)
    pipeline = Pipeline(router=FakeRouter([agent]), transport=transport, clock=clock, rng=random.Random(1))
    start = clock.now()
    events = [event async for event in pipeline.stream(ReachRequest(capability="query_order"))]
    assert events[-1].kind == "error"
    assert transport.closed_at[0] - start == pytest.approx(2.0)


async def test_within_cuts_a_waiting_coroutine_at_its_deadline_and_lets_a_quick_one_through() -> None:
    """within() returns what a coroutine that never waits returns, and cuts one that waits at the deadline."""
    clock = FakeClock()

    async def quick() -> str:
        return "at once"

    async def slow() -> str:
        await clock.sleep(10)
        return "too late"

    async def brief() -> str:
        await clock.sleep(1)
        return "in time"

    start = clock.now()
    assert await within(clock, start + 5, quick()) == "at once"
    assert await within(clock, start + 5, brief()) == "in time"
    with pytest.raises(TimeoutError):
        await within(clock, start + 5, slow())
    assert clock.now() - start == pytest.approx(5.0)
