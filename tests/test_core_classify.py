"""Classification of one attempt's result: what is retried, what may have executed, what signals overload."""

from __future__ import annotations

import pytest

from reach_plugins.errors import (
    Backpressure,
    BusinessError,
    ConnectError,
    ConnectionLost,
    HandlerFailed,
    InvalidResponse,
    PermissionDenied,
    ReachError,
    ReadTimeout,
    RemoteError,
    Retryable,
)
from reach_plugins.model import Capability, ErrorInfo
from reach_plugins.policy.classify import (
    check_return_schema,
    classify_exception,
    classify_reply,
    refused_before_running,
)
from reach_plugins.transport import Reply


def fail(code: int = 200, kind: str | None = None, retry_after: float | None = None) -> Reply:
    error = ErrorInfo(type=kind, message="x") if kind else None
    return Reply(status="fail", status_code=code, error=error, retry_after=retry_after)


@pytest.mark.parametrize(
    "reply, outcome, retryable, stage",
    [
        (Reply(status="success", data=1), "success", False, "success"),
        (fail(kind="business"), "business", False, "business"),
        (fail(code=503, kind="business"), "business", False, "business"),
        (fail(code=429), "backpressure", True, "failed"),
        (fail(code=503, retry_after=1), "backpressure", True, "failed"),
        (fail(code=503), "transient", True, "failed"),
        (fail(code=502), "transient", True, "failed"),
        (fail(code=504), "transient", True, "failed"),
        (fail(code=500), "transient", True, "failed"),
        (fail(code=404), "business", False, "business"),
        (fail(code=409, kind="rejected"), "business", False, "business"),
        (fail(kind="transient"), "transient", True, "failed"),
        (fail(kind="timeout"), "timeout", True, "unknown"),
        (fail(code=502, kind="outcome_unknown"), "transient", True, "unknown"),
        (fail(kind="backpressure", retry_after=2), "backpressure", True, "not_delivered"),
        (fail(code=503, kind="backend_unavailable"), "backpressure", True, "not_delivered"),
        (fail(kind="invalid_response"), "invalid_response", False, "failed"),
        (Reply(status="success", status_code=302), "invalid_response", False, "failed"),
        (fail(code=500, kind="handler_failed"), "handler_failed", False, "failed"),
        (fail(kind="handler_failed"), "handler_failed", False, "failed"),
        (fail(code=503, kind="handler_retryable"), "transient", True, "failed"),
    ],
)
def test_reply_classification(reply: Reply, outcome: str, retryable: bool, stage: str) -> None:
    """Error type first, then status: 5xx/429 failed, a hop's timeout or outcome_unknown unknown, backpressure not
    delivered."""
    verdict = classify_reply(reply)
    assert (verdict.outcome, verdict.retryable, verdict.stage) == (outcome, retryable, stage)


@pytest.mark.parametrize(
    "exc, outcome, stage, unreachable",
    [
        (ConnectError("refused"), "transient", "not_delivered", True),
        (ConnectionLost("reset"), "transient", "unknown", False),
        (ReadTimeout("slow"), "timeout", "unknown", False),
        (TimeoutError(), "timeout", "unknown", False),
        (Backpressure("busy", retry_after=1.5), "backpressure", "not_delivered", False),
        (InvalidResponse("not json"), "invalid_response", "failed", False),
        (BusinessError("no such order"), "business", "business", False),
        (RemoteError("oops"), "transient", "failed", False),
        (HandlerFailed("it raised"), "handler_failed", "failed", False),
        (Retryable("busy"), "transient", "failed", False),
        (PermissionDenied("bad token"), "business", "business", False),
    ],
)
def test_exception_classification(exc: ReachError | TimeoutError, outcome: str, stage: str, unreachable: bool) -> None:
    """A connect failure or backpressure never ran (11.1 not_delivered); a lost connection or timeout is unknown."""
    verdict = classify_exception(exc)
    assert (verdict.outcome, verdict.stage, verdict.unreachable) == (outcome, stage, unreachable)


def test_retry_after_comes_from_the_reply_or_its_error() -> None:
    """Retry-After is read from the reply, else from the error body."""
    assert classify_reply(fail(code=429, retry_after=3)).retry_after == 3
    assert (
        classify_reply(
            Reply(status="fail", error=ErrorInfo(type="backpressure", message="m", retry_after=4))
        ).retry_after
        == 4
    )
    assert classify_exception(Backpressure("busy", retry_after=1.5)).retry_after == 1.5


def test_overload_signals_and_breaker_faults() -> None:
    """Timeouts and 429/503/backpressure signal overload; business refusals are not the instance's fault."""
    assert classify_reply(fail(code=429)).overload and classify_exception(ReadTimeout("t")).overload
    assert not classify_reply(fail(code=502)).overload
    assert not classify_reply(fail(kind="business")).instance_fault
    assert classify_exception(InvalidResponse("x")).instance_fault


def test_429_and_503_with_retry_after_are_overload_never_a_fault() -> None:
    """ "Slow down" (429, or 503 with Retry-After) narrows the limit and is retried, but no breaker counts it."""
    for reply in (fail(code=429), fail(code=503, retry_after=1)):
        verdict = classify_reply(reply)
        assert verdict.overload and verdict.retryable and not verdict.instance_fault
        assert verdict.error is not None and verdict.error.type == "backpressure"
    bare = classify_reply(fail(code=503))
    assert bare.instance_fault and bare.overload


def test_return_schema_check() -> None:
    """Data breaking return_schema yields invalid_response naming where; valid data or no schema yields None."""
    cap = Capability(name="query_order", return_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    verdict = check_return_schema(cap, {"n": "seven"})
    assert verdict is not None and verdict.outcome == "invalid_response"
    assert verdict.error is not None and "n: " in verdict.error.message
    assert check_return_schema(cap, {"n": 7}) is None
    assert check_return_schema(Capability(name="query_order"), "anything") is None


@pytest.mark.parametrize(
    "reply",
    [
        fail(401, "invalid_token"),
        fail(401, "token_clock_skew"),
        fail(401, "unauthenticated"),
        fail(503, "backend_unavailable"),
    ],
)
def test_a_refusal_before_running_is_not_delivered_and_the_instance_fault(reply: Reply) -> None:
    """A token the instance cannot verify, or its key store down: nothing ran; fail over, count it, never retry it."""
    verdict = refused_before_running(classify_reply(reply))
    assert verdict.refusal and verdict.stage == "not_delivered" and not verdict.delivered
    assert verdict.instance_fault and not verdict.retryable
    assert verdict.error is not None and verdict.error.type == reply.error.type  # type: ignore[union-attr]


@pytest.mark.parametrize("reply", [fail(403, "permission_denied"), fail(200, "business"), fail(503, "backpressure")])
def test_other_refusals_keep_their_verdict(reply: Reply) -> None:
    """A business refusal, a denied permission or plain backpressure are not the instance's fault."""
    verdict = classify_reply(reply)
    assert refused_before_running(verdict) is verdict


def test_a_handler_that_raised_is_final_and_no_fault_of_the_instance() -> None:
    """handler_failed is settled (never OutcomeUnknown, not retried), no breaker counts it; Retryable is a fault."""
    failed, marked = (
        classify_reply(fail(code=500, kind="handler_failed")),
        classify_reply(fail(kind="handler_retryable")),
    )
    assert failed.settled and not failed.retryable and not failed.instance_fault and not failed.overload
    assert not marked.settled and marked.retryable and marked.instance_fault
