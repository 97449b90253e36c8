"""Sans-IO policy: state machines fed a clock; no asyncio (breaker, budget, limits, deadline, dedup table...)."""
