"""Shared state: dedup, session liveness and pins, session tables and snapshots; in memory, or in Redis.

Every entry is addressed by one tenant-scoped key (:mod:`.keys`) and every in-memory store is bounded in
entries and bytes by one :class:`~reach_plugins.stores.budget.Budget` it cannot be built without (:mod:`.budget`);
a Redis store bounds each value (``max_value_bytes``; Redis's own memory is the operator's) and judges every
lease and expiry by Redis's clock (``TIME`` in its scripts), never a caller's.
"""
