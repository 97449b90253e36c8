"""A handler's failure as the caller sees it: an error id and the exception's class; details stay in the agent's log.

A handler's exception text is the agent's business (``db connect failed:
postgres://svc:PASSWORD@...``): it is logged here under a fresh error id, and
the caller gets the capability's name, the exception's class and that id to
quote, as :class:`~reach_plugins.errors.HandlerFailed` — a result of a handler
that ran, which no layer runs again (a transient error of the handler's own
reaches too: they were retried there already). A :class:`~reach_plugins.errors.Retryable`
the handler raised keeps its mark and its message (written for the caller,
with addresses scrubbed as every outlet does), so it is retried per policy.
"""

from __future__ import annotations

import logging
import uuid

from reach_plugins.errors import HandlerFailed, Retryable
from reach_plugins.wire.redact import describe, without_addresses

log = logging.getLogger("reach_plugins.agent")


def failed(exc: BaseException, capability: str) -> HandlerFailed:
    """Log ``exc`` with a new error id; the error the caller gets, which names the class and that id."""
    error_id = uuid.uuid4().hex[:16]
    log.error("handler of %r failed; error id %s", capability, error_id, exc_info=exc)
    if isinstance(exc, Retryable):
        what = f"{describe(exc)}: {without_addresses(exc.message)}"
        return Retryable(f"{capability!r} failed ({what}); may pass if run again; error id {error_id}", error_id)
    told = f"{capability!r} failed ({describe(exc)}); not run again; the agent's log holds the details under error id"
    return HandlerFailed(f"{told} {error_id}", error_id)
