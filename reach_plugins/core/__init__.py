"""The resilience core: sans-IO state machines (breaker, backoff, budget, dedup, limits) and one async pipeline."""

from reach_plugins.core.backoff import full_jitter, retry_delay
from reach_plugins.core.batching import BatchPolicy, StreamBatcher, streamed_chars
from reach_plugins.core.breaker import Breakers, BreakerState, BreakerTransition, CircuitBreaker, Permit
from reach_plugins.core.budget import RetryBudget
from reach_plugins.core.classify import Outcome, Verdict, check_return_schema, classify_exception, classify_reply
from reach_plugins.core.clock import Clock, FakeClock, SystemClock
from reach_plugins.core.deadline import Deadline, per_attempt_timeout, resolve_deadline
from reach_plugins.core.dedup import (
    Begin,
    DedupStore,
    MemoryDedupStore,
    payload_hash,
    render_key,
    resolve_key,
    store_key,
)
from reach_plugins.core.limits import AdaptiveLimit, ConcurrencyLimiter, TokenBucket
from reach_plugins.core.loopguard import DEFAULT_MAX_HOPS, check_length, check_target, hops_header, parse_hops_header
from reach_plugins.core.pipeline import Pipeline
from reach_plugins.core.ports import CredentialResolver, RouteLike, RouterLike
from reach_plugins.core.trace import JsonLinesSink, LoggingSink, TraceSink, open_sink

__all__ = [
    "DEFAULT_MAX_HOPS",
    "AdaptiveLimit",
    "BatchPolicy",
    "Begin",
    "BreakerState",
    "BreakerTransition",
    "Breakers",
    "CircuitBreaker",
    "Clock",
    "ConcurrencyLimiter",
    "CredentialResolver",
    "Deadline",
    "DedupStore",
    "FakeClock",
    "JsonLinesSink",
    "LoggingSink",
    "MemoryDedupStore",
    "Outcome",
    "Permit",
    "Pipeline",
    "RetryBudget",
    "RouteLike",
    "RouterLike",
    "StreamBatcher",
    "SystemClock",
    "TokenBucket",
    "TraceSink",
    "Verdict",
    "check_length",
    "check_return_schema",
    "check_target",
    "classify_exception",
    "classify_reply",
    "full_jitter",
    "hops_header",
    "open_sink",
    "parse_hops_header",
    "payload_hash",
    "per_attempt_timeout",
    "render_key",
    "resolve_deadline",
    "resolve_key",
    "retry_delay",
    "store_key",
    "streamed_chars",
]
