"""The ``reach demo`` scenario: a customer-service front desk reaching four agents.

Needs the ``langchain`` and ``server`` extras (and the OpenTelemetry SDK to draw the trace).
"""

from reach_plugins.demo.run import DemoReport, run_demo

__all__ = ["DemoReport", "run_demo"]
