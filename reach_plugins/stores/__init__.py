"""Shared state: dedup, session liveness and pins, session tables and snapshots; in memory, or in Redis.

Every entry is addressed by one tenant-scoped key (:mod:`.keys`) and every in-memory store is bounded in
entries and bytes by one :class:`~reach_plugins.stores.budget.Budget` it cannot be built without (:mod:`.budget`).
"""
