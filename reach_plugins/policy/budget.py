"""Retry budget per target agent: retries that succeed keep retries allowed, retries that fail drain them.

A token bucket in the manner of gRPC retry throttling, but charged on
*retries*, not on failures: a retry takes one token when it is planned; a
retry that succeeds gives it back with one more, a first attempt that
succeeds adds ``token_ratio``. Retries are allowed only while the bucket is
more than half full. So

* a flaky agent (independent transient failures at rate ``p``) keeps its
  retries: each retry wins on average ``2 (1 - p) - 1`` tokens, positive up
  to ``p = 50 %``; at 30 % no retry is withheld, at 40 % almost none;
* a dead agent fails every retry: ten of them (with the default 20 tokens)
  drain the bucket to half, and from then on each request makes one
  attempt, until first attempts succeed again and refill it.

A first attempt that fails costs nothing here: the breaker judges the
instance; the budget only judges whether retrying has been paying off.
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

    def allows_retry(self) -> bool:
        """True while more than half the tokens are left."""
        return self.tokens > self.max_tokens / 2

    def spend(self) -> bool:
        """Take the token of one retry; False (nothing taken) when retries are not allowed now."""
        if not self.allows_retry():
            return False
        self.tokens = max(0.0, self.tokens - 1.0)
        return True

    def record_success(self, *, retry: bool) -> None:
        """An attempt succeeded: a retry gives its token back with one more, a first attempt adds ``token_ratio``."""
        self.tokens = min(self.max_tokens, self.tokens + (2.0 if retry else self.token_ratio))
