"""A few Prometheus counters, gauges and histograms, written in the text exposition format by hand.

Enough for a gateway's ``/metrics`` without another dependency: labelled
counters and gauges, and histograms with cumulative buckets, ``_sum`` and
``_count`` (format 0.0.4).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

Labels = tuple[tuple[str, str], ...]
Kind = Literal["counter", "gauge", "histogram"]

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(slots=True)
class _Histogram:
    counts: list[int]
    total: float = 0.0
    count: int = 0


@dataclass(slots=True)
class _Family:
    name: str
    kind: Kind
    help: str
    buckets: tuple[float, ...] = ()
    values: dict[Labels, float] = field(default_factory=dict)
    histograms: dict[Labels, _Histogram] = field(default_factory=dict)


def _labels(labels: dict[str, str] | None) -> Labels:
    return tuple(sorted(labels.items())) if labels else ()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    pairs = [*labels, extra] if extra else list(labels)
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in pairs) + "}" if pairs else ""


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if value != int(value) else str(int(value))


class Metrics:
    """Metric families declared up front, updated on the hot path, rendered on scrape."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def declare(self, name: str, kind: Kind, help: str, *, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self._families[name] = _Family(name, kind, help, tuple(sorted(buckets)) if kind == "histogram" else ())

    def inc(self, name: str, labels: dict[str, str] | None = None, value: float = 1.0) -> None:
        family = self._families[name]
        key = _labels(labels)
        family.values[key] = family.values.get(key, 0.0) + value

    def set(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        self._families[name].values[_labels(labels)] = value

    def observe(self, name: str, value: float, labels: dict[str, str] | None = None) -> None:
        family = self._families[name]
        key = _labels(labels)
        histogram = family.histograms.get(key)
        if histogram is None:
            histogram = family.histograms[key] = _Histogram([0] * len(family.buckets))
        index = bisect.bisect_left(family.buckets, value)
        if index < len(histogram.counts):
            histogram.counts[index] += 1
        histogram.total += value
        histogram.count += 1

    def value(self, name: str, labels: dict[str, str] | None = None) -> float:
        """A counter's or gauge's current value (0 when never touched); a histogram's observation count."""
        family = self._families[name]
        key = _labels(labels)
        if family.kind == "histogram":
            histogram = family.histograms.get(key)
            return float(histogram.count) if histogram else 0.0
        return family.values.get(key, 0.0)

    def render(self) -> str:
        lines: list[str] = []
        for family in self._families.values():
            lines.append(f"# HELP {family.name} {family.help}")
            lines.append(f"# TYPE {family.name} {family.kind}")
            for labels, value in sorted(family.values.items()):
                lines.append(f"{family.name}{_format(labels)} {_number(value)}")
            for labels, histogram in sorted(family.histograms.items()):
                running = 0
                for bound, count in zip(family.buckets, histogram.counts, strict=True):
                    running += count
                    lines.append(f"{family.name}_bucket{_format(labels, ('le', _number(bound)))} {running}")
                lines.append(f"{family.name}_bucket{_format(labels, ('le', '+Inf'))} {histogram.count}")
                lines.append(f"{family.name}_sum{_format(labels)} {_number(histogram.total)}")
                lines.append(f"{family.name}_count{_format(labels)} {histogram.count}")
        return "\n".join(lines) + "\n"
