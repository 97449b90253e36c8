"""Classification of one attempt's result: what is retried, what may have executed, what signals overload."""

from __future__ import annotations

import pytest

from reach_plugins.core import check_return_schema, classify_exception, classify_reply
from reach_plugins.errors import (
    Backpressure,
    BusinessError,
    ConnectError,
    ConnectionLost,
    InvalidResponse,
    PermissionDenied,
    ReachError,
    ReadTimeout,
    RemoteError,
)
from reach_plugins.model import Capability, ErrorInfo
from reach_plugins.transport import Reply


def fail(code: int = 200, kind: str | None = None, retry_after: float | None = None) -> Reply:
    error = ErrorInfo(type=kind, message="x") if kind else None
    return Reply(status="fail", status_code=code, error=error, retry_after=retry_after)


@pytest.mark.parametrize(
    "reply, outcome, retryable, delivered",
    [
        (Reply(status="success", data=1), "success", False, True),
        (fail(kind="business"), "business", False, True),
        (fail(code=503, kind="business"), "business", False, True),
        (fail(code=429), "transient", True, False),
        (fail(code=503), "transient", True, False),
        (fail(code=502), "transient", True, True),
        (fail(code=504), "transient", True, True),
        (fail(code=500), "transient", True, True),
        (fail(code=404), "business", False, True),
        (fail(code=409, kind="rejected"), "business", False, True),
        (fail(kind="transient"), "transient", True, True),
        (fail(kind="timeout"), "timeout", True, True),
        (fail(kind="backpressure", retry_after=2), "backpressure", True, False),
        (fail(kind="invalid_response"), "invalid_response", False, True),
        (Reply(status="success", status_code=302), "invalid_response", False, True),
    ],
)
def test_reply_classification(reply: Reply, outcome: str, retryable: bool, delivered: bool) -> None:
    """Error type first, then status code: 429/502/503/504 transient, other 4xx business, business never retried."""
    verdict = classify_reply(reply)
    assert (verdict.outcome, verdict.retryable, verdict.delivered) == (outcome, retryable, delivered)


@pytest.mark.parametrize(
    "exc, outcome, delivered, unreachable",
    [
        (ConnectError("refused"), "transient", False, True),
        (ConnectionLost("reset"), "transient", True, False),
        (ReadTimeout("slow"), "timeout", True, False),
        (TimeoutError(), "timeout", True, False),
        (Backpressure("busy", retry_after=1.5), "backpressure", False, False),
        (InvalidResponse("not json"), "invalid_response", True, False),
        (BusinessError("no such order"), "business", True, False),
        (RemoteError("oops"), "transient", True, False),
        (PermissionDenied("bad token"), "business", True, False),
    ],
)
def test_exception_classification(
    exc: ReachError | TimeoutError, outcome: str, delivered: bool, unreachable: bool
) -> None:
    """Only a connect failure proves the agent never saw the request; it also marks the instance unreachable."""
    verdict = classify_exception(exc)
    assert (verdict.outcome, verdict.delivered, verdict.unreachable) == (outcome, delivered, unreachable)


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


def test_return_schema_check() -> None:
    """Data breaking return_schema yields invalid_response naming where; valid data or no schema yields None."""
    cap = Capability(name="query_order", return_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    verdict = check_return_schema(cap, {"n": "seven"})
    assert verdict is not None and verdict.outcome == "invalid_response"
    assert verdict.error is not None and "n: " in verdict.error.message
    assert check_return_schema(cap, {"n": 7}) is None
    assert check_return_schema(Capability(name="query_order"), "anything") is None
