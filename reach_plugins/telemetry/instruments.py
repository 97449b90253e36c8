"""Instruments recorded in our own code on the hot path and handed to the OpenTelemetry SDK when a reader collects.

An SDK measurement costs ~10-16 us a call (a measurement object, attribute
hashing, a bucket search under a lock, an exemplar offer); a finished reach
makes five. :class:`RunningTotals` keeps a counter's sums and reports them as
an observable counter; :class:`QueuedHistogram` queues a histogram's values
and records them into the SDK histogram at the start of a collection. Either
way every reader sees what recording straight into the SDK showed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import NonRecordingSpan, SpanContext, set_span_in_context

Callback = Callable[[CallbackOptions], Iterable[Observation]]
"""What an observable instrument calls when a reader collects."""

_OVERFLOW: Final = (("otel.metric.overflow", "true"),)
"""The attribute set of everything past a counter's limit of attribute sets (the SDK's own overflow name)."""
_NO_SPAN: Final = Context()
"""The context of a value taken outside any span: no exemplar may name the collecting thread's span."""


class RunningTotals:
    """A monotonic counter kept as running totals per attribute set, which the SDK observes when it collects.

    An SDK ``Counter.add`` costs ~10 us; here an add is a dict update under a
    lock (~1 us) and the totals reach the SDK as an observable counter, so
    readers see the same cumulative sums. Attribute sets past ``limit`` fold
    into one overflow set (``otel.metric.overflow``, as the SDK does), so
    memory stays bounded with or without an SDK. ``before`` run first at each
    collection (a :meth:`QueuedHistogram.flush` of the same requests).
    """

    def __init__(
        self,
        meter: Meter,
        name: str,
        *,
        unit: str,
        description: str,
        limit: int = 2000,
        before: Sequence[Callback] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._totals: dict[tuple[tuple[str, Any], ...], float] = {}
        self._limit = limit
        meter.create_observable_counter(name, [*before, self._observe], unit=unit, description=description)

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        key = tuple(attributes.items()) if attributes else ()
        with self._lock:
            try:
                self._count(key, amount)
            except TypeError:  # a sequence value (a list): kept as a tuple, as the SDK keeps it
                self._count(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in key), amount)

    def _count(self, key: tuple[tuple[str, Any], ...], amount: float) -> None:
        totals = self._totals
        if key not in totals and len(totals) >= self._limit:
            key = _OVERFLOW
        totals[key] = totals.get(key, 0) + amount

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            totals = list(self._totals.items())
        return [Observation(value, dict(key)) for key, value in totals]


class QueuedHistogram:
    """An SDK histogram whose values are queued on the hot path and recorded into it when a reader collects.

    A :meth:`record` is a list append (~0.3 us). :meth:`flush` records the
    queued values into the SDK histogram in order, each with the span it was
    taken in (so a trace-based exemplar still names its request's span); it
    must be a callback of an observable instrument on the same meter provider
    (``RunningTotals(..., before=[histogram.flush])``): the SDK runs every
    callback before it reads any aggregation, so each reader sees exact
    counts, sums, min, max and buckets, and values flushed while one reader
    collects reach the others at their next collection, as any recording
    does. Only an exemplar's timestamp moves (to the collection). Past
    ``limit`` queued values, the record that reaches it flushes: memory stays
    bounded while no reader collects.
    """

    def __init__(
        self, meter: Meter, name: str, *, unit: str, description: str, boundaries: Sequence[float], limit: int = 4096
    ) -> None:
        self._histogram = meter.create_histogram(
            name, unit=unit, description=description, explicit_bucket_boundaries_advisory=boundaries
        )
        self._lock = threading.Lock()
        self._queued: list[tuple[float, Mapping[str, Any], SpanContext | None]] = []
        self._limit = limit

    def record(self, amount: float, attributes: Mapping[str, Any], span: SpanContext | None = None) -> None:
        """Queue ``amount`` with its attributes and the span (context) it was measured in, if any."""
        with self._lock:
            queued = self._queued
            queued.append((amount, attributes, span))
            full = len(queued) >= self._limit
        if full:
            self.flush(CallbackOptions())

    def flush(self, options: CallbackOptions) -> Iterable[Observation]:
        """Record every queued value into the SDK histogram (an observable's callback: it observes nothing)."""
        with self._lock:
            queued, self._queued = self._queued, []
        record = self._histogram.record
        for amount, attributes, span in queued:
            context = set_span_in_context(NonRecordingSpan(span)) if span is not None else _NO_SPAN
            record(amount, attributes, context=context)
        return ()
