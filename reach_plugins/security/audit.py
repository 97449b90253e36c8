"""The content audit of L3 agents (DESIGN.md 11.4): a hook that sees every request and reply, and may refuse.

The hook is a callable ``hook(event) -> bool | None | Awaitable[...]``
(``False`` refuses) or a URL that receives the event as JSON and answers 2xx
``{"allow": true|false, "reason": ...}``. An unreachable audit URL refuses,
and so does a gateway without an audit: an L3 call never goes unaudited. Only the gateway reaches L3 agents, so the
gateway installs :class:`AuditTransport` around its next hop.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from reach_plugins.errors import AuditRefused
from reach_plugins.security.wrapping import Wrapping
from reach_plugins.transport import Call, EventStream, Reply, Transport


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One thing the audit sees: a request about to be sent, or the reply that came back."""

    stage: Literal["request", "reply"]
    agent: str
    capability: str
    tenant: str | None
    request_id: str
    payload: Any
    reply: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "agent": self.agent,
            "capability": self.capability,
            "tenant": self.tenant,
            "request_id": self.request_id,
            "payload": self.payload,
            "reply": self.reply,
        }


AuditHook = Callable[[AuditEvent], "bool | Awaitable[bool | None] | None"]


def url_hook(url: str, *, timeout: float = 5.0) -> AuditHook:
    """A hook that POSTs each event to ``url``; anything but a 2xx ``allow: true`` refuses."""

    async def hook(event: AuditEvent) -> bool:
        import aiohttp

        try:
            async with (
                aiohttp.ClientSession(trust_env=False) as session,
                session.post(
                    url, json=event.as_json(), timeout=aiohttp.ClientTimeout(total=timeout), allow_redirects=False
                ) as reply,
            ):
                answer = await reply.json(content_type=None) if 200 <= reply.status < 300 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        return isinstance(answer, dict) and answer.get("allow") is True

    return hook


class AuditTransport(Wrapping):
    """``inner``, with every call to an L3 agent and its reply shown to ``hook`` first."""

    def __init__(self, inner: Transport, hook: AuditHook | str | None) -> None:
        super().__init__(inner)
        self.hook: AuditHook | None = url_hook(hook) if isinstance(hook, str) else hook

    async def _check(self, event: AuditEvent) -> None:
        if self.hook is None:
            raise AuditRefused(
                f"agent {event.agent!r} is L3 and this gateway has no content audit to show its traffic to; "
                "start the gateway with --audit URL (or pass audit= to create_app)"
            )
        verdict = self.hook(event)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is False:
            raise AuditRefused(
                f"the content audit refused the {event.stage} of {event.agent}/{event.capability} "
                f"(request {event.request_id}); agent {event.agent!r} is L3 and every exchange with it is audited"
            )

    def _event(self, call: Call, stage: Literal["request", "reply"], reply: dict[str, Any] | None = None) -> AuditEvent:
        request = call.request
        return AuditEvent(
            stage, call.agent.name, request.capability, request.tenant, request.request_id, request.payload, reply
        )

    async def send(self, call: Call) -> Reply:
        if call.agent.trust_level != "L3":
            return await self.inner.send(call)
        await self._check(self._event(call, "request"))
        reply = await self.inner.send(call)
        error = reply.error.model_dump(exclude_none=True) if reply.error else None
        await self._check(self._event(call, "reply", {"status": reply.status, "data": reply.data, "error": error}))
        return reply

    async def stream(self, call: Call) -> EventStream:
        if call.agent.trust_level != "L3":
            async for event in self.inner.stream(call):
                yield event
            return
        await self._check(self._event(call, "request"))
        async for event in self.inner.stream(call):
            if event.kind == "data":
                await self._check(self._event(call, "reply", {"status": "data", "data": event.data}))
            yield event
