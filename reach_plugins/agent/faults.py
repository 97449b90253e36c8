"""A handler's failure as the caller sees it: an error id and a generic message; details stay in the agent's log.

A handler's exception text is the agent's business (``db connect failed:
postgres://svc:PASSWORD@...``): it is logged here under a fresh error id, and
the caller gets only the capability's name and that id to quote.
"""

from __future__ import annotations

import logging
import uuid

log = logging.getLogger("reach_plugins.agent")


def concealed(exc: BaseException, capability: str) -> str:
    """Log ``exc`` with a new error id; the message for the caller, which names only that id."""
    error_id = uuid.uuid4().hex[:16]
    log.error("handler of %r failed; error id %s", capability, error_id, exc_info=exc)
    return f"{capability!r} failed; the agent's log holds the details under error id {error_id}"
