"""What a Reach token says (DESIGN.md 11.4): who calls (``sub``), whom (``aud``), for which tenant, down which chain."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

DEFAULT_TTL: Final = 300.0
MAX_TTL: Final = 900.0
"""Fifteen minutes: the seeds' answer to a leaked 24-hour token replayed across agents."""
MAX_CHAIN: Final = 16
VIA_GATEWAY: Final = "gateway"
"""``via`` claim of tokens the gateway issues for itself: what an L3 agent demands."""
TENANT_PREFIX: Final = "tenant:"
"""Subjects that are tenants read ``tenant:<name>``; agents are their plain names."""


@dataclass(frozen=True, slots=True)
class Claims:
    """A verified token's claims."""

    issuer: str
    subject: str
    audience: str
    tenant: str | None
    chain: tuple[str, ...]
    """Every holder before the subject: ``("tenant:alpha", "front")`` for a token front -> orders on alpha's behalf."""
    jti: str
    expires_at: float
    via: str | None = None
    trust: str | None = None
    """The trust level of the holder (the audience) when the issuer was told it: ``"L3"`` marks a sandboxed agent,
    whose token the issuer never exchanges for a direct hop."""

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> Claims:
        chain = payload.get("chain") or []
        if not isinstance(chain, list) or not all(isinstance(hop, str) for hop in chain):
            raise ValueError("the chain claim must be a list of names")
        tenant = payload.get("tenant")
        via = payload.get("via")
        trust = payload.get("trust")
        return cls(
            issuer=str(payload["iss"]),
            subject=str(payload["sub"]),
            audience=str(payload["aud"]),
            tenant=str(tenant) if tenant is not None else None,
            chain=tuple(chain),
            jti=str(payload["jti"]),
            expires_at=float(payload["exp"]),
            via=str(via) if via is not None else None,
            trust=str(trust) if trust is not None else None,
        )
