"""Shared pytest setup: the real-server fixtures of tests/servers.py."""

pytest_plugins = ["servers"]
