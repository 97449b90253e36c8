"""Shared pytest setup: the real-server fixtures of tests/servers.py, the in-memory spans of tests/span_capture.py."""

pytest_plugins = ["servers", "span_capture"]
