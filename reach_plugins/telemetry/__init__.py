"""Telemetry: attribute names and span helpers, the request trace and its sinks, metrics, usage."""
