"""Retry budget per target agent, in the manner of gRPC retry throttling.

Each failed attempt takes one token, each success gives back ``token_ratio``;
retries are allowed only while the bucket is more than half full. With the
defaults (20 tokens, 0.2 per success) the bucket keeps filling as long as
fewer than one attempt in six fails (``0.2 * (1 - p) > p``) and is deep
enough that random bursts at 10 % never drain it, so a 10 % transient failure
rate is still fully retried; a full outage drains it after ten failures and
from then on each request makes one attempt only.
"""

from __future__ import annotations

from reach_plugins.errors import ConfigError
from reach_plugins.model import RetryPolicy


class RetryBudget:
    """A token bucket of retry permission for one target agent (pure state, no clock needed)."""

    __slots__ = ("max_tokens", "token_ratio", "tokens")

    def __init__(self, max_tokens: float = 20.0, token_ratio: float = 0.2) -> None:
        if max_tokens <= 0 or token_ratio <= 0:
            raise ConfigError(
                f"retry budget needs budget_max_tokens > 0 and budget_token_ratio > 0, "
                f"got {max_tokens} and {token_ratio}"
            )
        self.max_tokens = max_tokens
        self.token_ratio = token_ratio
        self.tokens = max_tokens

    @classmethod
    def from_policy(cls, policy: RetryPolicy) -> RetryBudget:
        return cls(policy.budget_max_tokens, policy.budget_token_ratio)

    def record_success(self) -> None:
        self.tokens = min(self.max_tokens, self.tokens + self.token_ratio)

    def record_failure(self) -> None:
        self.tokens = max(0.0, self.tokens - 1.0)

    def allows_retry(self) -> bool:
        """True while more than half the tokens are left."""
        return self.tokens > self.max_tokens / 2
