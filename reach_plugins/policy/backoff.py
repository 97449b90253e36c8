"""Full-jitter exponential backoff: ``sleep = U(0, min(cap, base * 2**n))``.

Full jitter (AWS architecture blog, "Exponential Backoff And Jitter") spreads
the retries of many callers that failed together over the whole window, so
they do not come back as one synchronized wave.
"""

from __future__ import annotations

import random

from reach_plugins.model import RetryPolicy


def full_jitter(retry: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Delay before retry number ``retry`` (0 for the first retry): uniform in ``[0, min(cap, base * 2**retry)]``."""
    if retry < 0:
        raise ValueError(f"retry numbers start at 0, got {retry}")
    ceiling = min(cap, base * 2.0 ** min(retry, 62))
    return rng.uniform(0.0, ceiling)


def retry_delay(retry: int, policy: RetryPolicy, rng: random.Random, retry_after: float | None = None) -> float:
    """The jittered delay, but never shorter than what the downstream asked for (``Retry-After``)."""
    delay = full_jitter(retry, base=policy.base_wait, cap=policy.max_wait, rng=rng)
    if retry_after is not None and retry_after > delay:
        return retry_after
    return delay
