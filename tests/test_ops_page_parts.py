"""The parts of the operations page that need no server: endpoints shown without secrets, p95, the bounded recent
reaches and the trace file they follow, Basic passwords."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from reach_plugins.errors import ConfigError
from reach_plugins.gateway.ops import Recent, basic_password, figures, p95, shown_endpoint
from reach_plugins.model import ReachTrace
from reach_plugins.telemetry.trace import JsonLinesSink


def _trace(n: int, *, status: str = "success", ms: float = 1.0, tenant: str = "demo") -> ReachTrace:
    return ReachTrace(request_id=f"r{n}", capability="query_order", tenant=tenant, status=status, duration_ms=ms)


def test_endpoints_are_shown_without_userinfo_query_or_fragment() -> None:
    """A credential written into an endpoint URL never reaches the page."""
    assert shown_endpoint("https://user:s3cret@127.0.0.1:8443/a2a?key=s3cret#s3cret") == "https://127.0.0.1:8443/a2a"
    assert shown_endpoint("http://[::1]:9/x") == "http://[::1]:9/x"


def test_p95_is_the_nearest_rank() -> None:
    """Of 1..100 ms the p95 is 95; of one value, that value; of none, 0."""
    assert p95([float(v) for v in range(100, 0, -1)]) == 95.0
    assert (p95([7.0]), p95([])) == (7.0, 0.0)


def test_figures_count_errors_per_capability_and_calls_per_tenant() -> None:
    """3 of 4 succeeded: error rate 0.25; tenants summed apart."""
    traces = [_trace(1), _trace(2, status="fail", ms=9.0), _trace(3, tenant="acme"), _trace(4)]
    shown = figures(traces)
    assert shown["capabilities"] == [
        {"capability": "query_order", "calls": 4, "errors": 1, "error_rate": 0.25, "p95_ms": 9.0}
    ]
    assert [(t["tenant"], t["calls"], t["succeeded"]) for t in shown["tenants"]] == [("acme", 1, 1), ("demo", 3, 2)]
    assert [r["request_id"] for r in shown["recent"]] == ["r4", "r3", "r2", "r1"]


def test_recent_is_bounded_and_hands_every_trace_on() -> None:
    """Only the newest ``size`` are kept."""
    recent = Recent(size=3)
    for n in range(5):
        recent.emit(_trace(n))
    assert [t.request_id for t in recent.traces()] == ["r2", "r3", "r4"]
    assert recent.find("r1") is None and recent.find("r4") is not None
    with pytest.raises(ConfigError, match="at least 1"):
        Recent(size=0)


def test_recent_follows_a_trace_file_and_waits_for_a_line_to_end(tmp_path: Path) -> None:
    """Records appended by a client's JsonLinesSink appear; a half-written line waits until it is complete; a rotated
    file is read from its start."""
    path = tmp_path / "traces.jsonl"
    recent = Recent(follow=path)
    assert recent.traces() == []
    sink = JsonLinesSink(path)
    sink.emit(_trace(1))
    line = _trace(2).model_dump_json()
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line[:10])
    assert [t.request_id for t in recent.traces()] == ["r1"]
    with path.open("a", encoding="utf-8") as handle:
        handle.write(line[10:] + "\n")
    assert [t.request_id for t in recent.traces()] == ["r1", "r2"]
    sink.close()
    path.write_text(_trace(3).model_dump_json() + "\n", encoding="utf-8")  # rotated: a new, shorter file
    assert [t.request_id for t in recent.traces()] == ["r1", "r2", "r3"]


def test_a_basic_password_is_read_only_from_a_well_formed_header() -> None:
    """user:password -> password; anything else -> "" (never equal to a token)."""
    good = "Basic " + base64.b64encode(b"ops:tok:with:colons").decode()
    assert basic_password(good) == "tok:with:colons"
    for bad in (None, "", "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"\xff\xfe").decode()):
        assert basic_password(bad) == ""


def test_a_big_trace_file_is_read_from_its_newest_part_only(tmp_path: Path) -> None:
    """Past tail_bytes only the newest whole lines are read (the cut one is skipped), so a look stays bounded."""
    path = tmp_path / "traces.jsonl"
    lines = [_trace(n).model_dump_json() + "\n" for n in range(10)]
    path.write_text("".join(lines), encoding="utf-8")
    recent = Recent(follow=path, tail_bytes=len(lines[-1]) * 2 + 5)
    assert [t.request_id for t in recent.traces()] == ["r8", "r9"]
