"""Audit records (token exchanges, approval decisions) always reach an output.

They are INFO records on their own loggers; an application that configured logging receives them as it
receives any other record. A process that configured nothing (``serve()``, ``reach issuer``) would drop
INFO records, so each audit logger writes to stderr itself while the root logger has no handler.
"""

from __future__ import annotations

import logging
import sys


class _UnlessConfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to stderr only while the application has configured no root handler (then it gets the record)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not logging.getLogger().handlers:
            super().emit(record)


def audit_logger(name: str) -> logging.Logger:
    """The logger ``name`` for audit records: INFO and up, written to stderr when nothing else takes them."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    if not any(isinstance(handler, _UnlessConfigured) for handler in logger.handlers):
        handler = _UnlessConfigured(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
    return logger
