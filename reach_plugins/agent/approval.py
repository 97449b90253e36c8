"""Approval at the target (seed 004, section 5.2): a dangerous reach runs only once someone said yes.

The caller's framework may ask a human too (LangGraph ``interrupt``), but
callers that never passed through a framework (a plain ``ReachClient``, a Dify
plugin, another agent) reach the agent directly: the gate belongs where the
side effect happens. When an agent built with the SDK receives a reach for a
capability with ``danger_level: high`` or ``require_approval``, it does not run
the handler; it asks its approver (a callable, or a webhook URL it POSTs the
:class:`ApprovalRequest` to) and runs only on approval:

* approved -> the handler runs;
* denied -> a business error naming who denied it and why;
* no answer within the caller's deadline -> ``approval_required`` ("not executed").
  An approval that takes longer than a call can wait goes through the node's
  callback mode (``Submit`` with a long ``timeout_ms``, then ``Result``): the
  gate waits within that deadline.

:class:`CallerApproval` hands the question to the caller's human instead: a
call without a ticket is answered ``approval_required`` carrying a signed,
single-use ticket (bound to this agent, the capability, the tenant and the
verified caller, valid for ``ttl`` seconds); the caller's framework asks its
reviewer (LangGraph ``interrupt``, LlamaIndex ``InputRequiredEvent``, see the
adapters) and re-sends the call with the ticket as its ``action``; the ticket
is checked and spent, so the approved call runs once.

The approver sees verified facts only: the tenant, the caller and the chain
come from the token the agent verified (never from ``X-Reach-Hops``, which any
caller writes), and the whole payload as a structure (no cut a padded field
could push ``amount`` past). In the named open mode (``tokens="open"``) nothing
is verified, and the request says so (``verified=False``, no caller, no chain).

Every decision is audited: one JSON object per line on
``reach_plugins.agent.approval`` (``json.dumps`` of a dict, so no request field
can write a line of its own) and a ``reach.approval`` event on the agent's
server span.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import inspect
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from opentelemetry import trace

from reach_plugins.agent.handlers import ReachContext
from reach_plugins.errors import ApprovalRequired, BusinessError, ConfigError
from reach_plugins.model import Capability
from reach_plugins.security.auditlog import audit_logger

if TYPE_CHECKING:
    from reach_plugins.security.claims import Claims

audit = audit_logger("reach_plugins.agent.approval")

EVENT_APPROVAL = "reach.approval"


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """What an approver is asked: which capability, for whom, through which chain, with what."""

    request_id: str
    agent: str
    capability: str
    danger_level: str
    tenant: str | None
    """The tenant the verified token names."""
    caller: str | None
    """The verified token's subject: the agent that reached this one, or ``tenant:<name>`` for a tenant's caller
    (``None`` when the agent runs open and nothing was verified)."""
    chain: tuple[str, ...]
    """Every holder of the call so far, from the verified token, ending with the caller."""
    payload: Any
    """The whole payload, as the handler will receive it."""
    remaining_ms: int | None
    verified: bool
    """Whether tenant, caller and chain come from a verified token (``False`` only in the open mode)."""
    action: str | None = None
    """The call's ``action``: a :class:`CallerApproval` ticket when the caller re-sends an approved call."""


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """An approver's answer: ``approved``, by whom, and why."""

    approved: bool
    by: str
    reason: str = ""


Approver = Callable[[ApprovalRequest], "ApprovalDecision | bool | Awaitable[ApprovalDecision | bool]"]


def _reply_margin(remaining: float) -> float:
    """Time kept back from the caller's deadline so the "no approval" answer reaches it before it gives up."""
    return max(0.05, 0.1 * remaining)


class WebhookApprover:
    """POST the :class:`ApprovalRequest` as JSON to ``url``; the answer is ``{"approved", "by", "reason"}``.

    Redirects are not followed, and anything but a 200 with that shape is a denial by ``url``.
    """

    def __init__(self, url: str) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"the approval webhook must be an http(s) URL, got {url!r}")
        self.url = url

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        async with (
            aiohttp.ClientSession(trust_env=False) as session,
            session.post(self.url, json=asdict(request), allow_redirects=False) as answer,
        ):
            body = await answer.json(content_type=None) if answer.status == 200 else None
        if not isinstance(body, dict) or not isinstance(body.get("approved"), bool):
            return ApprovalDecision(
                False, "the approval service", f"it answered HTTP {answer.status} without a decision"
            )
        return ApprovalDecision(
            body["approved"], str(body.get("by") or "the approval service"), str(body.get("reason") or "")
        )


