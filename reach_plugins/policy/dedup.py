"""Idempotency keys and the claim lifecycle: one execution per key within the window (pure, no store).

The key is the caller's ``idempotency_key``, else the capability's template
(``${params.wo_number}``), else the agent's ``idempotency.key_from``, else
none. A store holds each key as in flight (someone is running it) or done
(its first successful response). Duplicates of a done key get the stored
response; duplicates of an in-flight key wait for it (single-flight); the
same key with another payload is an :class:`IdempotencyConflict`. Failed
results are not kept, so a later retry with the same key may run. A claim is
a lease (the request's deadline plus a grace): a key whose owner lost the
answer, or crashed, is ``unknown`` — never free — until the window ends
(:data:`CLAIM_TRANSITIONS`).

The stores that hold the claims (memory, Redis) live in
:mod:`reach_plugins.stores.dedup`; this module only renders keys, hashes
payloads and states the claim table.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Literal

from reach_plugins.errors import ConfigError, InvalidPayload
from reach_plugins.media import digests
from reach_plugins.model import AgentDescriptor, Capability, ReachRequest

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_REQUEST_FIELDS = ("tenant", "session_id", "action", "capability")


def render_key(template: str, request: ReachRequest) -> str:
    """Fill ``${params.a.b}`` (payload fields) and ``${tenant}``-style request fields into a key."""
    names = _PLACEHOLDER.findall(template)
    if not names:
        raise ConfigError(
            f"idempotency key template {template!r} has no placeholder; write it like '${{params.order_id}}' "
            "so each business operation gets its own key"
        )

    def fill(match: re.Match[str]) -> str:
        return _lookup(match.group(1).strip(), template, request)

    return _PLACEHOLDER.sub(fill, template)


def _lookup(name: str, template: str, request: ReachRequest) -> str:
    if name in _REQUEST_FIELDS:
        value: Any = getattr(request, name)
    elif name.startswith("params."):
        value = request.payload
        for part in name.removeprefix("params.").split("."):
            if not isinstance(value, dict) or part not in value:
                raise InvalidPayload(
                    f"capability {request.capability!r} derives its idempotency key from {template!r}, "
                    f"but the payload has no {name.removeprefix('params.')!r}; add that field or pass idempotency_key"
                )
            value = value[part]
    else:
        raise ConfigError(
            f"idempotency key template {template!r} uses unknown placeholder ${{{name}}}; "
            f"use ${{params.<field>}} or one of {', '.join(_REQUEST_FIELDS)}"
        )
    if value is None:
        raise InvalidPayload(f"idempotency key template {template!r}: {name} is empty in this request")
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))


def resolve_key(request: ReachRequest, agent: AgentDescriptor, capability: Capability | None) -> str | None:
    """The explicit key, else the capability's template, else the agent's ``key_from``, else None."""
    if request.idempotency_key:
        return request.idempotency_key
    if capability is not None and capability.idempotency_key:
        return render_key(capability.idempotency_key, request)
    if agent.idempotency.key_from:
        return render_key(agent.idempotency.key_from, request)
    return None


def payload_hash(request: ReachRequest) -> str:
    """A digest of what the key promises to mean: capability, action, payload and media parts."""
    meant = [request.capability, request.action, request.payload, *digests(request.media)]
    body = json.dumps(meant, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


ClaimState = Literal["in_flight", "done", "unknown"]

CLAIM_TRANSITIONS: dict[tuple[ClaimState | None, str], ClaimState | None] = {
    (None, "begin"): "in_flight",  # a free key: the caller owns it for its lease
    ("in_flight", "complete"): "done",  # the owner's success: replayed to every twin for the window
    ("in_flight", "unknown"): "unknown",  # sent, answer lost: kept for the window, never free
    ("in_flight", "fail"): None,  # nothing ran, or it failed for sure: the next request runs
    ("in_flight", "expire"): "unknown",  # the owner crashed: its lease ran out, it may have sent
    ("unknown", "begin"): "in_flight",  # taken over by a caller that retries only where the key is checked
    ("done", "expire"): None,  # the window ended
    ("unknown", "expire"): None,  # the window ended
}
"""The claim lifecycle (STYLE 14). Invariants: only the lease owner moves ``in_flight``; ``unknown`` is never
free within the window (a taker gets ``Begin`` state ``unknown`` and must not run it unguarded); a crashed
owner blocks its key for at most its lease (the request's deadline plus a grace)."""
