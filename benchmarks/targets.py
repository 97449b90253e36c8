"""Issue 18's targets beside the figures: which were met, printed and kept in each benchmark's JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Targets = Mapping[str, tuple[str, float]]
"""Figure name -> (``"<="`` or ``">="``, target)."""


def verdict(figures: Mapping[str, float], targets: Targets) -> dict[str, dict[str, Any]]:
    """Each target whose figure was measured: its value, the target as text, and whether it was met."""
    checks = {}
    for key, (sense, target) in targets.items():
        if key in figures:
            value = figures[key]
            met = value <= target if sense == "<=" else value >= target
            checks[key] = {"value": value, "target": f"{sense} {target:g}", "met": met}
    return checks


def print_verdict(checks: Mapping[str, Mapping[str, Any]]) -> None:
    for key, check in checks.items():
        print(f"{key:42} {check['value']:>9} (target {check['target']}: {'met' if check['met'] else 'MISSED'})")