class CallerApproval:
    """An approver that asks the caller's reviewer: a call runs when it carries a valid, unspent ticket.

    ``key`` signs the tickets (give every instance of the agent the same one, or a ticket from one instance is
    refused by another); ``ttl`` is how long a ticket stays valid; ``clock`` returns the wall time in seconds.
    """

    def __init__(self, *, key: bytes | None = None, ttl: float = 600.0, clock: Callable[[], float] = time.time) -> None:
        if ttl <= 0:
            raise ConfigError(f"CallerApproval(ttl=) is how long a ticket stays valid, in seconds > 0; got {ttl}")
        self._key = key if key is not None else secrets.token_bytes(32)
        self.ttl = ttl
        self._clock = clock
        self._spent: dict[str, float] = {}
        """Nonces of tickets used, with their expiry (forgotten once expired: an expired ticket fails anyway)."""

    def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        """Approve a call carrying a valid ticket; refuse one whose ticket is bad; ask the caller otherwise."""
        if request.action is None or not request.action.startswith(TICKET_PREFIX):
            raise ApprovalRequired(
                f"{request.capability!r} of agent {request.agent!r} needs the approval of the caller's reviewer "
                "(the person using the calling app) before it runs; nothing was executed. An app with a human in "
                "the loop (LangGraph interrupt, LlamaIndex InputRequiredEvent) asks them and re-sends the call "
                f"with this ticket; an app without one cannot approve it: ask the operator of {request.agent!r}",
                ticket=self._issue(request),
            )
        problem = self._spend(request, request.action.removeprefix(TICKET_PREFIX))
        if problem:
            return ApprovalDecision(False, f"agent {request.agent!r}", f"the approval ticket {problem}")
        return ApprovalDecision(True, f"the reviewer of {request.caller or 'the caller'}")

    def _facts(self, request: ApprovalRequest) -> list[Any]:
        return [request.agent, request.capability, request.tenant, request.caller]

    def _issue(self, request: ApprovalRequest) -> str:
        body = [*self._facts(request), round(self._clock() + self.ttl, 3), secrets.token_urlsafe(12)]
        raw = json.dumps(body, separators=(",", ":")).encode()
        return f"{TICKET_PREFIX}{_b64(raw)}.{_b64(self._sign(raw))}"

    def _spend(self, request: ApprovalRequest, ticket: str) -> str:
        """Why ``ticket`` cannot approve ``request`` (empty when it can; it is spent then)."""
        encoded, _, signature = ticket.partition(".")
        try:
            raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
            good = hmac.compare_digest(
                base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)), self._sign(raw)
            )
            body = json.loads(raw) if good else None
        except ValueError:
            body = None
        if not isinstance(body, list) or len(body) != 6:
            return "is not one this agent issued"
        *facts, expires, nonce = body
        now = self._clock()
        self._spent = {used: until for used, until in self._spent.items() if until > now}
        if facts != self._facts(request):
            return "was issued for another capability, tenant or caller"
        if expires <= now:
            return "has expired; call again for a new one"
        if nonce in self._spent:
            return "was already used; an approved call runs once"
        self._spent[nonce] = expires
        return ""

    def _sign(self, raw: bytes) -> bytes:
        return hmac.new(self._key, raw, hashlib.sha256).digest()


TICKET_PREFIX = "reach-approval:"
"""How a re-sent call's ``action`` carries a :class:`CallerApproval` ticket."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class ApprovalGate:
    """Asks ``approver`` before a dangerous capability runs; raises unless it approves in time."""

    def __init__(self, agent: str, approver: Approver | str) -> None:
        self.agent = agent
        self.approver: Approver = WebhookApprover(approver) if isinstance(approver, str) else approver

    async def check(self, capability: Capability, ctx: ReachContext, payload: object, claims: Claims | None) -> None:
        """Return when approved; ``BusinessError`` when denied, ``ApprovalRequired`` when nobody answered in time.

        ``claims`` are the verified token's (``None`` in the open mode): the approver's facts come from them.
        """
        request = self._request(capability, ctx, payload, claims)
        remaining = ctx.remaining()
        try:
            async with asyncio.timeout(None if remaining is None else remaining - _reply_margin(remaining)):
                answer = self.approver(request)
                decision = await answer if inspect.isawaitable(answer) else answer
        except ApprovalRequired:
            self._audit(request, "asked_caller", "nobody yet", "the caller's reviewer is asked for it")
            raise
        except TimeoutError:
            self._audit(request, "unanswered", "nobody", "no decision within the caller's deadline")
            raise ApprovalRequired(
                f"{capability.name!r} needs approval and none arrived within the caller's deadline; nothing was "
                "executed (for approvals that take longer, submit through a Reach node with a long timeout_ms)"
            ) from None
        if isinstance(decision, bool):
            decision = ApprovalDecision(decision, "the approver")
        self._audit(request, "approved" if decision.approved else "denied", decision.by, decision.reason)
        if not decision.approved:
            why = f": {decision.reason}" if decision.reason else ""
            raise BusinessError(f"{capability.name!r} was denied by {decision.by}{why}; nothing was executed")

    def _request(
        self, capability: Capability, ctx: ReachContext, payload: object, claims: Claims | None
    ) -> ApprovalRequest:
        remaining = ctx.remaining()
        return ApprovalRequest(
            request_id=ctx.request_id,
            agent=self.agent,
            capability=capability.name,
            danger_level=capability.danger_level,
            tenant=claims.tenant if claims is not None else ctx.tenant,
            caller=claims.subject if claims is not None else None,
            chain=(*claims.chain, claims.subject) if claims is not None else (),
            payload=payload,
            remaining_ms=None if remaining is None else max(0, int(remaining * 1000)),
            verified=claims is not None,
            action=ctx.action,
        )

    def _audit(self, request: ApprovalRequest, verdict: str, by: str, reason: str) -> None:
        record = {
            "event": "approval",
            "verdict": verdict,
            "agent": request.agent,
            "capability": request.capability,
            "request_id": request.request_id,
            "tenant": request.tenant,
            "caller": request.caller,
            "chain": list(request.chain),
            "verified": request.verified,
            "by": by,
            "reason": reason,
        }
        audit.info(json.dumps(record, ensure_ascii=True, default=str))
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(
                EVENT_APPROVAL,
                {"reach.approval.verdict": verdict, "reach.approval.by": by, "reach.approval.reason": reason},
            )
