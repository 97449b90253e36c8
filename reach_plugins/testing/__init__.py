"""Helpers for tests and simulations: virtual time."""
