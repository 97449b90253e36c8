"""Shared state: dedup, session liveness, session tables and snapshots; in memory, or in Redis."""
