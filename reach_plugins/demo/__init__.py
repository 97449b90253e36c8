"""The ``reach demo`` scenario: a customer-service front desk reaching four agents (needs the langchain and server extras)."""

from reach_plugins.demo.run import DemoReport, run_demo

__all__ = ["DemoReport", "run_demo"]
