"""``reach_plugins.langchain``, where LangChain users import it (DESIGN.md 9): the adapter lives in
:mod:`reach_plugins.frameworks.langchain`."""

from reach_plugins.frameworks.langchain import (
    ReachErrorMiddleware,
    ReachMiddleware,
    approval_request,
    create_agent,
    interrupt_approver,
    reach_error_message,
    thread_id_of,
    verdict_of,
)

__all__ = [
    "ReachErrorMiddleware",
    "ReachMiddleware",
    "approval_request",
    "create_agent",
    "interrupt_approver",
    "reach_error_message",
    "thread_id_of",
    "verdict_of",
]
